"""Why a run diverged: every likely cause, most important first, each with its evidence.

First what the ranks' parameters show at a glance (rank 0 alone combined, some parameters not
synchronised, compression rounding, a result held by rank 0 only, BatchNorm's per-batch
statistics). Then the gradients and the reported loss are explained separately, by the weights
each sample (or token) effectively carried (:mod:`ddp_verify.usercode.weights`), so a mistake
in one never hides the other. What is not linear (the optimizer stepped per micro-batch, say)
is recognised by simulating the known mistakes (:mod:`ddp_verify.usercode.mistakes`) and
finding the one that reproduces the run. "No known mistake" is kept for what fits nothing,
and then the fitted weights are shown anyway.
"""

from __future__ import annotations

import dataclasses
import os
import re

import torch

from ..engine.compare import compare, outside
from ..engine.compression import CompressionTolerance
from ..engine.models import one_thread, rank_items
from ..engine.scenario import Scenario
from ..engine.tolerances import Float64Tolerance, Tolerance, by_roundoff
from ..engine.trace import Trace
from ..world import RankError
from ..world.errors import failure_text
from ..world.naming import option
from . import findings as f
from .explain import gradient_causes, gradient_fits, loss_causes, loss_ratio, scaled_loss
from .findings import Cause
from .kinds import KIND
from .mistakes import Mistake, applies, candidates, simulate
from .weights import WeightFit, close_for, fit_gradient, observed_gradients, unit_of

__all__ = ["Cause", "failure_cause", "likely_cause", "likely_causes", "matches"]

# Loose on purpose: a simulated mistake need only be told apart from the other mistakes,
# which differ by far more; float32 and bfloat16 runs are matched against float64
# simulations, bfloat16's at about ten of its roundings (2^-8 each) per value. Other dtypes
# get theirs from the unit roundoff (engine.tolerances.by_roundoff).
_MATCH_RTOL = {"float64": 1e-5, "float32": 1e-3, "bfloat16": 4e-2}
_MATCH_ATOL = {"float64": 1e-7, "float32": 1e-5, "bfloat16": 4e-3}


def _match(dtype: str) -> Float64Tolerance:
    """How close a run must come to a simulated mistake's to be that mistake."""
    return Float64Tolerance(by_roundoff(dtype, _MATCH_RTOL), by_roundoff(dtype, _MATCH_ATOL))


# float16 compression rounds each contribution by 2^-11 of its size and the sum again per rank:
# a few parts in a thousand at these world sizes, far less than what tells mistakes apart.
_COMPRESSED_MATCH = Float64Tolerance(rtol=2e-2, atol=1e-4)

NO_KNOWN_MISTAKE = f.NO_KNOWN_MISTAKE


def likely_cause(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> str:
    """The first of :func:`likely_causes`, in words.

    Example::

        likely_cause("grad-sync", outcome.scenario, outcome.reference, outcome.got)
        # 'gradients averaged over ranks by the world size, not weighted by ...'
    """
    return likely_causes(kind, scenario, reference, got)[0].text


def likely_causes(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> list[Cause]:
    """Every cause found for ``got``'s divergence from ``reference``, most important first
    (what changes the model before what is only reported); never empty.

    Example::

        for cause in likely_causes("step", scenario, reference, got):
            print(cause.subject, cause.text, cause.evidence)
    """
    if os.environ.get("DDP_VERIFY_DIAGNOSIS", "old") == "new":
        from .diagnosis import likely_causes as by_hypotheses

        return by_hypotheses(kind, scenario, reference, got)
    structural = _structural(kind, scenario, reference, got)
    if any(c.pattern in (f.LOSSY.code, f.BATCH_NORM.code) for c in structural):
        return structural
    with one_thread():
        fits = []
        gradient: list[Cause] = []
        if not any(c.subject in ("gradient", "parameters") for c in structural):
            # A kind that may compress (a comm hook) is fitted more loosely.
            compressed = KIND[kind].lossy
            fits = gradient_fits(scenario, got, compressed=compressed)
            gradient = gradient_causes(scenario, fits, compressed=compressed)
        loss: list[Cause] = []
        if not any(c.subject == "loss" for c in structural):
            loss = loss_causes(scenario, reference, got)
        gradient = [_measured(c, fits, scenario, reference, got) for c in gradient]
        causes = (
            structural + gradient + _like_the_gradient(loss, gradient, scenario, reference, got)
        )
        open_questions = {finding.code for finding in f.OPEN_QUESTIONS}
        if not causes or any(c.pattern in open_questions for c in causes):
            causes = _with_simulated(kind, scenario, got, causes)
    causes = [c for c in causes if can_show(c.pattern, scenario)]
    if causes:
        return causes
    failed = failure_cause(kind, scenario)
    if failed:
        return [failed]
    shown = fits[0] if fits else _first_fit(scenario, got)
    read = "are the correct weighting of the samples" if shown else "could not be read"
    return [
        f.UNEXPLAINED.cause(
            evidence=shown.evidence() if shown else "",
            weights=shown.table() if shown else (),
            read=read,
        )
    ]


# Findings only a scenario with accumulation can show, and only one whose ranks hold
# different numbers of loss items at some step.
_NEEDS_MICRO_BATCHES = {
    f.MICRO_EQUAL.code,
    f.MICRO_LAST_ONLY.code,
    f.MICRO_DROPPED.code,
    f.MICRO_SAMPLES.code,
    f.MICRO_OTHER.code,
    f.STEP_EACH.code,
    f.LOSS_MICRO_EQUAL.code,
    f.LOSS_LAST_ONLY.code,
}
_NEEDS_UNEVEN_RANKS = {f.RANKS_WORLD.code, f.LOSS_WORLD.code, f.RANKS_EQUAL.code}


def can_show(pattern: str, scenario: Scenario) -> bool:
    """Whether ``scenario`` can show the finding ``pattern`` at all: a mistake in weighting
    micro-batches needs some rank to hold several, one in weighting ranks needs ranks with
    different numbers of loss items. A cause is never named where it cannot show.

    Example::

        >>> can_show("micro:equal", Scenario(world_size=2, schedule=(((1,), (2,)),)))
        False
    """
    if pattern in _NEEDS_MICRO_BATCHES:
        return scenario.accumulates
    if pattern in _NEEDS_UNEVEN_RANKS:
        return any(len(set(rank_items(scenario, s))) > 1 for s in range(scenario.steps))
    return True


def _first_fit(scenario: Scenario, got: Trace) -> WeightFit | None:
    """Rank 0's fit at step 0, to show the weights when nothing else explains the run."""
    observed = observed_gradients(scenario, got, 0)[0]
    if observed is None:
        return None
    with one_thread():
        return fit_gradient(scenario, observed, 0, rank=0)


def _with_simulated(kind: str, scenario: Scenario, got: Trace, causes: list[Cause]) -> list[Cause]:
    """``causes`` with what the fit could not say (a nonlinear gradient, an unexplained loss)
    replaced by the known mistake that reproduces the run, when one does."""
    tolerance = _match(scenario.dtype)
    unexplained_loss = any(c.pattern == f.LOSS_UNEXPLAINED.code for c in causes)
    simulated = []
    # Simplest first, and no further than the first that reproduces the run.
    for mistake in candidates(kind):
        if not applies(mistake, scenario):
            continue
        trace = simulate(scenario, mistake)
        if matches(trace, got, tolerance, losses=unexplained_loss):
            return _merge(causes, mistake, unexplained_loss, unit_of(scenario))
        simulated.append((mistake, trace))
    if KIND[kind].lossy:
        # A hook that compresses and also makes a mistake: the mistake, up to the
        # compression's rounding (float16: a few parts in a thousand).
        for mistake, trace in simulated:
            if matches(trace, got, _COMPRESSED_MATCH, losses=unexplained_loss):
                rounded = " (up to compression rounding: the hook also compresses)"
                return _merge(causes, mistake, unexplained_loss, unit_of(scenario), said=rounded)
    return causes


def _merge(
    causes: list[Cause], mistake: Mistake, with_loss: bool, unit: str, *, said: str = ""
) -> list[Cause]:
    """The mistake's gradient causes in place of a nonlinear fit (or none), its loss cause in
    place of an unexplained loss; what the fits found stands. The mistake's causes are the
    same findings the fits make, with the simulation as their evidence (and ``said`` after
    their words)."""
    evidence = f"simulating {mistake} reproduces every rank's parameters" + (
        " and losses" if with_loss else ""
    )
    from_mistake = [
        dataclasses.replace(c, text=c.text + said)
        for c in mistake.causes(unit=unit, evidence=evidence)
        if c.subject == "gradient" or with_loss
    ]
    open_questions = {finding.code for finding in f.OPEN_QUESTIONS}
    kept = [c for c in causes if c.pattern not in open_questions]
    fitted_gradient = any(c.subject == "gradient" for c in kept)
    if fitted_gradient:
        from_mistake = [c for c in from_mistake if c.subject != "gradient"]
    gradients = [c for c in kept if c.subject in ("gradient", "parameters")]
    rest = [c for c in kept if c not in gradients]
    return (
        gradients
        + [c for c in from_mistake if c.subject == "gradient"]
        + rest
        + [c for c in from_mistake if c.subject != "gradient"]
    )


def _measured(
    cause: Cause, fits: list[WeightFit], scenario: Scenario, reference: Trace, got: Trace
) -> Cause:
    """A gradient no weighting explains, described by what was measured at the fitted step:
    a factor per parameter, or how far from proportional to the full-batch gradient it is."""
    if cause.pattern != f.NONLINEAR.code or not fits or not reference.ranks[0].grads:
        return cause
    step = fits[0].step
    rank = max(fits, key=lambda fit: fit.residual).rank
    expected = reference.ranks[0].grads[step]
    # As the fit read it: .grad, or for a step function the first SGD update's.
    observed = observed_gradients(scenario, got, step)[rank] or {}
    pairs = []
    for name, truth in expected.items():
        value = observed.get(name)
        if truth is not None and value is not None and float(truth.norm()) > 0:
            pairs.append((name, truth.double().flatten(), value.double().flatten()))
    if not pairs:
        return cause
    scales, proportional = [], True
    for name, truth, value in pairs:
        factor = float(value @ truth / (truth @ truth))
        proportional &= float((value - factor * truth).norm()) <= 1e-6 * float(value.norm() + 1)
        scales.append(f"{name!r} x{factor:.4g}")
    if proportional:
        measured = f.PER_PARAMETER_SCALE.format(scales=", ".join(scales))
    else:
        truth = torch.cat([t for _, t, _ in pairs])
        value = torch.cat([v for _, _, v in pairs])
        cosine = float(value @ truth / (value.norm() * truth.norm() + 1e-300))
        measured = f.NOT_PROPORTIONAL.format(
            cosine=cosine, ratio=float(value.norm() / truth.norm())
        )
    return dataclasses.replace(cause, text=f.NONLINEAR.says(measured=measured))


def _like_the_gradient(
    loss: list[Cause], gradient: list[Cause], scenario: Scenario, reference: Trace, got: Trace
) -> list[Cause]:
    """A reported loss scaled by the gradient's own factor is said to be so (the loss that
    was backpropagated, scaled, is what was reported), on one step as on several."""
    scales = [
        row["weight"] / row["expected"]
        for c in gradient
        if c.pattern == f.SCALE.code and c.weights
        for row in c.weights[:1]
    ]
    factor = loss_ratio(scenario, reference, got, 0)
    close = close_for(scenario.dtype)
    if factor is None or not any(abs(k - factor) <= close * abs(k) for k in scales):
        return loss
    scaled = scaled_loss(reference, got, 0, factor, why=f.LOSS_SCALED_LIKE_GRADIENT)
    unsaid = (f.LOSS_SCALED.code, f.LOSS_UNEXPLAINED.code)
    return [scaled] + [c for c in loss if c.pattern not in unsaid]


def _structural(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> list[Cause]:
    """What the ranks' parameters or losses show at a glance."""
    if scenario.model.batch_norm == "batch":
        return [f.BATCH_NORM.cause()]
    found = []
    if _only_rank_zero_synchronised(scenario, reference, got):
        found.append(f.RANKS_REDUCE_TO_0.cause())
    partial = _partly_synchronised(reference, got)
    if partial:
        found.append(f.PARTIAL_SYNC.cause(names=", ".join(repr(n) for n in partial)))
    low_rank = low_rank_cause(kind, reference, got)
    if low_rank is not None:
        return [low_rank]
    lossy = _lossy_compression(kind, scenario, reference, got)
    if lossy is not None:
        return [lossy]
    if KIND[kind].result_on_rank0 and _held_by_rank_zero_only(scenario, got):
        found.append(f.LOSS_RANK0_ONLY.cause(result_on=option("result_on", "rank0")))
    return found


def _held_by_rank_zero_only(scenario: Scenario, got: Trace) -> bool:
    """Every rank but 0 holds what a reduce onto rank 0 leaves it, at every step (its own
    local loss, or the partial sum of its subtree: gloo's and nccl's reduce trees leave those
    on the inner ranks from 4 ranks on), and rank 0 does not hold its own."""
    size = scenario.world_size
    if size < 2:
        return False
    with one_thread():
        local = simulate(scenario, Mistake(report="local"))
    tolerance = _match(scenario.dtype)

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


def low_rank_cause(kind: str, reference: Trace, got: Trace) -> Cause | None:
    """A kind that may compress whose gradient of some weight matrix at some step has a lower
    rank than the full-batch gradient's: a low-rank approximation, PowerSGD's design below
    full rank. Named with the matrix, both ranks and the relative error.

    Example::

        low_rank_cause("comm-hook", reference, got).pattern  # 'lowrank'
    """
    if not KIND[kind].lossy or not reference.ranks[0].grads or not got.ranks[0].grads:
        return None
    steps = zip(reference.ranks[0].grads, got.ranks[0].grads, strict=False)
    for step, (expected, mine) in enumerate(steps):
        for name, truth in expected.items():
            value = mine.get(name)
            if truth is None or value is None or truth.dim() < 2 or min(truth.shape) < 2:
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


def _rank(matrix: torch.Tensor) -> int:
    """The numerical rank: singular values above float32's roundoff of the largest (a
    low-rank product P Q^T computed in float64 or float32 leaves the rest at rounding)."""
    values = torch.linalg.svdvals(matrix.double().reshape(matrix.shape[0], -1))
    if not values.numel() or float(values[0]) == 0.0:
        return 0
    return int((values > values[0] * 1e-6).sum())


def _lossy_compression(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> Cause | None:
    """A kind that may compress (a comm hook) whose every value is within a compression
    format's rounding bound (the bound is derived for SGD only): it compresses, which may be
    its design."""
    if not KIND[kind].lossy or scenario.optimizer.name != "sgd":
        return None
    for fmt, flag in (("float16", "fp16"), ("bfloat16", "bf16")):
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


def failure_cause(kind: str, scenario: Scenario) -> Cause | None:
    """Why a step function hung, crashed in a collective or computed nonsense, when the
    scenario itself says: its ranks held different numbers of micro-batches, so code that
    calls collectives per micro-batch pairs them up wrongly or leaves ranks waiting.

    Example::

        failure_cause("step", scenario).text
        # 'collectives called once per micro-batch (...), and in step 0 the ranks held ...'
    """
    if not KIND[kind].owns_micro_batches:
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


def matches(expected: Trace, got: Trace, tolerance: Tolerance, *, losses: bool = True) -> bool:
    """Every rank of ``got`` follows the same rank of ``expected`` at every step (its
    parameters and gradients; its losses too unless ``losses=False``)."""
    if len(expected.ranks) != len(got.ranks) or got.steps != expected.steps:
        return False
    for mine, theirs in zip(expected.ranks, got.ranks, strict=True):
        for step in range(expected.steps):
            pairs = []
            if losses:
                pairs.append(
                    ("loss", torch.tensor(mine.losses[step]), torch.tensor(theirs.losses[step]))
                )
            pairs += [
                ("parameter", v, theirs.params[step][n]) for n, v in mine.params[step].items()
            ]
            if theirs.grads is not None and mine.grads is not None:
                pairs += [
                    ("gradient", v, theirs.grads[step].get(n)) for n, v in mine.grads[step].items()
                ]
            for quantity, exp, value in pairs:
                if (exp is None) != (value is None):
                    return False
                if exp is None or value is None:
                    continue
                allowed = tolerance.allowed(quantity, step, "", exp)
                if value.shape != exp.shape or bool(outside(value, exp, allowed).any()):
                    return False
    return True


def _only_rank_zero_synchronised(scenario: Scenario, reference: Trace, got: Trace) -> bool:
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
    match = _match(scenario.dtype)
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


def _partly_synchronised(reference: Trace, got: Trace) -> list[str]:
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
