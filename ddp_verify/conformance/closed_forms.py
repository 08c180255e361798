"""Closed-form properties' verdicts: what every rank holds after every step, held to what the
feature's definition gives, with ``torch.testing.assert_close``'s report under a sentence that
names the rank and the step."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st


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


def rounded(value: float, dtype: str) -> float:
    """``value`` rounded to ``dtype`` (a torch dtype's name), back as a float.

    >>> rounded(257.0, "bfloat16")
    256.0
    """
    return float(torch.tensor(value, dtype=torch.float64).to(getattr(torch, dtype)).double())


def one_sample_per_rank(world_size: int) -> st.SearchStrategy:
    """(inputs, weights): each rank's one integer input row (up to 600: past 256 not every one
    is a bfloat16 number, so a cast to a low-precision dtype is seen) and its integer loss
    weights, so that a Linear's weight gradient, outer(weights, inputs), is one product per
    entry and known exactly in any dtype the operands are rounded to first."""

    @st.composite
    def draw(draw_: st.DrawFn) -> tuple[list[list[float]], list[list[float]]]:
        n_in, n_out = draw_(st.integers(1, 4)), draw_(st.integers(1, 3))

        def row(n: int, bound: int) -> st.SearchStrategy[list[float]]:
            return st.lists(st.integers(-bound, bound).map(float), min_size=n, max_size=n)

        inputs = draw_(st.lists(row(n_in, 600), min_size=world_size, max_size=world_size))
        weights = draw_(st.lists(row(n_out, 20), min_size=world_size, max_size=world_size))
        return inputs, weights

    return draw()
