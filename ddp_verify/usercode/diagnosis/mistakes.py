"""Known mistakes, simulated: what data-parallel training computes when it gets one wrong.

One process holds a replica per rank and trains them the way a mistaken implementation would:
how each rank weights its micro-batches, how gradients are combined across ranks, what loss
is reported. :mod:`.passes` matches a user's trace against these runs, and
says what a matching one gets wrong in the words of :mod:`ddp_verify.usercode.findings`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import torch

from ...engine.compare import outside
from ...engine.models import normaliser
from ...engine.scenario import Scenario
from ...engine.tolerances import Float64Tolerance, Tolerance
from ...engine.trace import Trace
from ...engine.training import Step, train
from .. import findings
from ..findings import Cause, Finding
from ..kinds import Kind, as_kind
from .axes import choice
from .evidence import tolerance


def _rows(axis: str, names: tuple[str, ...]) -> dict[str, Finding | None]:
    """The finding each named row of the axes table makes (None for the right one): the
    simulation's choices are the axes' rows, in their names and their words."""
    return {name: _finding_of(axis, name) for name in names}


def _finding_of(axis: str, name: str) -> Finding | None:
    code = choice(axis, name).finding
    return findings.finding(code) if code else None


# Each dimension: the correct row first (no finding), then the mistakes, as the axes table
# names them (:mod:`.axes`): one vocabulary for the simulation and the fitted weights.
COMBINE = _rows("ranks", ("share", "world", "sum", "own"))
MICRO = _rows("micro", ("items", "equal", "last"))
# The reported loss: how ranks' losses combine (report-ranks), or carried across steps.
REPORT = {**_rows("report-ranks", ("share", "own", "sum", "world")), "carried": None}
REPORT["carried"] = _finding_of("report-carry", "carried")
# Stepping per micro-batch is no axis (a pass reads it from the optimizer's calls).
STEPPING: dict[str, Finding | None] = {"once": None, "each": findings.STEP_EACH}


@dataclasses.dataclass(frozen=True)
class Mistake:
    """One way to get data-parallel training wrong; ``prescaled`` marks DDP-style training,
    where each rank's loss is already scaled by ``world_size * n_i / N`` and the right combine
    is a plain average."""

    combine: str = "share"
    micro: str = "items"
    report: str = "share"
    prescaled: bool = False
    stepping: str = "once"

    def causes(
        self, *, unit: str = "sample", evidence: str = "", whole: str = findings.WHOLE_MEAN
    ) -> list[Cause]:
        """A cause for each of this mistake's wrong choices: the gradient's (how ranks
        combine, how micro-batches weigh, when the optimizer steps), then the loss's."""
        found: list[Cause] = []
        combine = COMBINE[self.combine]
        if self.prescaled and self.combine == "world":
            combine = None  # a plain average is right after DDP-style scaling
        if self.prescaled and self.combine == "sum":
            # Each rank's loss was already scaled to its share: summing is scaling by W.
            found.append(Cause(findings.SUMMED_NOT_DIVIDED_BY_WORLD, "gradient", "scale", evidence))
        elif combine is not None:
            found.append(combine.cause(evidence=evidence, unit=unit))
        for finding in (MICRO[self.micro], REPORT[self.report], STEPPING[self.stepping]):
            if finding is not None:
                found.append(finding.cause(evidence=evidence, unit=unit, whole=whole))
        return sorted(found, key=lambda c: c.subject != "gradient")

    @property
    def findings(self) -> list[str]:
        """The codes of what this mistake gets wrong (fewest first sorts the candidates)."""
        return [c.pattern for c in self.causes()]


def _combine_family() -> list[Mistake]:
    return [Mistake(combine=c) for c in ("world", "sum", "own")]


def _report_family() -> list[Mistake]:
    return [Mistake(report=r) for r in ("own", "sum", "world", "carried")]


def _prescaled_family() -> list[Mistake]:
    return [Mistake(combine=c, prescaled=True) for c in ("sum", "own")]


def _loss_fn_family() -> list[Mistake]:
    return [
        Mistake(combine=c, micro=m)
        for c, m in itertools.product(COMBINE, MICRO)
        if (c, m) != ("share", "items")
    ]


def _step_family() -> list[Mistake]:
    found = [
        Mistake(combine=c, micro=m, report=r)
        for c, m, r in itertools.product(COMBINE, MICRO, REPORT)
        if (c, m, r) != ("share", "items", "share")
    ]
    # Stepping per micro-batch treats each micro-batch as a batch: no micro-batch weighting.
    return found + [
        Mistake(combine=c, report=r, stepping="each") for c, r in itertools.product(COMBINE, REPORT)
    ]


# The mistakes a kind's code can make, by family (Kind.mistakes names one): the harness owns
# what the kind does not, so only the kind's own choices can be wrong.
FAMILIES: dict[str, Callable[[], list[Mistake]]] = {
    "combine": _combine_family,
    "report": _report_family,
    "prescaled": _prescaled_family,
    "loss-fn": _loss_fn_family,
    "step": _step_family,
    # A coupled loss's mistakes are not simulated: its own probes name them
    # (diagnosis/coupled.py).
    "coupled": list,
}


def candidates(kind: Kind | str) -> list[Mistake]:
    """The mistakes a plug-in of ``kind`` can make, fewest mistakes first."""
    found = FAMILIES[as_kind(kind).mistakes]()
    return sorted(found, key=lambda mistake: len(mistake.findings))


def applies(mistake: Mistake, scenario: Scenario) -> bool:
    """Whether ``scenario`` can be trained that way: stepping per micro-batch needs every rank
    of a step to hold as many micro-batches (else the ranks' collectives do not pair up)."""
    if mistake.stepping == "once":
        return True
    return all(len({len(sizes) for sizes in step}) == 1 for step in scenario.schedule)


def simulate(scenario: Scenario, mistake: Mistake) -> Trace:
    """Train ``scenario`` in float64 the way ``mistake`` does, one replica per rank."""
    if not applies(mistake, scenario):
        raise ValueError(f"{mistake} cannot train {scenario!r}: micro-batch counts differ")
    backward = _stepping_each if mistake.stepping == "each" else _stepping_once
    accumulated = [0.0]  # the global losses reported so far, for the "carried" report

    def step_with_mistake(step: Step) -> list[float]:
        local_means, global_loss = backward(step, mistake)
        accumulated[0] += global_loss
        return [
            _reported(mistake, global_loss, local_means, rank, accumulated[0])
            for rank in range(scenario.world_size)
        ]

    return train(
        scenario,
        step_with_mistake,
        dtype="float64",
        replicas=scenario.world_size,
        name=f"simulated {mistake}",
    )


def _stepping_once(step: Step, mistake: Mistake) -> tuple[list[float], float]:
    """Each rank weights its micro-batches the mistake's way, then gradients are combined
    across ranks; returns each rank's local mean loss and the global mean loss."""
    world = step.scenario.world_size
    # Under a mean, the loss items; under a declared sum, 1 (a batch's loss already sums).
    total = step.normaliser()
    counts = [step.normaliser(rank) for rank in range(world)]
    local_means = []
    for rank, (model, optimizer) in enumerate(zip(step.models, step.optimizers, strict=True)):
        batches = step.micro_batches(rank)
        local_sum = 0.0
        for batch in batches:
            size = step.weight(batch)
            if mistake.micro == "last":
                optimizer.zero_grad(set_to_none=True)
            loss = step.loss(model, batch)
            share = 1 / len(batches) if mistake.micro == "equal" else size / counts[rank]
            if mistake.prescaled:
                share *= world * counts[rank] / total
            (loss * share).backward()
            local_sum += loss.item() * size
        local_means.append(local_sum / counts[rank])
    _combine(step.models, counts, total, mistake)
    return local_means, sum(m * n for m, n in zip(local_means, counts, strict=True)) / total


def _stepping_each(step: Step, mistake: Mistake) -> tuple[list[float], float]:
    """Every micro-batch is a step of its own: each rank's micro-batch mean loss, combined
    across ranks by the micro-batch sizes, then an optimizer step."""
    world = step.scenario.world_size
    per_rank = [step.micro_batches(rank) for rank in range(world)]
    local_sums = [0.0] * world
    for j in range(len(per_rank[0])):
        batches = [per_rank[rank][j] for rank in range(world)]
        sizes = [step.weight(batch) for batch in batches]
        for rank, (model, optimizer) in enumerate(zip(step.models, step.optimizers, strict=True)):
            optimizer.zero_grad(set_to_none=True)
            loss = step.loss(model, batches[rank])
            loss.backward()
            local_sums[rank] += loss.item() * sizes[rank]
        items = sum(step.items(batch) for batch in batches)
        _combine(step.models, sizes, normaliser(step.scenario, items), mistake)
        step.step_optimizers()
    counts = [step.normaliser(rank) for rank in range(world)]
    local_means = [s / n for s, n in zip(local_sums, counts, strict=True)]
    return local_means, sum(local_sums) / step.normaliser()


def _combine(
    models: list[torch.nn.Module], counts: list[int], total: int, mistake: Mistake
) -> None:
    if mistake.combine == "own":
        return
    per_rank = [[p for p in m.parameters() if p.requires_grad] for m in models]
    for params in zip(*per_rank, strict=True):
        grads = [p.grad for p in params]
        if any(g is None for g in grads):
            continue
        if mistake.combine == "share" and not mistake.prescaled:
            combined = sum(g * n for g, n in zip(grads, counts, strict=True)) / total
        elif mistake.combine == "sum":
            combined = sum(grads)
        else:  # "world", or the plain average after DDP-style scaling
            combined = sum(grads) / len(grads)
        for p in params:
            p.grad = combined.clone()


def _reported(
    mistake: Mistake, global_loss: float, local_means: list[float], rank: int, accumulated: float
) -> float:
    return {
        "share": global_loss,
        "own": local_means[rank],
        "sum": sum(local_means),
        "world": sum(local_means) / len(local_means),
        "carried": accumulated,
    }[mistake.report]


def match_tolerance(dtype: str, *, compressed: bool = False) -> Float64Tolerance:
    """How close a run must come to a simulated mistake's to be that mistake: loose on
    purpose, as it need only be told apart from the other mistakes (the tolerance table's
    ``match_rtol``/``match_atol``; a hook that may compress, a few parts in a thousand).

    Example::

        >>> match_tolerance("float64").rtol
        1e-05
    """
    held = tolerance(dtype, compressed=compressed)
    return Float64Tolerance(held.match_rtol, held.match_atol)


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
