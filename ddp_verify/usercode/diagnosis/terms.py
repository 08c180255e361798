"""Each term's effective weight and aggregation, where the objective has several terms
(:mod:`ddp_verify.engine.terms`): read from the ranks' own gradients, step by step.

At each step, at the parameters the ranks started it from, every term's gradient on the
global batch is one column; the ranks' gradient, least squares over those columns, gives
each term's effective weight. Where that leaves a rest, each term's aggregation is tried in
turn as each other of the table, computed over the step, within each rank, or within each
micro-batch; the reading that leaves no rest with the fewest terms changed is the one kept,
and training it reproduces the run before it is said.

Example::

    reading = read_terms(scenario, got)
    [str(t) for t in reading.changed()]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from ...engine.models import build_data, loss_function
from ...engine.objectives import Objective, objective
from ...engine.scenario import Scenario
from ...engine.term_values import aggregated, term_factor, term_losses
from ...engine.terms import MICRO, PER, Term, term_sum
from ...engine.trace import Trace
from ...engine.training import Step, train
from .evidence import _model_at, flatten, observed_gradients, starts_of

__all__ = ["Reading", "TermReading", "read_terms", "train_reading"]

# The aggregations a term is tried as, beside its own.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum")


@dataclasses.dataclass(frozen=True)
class TermReading:
    """How the run weighted one term: the ``aggregation`` it computed, ``per`` which piece
    (:data:`ddp_verify.engine.terms.PER`), its effective weight at each step, and the term
    as computed (``computed``: its mask left out where the code counted every token)."""

    term: Term
    aggregation: Objective
    per: str
    # None where the term had no gradient at the step (nothing in its mask): any weight.
    weights: tuple[float | None, ...]
    computed: Term

    @property
    def unmasked(self) -> bool:
        """Whether the code counted every counted token where the term declares a mask."""
        return self.computed.mask != self.term.mask

    @property
    def declared_per(self) -> str:
        return MICRO if self.term.micro else "step"

    @property
    def aggregates_as_declared(self) -> bool:
        same = self.aggregation == self.term.aggregation and self.per == self.declared_per
        return same and not self.unmasked

    def factors(self) -> tuple[float | None, ...]:
        """Each step's effective weight over the declared one (None: any)."""
        return tuple(None if w is None else w / self.term.weight for w in self.weights)

    def weight_at(self, step: int) -> float:
        """The weight to train step ``step`` with: as read, or as declared where any is."""
        weight = self.weights[step]
        return self.term.weight if weight is None else weight

    def as_declared(self, rtol: float) -> bool:
        return self.aggregates_as_declared and all(
            f is None or abs(f - 1) <= rtol for f in self.factors()
        )

    def words(self, scenario: Scenario) -> str:
        """The reading, as a report says it, with what the factor is where it is a count
        of the scenario (the accumulation steps, the world size)."""
        name = f"the {self.term.name} term"
        said = ""
        if not self.aggregates_as_declared:
            computed = _aggregation_words(self.aggregation, self.per)
            declared = _aggregation_words(self.term.aggregation, self.declared_per)
            if self.unmasked:
                computed += " over every counted token"
                declared += f" over its mask {self.term.mask}"
            said = f"{name} computes {computed} where {declared} was declared"
        factors = [f for f in self.factors() if f is not None]
        if said and all(_near(f, 1.0) for f in factors):
            return said
        weight = f"{self.term.weight:g}"
        first = factors[0]
        if all(_near(f, first) for f in factors):
            counts = f"counts {first:.4g}x its declared weight {weight}"
            if _near(first, 0.0):
                counts = f"is left out (counts 0x its declared weight {weight})"
        else:
            steps = ", ".join(
                f"{f:.4g}x at step {s}" for s, f in enumerate(self.factors()) if f is not None
            )
            counts = f"counts {steps} its declared weight {weight}"
        why = factor_reason(scenario, self.factors(), self.per)
        counts += f" ({why})" if why else ""
        return f"{said}, and {counts}" if said else f"{name} {counts}"


def _near(value: float, target: float) -> bool:
    # Loose enough for a float32 run's fit; counts' ratios lie much further apart.
    return abs(value - target) <= 1e-4 * max(1.0, abs(target))


def factor_reason(scenario: Scenario, factors: Sequence[float | None], per: str = "step") -> str:
    """What ``factors`` (one per step; None: any) are where each is a count of its step:
    the steps k of its window and their inverse (where steps share windows), the
    micro-batches of every rank M x W (first for a term read ``per`` micro-batch), the
    accumulation steps M, the world size W, their inverses, -1; "" otherwise.

    Example::

        factor_reason(scenario, [2.0, 3.0])  # 'x M, the accumulation steps: ...'
    """
    world = scenario.world_size
    micro = [len(scenario.schedule[s][0]) for s in range(len(factors))]
    windows = [float(len(scenario.window_of(s))) for s in range(len(factors))]
    said = (
        (
            [1.0 / k for k in windows] if scenario.window > 1 else [],
            "/ k, the steps of its window: divided by the window's whole count where its count "
            "per step was declared",
        ),
        (
            windows if scenario.window > 1 else [],
            "x k, the steps of its window: divided by the window's count per step where its "
            "whole count was declared",
        ),
        (
            # Said first where the term is read per micro-batch: with one micro-batch a
            # rank it is W, and the words say what the code did.
            [float(m * world) for m in micro] if per == MICRO or max(micro) > 1 else [],
            "x M x W, the micro-batches of every rank: each one's value summed, never divided "
            "by their number",
        ),
        (
            [float(m) for m in micro],
            "x M, the micro-batches each rank accumulates: multiplied by the accumulation "
            "steps, or never divided by them",
        ),
        ([1.0 / m for m in micro], "/ M: divided by the accumulation steps once too often"),
        ([float(world)] * len(factors), "x W: multiplied by the world size once too often"),
        ([1.0 / world] * len(factors), "/ W: divided by the world size once too often"),
        ([-1.0] * len(factors), "its sign flipped: added where subtracted, or the reverse"),
    )
    for expected, words in said:
        if not expected:
            continue
        pairs = [(f, e) for f, e in zip(factors, expected, strict=True) if f is not None]
        if {e for _, e in pairs} != {1.0} and all(_near(f, e) for f, e in pairs):
            return words
    return ""


@dataclasses.dataclass(frozen=True)
class Reading:
    """Every term's reading; ``rest``: the largest relative rest the fit left at a step."""

    terms: tuple[TermReading, ...]
    rest: float

    def changed(self, rtol: float = 1e-6) -> list[TermReading]:
        """The terms not weighted as declared."""
        return [t for t in self.terms if not t.as_declared(rtol)]


def _aggregation_words(aggregation: Objective, per: str) -> str:
    where = {"step": "", "rank": " within each rank", MICRO: " within each micro-batch"}[per]
    return f"{aggregation}{where}"


def _column(
    scenario: Scenario,
    step: int,
    params: Mapping[str, torch.Tensor] | None,
    choice: tuple[Term, Objective, str],
) -> torch.Tensor:
    """The gradient of ``choice`` (a term, the aggregation it is read as, and ``per`` which
    piece) on ``step``'s global batch at ``params``, flattened, float64."""
    term, aggregation, per = choice
    inputs, targets = build_data(scenario, "float64")[step]
    model = _model_at(scenario, params)
    losses, mask = term_losses(term, model(inputs), targets, loss_function(scenario, "none"))
    value = aggregated(scenario, step, aggregation, per, losses, mask)
    if per == "step":
        value = value * term_factor(
            scenario, dataclasses.replace(term, aggregation=aggregation), step
        )
    if value.requires_grad:
        value.backward()
    return flatten(model, {n: p.grad for n, p in model.named_parameters()})


def _changes(choice: tuple[Term, Objective, str], declared: tuple[Term, Objective, str]) -> int:
    return sum(a != b for a, b in zip(choice, declared, strict=True))


def _fit(columns: torch.Tensor, observed: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Least-squares weights of ``columns`` for ``observed``, and the rest relative to it."""
    solution = torch.linalg.lstsq(columns, observed.unsqueeze(1)).solution.squeeze(1)
    rest = float((columns @ solution - observed).norm())
    scale = float(observed.norm())
    return solution, rest / scale if scale else rest


def read_terms(scenario: Scenario, got: Trace, rtol: float) -> Reading | None:
    """The reading of ``got``'s gradients that leaves a rest within ``rtol`` at every step,
    with the fewest terms aggregating otherwise than declared; None where none does (or the
    ranks' gradients are not to be had)."""
    terms = term_sum(scenario.terms).terms
    declared = [(t, t.aggregation, MICRO if t.micro else "step") for t in terms]
    readings = [declared]
    for term in terms:
        # Over its own mask, then (where it has one) over every counted token.
        for over in (term, dataclasses.replace(term, mask="")) if term.mask else (term,):
            for name in AGGREGATIONS:
                for per in PER:
                    other = objective(name)
                    if (over, other, per) == declared[term.index]:
                        continue
                    choice = list(declared)
                    choice[term.index] = (over, other, per)
                    readings.append(choice)
    # The fewest changes first (of the mask, the aggregation, where it is computed): where
    # two readings fit alike (within each rank and within each micro-batch, for one
    # micro-batch a rank), the nearer to the declaration is said.
    readings.sort(
        key=lambda choice: sum(_changes(c, d) for c, d in zip(choice, declared, strict=True))
    )
    observed = [observed_gradients(scenario, got, s)[0] for s in range(scenario.steps)]
    if any(o is None for o in observed):
        return None
    model = _model_at(scenario, None)
    wanted = [flatten(model, o) for o in observed if o is not None]
    starts = [starts_of(scenario, got, step)[0] for step in range(scenario.steps)]
    # Each term's reading differs from the declared in one term: a column, once computed,
    # serves every reading that holds it.
    known: dict[tuple[int, tuple[Term, Objective, str]], torch.Tensor] = {}

    def column(step: int, choice: tuple[Term, Objective, str]) -> torch.Tensor:
        if (step, choice) not in known:
            known[step, choice] = _column(scenario, step, starts[step], choice)
        return known[step, choice]

    for choice in readings:
        weights: list[list[float | None]] = [[] for _ in terms]
        worst = 0.0
        for step in range(scenario.steps):
            columns = torch.stack([column(step, c) for c in choice], dim=1)
            solution, rest = _fit(columns, wanted[step])
            worst = max(worst, rest)
            if rest > rtol:
                break
            for k, w in enumerate(solution.tolist()):
                # A term with no gradient at a step (nothing in its mask) says nothing of
                # its weight there: read as declared.
                weights[k].append(w if bool(columns[:, k].any()) else None)
        else:
            return Reading(
                tuple(
                    TermReading(terms[k], aggregation, per, tuple(weights[k]), computed)
                    for k, (computed, aggregation, per) in enumerate(choice)
                ),
                worst,
            )
    return None


def train_reading(scenario: Scenario, reading: Reading) -> Trace:
    """``scenario`` trained on one process, each term as ``reading`` says (its aggregation,
    and its effective weight at each step), float64: what code that weighs the terms so
    trains."""

    def backward(step: Step) -> list[float]:
        per_token = loss_function(scenario, "none")
        logits = step.model(step.inputs)
        total = torch.zeros((), dtype=torch.float64)
        for read in reading.terms:
            losses, mask = term_losses(read.computed, logits, step.targets, per_token)
            value = aggregated(scenario, step.index, read.aggregation, read.per, losses, mask)
            if read.per == "step":
                replaced = dataclasses.replace(read.computed, aggregation=read.aggregation)
                value = value * term_factor(scenario, replaced, step.index)
            total = total + read.weight_at(step.index) * value
        total.backward()
        return [total.item()]

    return train(scenario, backward, dtype="float64", name="terms as read")
