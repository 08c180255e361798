"""What the ranks' parameters, losses or failures show at a glance: a result held by rank 0
only, rank 0 alone combined, some parameters left out of synchronisation, a low-rank or
rounded gradient, a known torch issue, collectives that could not pair up. Each is a test
of the run, used by :mod:`.passes` to make a hypothesis (and by the search, for failures).
"""

from __future__ import annotations

import re

import torch

from ...engine.compare import compare, outside
from ...engine.compression import CompressionTolerance
from ...engine.models import one_thread
from ...engine.scenario import Scenario
from ...engine.trace import Trace
from ...world import RankError
from ...world.errors import failure_text
from ...world.naming import option
from .. import findings as f
from ..findings import Cause
from ..kinds import Kind
from .mistakes import Mistake, match_tolerance, simulate

__all__ = [
    "failure_cause",
    "held_by_rank_zero_only",
    "known_issue_cause",
    "lossy_compression",
    "low_rank_cause",
    "only_rank_zero_synchronised",
    "partly_synchronised",
]


def held_by_rank_zero_only(scenario: Scenario, got: Trace) -> bool:
    """Every rank but 0 holds what a reduce onto rank 0 leaves it, at every step (its own
    local loss, or the partial sum of its subtree: gloo's and nccl's reduce trees leave those
    on the inner ranks from 4 ranks on), and rank 0 does not hold its own."""
    size = scenario.world_size
    if size < 2:
        return False
    with one_thread():
        local = simulate(scenario, Mistake(report="own"))
    tolerance = match_tolerance(scenario.dtype)

    def holds(rank: int, step: int, candidates: list[float]) -> bool:
        value = torch.tensor(got.ranks[rank].losses[step])
        return any(
            not bool(
                outside(
                    value,
                    torch.tensor(candidate),
                    tolerance.allowed("loss", step, "", torch.tensor(candidate)),
                ).any()
            )
            for candidate in candidates
        )

    def partial_sums(rank: int, step: int) -> list[float]:
        # Sums of the local losses of the rank and any of the others (2^(size-1) of them),
        # as left, or divided by the world size where the helper divides on every rank.
        mine = local.ranks[rank].losses[step]
        others = [local.ranks[r].losses[step] for r in range(size) if r != rank]
        sums = [
            mine + sum(v for bit, v in enumerate(others) if chosen >> bit & 1)
            for chosen in range(2 ** len(others))
        ]
        return sums + [s / size for s in sums]

    steps = range(got.steps)
    others_partial = all(
        holds(r, step, partial_sums(r, step)) for r in range(1, size) for step in steps
    )
    own = all(holds(0, step, [local.ranks[0].losses[step]]) for step in steps)
    # A result every rank holds alike (a sum, say) is not a reduce onto rank 0.
    apart = any(
        not holds(r, step, [got.ranks[0].losses[step]]) for r in range(1, size) for step in steps
    )
    return others_partial and apart and not own


def low_rank_cause(
    kind: Kind, reference: Trace, got: Trace, *, fmt: str | None = None
) -> Cause | None:
    """A kind that may compress whose gradient of some weight matrix at some step has a lower
    rank than the full-batch gradient's: a low-rank approximation, PowerSGD's design below
    full rank. Named with the matrix, both ranks and the relative error. Where the hook
    compresses to a 16-bit ``fmt``, a matrix whose gradient lies below that format's normal
    range (its smallest normal number times the world size: the hook sums that many
    compressed parts) is left out: there rounding itself flushes values to zero and drops
    rank (float16's underflow of a gradient near 1e-6).

    Example::

        low_rank_cause("comm-hook", reference, got).pattern  # 'lowrank'
    """
    if not kind.lossy or not reference.ranks[0].grads or not got.ranks[0].grads:
        return None
    steps = zip(reference.ranks[0].grads, got.ranks[0].grads, strict=False)
    for step, (expected, mine) in enumerate(steps):
        for name, truth in expected.items():
            value = mine.get(name)
            if truth is None or value is None or truth.dim() < 2 or min(truth.shape) < 2:
                continue
            if fmt is not None and float(truth.abs().max()) < _normal_floor(fmt, got):
                continue
            full, lowered = _rank(truth), _rank(value)
            if lowered < full:
                truth, value = truth.double(), value.double()
                error = float((value - truth).norm() / truth.norm())
                what = (
                    f"the gradient of {name!r} {tuple(truth.shape)} at step {step} has rank "
                    f"{lowered} where the full-batch gradient's has rank {full} (relative "
                    f"error {error:.3g})"
                )
                return f.LOW_RANK.cause(what=what, lossy=option("lossy", "lowrank"))
    return None


def _normal_floor(fmt: str, got: Trace) -> float:
    """Below this, a gradient summed from the world's ``fmt``-compressed parts may underflow."""
    return float(torch.finfo(getattr(torch, fmt)).tiny) * len(got.ranks)


def _rank(matrix: torch.Tensor) -> int:
    """The numerical rank: singular values above float32's roundoff of the largest (a
    low-rank product P Q^T computed in float64 or float32 leaves the rest at rounding)."""
    values = torch.linalg.svdvals(matrix.double().reshape(matrix.shape[0], -1))
    if not values.numel() or float(values[0]) == 0.0:
        return 0
    return int((values > values[0] * 1e-6).sum())


def lossy_compression(kind: Kind, scenario: Scenario, reference: Trace, got: Trace) -> Cause | None:
    """A kind that may compress (a comm hook) whose every value is within a compression
    format's rounding bound (the bound is derived for SGD only): it compresses, which may be
    its design."""
    if not kind.lossy or scenario.optimizer.name != "sgd":
        return None
    for fmt, flag in (("float16", "fp16"), ("bfloat16", "bf16")):
        if low_rank_cause(kind, reference, got, fmt=fmt) is not None:
            # A gradient that lost rank where this format's rounding cannot flush it is a
            # low-rank approximation, however loose the format's bound (PowerSGD at rank 1
            # fits bfloat16's): never called rounding.
            continue
        with one_thread():
            tolerance = CompressionTolerance(scenario, fmt)
        if compare(reference, got, scenario, tolerance) is None:
            return f.LOSSY.cause(fmt=fmt, bound=tolerance.describe(), lossy=option("lossy", flag))
    return None


def known_issue_cause(scenario: Scenario, error: RankError) -> Cause | None:
    """A torch issue the conformance suite knows, when the failure is its signature on a
    scenario that reaches it (PowerSGD with a parameter forward never uses); the option that
    avoids it is in the words.

    Example::

        known_issue_cause(scenario, error).pattern  # 'torch:powersgd-unused'
    """
    if scenario.model.unused and re.search(f.POWERSGD_UNUSED_SIGNATURE, failure_text(error)):
        exclude = option("excluded_features", "unused")
        return f.TORCH_POWERSGD_UNUSED.cause(exclude=exclude)
    return None


# The drawn model feature that reaches each known torch issue: the search leaves it out once
# met (see usercode.search).
_REACHED_BY = {f.TORCH_POWERSGD_UNUSED.code: "unused"}


def known_torch_issue(scenario: Scenario, error: RankError) -> tuple[Cause, str] | None:
    """:func:`known_issue_cause`, with the model feature of ``scenario`` that reaches it (a
    field of :class:`~ddp_verify.engine.scenario.ModelSpec`), where leaving that feature out
    avoids it; None otherwise.

    Example::

        cause, feature = known_torch_issue(scenario, error)  # (..., 'unused')
    """
    cause = known_issue_cause(scenario, error)
    feature = _REACHED_BY.get(cause.pattern) if cause is not None else None
    if cause is None or feature is None:
        return None
    return cause, feature


def failure_cause(kind: Kind, scenario: Scenario) -> Cause | None:
    """Why a step function hung, crashed in a collective or computed nonsense, when the
    scenario itself says: its ranks held different numbers of micro-batches, so code that
    calls collectives per micro-batch pairs them up wrongly or leaves ranks waiting.

    Example::

        failure_cause("step", scenario).text
        # 'collectives called once per micro-batch (...), and in step 0 the ranks held ...'
    """
    if not kind.owns_micro_batches:
        return None  # the harness owns the micro-batch loop of every other kind
    for step, per_rank in enumerate(scenario.schedule):
        counts = [len(sizes) for sizes in per_rank]
        if len(set(counts)) > 1:
            return f.COLLECTIVES_PER_MICRO_BATCH.cause(
                step=step,
                held=", ".join(f"rank {r}: {c}" for r, c in enumerate(counts)),
                same_counts=option("same_micro_batch_counts", True),
            )
    return None


def only_rank_zero_synchronised(scenario: Scenario, reference: Trace, got: Trace) -> bool:
    """Rank 0 took a combined step (weighted or not), while every other rank differs from it
    on every trained parameter."""
    trained = _trained(reference)
    if len(got.ranks) < 2 or not trained:
        return False
    first = got.ranks[0].params[0]
    for rank in got.ranks[1:]:
        if any(torch.allclose(rank.params[0][n], first[n], rtol=1e-5, atol=1e-7) for n in trained):
            return False
    combined = [
        reference.ranks[0].params[0],
        simulate(scenario, Mistake("world")).ranks[0].params[0],
    ]
    # As close as the dtype lets a run come to a float64 simulation (bfloat16: far from 1e-4).
    match = match_tolerance(scenario.dtype)
    rtol, atol = max(1e-4, match.rtol), max(1e-6, match.atol)
    return any(
        all(
            torch.allclose(first[n], step[n].to(first[n].dtype), rtol=rtol, atol=atol)
            for n in trained
        )
        for step in combined
    )


def _trained(reference: Trace) -> list[str]:
    """Parameters with a nonzero gradient at step 0: others may agree by standing still."""
    if not reference.ranks[0].grads:
        return []
    return [n for n, g in reference.ranks[0].grads[0].items() if g is not None and bool(g.any())]


def partly_synchronised(reference: Trace, got: Trace) -> list[str]:
    """Trained parameters the ranks disagree on after step 0, when they agree on others."""
    if len(got.ranks) < 2 or not reference.ranks[0].grads:
        return []
    trained = _trained(reference)
    first = got.ranks[0].params[0]
    disagree = [
        name
        for name in trained
        if any(
            not torch.allclose(r.params[0][name], first[name], rtol=1e-5, atol=1e-7)
            for r in got.ranks[1:]
        )
    ]
    return disagree if 0 < len(disagree) < len(trained) else []
