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

import torch

from ..engine.compare import compare, outside
from ..engine.compression import CompressionTolerance
from ..engine.models import one_thread
from ..engine.scenario import Scenario
from ..engine.tolerances import Float64Tolerance, Tolerance
from ..engine.trace import Trace
from ..world.naming import option
from .kinds import RESULT_KINDS
from .mistakes import Mistake, applies, candidates, simulate
from .weights import (
    Cause,
    WeightFit,
    fit_gradient,
    gradient_causes,
    gradient_fits,
    loss_causes,
    observed_gradients,
)

__all__ = ["Cause", "failure_cause", "likely_cause", "likely_causes", "matches"]

# Loose on purpose: a simulated mistake need only be told apart from the other mistakes,
# which differ by far more; float32 and bfloat16 runs are matched against float64
# simulations, bfloat16's at about ten of its roundings (2^-8 each) per value.
_MATCH = {
    "float64": Float64Tolerance(rtol=1e-5, atol=1e-7),
    "float32": Float64Tolerance(1e-3, 1e-5),
    "bfloat16": Float64Tolerance(4e-2, 4e-3),
}


# float16 compression rounds each contribution by 2^-11 of its size and the sum again per rank:
# a few parts in a thousand at these world sizes, far less than what tells mistakes apart.
_COMPRESSED_MATCH = Float64Tolerance(rtol=2e-2, atol=1e-4)

NO_KNOWN_MISTAKE = "no known mistake reproduces this divergence"


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
    structural = _structural(kind, scenario, reference, got)
    if any(c.pattern in ("lossy", "batch-norm") for c in structural):
        return structural
    with one_thread():
        fits = []
        gradient: list[Cause] = []
        if not any(c.subject in ("gradient", "parameters") for c in structural):
            compressed = kind == "comm-hook"
            fits = gradient_fits(scenario, got, compressed=compressed)
            gradient = gradient_causes(scenario, fits, compressed=compressed)
        loss: list[Cause] = []
        if not any(c.subject == "loss" for c in structural):
            loss = loss_causes(scenario, reference, got)
        causes = structural + gradient + loss
        open_questions = {"nonlinear", "loss:unexplained"}
        if not causes or any(c.pattern in open_questions for c in causes):
            causes = _with_simulated(kind, scenario, got, causes)
    if causes:
        return causes
    failed = failure_cause(kind, scenario)
    if failed:
        return [Cause(failed, "run", "collectives-per-micro-batch")]
    shown = fits[0] if fits else _first_fit(scenario, got)
    return [
        Cause(
            f"{NO_KNOWN_MISTAKE}: the gradients each rank ended with"
            + (" are the correct weighting of the samples" if shown else " could not be read")
            + " and the reported loss is the global mean, so the difference lies elsewhere "
            "(the optimizer, the parameters' update); see the first divergence above",
            "run",
            "unexplained",
            shown.evidence() if shown else "",
            shown.table() if shown else (),
        )
    ]


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
    tolerance = _MATCH[scenario.dtype]
    unexplained_loss = any(c.pattern == "loss:unexplained" for c in causes)
    simulated = []
    # Simplest first, and no further than the first that reproduces the run.
    for mistake in candidates(kind):
        if not applies(mistake, scenario):
            continue
        trace = simulate(scenario, mistake)
        if matches(trace, got, tolerance, losses=unexplained_loss):
            return _merge(causes, mistake, unexplained_loss)
        simulated.append((mistake, trace))
    if kind == "comm-hook":
        # A hook that compresses and also makes a mistake: the mistake, up to the
        # compression's rounding (float16: a few parts in a thousand).
        for mistake, trace in simulated:
            if matches(trace, got, _COMPRESSED_MATCH, losses=unexplained_loss):
                merged = _merge(causes, mistake, unexplained_loss)
                return [
                    dataclasses.replace(
                        c, text=c.text + " (up to compression rounding: the hook also compresses)"
                    )
                    if c.pattern.startswith("simulated")
                    else c
                    for c in merged
                ]
    return causes


def _merge(causes: list[Cause], mistake: Mistake, with_loss: bool) -> list[Cause]:
    """The mistake's gradient causes in place of a nonlinear fit (or none), its loss cause in
    place of an unexplained loss; what the fits found stands."""
    evidence = f"simulating {mistake} reproduces every rank's parameters" + (
        " and losses" if with_loss else ""
    )
    from_mistake = [
        Cause(text, subject, f"simulated:{subject}", evidence)
        for subject, text in mistake.parts()
        if subject == "gradient" or with_loss
    ]
    kept = [c for c in causes if c.pattern not in ("nonlinear", "loss:unexplained")]
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


def _structural(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> list[Cause]:
    """What the ranks' parameters or losses show at a glance."""
    found = []
    if scenario.model.batch_norm == "batch":
        found.append(
            Cause(
                "BatchNorm normalises each forward by its own batch's statistics: data-parallel "
                "training normalises each rank's micro-batch by its own, full-batch training "
                "the whole global batch (documented DDP behaviour; use SyncBatchNorm with one "
                "micro-batch per rank for global statistics)",
                "run",
                "batch-norm",
            )
        )
        return found
    if _only_rank_zero_synchronised(scenario, reference, got):
        found.append(
            Cause(
                "gradients reduced onto rank 0 only (dist.reduce where all_reduce was needed): "
                "rank 0 holds the combined gradient after step 0, the other ranks do not",
                "gradient",
                "ranks:reduce-to-0",
            )
        )
    partial = _partly_synchronised(reference, got)
    if partial:
        found.append(
            Cause(
                "some parameters are not synchronised across ranks (ranks disagree on "
                + ", ".join(repr(n) for n in partial)
                + " after step 0, and agree on the others)",
                "parameters",
                "partial-sync",
            )
        )
    lossy = _lossy_compression(kind, scenario, reference, got)
    if lossy:
        return [Cause(lossy, "gradient", "lossy")]
    if kind in RESULT_KINDS and _held_by_rank_zero_only(scenario, got):
        found.append(
            Cause(
                "only rank 0 holds the result: the other ranks report their own local loss, as "
                "a helper that reduces onto rank 0 (dist.reduce, gather to rank 0) leaves "
                "them; if only rank 0's result is meant to be used, check with "
                f"{option('result_on', 'rank0')}, which holds rank 0's result to the global "
                "mean",
                "loss",
                "loss:rank0-only",
            )
        )
    return found


def _held_by_rank_zero_only(scenario: Scenario, got: Trace) -> bool:
    """Every rank but 0 reports its own local loss at every step, and rank 0 does not."""
    if scenario.world_size < 2:
        return False
    with one_thread():
        local = simulate(scenario, Mistake(report="local"))
    tolerance = _MATCH[scenario.dtype]

    def reports_local(rank: int) -> bool:
        return all(
            not bool(
                outside(
                    torch.tensor(got.ranks[rank].losses[step]),
                    torch.tensor(local.ranks[rank].losses[step]),
                    tolerance.allowed(
                        "loss", step, "", torch.tensor(local.ranks[rank].losses[step])
                    ),
                ).any()
            )
            for step in range(got.steps)
        )

    others_local = all(reports_local(r) for r in range(1, scenario.world_size))
    return others_local and not reports_local(0)


def _lossy_compression(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> str:
    """A comm hook whose every value is within a compression format's rounding bound (the
    bound is derived for SGD only): it compresses, which may be its design."""
    if kind != "comm-hook" or scenario.optimizer.name != "sgd":
        return ""
    for fmt, flag in (("float16", "fp16"), ("bfloat16", "bf16")):
        with one_thread():
            tolerance = CompressionTolerance(scenario, fmt)
        if compare(reference, got, scenario, tolerance) is None:
            return (
                f"lossy compression ({fmt} rounding): every gradient, parameter and loss is "
                f"within what {fmt}'s rounding allows ({tolerance.describe()}); if the hook "
                f"compresses on purpose, check it with {option('lossy', flag)}"
            )
    return ""


def failure_cause(kind: str, scenario: Scenario) -> str | None:
    """Why a step function hung, crashed in a collective or computed nonsense, when the
    scenario itself says: its ranks held different numbers of micro-batches, so code that
    calls collectives per micro-batch pairs them up wrongly or leaves ranks waiting.

    Example::

        failure_cause("step", scenario)
        # 'collectives called once per micro-batch (...), and in step 0 the ranks held ...'
    """
    if kind not in ("step", "wrapped-step"):
        return None  # the harness owns the micro-batch loop of every other kind
    for step, per_rank in enumerate(scenario.schedule):
        counts = [len(sizes) for sizes in per_rank]
        if len(set(counts)) > 1:
            held = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
            return (
                "collectives called once per micro-batch (gradients synchronised or the "
                f"optimizer stepped per micro-batch), and in step {step} the ranks held "
                f"different numbers of micro-batches ({held}), so their collectives did not "
                "pair up. If every rank of your training always has as many micro-batches, "
                f"check with {option('same_micro_batch_counts', True)}; "
                "otherwise synchronise once per step"
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
    match = _MATCH[scenario.dtype]
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
