"""The ``coupled-loss`` kind's diagnosis: what a contrastive loss's data-parallel gradient
is, in the words of that kind, found by probed calls of the code itself.

The evidence: each rank's own call at step 0 (the loss it returns, and the gradient its
backward leaves on the rank before DDP averages, through whatever its collectives send
back), the same calls with the ranks' losses reweighted or all but one left out, and runs of
the code on a one-rank world that predict what it would train were its gradient to reach
only each rank's local features, no feature at all, or were its negatives the local batch's
only. Each is a registered pass (:data:`PASSES`) whose hypothesis predicts step 0's gradient
(or reads a probe's record), scored against float64's closeness; the first consistent one,
in the order they are registered (the plainest first), is the cause.

Example::

    causes = coupled_causes(world, method, scenario, reference, got)
    causes[0].pattern  # 'coupled:local-gradient'
"""

from __future__ import annotations

import dataclasses
import math
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
from .engine import Hypothesis

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
    probes = Probes(world, method, scenario, reference, got)
    if _misfit(probes.observed, probes.truth) <= 1:
        # Every probe reads step 0 from the initial parameters: nothing to read there.
        return [f.COUPLED_UNEXPLAINED.cause(why="step 0 trains right; a later step diverges")]
    # The passes in order, the plainest first: each predicts step 0's gradient from a probe
    # (or reads a probe's record) and is scored against float64's closeness; the first
    # consistent one is the cause. Later ones are not run: each costs probes on the world.
    for each in PASSES:
        found = each.look(probes)
        if found is not None and found.consistent:
            return list(found.causes)
    return [f.COUPLED_UNEXPLAINED.cause(why="the probes")]


class Probes:
    """What the coupled passes read: step 0's gradient of the reference and of the run
    (rank 0's), and the probes of the code on the world, each run once, when first asked."""

    def __init__(
        self, world: Ranked, method: CoupledLoss, scenario: Scenario, reference: Trace, got: Trace
    ) -> None:
        self.world, self.method, self.scenario = world, method, scenario
        self.truth = _zero_filled(reference.ranks[0].grads[0])  # type: ignore[index]
        self.observed = _zero_filled(got.ranks[0].grads[0], like=self.truth)  # type: ignore[index]
        self.world_size = scenario.world_size
        self.shipped = method.shipped()
        self._cache: dict[Any, Any] = {}

    def matched(self) -> list[tuple[int, int, int]]:
        """Each pair that was scored against another pair's view: (micro-batch, pair, with)."""
        if "matched" not in self._cache:
            on_ranks = self.world.run_job(
                matched_on_ranks, (self.shipped, self.scenario), name="a matched-pairs probe"
            )
            self._cache["matched"] = [(m, g, to) for r in on_ranks for m, g, to in r if g != to]
        return self._cache["matched"]

    def on_one_rank(self, variant: str) -> Gradients:
        """What the code trains on a one-rank world in ``variant``."""
        if variant not in self._cache:
            job = (self.shipped, self.scenario, variant)
            self._cache[variant] = self.world.solo.run_job(
                predicted_on_one_rank, job, name=f"a {variant} prediction"
            )[0]
        return self._cache[variant]

    def probed(self, weights: Sequence[Sequence[float]] | None = None) -> list[Probed]:
        """Each rank's call at step 0, its micro-batches' losses weighted by ``weights``."""
        given = None if weights is None else tuple(tuple(w) for w in weights)
        if ("probed", given) not in self._cache:
            job = (self.shipped, self.scenario, given)
            self._cache["probed", given] = list(
                self.world.run_job(probe_ranks, job, name="a probed call")
            )
        return self._cache["probed", given]

    def sizes(self) -> list[list[int]]:
        return [micro_sizes(self.scenario, m) for m in range(micro_batches(self.scenario))]


@dataclasses.dataclass(frozen=True)
class CoupledPass:
    """A named coupled pass: ``look(probes)`` returns its hypothesis (None where it does
    not apply); ``says``: the findings it may name (for the causes table)."""

    name: str
    look: Callable[[Probes], Hypothesis | None]
    says: tuple[str, ...]


PASSES: list[CoupledPass] = []


def register(name: str, *, says: tuple[str, ...]) -> Callable[..., CoupledPass]:
    """Register a coupled pass, tried after those registered before it."""

    def decorate(look: Callable[[Probes], Hypothesis | None]) -> CoupledPass:
        made = CoupledPass(name, look, says)
        PASSES.append(made)
        return made

    return decorate


def _hypothesis(cause: Cause, misfit: float, source: str) -> Hypothesis:
    covers = frozenset({"gradient"})
    return Hypothesis("gradient", covers, 1.0, misfit, causes=(cause,), source=source)


@register("scale", says=(f.COUPLED_SCALE.code,))
def _scale(probes: Probes) -> Hypothesis | None:
    """The reference's gradient times W or 1/W."""
    w = probes.world_size
    fits = [
        (_misfit(probes.observed, _scaled(probes.truth, factor)), reading)
        for factor, reading in ((1 / w, "1/W"), (float(w), "W"))
    ]
    misfit, reading = min(fits)
    return _hypothesis(_scale_cause(reading, w), misfit, "coupled scale")


@register("wrong-positives", says=(f.COUPLED_WRONG_POSITIVES.code,))
def _wrong_positives(probes: Probes) -> Hypothesis | None:
    """Pairs scored as positives against another pair's view, measured (a record, not a
    prediction: wrong whatever else the gradient shows)."""
    wrong = probes.matched()
    if not wrong:
        return None
    return _hypothesis(_wrong_positives_cause(probes.scenario, wrong), 0.0, "coupled positives")


@register("local-gradient", says=(f.COUPLED_LOCAL_GRADIENT.code,))
def _local_gradient(probes: Probes) -> Hypothesis | None:
    """The gradient reaches each rank's local features only."""
    misfit = _misfit(probes.observed, probes.on_one_rank("local-gradient"))
    cause = _local_gradient_cause(probes.truth, probes.observed, probes.world_size)
    return _hypothesis(cause, misfit, "coupled local gradient")


@register("local-negatives", says=(f.COUPLED_LOCAL_NEGATIVES.code,))
def _local_negatives(probes: Probes) -> Hypothesis | None:
    """Negatives from the local batch only (before no gradient at all: one pair alone has a
    loss without one)."""
    if not all(all(each) for each in probes.sizes()):
        return None
    misfit = _misfit(probes.observed, probes.on_one_rank("alone"))
    cause = f.COUPLED_LOCAL_NEGATIVES.cause(evidence=_factors(probes.truth, probes.observed))
    return _hypothesis(cause, misfit, "coupled local negatives")


@register("no-feature-gradient", says=(f.COUPLED_NO_FEATURE_GRADIENT.code,))
def _no_feature_gradient(probes: Probes) -> Hypothesis | None:
    """No gradient through any gathered feature."""
    misfit = _misfit(probes.observed, probes.on_one_rank("detached"))
    cause = f.COUPLED_NO_FEATURE_GRADIENT.cause(evidence=_factors(probes.truth, probes.observed))
    return _hypothesis(cause, misfit, "coupled detached")


@register("ranks-equal", says=(f.COUPLED_RANKS_EQUAL.code,))
def _ranks_equal(probes: Probes) -> Hypothesis | None:
    """Each rank's loss weighted equally where ranks hold different numbers of pairs:
    predicted by reweighting each rank's micro-batch losses by its pairs x W / N."""
    w, sizes = probes.world_size, probes.sizes()
    if not any(len(set(each)) > 1 for each in sizes):
        return None
    by_pairs = [[each[r] * w / (sum(each) or 1) for each in sizes] for r in range(w)]
    misfit = _misfit(_average(probes.probed(by_pairs)), probes.truth)
    plain = probes.probed()
    numbers = "; ".join(
        f"rank {r}: {n} pair{'s' * (n != 1)}, loss {p.loss:.6g}"
        for r, (n, p) in enumerate(zip(probes.scenario.samples(0), plain, strict=True))
    )
    cause = f.COUPLED_RANKS_EQUAL.cause(
        evidence=f"weighting each rank's loss by its pairs x W / N makes the run the "
        f"reference's ({numbers})",
        share=f"1/{w}",
    )
    return _hypothesis(cause, misfit, "coupled ranks equal")


@register(
    "constant-features", says=(f.COUPLED_CONSTANT_FEATURES.code, f.COUPLED_CONSTANT_TOWER.code)
)
def _constant_features(probes: Probes) -> Hypothesis | None:
    """Each rank's gradient (per tower) the same whether or not the other ranks' losses are
    backpropagated: features that cross ranks without their gradient."""
    w, count = probes.world_size, len(probes.sizes())
    plain = probes.probed()
    alone = [probes.probed([[float(r == s)] * count for s in range(w)])[r] for r in range(w)]
    towers = sorted({n.split(".")[0] for n in probes.truth if n.startswith("tower_")})
    misfits = {
        t: max(_misfit(_of(a.grads, t), _of(p.grads, t)) for a, p in zip(alone, plain, strict=True))
        for t in towers
    }
    constant = [t for t in towers if misfits[t] <= 1]
    factors = _factors(probes.truth, probes.observed)
    if constant == towers:
        cause = f.COUPLED_CONSTANT_FEATURES.cause(
            evidence="each rank's gradient is the same whether or not the other ranks' "
            "losses are backpropagated: " + factors
        )
        return _hypothesis(cause, max(misfits.values(), default=0.0), "coupled constant")
    if len(constant) == 1 and len(towers) == 2:
        # One tower's features cross ranks with their gradient, the other's do not.
        (tower,) = constant
        (other,) = set(towers) - {tower}
        cause = f.COUPLED_CONSTANT_TOWER.cause(
            tower=tower,
            other=other,
            evidence=f"each rank's {tower} gradient is the same whether or not the other "
            f"ranks' losses are backpropagated, its {other} gradient is not: " + factors,
        )
        return _hypothesis(cause, misfits[tower], "coupled constant tower")
    return None


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


def _misfit(a: Gradients, b: Gradients) -> float:
    """How far ``a`` is from ``b``, relative to the larger norm, in units of float64's
    closeness (at most 1: the same run); infinite where they cannot be compared."""
    x, y = _flat(a), _flat(b)
    if x.shape != y.shape or not bool(torch.isfinite(x).all() and torch.isfinite(y).all()):
        return math.inf
    scale = max(float(y.norm()), float(x.norm()), 1e-12)
    return float((x - y).norm()) / (CLOSE * scale)


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
