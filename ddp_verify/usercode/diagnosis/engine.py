"""The diagnosis's one mechanism: enumerate hypotheses, predict, score, choose.

A hypothesis is one choice per axis a subject owns (:mod:`.axes`), or what a pass
(:mod:`.passes`) found structurally. Axis hypotheses are predicted in closed form: a
gradient as the micro-batches' gradient columns weighted by the choices, a reported loss as
their mean losses weighted alike. Each is scored against the run in units of the dtype's
tolerance (:func:`.evidence.tolerance`): a misfit of at most 1 is consistent. Among the
consistent hypotheses the cheapest wins (0 for each right choice, 1 for each named mistake,
more for a fitted free number), covering every subject that diverged; hypotheses as cheap
and consistent as the winner are its alternatives, which a scenario where their predictions
part tells apart (:func:`separation`).

Example::

    hypotheses = gradient_hypotheses(evidence)
    chosen, open_subjects = choose(hypotheses)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..findings import Cause
from .axes import GRADIENT_AXES, LOSS_AXES, Choice, Context, applicable, rows
from .evidence import Evidence, Terms

__all__ = [
    "Hypothesis",
    "choose",
    "gradient_hypotheses",
    "hypotheses_of",
    "loss_hypotheses",
    "predict_gradient",
    "predict_losses",
    "separation",
]

# The subjects a run can diverge on, in the order a report names them.
SUBJECTS = ("run", "optimizer", "parameters", "gradient", "loss")


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One explanation of a run. ``subject``: what it is chiefly about; ``covers``: every
    subject it explains; ``cost``: what it takes to believe (the sum of its choices'); a
    ``misfit`` of at most 1 is consistent with the run (its prediction is within the dtype's
    tolerance). Axis hypotheses carry their ``choices`` (one per axis); a pass's carries the
    ``causes`` it says. ``detail``: the numbers its words need."""

    subject: str
    covers: frozenset[str]
    cost: float
    misfit: float
    choices: tuple[Choice, ...] = ()
    causes: tuple[Cause, ...] = ()
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: str = ""

    @property
    def consistent(self) -> bool:
        return self.misfit <= 1.0

    @property
    def right(self) -> bool:
        """An axis hypothesis with every choice right (in whatever precision)."""
        return bool(self.choices) and not self.wrong

    @property
    def wrong(self) -> tuple[Choice, ...]:
        return tuple(c for c in self.choices if not c.right)

    @property
    def keys(self) -> tuple[str, ...]:
        """How a report names what it says: its wrong choices' readings, or its causes'."""
        if self.choices:
            return tuple(c.reading for c in self.wrong)
        return tuple(c.key for c in self.causes)

    def describe(self) -> str:
        """Its choices as ``axis=name`` (the wrong ones, and a precision other than the
        run's), or its causes' readings."""
        if self.choices:
            said = [f"{c.axis}={c.name}" for c in self.choices if c.cost > 0]
            return ", ".join(said) + " (every other choice right)" if said else "every choice right"
        return ", ".join(self.keys) or self.source


def _cost(choices: Iterable[Choice]) -> float:
    return sum(c.cost for c in choices)


def _combinations(
    axes: Sequence[str], evidence: Evidence, extra: Sequence[Choice] = ()
) -> Iterable[tuple[Choice, ...]]:
    tokens = evidence.unit == "token"
    accumulates = evidence.scenario.accumulates
    per_axis = [
        applicable(
            rows(a) + tuple(c for c in extra if c.axis == a),
            tokens=tokens,
            accumulates=accumulates,
            unit=evidence.unit,
            sums=evidence.sums,
        )
        for a in axes
    ]
    return itertools.product(*per_axis)


def _coefficients(
    choices: Sequence[Choice], context: Context, groups: Sequence[Any]
) -> torch.Tensor:
    """Each group's weight under the choices that weight groups (ranks, micro-batches)."""
    weights = [c for c in choices if c.weight is not None]
    return torch.tensor(
        [math.prod(c.weight(context, g) for c in weights) for g in groups],  # type: ignore[misc]
        dtype=torch.float64,
    )


def _factor(choices: Sequence[Choice], context: Context) -> float | None:
    """The overall factor the choices fix, or None where one of them leaves it free."""
    value = 1.0
    for c in choices:
        if c.free:
            return None
        if c.factor is not None:
            factor = c.factor(context)
            if factor is None:
                return None
            value *= factor
    return value


def _fitted(predicted: torch.Tensor, observed: torch.Tensor) -> float:
    """The least-squares factor of ``predicted`` onto ``observed``."""
    denominator = float(predicted @ predicted)
    return float(predicted @ observed) / denominator if denominator > 0 else 1.0


def predict_gradient(
    choices: Sequence[Choice], terms: Terms, observer: int, source: int = 0
) -> tuple[torch.Tensor, float | None]:
    """What ``observer``'s gradient is under ``choices`` (before a free factor is fitted),
    and the factor they fix (None: fitted).

    Example::

        predicted, factor = predict_gradient(choices, evidence.terms(0), observer=1)
    """
    context = Context(terms.groups, observer=observer, source=source)
    coefficients = _coefficients(choices, context, terms.groups)
    return terms.columns @ coefficients, _factor(choices, context)


def _residual(observed: torch.Tensor, predicted: torch.Tensor) -> float:
    scale = max(float(observed.norm()), float(predicted.norm()), 1e-300)
    return float((observed - predicted).norm()) / scale


def gradient_hypotheses(evidence: Evidence, step: int) -> list[Hypothesis]:
    """Every combination of the gradient's axes at ``step``, scored against every rank's
    gradient there (rows about one rank once per rank); only the consistent ones and the
    right one are kept. Empty where the gradients cannot be read.

    Example::

        [h.describe() for h in gradient_hypotheses(evidence, 0) if h.consistent]
        # ['ranks=world, micro=items, scale=1']
    """
    observed = evidence.gradients(step)
    if observed is None:
        return []
    terms = evidence.terms(step)
    kept: list[Hypothesis] = []
    for choices in _combinations(GRADIENT_AXES, evidence):
        if any(c.free for c in choices) and any(
            c.factor is not None and c.name != "1" for c in choices
        ):
            continue  # a free factor already takes any scale
        sources = range(evidence.world) if any(c.per_rank for c in choices) else (0,)
        for source in sources:
            residual, factors = 0.0, []
            for rank, mine in enumerate(observed):
                predicted, factor = predict_gradient(choices, terms, rank, source)
                if factor is None:
                    factor = _fitted(predicted, mine)
                if math.isnan(factor):
                    residual = math.inf
                    break
                factors.append(factor)
                residual = max(residual, _residual(mine, predicted * factor))
            right = all(c.right for c in choices)
            for precision, misfit in _held(evidence, residual, "residual"):
                if misfit <= 1.0 or (right and precision.cost == 0):
                    kept.append(
                        Hypothesis(
                            "gradient",
                            frozenset({"gradient"}),
                            _cost((*choices, precision)),
                            misfit,
                            choices=(*choices, precision),
                            detail={"step": step, "source": source, "factors": tuple(factors)},
                            source="gradient axes",
                        )
                    )
                if misfit <= 1.0:
                    break  # a tighter precision already fits
    return kept


def _held(evidence: Evidence, error: float, field: str) -> Iterable[tuple[Choice, float]]:
    """``error`` in units of each precision's tolerance (``field`` of it), tightest first."""
    for precision, tolerance in evidence.ladder():
        yield precision, error / getattr(tolerance, field)


def predict_losses(
    choices: Sequence[Choice], steps: Sequence[Terms], observer: int
) -> tuple[list[float], list[float] | None]:
    """What ``observer`` reports at every step under ``choices``, before a free factor, and
    each step's fixed factor (None: fitted)."""
    carried = any(c.axis == "report-carry" and not c.right for c in choices)
    values: list[float] = []
    factors: list[float] | None = []
    total = 0.0
    for terms in steps:
        context = Context(terms.groups, observer=observer)
        value = float(_coefficients(choices, context, terms.groups) @ terms.losses)
        factor = _factor(choices, context)
        if factor is None or factors is None:
            factors = None
        else:
            factors.append(factor)
            value *= factor
        total = total + value if carried else value
        values.append(total)
    return values, factors


def loss_hypotheses(evidence: Evidence, extra: Sequence[Choice] = ()) -> list[Hypothesis]:
    """Every combination of the reported loss's axes (and the ``extra`` rows, choices this
    run's other findings make possible), scored against every rank's loss at every step;
    only the consistent ones and the right one are kept."""
    steps = [evidence.terms(s) for s in range(evidence.steps)]
    kept: list[Hypothesis] = []
    for choices in _combinations(LOSS_AXES, evidence, extra):
        error, factors = 0.0, []
        for rank in range(len(evidence.got.ranks)):
            reported = evidence.reported(rank)
            predicted, fixed = predict_losses(choices, steps, rank)
            if fixed is None:
                # One step's ratio is constant by itself: a free factor needs two to show.
                if len(steps) < 2:
                    error = math.inf
                    break
                factor = _fitted(torch.tensor(predicted), torch.tensor(reported))
                predicted = [v * factor for v in predicted]
                factors.append(factor)
            error = max(
                error,
                max(
                    abs(r - p) / max(abs(p), 1e-3) for r, p in zip(reported, predicted, strict=True)
                ),
            )
        right = all(c.right for c in choices)
        for precision, misfit in _held(evidence, error, "loss"):
            if misfit <= 1.0 or (right and precision.cost == 0):
                kept.append(
                    Hypothesis(
                        "loss",
                        frozenset({"loss"}),
                        _cost((*choices, precision)),
                        misfit,
                        choices=(*choices, precision),
                        detail={"factors": tuple(factors)},
                        source="loss axes",
                    )
                )
            if misfit <= 1.0:
                break
    return kept


def choose(
    hypotheses: Sequence[Hypothesis],
) -> tuple[list[tuple[Hypothesis, tuple[Hypothesis, ...]]], list[str]]:
    """The cheapest consistent hypotheses that together explain every subject that diverged,
    each with its alternatives (as cheap, as consistent, explaining the same), and the
    subjects nothing explains. A subject diverged unless a consistent hypothesis with every
    choice right covers it.

    Example::

        chosen, open_subjects = choose(found)
        chosen[0][0].keys  # ('ranks:world',)
    """
    subjects = {s for h in hypotheses for s in h.covers}
    settled = {s for h in hypotheses if h.consistent and h.right for s in h.covers}
    needed = subjects - settled
    pool = [h for h in hypotheses if h.consistent and not h.right]
    chosen: list[tuple[Hypothesis, tuple[Hypothesis, ...]]] = []
    while needed:
        useful = [h for h in pool if h.covers & needed]
        if not useful:
            break
        # Cheapest first; of those, the one that explains most of what is left. Hypotheses
        # alike on both are not told apart by this run: the first (the rows' order, plainest
        # first) is named, the others are its alternatives.
        best = min(useful, key=lambda h: (h.cost, -len(h.covers & needed)))
        ties = tuple(
            h
            for h in useful
            if h is not best
            and h.cost == best.cost
            and h.covers & needed == best.covers & needed
            and h.keys != best.keys
        )
        chosen.append((best, _unique(ties)))
        needed -= best.covers
        pool = [h for h in pool if h is not best and h not in ties]
    return chosen, sorted(needed, key=SUBJECTS.index)


def _unique(hypotheses: Iterable[Hypothesis]) -> tuple[Hypothesis, ...]:
    seen: set[tuple[str, ...]] = set()
    kept = []
    for h in hypotheses:
        if h.keys not in seen:
            seen.add(h.keys)
            kept.append(h)
    return tuple(kept)


def separation(hypotheses: Sequence[Hypothesis], terms: Terms, *, observer: int = 0) -> float:
    """How far apart ``hypotheses``' gradient predictions are on a scenario's ``terms``: the
    smallest relative distance between any two (0: this scenario cannot tell them apart).
    The probe that tells alternatives apart is the one where this is largest.

    Example::

        separation([scale_w, ranks_sum], evidence.terms(0))  # 0.0 on even ranks
    """
    predictions = []
    for h in hypotheses:
        if not h.choices or h.subject != "gradient":
            continue
        predicted, factor = predict_gradient(h.choices, terms, observer, h.detail.get("source", 0))
        predictions.append(predicted * (1.0 if factor is None else factor))
    if len(predictions) < 2:
        return 0.0
    return min(_residual(a, b) for a, b in itertools.combinations(predictions, 2))


def hypotheses_of(keys: Sequence[str]) -> list[Hypothesis]:
    """A gradient hypothesis for each of ``keys`` that reads one row of the gradient's axes
    (``ranks:world``, ``scale:W``; the other axes right), to predict where readings a run
    could not tell apart part; keys of no such row are left out.

    Example::

        >>> [h.describe() for h in hypotheses_of(["scale:W", "loss:sum"])]
        ['scale=W (every other choice right)']
    """
    made = []
    for key in keys:
        for axis in GRADIENT_AXES:
            row = next((c for c in rows(axis) if not c.right and c.reading == key), None)
            if row is None or row.per_rank or row.free:
                continue
            choices = tuple(row if a == axis else rows(a)[0] for a in GRADIENT_AXES)
            made.append(
                Hypothesis("gradient", frozenset({"gradient"}), _cost(choices), 0.0, choices)
            )
    return made
