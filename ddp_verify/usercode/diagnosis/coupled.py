"""The ``coupled-loss`` kind's diagnosis: what a contrastive loss's data-parallel gradient
is, in the words of that kind, found by probed calls of the code itself.

The evidence: each rank's own call at step 0 (the loss it returns, and the gradient its
backward leaves on the rank before DDP averages, through whatever its collectives send
back), the same calls with the ranks' losses reweighted or all but one left out, and runs of
the code on a one-rank world that predict what it would train were its gradient to reach
only each rank's local features, no feature at all, or were its negatives the local batch's
only. Each hypothesis is a prediction of step 0's gradient, held to float64's tolerance; the
first that fits, in the order below (the plainest first), is the cause.

Example::

    causes = coupled_causes(world, method, scenario, reference, got)
    causes[0].pattern  # 'coupled:local-gradient'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...engine.coupled import LEARNED
from ...engine.scenario import Scenario
from ...engine.trace import Trace
from ...methods.equivalence import check_equivalent
from ...world import RankError
from ...world.interface import Ranked
from .. import findings as f
from ..coupled import (
    CoupledLoss,
    Gradients,
    Probed,
    check_feature_count,
    learned_parameters,
    matched_on_ranks,
    micro_batches,
    micro_sizes,
    predicted_on_one_rank,
    probe_ranks,
)
from ..findings import Cause
from ..kinds import Call

__all__ = ["coupled_bounds", "coupled_causes", "uneven_cause"]

# How close a prediction must come to the run, relative to the gradient's norm: float64's
# rounding, loosely (the runs differ in summation order only).
CLOSE = 1e-6


def coupled_causes(
    world: Ranked, method: CoupledLoss, scenario: Scenario, reference: Trace, got: Trace
) -> list[Cause]:
    """Every cause of ``got``'s divergence from ``reference`` that the probes show, the
    first the one that explains it; never empty."""
    if scenario.dtype != "float64":
        # The probes read float64 gradients to float64's closeness: the same counterexample
        # in float64 says what the code does, where rounding cannot blur it.
        exact = dataclasses.replace(scenario, dtype="float64")
        outcome = check_equivalent(world, method, exact)
        if outcome.equivalent:
            why = (
                f"it trains right in float64; only its {scenario.dtype} run lands further "
                "from the reference than your code's own run on one rank measured"
            )
            return [f.COUPLED_UNEXPLAINED.cause(why=why)]
        causes = coupled_causes(world, method, exact, outcome.reference, outcome.got)
        return [dataclasses.replace(c, scenario=c.scenario or repr(exact)) for c in causes]
    truth = _zero_filled(reference.ranks[0].grads[0])  # type: ignore[index]
    observed = _zero_filled(got.ranks[0].grads[0], like=truth)  # type: ignore[index]
    world_size = scenario.world_size
    if _close(observed, truth):
        # Every probe reads step 0 from the initial parameters: nothing to read there.
        return [f.COUPLED_UNEXPLAINED.cause(why="step 0 trains right; a later step diverges")]
    for factor, reading in ((1 / world_size, "1/W"), (float(world_size), "W")):
        if _close(observed, _scaled(truth, factor)):
            return [_scale_cause(reading, world_size)]
    shipped = method.shipped()
    # Which pairs were scored as positives, measured: a wrong positive is wrong whatever
    # else the gradient shows.
    matched = world.run_job(matched_on_ranks, (shipped, scenario), name="a matched-pairs probe")
    wrong = [(m, g, to) for on_rank in matched for m, g, to in on_rank if g != to]
    if wrong:
        return [_wrong_positives_cause(scenario, wrong)]

    def on_one_rank(variant: str) -> Gradients:
        job = (shipped, scenario, variant)
        return world.solo.run_job(predicted_on_one_rank, job, name=f"a {variant} prediction")[0]

    if _close(observed, on_one_rank("local-gradient")):
        return [_local_gradient_cause(truth, observed, world_size)]
    pairs = scenario.samples(0)
    count = micro_batches(scenario)
    sizes = [micro_sizes(scenario, m) for m in range(count)]
    # Local negatives before no gradient at all: one pair alone has a loss without one.
    if all(all(each) for each in sizes) and _close(observed, on_one_rank("alone")):
        return [f.COUPLED_LOCAL_NEGATIVES.cause(evidence=_factors(truth, observed))]
    if _close(observed, on_one_rank("detached")):
        return [f.COUPLED_NO_FEATURE_GRADIENT.cause(evidence=_factors(truth, observed))]

    def probed(weights: Sequence[Sequence[float]] | None = None) -> list[Probed]:
        given = None if weights is None else tuple(tuple(w) for w in weights)
        job = (shipped, scenario, given)
        return list(world.run_job(probe_ranks, job, name="a probed call"))

    plain = probed()
    # Each rank's loss on each micro-batch weighted by its pairs x W / the micro-batch's.
    by_pairs = [
        [each[r] * world_size / (sum(each) or 1) for each in sizes] for r in range(world_size)
    ]
    uneven = any(len(set(each)) > 1 for each in sizes)
    if uneven and _close(_average(probed(by_pairs)), truth):
        numbers = "; ".join(
            f"rank {r}: {n} pair{'s' * (n != 1)}, loss {p.loss:.6g}"
            for r, (n, p) in enumerate(zip(pairs, plain, strict=True))
        )
        return [
            f.COUPLED_RANKS_EQUAL.cause(
                evidence=f"weighting each rank's loss by its pairs x W / N makes the run the "
                f"reference's ({numbers})",
                share=f"1/{world_size}",
            )
        ]
    alone = [
        probed([[float(r == s)] * count for s in range(world_size)])[r] for r in range(world_size)
    ]
    # Per tower: whether each rank's gradient is the same without the other ranks' losses.
    towers = sorted({n.split(".")[0] for n in truth if n.startswith("tower_")})
    constant = [
        t
        for t in towers
        if all(_close(_of(a.grads, t), _of(p.grads, t)) for a, p in zip(alone, plain, strict=True))
    ]
    if constant == towers:
        return [
            f.COUPLED_CONSTANT_FEATURES.cause(
                evidence="each rank's gradient is the same whether or not the other ranks' "
                "losses are backpropagated: " + _factors(truth, observed)
            )
        ]
    if constant:
        # One tower's features cross ranks with their gradient, the other's do not.
        (tower,) = constant
        (other,) = set(towers) - {tower}
        return [
            f.COUPLED_CONSTANT_TOWER.cause(
                tower=tower,
                other=other,
                evidence=f"each rank's {tower} gradient is the same whether or not the other "
                f"ranks' losses are backpropagated, its {other} gradient is not: "
                + _factors(truth, observed),
            )
        ]
    return [f.COUPLED_UNEXPLAINED.cause(why="the probes")]


def _of(grads: Gradients, tower: str) -> Gradients:
    """The gradients of one tower's parameters."""
    return {n: g for n, g in grads.items() if n.split(".")[0] == tower}


def coupled_bounds(fn: Callable[..., Any], call: Call, bounds: dict[str, Any]) -> dict[str, Any]:
    """``bounds`` for ``fn``'s scenarios: the learned parameters it asks for by name, and a
    :class:`~ddp_verify.usercode.kinds.KindError` before any world starts where it takes
    another number of feature tensors than the bounds' negatives give it."""
    check_feature_count(call, bounds.get("negatives", 0))
    return {**bounds, "learned": learned_parameters(fn)}


def uneven_cause(scenario: Scenario, error: RankError) -> Cause | None:
    """What a crash on ranks holding different numbers of pairs says: a gather of unequal
    sizes (gloo aborts the process, SIGABRT, or raises on the size it received), or labels
    out of range; None where the ranks held as many pairs."""
    sizes = [scenario.samples(step) for step in range(scenario.steps)]
    if all(len(set(step)) == 1 for step in sizes):
        return None
    said = str(error)
    if "size" in said.lower() and ("match" in said.lower() or "gloo" in said.lower()):
        what = (
            "a gather or exchange of tensors of unequal sizes failed (gloo checks every size "
            "it receives)"
        )
    elif "SIGABRT" in said or "abort" in said.lower():
        what = (
            "a rank was aborted (SIGABRT) in a collective: gloo aborts a process that receives "
            "a tensor of another size than it expected"
        )
    elif "out of bounds" in said or "IndexError" in said:
        what = (
            "a label fell outside the gathered batch: positives offset by rank x local batch "
            "assume every rank holds as many pairs"
        )
    else:
        what = "it failed where they differ"
    pairs = ", ".join(f"rank {r} {n} pair{'s' * (n != 1)}" for r, n in enumerate(sizes[0]))
    return f.COUPLED_UNEVEN.cause(sizes=pairs, what=what)


def _wrong_positives_cause(scenario: Scenario, wrong: Sequence[tuple[int, int, int]]) -> Cause:
    """Which pairs were matched with which, each named by its rank and place there (and its
    micro-batch, where ranks hold several)."""
    several = micro_batches(scenario) > 1

    def named(m: int, g: int) -> str:
        sizes = micro_sizes(scenario, m)
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
        rank = max(r for r, start in enumerate(starts) if start <= g and sizes[r])
        where = f"micro-batch {m}'s " if several else ""
        return f"{where}pair {g} (rank {rank}'s pair {g - starts[rank]})"

    matched = "; ".join(
        f"{named(m, g)} with " + (f"pair {to}" if to >= 0 else "no pair's view (a padding row?)")
        for m, g, to in wrong[:4]
    )
    more = f"; {len(wrong) - 4} more" if len(wrong) > 4 else ""
    return f.COUPLED_WRONG_POSITIVES.cause(
        matched=matched + more,
        evidence="given one-hot features (each pair's views alike, every other pair unlike "
        "them), the gradient on each listed pair's first view pulls it toward the other pair",
    )


def _scale_cause(reading: str, world_size: int) -> Cause:
    why = f.COUPLED_TIMES_WORLD if reading == "W" else f.COUPLED_OVER_WORLD
    cause = f.COUPLED_SCALE.cause(factor=reading.replace("W", str(world_size)), why=why)
    return Cause(cause.text, cause.subject, cause.pattern, reading=f"coupled:scale:{reading}")


def _local_gradient_cause(truth: Gradients, observed: Gradients, world_size: int) -> Cause:
    towers = _factor(truth, observed, lambda name: name not in LEARNED)
    learned = [n for n in LEARNED if truth.get(n) is not None]
    said = ""
    if learned:
        factor = _factor(truth, observed, lambda name: name in LEARNED)
        said = f", {' and '.join(learned)} {_times(factor)} of theirs"
    return f.COUPLED_LOCAL_GRADIENT.cause(
        towers=_times(towers), learned=said, evidence=_factors(truth, observed)
    )


def _times(factor: float) -> str:
    """A factor as the words say it: ``1/2``, ``all``, ``0.3``."""
    if abs(factor - 1) < 1e-6:
        return "all"
    if factor > 0 and abs(1 / factor - round(1 / factor)) < 1e-6:
        return f"1/{round(1 / factor)}"
    return f"{factor:.4g}x"


def _factors(truth: Gradients, observed: Gradients) -> str:
    """Each parameter's gradient as a factor of the reference's, where one fits."""
    parts = [
        f"{name} {_factor(truth, observed, _named(name)):.4g}x"
        for name, value in truth.items()
        if value is not None
    ]
    return "the gradient of each parameter against the reference's: " + ", ".join(parts)


def _named(name: str) -> Callable[[str], bool]:
    return lambda other: other == name


def _factor(truth: Gradients, observed: Gradients, which: Callable[[str], bool]) -> float:
    ref = _flat(truth, which)
    got = _flat(observed, which)
    norm = float(ref @ ref)
    return float(ref @ got) / norm if norm else 0.0


def _flat(grads: Gradients, which: Callable[[str], bool] = lambda name: True) -> torch.Tensor:
    parts = [
        (g if g is not None else torch.zeros(0)).detach().to("cpu", torch.float64).reshape(-1)
        for name, g in sorted(grads.items())
        if which(name)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _close(a: Gradients, b: Gradients) -> bool:
    x, y = _flat(a), _flat(b)
    if x.shape != y.shape or not bool(torch.isfinite(x).all() and torch.isfinite(y).all()):
        return False
    scale = max(float(y.norm()), float(x.norm()), 1e-12)
    return float((x - y).norm()) <= CLOSE * scale


def _zero_filled(grads: Gradients, like: Gradients | None = None) -> Gradients:
    """``grads`` with a zero where no gradient reached a parameter (``like`` gives shapes)."""
    like = like or {}
    return {
        n: g if g is not None else (None if like.get(n) is None else torch.zeros_like(like[n]))
        for n, g in {**dict.fromkeys(like), **grads}.items()
    }


def _scaled(grads: Gradients, factor: float) -> Gradients:
    return {n: None if g is None else g * factor for n, g in grads.items()}


def _average(probes: Sequence[Probed]) -> Gradients:
    """DDP's average of the ranks' gradients."""
    names = probes[0].grads
    return {
        n: None if probes[0].grads[n] is None else sum(p.grads[n] for p in probes) / len(probes)  # type: ignore[misc]
        for n in names
    }
