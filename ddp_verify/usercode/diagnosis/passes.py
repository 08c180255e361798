"""The diagnosis's passes: each looks at the evidence its own way and returns scored
hypotheses; :func:`run` runs every registered pass in one loop, and the engine chooses.

What the ranks' parameters show at a glance (BatchNorm's statistics, rank 0 alone combined,
some parameters left out, a low-rank or rounded gradient, a result held by rank 0 only) is a
hypothesis like any other, never an early answer. The axes' hypotheses are predicted in
closed form (:mod:`.engine`); a clip before the all-reduce in closed form from each rank's
own gradient; what is not linear by simulating the known mistakes
(:mod:`ddp_verify.usercode.mistakes`), run only where it can change the answer.

Example::

    found = run(evidence)
    [(h.source, h.keys) for h in found if h.consistent]
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ...engine.models import (
    build_data,
    build_model,
    global_items,
    loss_function,
    normalises_by_batch,
    one_thread,
    rank_items,
    torch_dtype,
    window_factor,
)
from ...engine.objectives import SCOPES, objective
from ...engine.optimizers import scheduled_settings
from ...engine.reference import train_reference
from ...engine.scenario import IGNORE_INDEX
from ...engine.trace import Settings, Trace
from ...world.naming import option
from .. import findings as f
from ..findings import Cause
from .axes import Choice
from .engine import Hypothesis, gradient_hypotheses, loss_hypotheses
from .evidence import Evidence, WithoutParameters, flatten
from .mistakes import applies, candidates, match_tolerance, matches, simulate
from .readings import gradient_causes, gradient_fits
from .structural import (
    held_by_rank_zero_only,
    lossy_compression,
    low_rank_cause,
    only_rank_zero_synchronised,
    partly_synchronised,
)

__all__ = ["Pass", "added", "register", "registered", "run"]

Found = Sequence[Hypothesis]


@dataclasses.dataclass(frozen=True)
class Pass:
    """A named pass: ``look(evidence, found so far)`` returns its hypotheses; ``says``: the
    finding codes its hypotheses may name, besides the axes'; ``adds``: the rows it adds to
    an axis at run time, as templates (their numbers come from the run). Both are for the
    causes table, which lists every reading a report can make. ``needs``: what the evidence
    must hold for the pass to run (:data:`NEEDS`); a pass that needs what a run lacks is not
    run on it."""

    name: str
    look: Callable[[Evidence, Found], list[Hypothesis]]
    says: tuple[str, ...] = ()
    adds: tuple[Choice, ...] = ()
    needs: tuple[str, ...] = ("finite", "one-objective")


# What a pass may need of the evidence, and how to tell whether a run holds it.
NEEDS: dict[str, Callable[[Evidence], bool]] = {
    # Every loss and parameter a rank reported is a number (a NaN divides every weighting
    # by nothing: only the passes that read non-finite values run on it).
    "finite": lambda evidence: evidence.finite,
    # One objective, whose pieces are share-weighted (the axes' and mistakes' model of
    # training): an objective of several terms is read term by term instead.
    "one-objective": lambda evidence: not evidence.scenario.terms,
    "terms": lambda evidence: bool(evidence.scenario.terms),
}

_PASSES: list[Pass] = []


def register(
    name: str,
    *,
    says: tuple[str, ...] = (),
    adds: tuple[Choice, ...] = (),
    needs: tuple[str, ...] = ("finite", "one-objective"),
) -> Callable[[Callable[[Evidence, Found], list[Hypothesis]]], Pass]:
    """Register a pass, run after those registered before it, on the runs that hold what it
    ``needs``."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"a pass needs one of {', '.join(NEEDS)}, got {sorted(unknown)}")

    def decorate(look: Callable[[Evidence, Found], list[Hypothesis]]) -> Pass:
        made = Pass(name, look, says, adds, needs)
        _PASSES.append(made)
        return made

    return decorate


def registered() -> tuple[Pass, ...]:
    return tuple(_PASSES)


@contextlib.contextmanager
def added(made: Pass, *, before: str | None = None) -> Iterator[Pass]:
    """``made`` runs (before the pass named ``before``, else last) while the block runs."""
    index = next((i for i, p in enumerate(_PASSES) if p.name == before), len(_PASSES))
    _PASSES.insert(index, made)
    try:
        yield made
    finally:
        _PASSES.remove(made)


def run(evidence: Evidence) -> list[Hypothesis]:
    """Every registered pass's hypotheses, in one loop: each sees what the earlier found."""
    found: list[Hypothesis] = []
    held = {need: holds(evidence) for need, holds in NEEDS.items()}
    for each in _PASSES:
        if all(held[need] for need in each.needs):
            found.extend(each.look(evidence, tuple(found)))
    return found


def _structural(cause: Cause, covers: set[str], cost: float = 1.0, source: str = "") -> Hypothesis:
    return Hypothesis(
        cause.subject,
        frozenset(covers),
        cost,
        0.0,
        causes=(cause,),
        source=source or cause.pattern,
    )


ALL = {"run", "parameters", "gradient", "loss"}


@register("batch-norm", says=(f.BATCH_NORM.code,))
def batch_norm(evidence: Evidence, found: Found) -> list[Hypothesis]:
    if not normalises_by_batch(evidence.scenario):
        return []
    return [_structural(f.BATCH_NORM.cause(), ALL)]


@register("reduce-to-0", says=(f.RANKS_REDUCE_TO_0.code,))
def reduce_to_zero(evidence: Evidence, found: Found) -> list[Hypothesis]:
    if not only_rank_zero_synchronised(evidence.scenario, evidence.reference, evidence.got):
        return []
    return [_structural(f.RANKS_REDUCE_TO_0.cause(), {"gradient", "parameters"})]


@register("partial-sync", says=(f.PARTIAL_SYNC.code,))
def partial_sync(evidence: Evidence, found: Found) -> list[Hypothesis]:
    partial = partly_synchronised(evidence.reference, evidence.got)
    if not partial:
        return []
    names = ", ".join(repr(n) for n in partial)
    return [_structural(f.PARTIAL_SYNC.cause(names=names), {"gradient", "parameters"})]


@register("low-rank", says=(f.LOW_RANK.code,))
def low_rank(evidence: Evidence, found: Found) -> list[Hypothesis]:
    cause = low_rank_cause(evidence.kind, evidence.reference, evidence.got)
    return [] if cause is None else [_structural(cause, ALL)]


@register("lossy", says=(f.LOSSY.code,))
def lossy(evidence: Evidence, found: Found) -> list[Hypothesis]:
    cause = lossy_compression(evidence.kind, evidence.scenario, evidence.reference, evidence.got)
    # Within a compression format's rounding everywhere: cheaper than any mistake.
    return [] if cause is None else [_structural(cause, ALL, cost=0.5)]


@register("optimizer-steps", says=(f.STEP_EACH.code, f.OPTIMIZER_SETTINGS.code))
def optimizer_steps(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """What the code's own optimizer says it did, recorded on the ranks by an optimizer step
    hook, not read from the parameters: stepped more than once in a step (inside its
    micro-batch loop; twice on one micro-batch's gradient reads as a gradient scaled 2x), or
    with settings (a learning rate, momentum, betas, weight decay) other than the
    reference's at that step (a warm-up stepped per micro-batch reads as a weighting). Where
    the code owns the step."""
    scenario = evidence.scenario
    for rank, trace in enumerate(evidence.got.ranks):
        for step, calls in enumerate((trace.optimizer_calls or [])[: scenario.steps]):
            if len(calls) > 1:
                micro_batches = len(scenario.schedule[step][rank])
                cause = dataclasses.replace(
                    f.STEP_EACH.cause(),
                    evidence=f"the optimizer stepped {len(calls)} times in step {step} on rank "
                    f"{rank}, which holds {micro_batches} micro-batch(es): once is due",
                )
                return [_structural(cause, ALL, source="optimizer-steps")]
            due, whose = _due_settings(evidence, step)
            differs = _first_difference(calls[0] if calls else (), due)
            if differs is not None:
                group, name, got, expected = differs
                ratio = f", {got / expected:.4g}x" if expected else ""
                groups = f" of param group {group}" if len(due) > 1 else ""
                said = (
                    f"{name} {got:.6g}{groups} at step {step} on rank {rank} where {whose} is "
                    f"{expected:.6g}{ratio}"
                )
                cause = f.OPTIMIZER_SETTINGS.cause(what=said)
                return [_structural(cause, {"parameters", "loss"}, source="optimizer-steps")]
    return []


@register("not-a-number", says=(f.NAN_EMPTY_RANK.code, f.NAN.code), needs=())
def not_a_number(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """A NaN or an infinity in what a rank reported or holds: at the first step that has
    one, where some rank held no loss item (its count 0), the code divided by it (0/0), and
    an all-reduce spread it to every rank; otherwise named as it is. Read from the run, not
    predicted: its misfit is 0 where the run holds a non-finite value, as the values are."""
    scenario = evidence.scenario
    for step in range(evidence.steps):
        where = []
        for rank, trace in enumerate(evidence.got.ranks):
            values = [trace.losses[step]] if step < len(trace.losses) else []
            params = trace.params[step] if step < len(trace.params) else {}
            finite = all(math.isfinite(v) for v in values) and all(
                bool(torch.isfinite(t).all()) for t in params.values() if t is not None
            )
            if not finite:
                where.append(rank)
        if not where:
            continue
        empty = [r for r, n in enumerate(rank_items(scenario, step)) if n == 0]
        ranks = ", ".join(map(str, where))
        if empty:
            cause = f.NAN_EMPTY_RANK.cause(
                empty=empty[0],
                step=step,
                evidence=f"rank {empty[0]} holds no {evidence.unit} at step {step}; ranks "
                f"{ranks} hold a NaN or an infinity after it",
            )
        else:
            cause = f.NAN.cause(step=step, nonfinite=ranks)
        return [Hypothesis("run", frozenset(ALL), 1.0, 0.0, causes=(cause,), source="not-a-number")]
    return []


@register("label-dropped", says=(f.LABEL_DROPPED.code, f.IGNORED_COUNTED.code))
def label_dropped(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """A class or label value left out of the loss (taken for padding: 0 where ``-100`` is
    the ignored target): at step 0, the objective's gradient with the items of one target
    value weighted 0, over the count without them or the count with them, predicted for each
    value the step's targets hold, against each rank's gradient. Its misfit: the prediction's
    distance, against the dtype's bound. Class and token losses whose gradients are read."""
    scenario = evidence.scenario
    if scenario.loss not in ("cross_entropy", "tokens") or scenario.objective:
        return []
    if scenario.recipe.loss:
        return []  # the user's own loss gives no loss per item to weigh
    observed = evidence.gradients(0)
    if observed is None:
        return []
    with one_thread():
        model = build_model(scenario, "float64")
        inputs, targets = build_data(scenario, "float64")[0]
        per_item = loss_function(scenario, "none")(model(inputs), targets)
        counted = targets != IGNORE_INDEX
        values = sorted({int(v) for v in targets[counted].unique()})
        tolerance = evidence.tolerance
        total = int(counted.sum())

        def distance(items: torch.Tensor, weights: torch.Tensor, count: int) -> float:
            model.zero_grad(set_to_none=True)
            (items * weights).sum().div(count).backward(retain_graph=True)
            predicted = flatten(model, {n: p.grad for n, p in model.named_parameters()})
            scale = max(float(predicted.norm()), 1e-300)
            return max(float((g - predicted).norm()) / scale for g in observed)

        def hypothesis(cause: Cause, misfit: float) -> list[Hypothesis]:
            covers = frozenset({"gradient", "loss"})
            return [Hypothesis("gradient", covers, 1.0, misfit / tolerance.close,
                               causes=(cause,), source="label-dropped")]  # fmt: skip

        for value in values[:MAX_LABELS]:
            kept = counted & (targets != value)
            if not bool(kept.any()):
                continue
            for over, count in (("without them", int(kept.sum())), ("with them", total)):
                misfit = distance(per_item, kept, count)
                if misfit <= tolerance.close:
                    dropped = int((counted & (targets == value)).sum())
                    cause = f.LABEL_DROPPED.cause(
                        label=value,
                        evidence=f"at step 0 every rank's gradient is the objective's with the "
                        f"{dropped} {evidence.unit}(s) of target {value} weighted 0, over the "
                        f"count {over} ({count} of {total}); relative distance {misfit:.2g}",
                    )
                    return hypothesis(cause, misfit)
        ignored = ~counted
        if bool(ignored.any()):
            # The ignored targets counted as a class (code that clamps them to build its own
            # mask, then never applies it): over the count of those that count.
            everything = loss_function(scenario, "none")(model(inputs), targets.clamp(min=0))
            misfit = distance(everything, torch.ones_like(everything), total)
            if misfit <= tolerance.close:
                cause = f.IGNORED_COUNTED.cause(
                    evidence=f"at step 0 every rank's gradient is the objective's with the "
                    f"{int(ignored.sum())} ignored target(s) counted as class 0, over the "
                    f"{total} that count; relative distance {misfit:.2g}",
                )
                return hypothesis(cause, misfit)
    return []


# The target values a label pass tries, the smallest first (0 is the padding convention).
MAX_LABELS = 16


@register("integer-values", says=(f.LOSS_INTEGER.code,))
def integer_values(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """A loss value truncated or rounded to a whole number on its way (a sum held in an
    integer tensor, ``int()`` of a mean): at the first step whose reported loss is not the
    reference's, the reported value times ``k`` (1, the step's loss items, the world size) is
    a whole number where the reference's is not, and the two part by less than one unit in
    ``k``'s place per rank. Its misfit: how far from whole the value is, against the dtype's
    bound."""
    tolerance, scenario = evidence.tolerance, evidence.scenario
    for step in range(evidence.steps):
        expected = evidence.reference.ranks[0].losses[step]
        got = [evidence.reported(r)[step] for r in range(len(evidence.got.ranks))]
        if not all(map(math.isfinite, [*got, expected])):
            return []  # a NaN is no whole number: the not-a-number pass says it
        if all(math.isclose(g, expected, rel_tol=tolerance.loss, abs_tol=1e-12) for g in got):
            continue
        items = global_items(scenario, step)
        # A sum truncated first: the usual way (a value of 0 is whole every way).
        ways = (
            (items, f"the sum over the step's {items} {evidence.unit}s"),
            (evidence.world, "the sum over the ranks"),
            (1, "the value itself"),
        )
        for k, what in ways:
            scaled = [g * k for g in got]
            whole = [abs(v - round(v)) for v in scaled]
            # Whole to the run's rounding (a truncated value is exact), not to a fit's bound.
            exact = 1e3 * torch.finfo(torch_dtype(scenario.dtype)).eps
            if max(whole) > exact * max(1.0, *map(abs, scaled)):
                continue
            if abs(expected * k - round(expected * k)) <= 1e-6 * max(1.0, abs(expected * k)):
                continue  # the reference's is whole too: nothing to tell
            if max(abs(v - expected * k) for v in scaled) >= evidence.world + 1:
                continue
            cause = f.LOSS_INTEGER.cause(
                whole=what,
                evidence=f"at step {step} the reported loss times {k} is "
                f"{', '.join(f'{v:.6g}' for v in scaled)}, a whole number, where the "
                f"reference's is {expected * k:.6g}",
            )
            misfit = max(whole) / (exact * max(1.0, *map(abs, scaled)))
            return [
                Hypothesis(
                    "loss", frozenset({"loss"}), 1.0, misfit, causes=(cause,), source="integer"
                )
            ]
        return []
    return []


def _due_settings(evidence: Evidence, step: int) -> tuple[Settings, str]:
    """The optimizer settings due at ``step``, and whose they are: those the reference's own
    optimizer stepped with where it recorded them (the user's code on one rank, with the
    user's optimizer and schedule), else the scenario's optimizer's at that step."""
    reference = evidence.reference.ranks[0].optimizer_calls if evidence.reference.ranks else None
    if reference is not None:
        calls = reference[step] if step < len(reference) else []
        return (calls[0] if calls else ()), "the reference's (your code on one rank)"
    return scheduled_settings(evidence.scenario.optimizer, step), "the scenario's optimizer's"


def _first_difference(got: Settings, due: Settings) -> tuple[int, str, float, float] | None:
    """The first setting (group, name, recorded, due) that differs, of those both have."""
    for group, (mine, theirs) in enumerate(zip(got, due, strict=False)):
        expected = dict(theirs)
        for name, value in mine:
            if name in expected and not math.isclose(value, expected[name], rel_tol=1e-9):
                return group, name, value, expected[name]
    return None


@register("rank-0-result", says=(f.LOSS_RANK0_ONLY.code,))
def rank_zero_result(evidence: Evidence, found: Found) -> list[Hypothesis]:
    if not evidence.kind.result_on_rank0:
        return []
    if not held_by_rank_zero_only(evidence.scenario, evidence.got):
        return []
    cause = f.LOSS_RANK0_ONLY.cause(result_on=option("result_on", "rank0"), whole=evidence.whole)
    return [_structural(cause, {"loss"})]


@register("gradient-axes")
def gradient_axes(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """The axes' hypotheses at the first step whose gradient the right one does not fit."""
    kept: list[Hypothesis] = []
    for step in range(evidence.steps):
        kept = gradient_hypotheses(evidence, step)
        if not any(h.right and h.consistent for h in kept):
            return kept
    return kept


def wrong_step(found: Found) -> int | None:
    """The step the gradient axes found wrong (no right hypothesis fits it), if any."""
    axes = [h for h in found if h.source == "gradient axes"]
    if not axes or any(h.right and h.consistent for h in axes):
        return None
    return int(axes[0].detail["step"])


@register("tied-repeated", says=(f.TIED_REPEATED.code,))
def tied_repeated(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """A gradient no axis hypothesis fits whole, where one fits every parameter but those
    reached by several names (tied weights): the code treated those once per name. The
    gradient axes are scored again on the other parameters; each consistent one is said
    with the tied parameters' own factor beside it (a right one: the tied parameters alone
    are wrong). Its misfit is the axes' on the rest, from the one tolerance table."""
    step = wrong_step(found)
    if step is None or any(
        h.consistent for h in found if h.source == "gradient axes" and h.subject == "gradient"
    ):
        return []
    with one_thread():
        model = build_model(evidence.scenario, "float64")
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = [n for n in names.values() if len(n) > 1]
    if not tied:
        return []
    first = {name for n in tied for name in n[:1]}
    rest = gradient_hypotheses(WithoutParameters(evidence, sorted(first)), step)
    fitting = [h for h in rest if h.consistent]
    if not fitting:
        return []
    said = _tied_factors(evidence, step, tied)
    if said is None:
        return []
    cause = f.TIED_REPEATED.cause(tied=said, evidence=f"at step {step}, on rank 0")
    if any(h.right for h in fitting):
        best = min((h for h in fitting if h.right), key=lambda h: h.misfit)
        return [
            Hypothesis(
                "gradient",
                frozenset({"gradient"}),
                1.0,
                best.misfit,
                causes=(cause,),
                source="tied-repeated",
            )
        ]
    return [
        dataclasses.replace(h, source="tied-repeated", detail={**h.detail, "tied": cause})
        for h in fitting
    ]


def _tied_factors(evidence: Evidence, step: int, tied: list[list[str]]) -> str | None:
    """Each tied parameter's gradient on rank 0 as a multiple of the reference's."""
    expected = evidence.reference.ranks[0].grads
    got = evidence.got.ranks[0].grads
    if not expected or not got:
        return None
    parts = []
    for group in tied:
        truth, value = expected[step].get(group[0]), got[step].get(group[0])
        if truth is None or value is None or float(truth.norm()) == 0:
            return None
        truth, value = truth.double().flatten(), value.to("cpu", torch.float64).flatten()
        factor = float(value @ truth / (truth @ truth))
        others = ", ".join(repr(n) for n in group[1:])
        parts.append(f"{group[0]!r} (also {others}) has a gradient {factor:.4g}x the reference's")
    return "; ".join(parts) + ", where the other parameters' fit the rest of this diagnosis"


def _on_parameters(cause: Cause, misfit: float, source: str) -> Hypothesis:
    """A pass's reading of the parameters after a step (which the loss then follows)."""
    return Hypothesis(
        "parameters", frozenset({"parameters", "loss"}), 1.0, misfit, causes=(cause,), source=source
    )


def _step_start(
    evidence: Evidence, found: Found
) -> tuple[dict[str, torch.Tensor], Mapping[str, Any], list[str]] | None:
    """For the passes that read parameters replaced after a step: the step's start, the
    reference's parameters after it and the trainable names, where the gradients the
    optimizer stepped on are recorded and the gradient axes found them right; else None."""
    if not evidence.got.ranks or not evidence.reference.ranks:
        return None
    if not evidence.reference.ranks[0].params or not evidence.got.ranks[0].params:
        return None
    if not evidence.got.ranks[0].grads or wrong_step(found) is not None:
        return None
    if not any(h.source == "gradient axes" for h in found):
        return None
    with one_thread():
        start_model = build_model(evidence.scenario, "float64")
    start = dict(start_model.named_parameters())
    expected = evidence.reference.ranks[0].params[0]
    names = [n for n in expected if n in start and start[n].requires_grad]
    return (start, expected, names) if names else None


@register("parameters-replaced", says=(f.PARAMS_REPLACED.code,))
def parameters_replaced(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Parameters replaced after the step rather than gradients misweighted: at the first
    step, each rank's parameters are ``a * start + (1 - a) * reference`` for one ``a`` in
    ``(0, 1]`` (a running average of the weights kept in the model, EMA decay ``a``; at
    ``a = 1`` the update undone), where the recorded gradients are right. Needs the step's
    start, the reference's parameters and the gradient axes' word; its misfit is what that
    line leaves unexplained, against the dtype's residual bound."""
    # Only where the gradients the optimizer stepped on are recorded and right: with SGD a
    # gradient scaled by k lands on the same line (a = 1 - k), which the gradient says.
    read = _step_start(evidence, found)
    if read is None:
        return []
    start, expected, names = read

    def flat(params: Mapping[str, Any]) -> torch.Tensor:
        return torch.cat([params[n].detach().to("cpu", torch.float64).reshape(-1) for n in names])

    before, after = flat(start), flat(expected)
    moved = before - after
    if float(moved.norm()) == 0.0:
        return []
    tolerance = evidence.tolerance
    worst, decays = 0.0, []
    for rank in evidence.got.ranks:
        got = flat(rank.params[0])
        off = got - after
        if float(off.norm()) <= tolerance.close * float(moved.norm()):
            return []  # this rank's step is the reference's: not a replacement
        decay = float(off @ moved) / float(moved @ moved)
        unexplained = float((off - decay * moved).norm()) / float(off.norm())
        worst = max(worst, unexplained / tolerance.residual)
        decays.append(decay)
    if not all(tolerance.close < d <= 1 + tolerance.close for d in decays):
        return []
    decay = sum(decays) / len(decays)
    how = (
        "the update undone: the parameters are the step's start again"
        if abs(decay - 1) <= tolerance.close
        else f"each parameter {decay:.4g} of its value before the step plus {1 - decay:.4g} "
        "of the reference's after it: a running average (EMA) of the weights left in the model"
    )
    cause = f.PARAMS_REPLACED.cause(
        replaced=how,
        evidence=f"at step 0 every rank's parameters lie on the line from the reference's "
        f"update back to the start, at {', '.join(f'{d:.6g}' for d in decays)} of the way "
        f"(unexplained: {worst * tolerance.residual:.2g} of the difference)",
    )
    return [_on_parameters(cause, worst, "parameters-replaced")]


@register("parameters-not-stepped", says=(f.PARAMS_STALE.code,))
def parameters_not_stepped(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Some ranks' parameters left as they were before the step while other ranks updated
    them, where the recorded gradients are right: at the first step, each rank's parameter
    is the reference's after the step or the start (one of the two, each parameter and rank
    its own), and the ranks differ. The undone update on every rank alike is the
    parameters-replaced pass's. Its misfit is what the nearer of the two leaves unexplained,
    against the dtype's residual bound."""
    read = _step_start(evidence, found) if evidence.world > 1 else None
    if read is None:
        return []
    start, expected, names = read
    tolerance = evidence.tolerance
    stale: dict[str, list[int]] = {}
    worst, updated = 0.0, 0
    for name in names:
        before = start[name].detach().double().reshape(-1)
        after = expected[name].detach().to("cpu", torch.float64).reshape(-1)
        moved = float((before - after).norm())
        if moved == 0.0:
            continue
        for rank, trace in enumerate(evidence.got.ranks):
            got = trace.params[0][name].detach().to("cpu", torch.float64).reshape(-1)
            to_after, to_before = float((got - after).norm()), float((got - before).norm())
            worst = max(worst, min(to_after, to_before) / moved / tolerance.residual)
            if to_before < to_after:
                stale.setdefault(name, []).append(rank)
            else:
                updated += 1
    # Ranks that differ: some updated what others kept (all kept is an update undone).
    if not stale or not updated or all(len(r) == evidence.world for r in stale.values()):
        return []
    said = "; ".join(
        f"{name!r} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        for name, ranks in list(stale.items())[:4]
    )
    more = f" and {len(stale) - 4} more" if len(stale) > 4 else ""
    cause = f.PARAMS_STALE.cause(
        stale=f"{said}{more}",
        evidence=f"at step 0 each rank's parameter is the reference's update or the step's "
        f"start, the nearer within {worst * tolerance.residual:.2g} of the update's size; "
        f"{sum(map(len, stale.values()))} kept, {updated} updated",
    )
    return [_on_parameters(cause, worst, "parameters-not-stepped")]


@register("clip", says=(f.CLIP.code,))
def clip(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Each rank's own gradient clipped to one norm before the ranks were combined.

    Every rank's gradient is a multiple ``a_r`` of its own mean gradient ``l_r`` weighted by
    its share; a clip scales a rank by ``min(1, c / |p_r l_r|)``, where ``p_r`` is how the
    rank's gradient was scaled when it was clipped (its mean, its share, DDP's share times
    the world size, or its sum). It fits where the clipped ranks all end at one norm ``c``
    and the others were under it."""
    step = wrong_step(found)
    observed = None if step is None else evidence.gradients(step)
    if step is None or observed is None or evidence.world < 2:
        return []
    terms = evidence.terms(step)
    groups, world = terms.groups, evidence.world
    items = [sum(g.items for g in groups if g.rank == r) for r in range(world)]
    total = sum(items)
    own = []
    for r in range(world):
        index = [i for i, g in enumerate(groups) if g.rank == r]
        weights = torch.tensor([groups[i].items / items[r] for i in index], dtype=torch.float64)
        own.append(terms.columns[:, index] @ weights)
    local = torch.stack(own, dim=1)
    norms = [float(v.norm()) for v in own]
    tolerance = evidence.tolerance
    pre = {
        "mean": [1.0] * world,
        "share": [n / total for n in items],
        "ddp": [world * n / total for n in items],
        "sum": [float(n) for n in items],
    }
    kept = []
    for how, scaled in pre.items():
        misfit, bound, described = 0.0, 0.0, ""
        for mine in observed:
            solution = torch.linalg.lstsq(local, mine.unsqueeze(1), driver="gelsd").solution
            a = solution.squeeze(1)
            scale = max(float(mine.norm()), 1e-300)
            residual = float((local @ a - mine).norm()) / scale / tolerance.residual
            kept_share = [float(a[r]) * total / items[r] for r in range(world)]
            fit = _clip_bound(
                kept_share, [p * n for p, n in zip(scaled, norms, strict=True)], tolerance.close
            )
            if fit is None:
                misfit = math.inf
                break
            bound, described = fit
            misfit = max(misfit, residual)
        if misfit <= 1.0:
            cause = f.CLIP.cause(
                evidence=f"each rank's gradient at step {step} is its own mean gradient times "
                f"min(1, {bound:.4g} / its norm), the norm taken of the rank's {how} gradient",
                bound=bound,
                ranks=described,
            )
            kept.append(
                Hypothesis(
                    "gradient", frozenset({"gradient"}), 1.0, misfit, causes=(cause,), source="clip"
                )
            )
            break
    return kept


def _clip_bound(kept: list[float], norms: list[float], close: float) -> tuple[float, str] | None:
    """The one norm the clipped ranks ended at, and the ranks' numbers, if ``kept`` (what
    each rank kept of its gradient) is what a clip to it leaves; None otherwise."""
    if any(k < -close or k > 1 + close for k in kept):
        return None
    clipped = [r for r, k in enumerate(kept) if k < 1 - close]
    if not clipped:
        return None
    ends = [kept[r] * norms[r] for r in clipped]
    bound = sum(ends) / len(ends)
    if bound <= 0 or any(abs(e - bound) > close * bound for e in ends):
        return None
    others = [r for r in range(len(kept)) if r not in clipped]
    if any(norms[r] > bound * (1 + close) for r in others):
        return None
    if len(clipped) < 2 and not others:
        return None  # one rank's factor alone: any scale fits it
    words = "; ".join(
        f"rank {r}'s gradient of norm {norms[r]:.4g} kept {kept[r]:.4g} of itself"
        for r in range(len(kept))
    )
    return bound, words


@register(
    "fitted-weights",
    says=(
        f.MICRO_UNSYNCED.code,
        f.MICRO_DROPPED.code,
        f.MICRO_OTHER.code,
        f.RANKS_EQUAL.code,
        f.RANKS_OTHER.code,
    ),
)
def fitted_weights(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Any weights at all (least squares), read by what they show: what no row names, at a
    cost above any two named mistakes together."""
    if wrong_step(found) is None:
        return []
    if any(h.consistent and h.cost > 0 and "gradient" in h.covers for h in found):
        return []
    fits = gradient_fits(evidence.scenario, evidence.got, compressed=evidence.compressed)
    causes = [
        c
        for c in gradient_causes(evidence.scenario, fits, compressed=evidence.compressed)
        if c.pattern != f.NONLINEAR.code
    ]
    if not causes:
        return []
    return [
        Hypothesis(
            "gradient",
            frozenset({"gradient"}),
            3.5,
            0.0,
            causes=tuple(causes),
            source="fitted weights",
        )
    ]


# The reported loss scaled as the gradient was: its factor is the one the gradient was found
# scaled by, filled in per run.
LIKE_GRADIENT = Choice(
    "report-scale",
    "like-gradient",
    f.LOSS_SCALED.code,
    cost=0.5,
    words=f.LOSS_SCALED_LIKE_GRADIENT,
)


@register("loss-axes", adds=(LIKE_GRADIENT,))
def loss_axes(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """The reported loss's hypotheses, with one row more for each factor the gradient was
    found scaled by: the scaled loss that was backpropagated, reported, is one mistake seen
    twice, and its factor is no free number (one step shows it). Only the gradient's
    cheapest consistent readings count: where the gradient is right, a costlier reading that
    happens to fit too (a sum divided by W on even ranks) scaled nothing."""
    gradient = [h for h in found if h.consistent and h.subject == "gradient"]
    cheapest = min((h.cost for h in gradient), default=0.0)
    factors = sorted(
        {
            round(float(h.detail["factors"][0]), 12)
            for h in gradient
            if h.cost == cheapest
            and h.detail.get("factors")
            and any(c.axis == "scale" for c in h.wrong)
        }
    )
    like = [dataclasses.replace(LIKE_GRADIENT, factor=_constant(k)) for k in factors]
    return loss_hypotheses(evidence, like)


def _constant(value: float) -> Callable[[Any], float]:
    return lambda context: value


@register("objective", says=(f.OBJECTIVE_OTHER.code,))
def other_objective(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Under a declared objective, each other objective the scenarios train, trained on the
    same data as the reference: where the ranks' gradients are exactly one of them, the code
    computes that objective instead (a sequence mean where a token mean was declared)."""
    scenario = evidence.scenario
    # The other objectives aggregate the built-in token data; a sum of other losses is told
    # from their mean by its scale alone.
    if not scenario.objective or scenario.loss != "tokens" or scenario.model.kind == "user":
        return []
    declared = objective(scenario.objective)
    others = [o for o in OTHER_OBJECTIVES if objective(o).name != declared.name]
    strict = match_tolerance(scenario.dtype)
    kept = []
    for other in others:
        alternative = dataclasses.replace(scenario, objective=other)
        truth = train_reference(alternative, "float64")
        expected = Trace(truth.method, [truth.ranks[0]] * scenario.world_size)
        if not matches(expected, evidence.got, strict, losses=False):
            continue
        cause = f.OBJECTIVE_OTHER.cause(
            computed=other,
            declared=str(declared),
            evidence=f"training {other} on the whole global batch reproduces every rank's "
            "gradients and parameters",
        )
        kept.append(Hypothesis("gradient", frozenset({"gradient"}), 1.0, 0.0, causes=(cause,)))
    return kept


# The objectives another one is compared with (those scenarios train).
OTHER_OBJECTIVES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


@register("packed-rows", says=(f.PACKED_ROWS.code,))
def packed_rows(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Where sequences were packed under a sequence-level objective, the objective with each
    packed row taken for a sequence (over the declared sequences, or over the rows): where
    the ranks' gradients are exactly one of them, the code means per row."""
    from .packed import OVER, rows_as_sequences

    scenario = evidence.scenario
    if not scenario.packing or not scenario.objective or scenario.loss != "tokens":
        return []
    declared = objective(scenario.objective)
    if declared.unit != "sequence":
        return []
    strict = match_tolerance(scenario.dtype)
    kept = []
    for over in OVER:
        truth = rows_as_sequences(scenario, over)
        expected = Trace(truth.method, [truth.ranks[0]] * scenario.world_size)
        if not matches(expected, evidence.got, strict, losses=False):
            continue
        with_loss = matches(expected, evidence.got, strict, losses=True)
        cause = f.PACKED_ROWS.cause(
            declared=declared.name,
            over="step's sequences" if over == "sequences" else "step's rows",
            evidence=f"training with each packed ({scenario.packing}) row as a sequence, over "
            f"the {over}, reproduces every rank's gradients and parameters"
            f"{' and losses' if with_loss else ''}",
        )
        covers = {"gradient", "loss"} if with_loss else {"gradient"}
        kept.append(Hypothesis("gradient", frozenset(covers), 1.0, 0.0, causes=(cause,)))
    return kept


@register("packed-boundary", says=(f.PACKED_BOUNDARY.code,))
def packed_boundary(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Where sequences were packed for a loss that shifts its labels and each segment's
    first label was kept, the loss with every boundary prediction counted (each sequence's
    last position predicting the next one's first token), over the step's count, over that
    count and the boundaries, or per micro-batch: where the ranks' gradients are exactly
    one of them, the code never masks the boundaries."""
    from .packed import BOUNDARY_OVER, boundaries_counted, boundary_pairs

    scenario = evidence.scenario
    packed = scenario.packing and scenario.labels == "unshifted"
    if not packed or scenario.boundary != "kept" or evidence.kind.token_losses:
        return []
    strict = match_tolerance(scenario.dtype)
    said = {
        "step": "the step's count, as handed",
        "step-and-boundaries": "the step's count with the boundaries",
        "micro-batch": "each micro-batch's own count",
    }
    kept = []
    for over in BOUNDARY_OVER:
        truth = boundaries_counted(scenario, over)
        expected = Trace(truth.method, [truth.ranks[0]] * scenario.world_size)
        if not matches(expected, evidence.got, strict, losses=False):
            continue
        with_loss = matches(expected, evidence.got, strict, losses=True)
        cause = f.PACKED_BOUNDARY.cause(
            count=boundary_pairs(scenario, 0),
            over=said[over],
            evidence="training with every boundary prediction counted reproduces every "
            f"rank's gradients and parameters{' and losses' if with_loss else ''}",
        )
        covers = {"gradient", "loss"} if with_loss else {"gradient"}
        kept.append(Hypothesis("gradient", frozenset(covers), 1.0, 0.0, causes=(cause,)))
    return kept


@register("window", says=(f.OBJECTIVE_WINDOW.code,))
def window_scope(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Where steps share windows, the declared objective with its count taken over each other
    scope (the step's own, the window's per step, the window's whole), trained on the same
    data: where the ranks' gradients are exactly one of them, the code normalises by that
    count, and each step counted that scope's factor over the declared one's."""
    scenario = evidence.scenario
    if scenario.window == 1 or not scenario.objective or scenario.loss != "tokens":
        return []
    declared = objective(scenario.objective)
    if not declared.unit:
        return []
    strict = match_tolerance(scenario.dtype)
    kept = []
    for scope in SCOPES:
        if scope == declared.scope:
            continue
        alternative = dataclasses.replace(scenario, objective=str(declared.scoped(scope)))
        truth = train_reference(alternative, "float64")
        expected = Trace(truth.method, [truth.ranks[0]] * scenario.world_size)
        if not matches(expected, evidence.got, strict, losses=False):
            continue
        # Where the losses it reports are that objective's too, it explains them as well.
        with_loss = matches(expected, evidence.got, strict, losses=True)
        # A step with no unit counts nothing under either scope (never drawn: every
        # micro-batch's first sequence counts): its factor is said as 1.
        factors = [
            window_factor(alternative, step) / (window_factor(scenario, step) or 1.0)
            for step in range(scenario.steps)
        ]
        cause = f.OBJECTIVE_WINDOW.cause(
            computed=SCOPES[scope],
            declared=str(declared),
            meant=SCOPES[declared.scope],
            factors=", ".join(
                f"step {step} counted {factor:.4g}x its declared weight"
                for step, factor in enumerate(factors)
            ),
            evidence=f"training {alternative.objective} on the whole global batch reproduces "
            f"every rank's gradients and parameters{' and losses' if with_loss else ''}",
        )
        kept.append(
            Hypothesis(
                "gradient",
                frozenset({"gradient", "loss"} if with_loss else {"gradient"}),
                1.0,
                0.0,
                causes=(cause,),
                detail={"factors": factors},
            )
        )
    return kept


@register("terms", says=(f.OBJECTIVE_TERM.code,), needs=("finite", "terms"))
def term_weights(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """Under an objective of several terms, each term's effective weight and aggregation
    read from the ranks' gradients (:mod:`.terms`): where training that reading reproduces
    the run, the terms it weighs otherwise than declared are named, each with its factor."""
    from .terms import read_terms, train_reading

    scenario = evidence.scenario
    strict = match_tolerance(scenario.dtype)
    reading = read_terms(scenario, evidence.got, strict.rtol)
    if reading is None or not reading.changed(strict.rtol):
        return []
    truth = train_reading(scenario, reading)
    expected = Trace(truth.method, [truth.ranks[0]] * scenario.world_size)
    if not matches(expected, evidence.got, strict, losses=False):
        return []
    with_loss = matches(expected, evidence.got, strict, losses=True)
    changed = reading.changed(strict.rtol)
    said = (
        "training each term at the weight and aggregation read from the ranks' gradients "
        f"reproduces every rank's gradients and parameters{' and losses' if with_loss else ''}"
    )
    read = {x for t in reading.terms for x in t.factors() if x is not None}
    first = min(read) if read else 1.0
    alike = all(abs(x - first) <= strict.rtol * max(1.0, abs(first)) for x in read)
    if (
        len(changed) == len(reading.terms) > 1
        and alike
        and all(t.aggregates_as_declared for t in changed)
    ):
        # Every term at one factor: the whole loss is scaled, whatever its terms.
        world = scenario.world_size
        why = f.SCALED
        if abs(first - world) <= strict.rtol * world:
            why = f.SUMMED_NOT_DIVIDED_BY_WORLD
        elif abs(first * world - 1) <= strict.rtol:
            why = f.DIVIDED_TWICE
        cause = f.SCALE.cause(why=why, unit=evidence.unit, factor=first, evidence=said)
    else:
        words = "; ".join(t.words(scenario) for t in changed)
        cause = f.OBJECTIVE_TERM.cause(terms=words, evidence=said)
    covers = {"gradient", "loss"} if with_loss else {"gradient"}
    return [
        Hypothesis(
            "gradient",
            frozenset(covers),
            float(len(changed)),
            0.0,
            causes=(cause,),
            detail={"terms": {t.term.name: list(t.factors()) for t in changed}},
        )
    ]


@register("simulated", says=(f.STEP_EACH.code,))
def simulated(evidence: Evidence, found: Found) -> list[Hypothesis]:
    """The known mistakes, simulated: every one where a subject is left unexplained, and
    otherwise those the closed form cannot predict (an optimizer stepped per micro-batch)."""
    unexplained = {
        s for s in ("gradient", "loss") if not any(h.consistent and s in h.covers for h in found)
    }
    scenario = evidence.scenario
    family = candidates(evidence.kind)
    if not unexplained:
        if not scenario.accumulates:
            return []
        family = [m for m in family if m.stepping != "once"]
    strict = match_tolerance(scenario.dtype)
    loose = match_tolerance(scenario.dtype, compressed=True)
    kept: list[Hypothesis] = []
    cheapest: int | None = None
    for mistake in family:
        cost = len(mistake.findings)
        if cheapest is not None and cost > cheapest:
            break  # only the cheapest that reproduce the run can be chosen
        if not applies(mistake, scenario):
            continue
        trace = simulate(scenario, mistake)
        said = ""
        with_loss = matches(trace, evidence.got, strict, losses=True)
        gradient = with_loss or matches(trace, evidence.got, strict, losses=False)
        if not gradient and evidence.compressed:
            with_loss = matches(trace, evidence.got, loose, losses=True)
            gradient = with_loss or matches(trace, evidence.got, loose, losses=False)
            said = " (up to compression rounding: the hook also compresses)"
        if not gradient:
            continue
        reproduces = "parameters and losses" if with_loss else "parameters"
        causes = tuple(
            dataclasses.replace(c, text=c.text + said)
            for c in mistake.causes(
                unit=evidence.unit,
                whole=evidence.whole,
                evidence=f"simulating {mistake} reproduces every rank's {reproduces}",
            )
            if c.subject == "gradient" or with_loss
        )
        if not causes:
            continue
        covers = {"gradient"} | ({"loss"} if with_loss else set())
        kept.append(
            Hypothesis(
                causes[0].subject,
                frozenset(covers),
                float(cost),
                0.0,
                causes=causes,
                source="simulated",
            )
        )
        cheapest = cost
    return kept
