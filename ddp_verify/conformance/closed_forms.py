"""Closed-form properties' verdicts: what every rank holds after every step, held to what the
feature's definition gives, with ``torch.testing.assert_close``'s report under a sentence that
names the rank and the step."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def assert_every_rank_and_step(
    results: Sequence[Sequence[Sequence[float]]],
    want: Callable[[int, int], Sequence[float] | Sequence[Sequence[float]]],
    message: Callable[[int, int], str],
    *,
    rtol: float = 1e-12,
    atol: float = 1e-12,
) -> None:
    """Hold ``results[rank][step]`` to ``want(rank, step)``, compared in float64; the first
    mismatch fails with ``message(rank, step)`` above assert_close's report.

    >>> assert_every_rank_and_step([[[1.0], [2.0]]], lambda r, s: [s + 1.0], lambda r, s: "")
    >>> assert_every_rank_and_step([[[1.0]]], lambda r, s: [1.5], lambda r, s: f"rank {r}")
    Traceback (most recent call last):
    ...
    AssertionError: rank 0
    Tensor-likes are not close!
    <BLANKLINE>
    Mismatched elements: 1 / 1 (100.0%)
    Greatest absolute difference: 0.5 at index (0,) (up to 1e-12 allowed)
    Greatest relative difference: 0.3333333333333333 at index (0,) (up to 1e-12 allowed)
    """
    for rank, steps in enumerate(results):
        for step, got in enumerate(steps):
            torch.testing.assert_close(
                torch.tensor(got, dtype=torch.float64),
                torch.tensor(want(rank, step), dtype=torch.float64),
                rtol=rtol,
                atol=atol,
                msg=lambda report, rank=rank, step=step: f"{message(rank, step)}\n{report}",
            )
