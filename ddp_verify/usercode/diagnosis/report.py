"""The diagnosis's words, rendered once from the chosen hypotheses.

An axis hypothesis says one cause per wrong choice, in the words of
:mod:`ddp_verify.usercode.findings`, with the numbers of this run: what each rank's items
counted, each micro-batch's share, the factor; a pass's hypothesis says its own causes. The
alternatives the run could not tell apart go with the first cause of each. A subject nothing
explains is said to be so, with what was measured.

Example::

    causes = render(evidence, chosen, open_subjects)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ...engine.models import one_thread, rank_items
from ...engine.scenario import Scenario
from ...engine.trace import Trace
from .. import findings as f
from ..findings import Cause
from .axes import Choice, Context
from .engine import SUBJECTS, Hypothesis
from .engine import _coefficients as weigh
from .evidence import Evidence, observed_gradients
from .readings import gradient_fits
from .structural import failure_cause
from .weights import WeightFit, fit_gradient

__all__ = ["can_show", "render"]


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else unit + "s"


def render(
    evidence: Evidence,
    chosen: Sequence[tuple[Hypothesis, tuple[Hypothesis, ...]]],
    open_subjects: Sequence[str],
) -> list[Cause]:
    """Every cause of the chosen hypotheses, most important first (what changes the model
    before what is only reported), then what nothing explains; never empty."""
    causes: list[Cause] = []
    fits = _Fits(evidence)
    ordered = sorted(chosen, key=lambda pair: SUBJECTS.index(pair[0].subject))
    for hypothesis, ties in ordered:
        said = _said(evidence, hypothesis, fits)
        if not said:
            continue
        others = tuple(key for tie in ties for key in tie.keys[:1] if key != said[0].key)
        if others:
            said[0] = dataclasses.replace(said[0], alternatives=tuple(dict.fromkeys(others)))
        causes.extend(said)
    for subject in open_subjects:
        if subject == "gradient":
            causes.extend(_nonlinear(evidence, fits))
        elif subject == "loss":
            causes.append(_unexplained_loss(evidence))
    causes = [c for c in causes if can_show(c.pattern, evidence.scenario)]
    if causes:
        return causes
    failed = failure_cause(evidence.kind, evidence.scenario)
    if failed:
        return [failed]
    shown = fits.first()
    read = "are the correct weighting of the samples" if shown else "could not be read"
    return [
        f.UNEXPLAINED.cause(
            evidence=shown.evidence() if shown else "",
            weights=shown.table() if shown else (),
            read=read,
            whole=evidence.whole,
        )
    ]


class _Fits:
    """The least-squares weights of every rank at the first wrong step, fitted once, for
    the numbers the words show."""

    def __init__(self, evidence: Evidence) -> None:
        self.evidence = evidence
        self._fits: list[WeightFit] | None = None

    def all(self) -> list[WeightFit]:
        if self._fits is None:
            e = self.evidence
            self._fits = gradient_fits(e.scenario, e.got, compressed=e.compressed)
        return self._fits

    def first(self) -> WeightFit | None:
        fits = self.all()
        return fits[0] if fits else _first_fit(self.evidence.scenario, self.evidence.got)


def _said(evidence: Evidence, hypothesis: Hypothesis, fits: _Fits) -> list[Cause]:
    if not hypothesis.choices:
        return list(hypothesis.causes)
    if hypothesis.subject == "gradient":
        said = _gradient_causes(evidence, hypothesis, fits)
        tied = hypothesis.detail.get("tied")
        # The parameters the axes were scored without, and why (see passes.tied_repeated).
        return [*said, tied] if tied is not None else said
    return _loss_causes(evidence, hypothesis)


def _gradient_causes(evidence: Evidence, h: Hypothesis, fits: _Fits) -> list[Cause]:
    step = int(h.detail["step"])
    source = int(h.detail.get("source", 0))
    terms = evidence.terms(step)
    factor = float(h.detail["factors"][0]) if h.detail.get("factors") else 1.0
    context = Context(terms.groups, observer=0, source=source)
    coefficients = [float(v) * factor for v in weigh(h.choices, context, terms.groups)]
    groups = terms.groups
    ranks = sorted({g.rank for g in groups})
    total = context.total
    shares = {r: context.items(r) / total for r in ranks}
    totals = {
        r: float(sum(c for c, g in zip(coefficients, groups, strict=True) if g.rank == r))
        for r in ranks
    }
    limit = evidence.tolerance.residual
    fitted = fits.all()
    shown = fitted[0] if fitted else None
    evidence_text = (
        f"every rank's gradient at step {step} is what {h.describe()} predicts, to "
        f"{h.misfit * limit:.1e} of its norm (tolerance {limit:.0e})"
    ) + (f"; {shown.evidence()}" if shown else "")
    if evidence.read_from_update:
        evidence_text += (
            " (the gradient read back from the SGD update, (p0 - p1) / lr: a factor there is "
            "also what more optimizer steps than one, or a scaled learning rate, would give)"
        )
    weights = shown.table() if shown else ()
    said = []
    for choice in h.wrong:
        words = _gradient_words(
            choice, evidence, context, totals, shares, coefficients, factor, source
        )
        said.append(
            Cause(
                words,
                "gradient",
                choice.finding,
                evidence_text,
                weights,
                reading=choice.reading if choice.axis == "scale" else "",
            )
        )
    if shown is not None and not all(fit.identifiable for fit in fitted):
        said = [
            dataclasses.replace(
                c,
                evidence=c.evidence + " (the micro-batches' gradients are linearly dependent "
                "here, at the run's precision, so other weights would explain it as well)",
            )
            for c in said
        ]
    return said


def _gradient_words(
    choice: Choice,
    evidence: Evidence,
    context: Context,
    totals: dict[int, float],
    shares: dict[int, float],
    coefficients: list[float],
    factor: float,
    source: int,
) -> str:
    unit, world, total = evidence.unit, context.world, context.total
    if choice.axis in ("ranks", "micro") and choice.words:
        # A row's own words (a cause added as one row), with the numbers after them.
        finding = f.Finding(choice.finding, "gradient", choice.words)
    else:
        finding = f.finding(choice.finding)
    if choice.axis == "ranks":
        numbers = "; ".join(
            f"rank {r}'s {context.items(r)} {_plural(unit, context.items(r))} counted "
            f"{totals[r]:.4g} in all instead of {shares[r]:.4g}"
            for r in sorted(totals)
            if abs(totals[r] - shares[r]) > 1e-12 * max(1.0, abs(shares[r]))
        )
        tokens = (
            f.PER_RANK_DENOMINATOR.format(unit=unit)
            if unit in f.COUNTED_UNITS and choice.name == "world"
            else ""
        )
        value = next(iter(totals.values()), 0.0)
        words = finding.says(unit=unit, source=source, where="every rank", total=total, value=value)
        return f"{words}{tokens}: {numbers}" if numbers else words
    if choice.axis == "micro":
        words = (
            f.MICRO_EQUAL_COUNTED.format(unit=unit)
            if choice.name == "equal" and unit in f.COUNTED_UNITS
            else finding.says(unit=unit)
        )
        # Where the reading turns on a count the micro-batch holds (the rows a mean divided
        # by, the width it was padded to), that count, per micro-batch of each rank.
        counted = {
            "rows": lambda g: (
                f"divided by {g.samples} {_plural('row', g.samples)}, {g.items} "
                f"{_plural(unit, g.items)} counting"
            ),
            "padded-width": lambda g: (
                f"padded to {g.width}, counted {context.constant / g.width:.3g}x its share"
            ),
        }.get(choice.name)
        if counted is not None:
            said = "; ".join(
                f"rank {r}: "
                + ", ".join(
                    f"micro-batch {g.micro} {counted(g)}" for g in context.groups if g.rank == r
                )
                for r in sorted(totals)
            )
            constant = (
                f", the constant {context.constant:g}" if choice.name == "padded-width" else ""
            )
            return f"{words}{constant}: {said}"
        details = []
        for r in sorted(totals):
            index = [i for i, g in enumerate(context.groups) if g.rank == r]
            rank_total = sum(coefficients[i] for i in index) or 1.0
            parts = ", ".join(
                f"micro-batch {j} ({context.groups[i].items} "
                f"{_plural(unit, context.groups[i].items)}) {coefficients[i] / rank_total:.3g} "
                f"of the rank instead of {context.groups[i].items / context.items(r):.3g}"
                for j, i in enumerate(index)
            )
            details.append(f"rank {r}: {parts}")
        return f"{words}: {'; '.join(details)}"
    if choice.axis == "scale":
        counts = context.micro_counts()
        why = choice.words.format(
            n=total, unit=unit, world=world, m=counts.pop() if len(counts) == 1 else "?"
        )
        return f.SCALE.says(why=why, unit=unit, factor=factor)
    return finding.says(unit=unit)


def _loss_causes(evidence: Evidence, h: Hypothesis) -> list[Cause]:
    unit = evidence.unit
    terms = evidence.terms(0)
    context = Context(terms.groups)
    reported = evidence.reported(0)
    truth = [float(v) for v in evidence.reference.ranks[0].losses[: evidence.steps]]
    evidence_text = (
        f"rank 0 reported {reported[0]:.6g} at step 0, the {evidence.whole} there is "
        f"{truth[0]:.6g}; every step of every rank is what {h.describe()} predicts"
    )
    said = []
    for choice in h.wrong:
        if choice.axis == "report-scale":
            if choice.factor is not None and choice.factor(context) is not None:
                value = choice.factor(context)
                factor = (
                    f"1/N ({value:.4g} at step 0)"
                    if choice.name == "1/N"
                    else f"{value:.4g} at every step"
                )
                why = choice.words.format(world=context.world, unit=unit, n=context.total, step=0)
            else:
                factors = h.detail.get("factors") or (1.0,)
                factor, why = f"{float(factors[0]):.4g} at every step", ""
            text = f.LOSS_SCALED.says(factor=factor, why=why, whole=evidence.whole)
        elif choice.words:
            text = choice.words.format(unit=unit)
        else:
            text = f.finding(choice.finding).says(unit=unit, whole=evidence.whole)
        said.append(
            Cause(
                text,
                "loss",
                choice.finding,
                evidence_text,
                reading=choice.reading if choice.axis == "report-scale" else "",
            )
        )
    return said


def _nonlinear(evidence: Evidence, fits: _Fits) -> list[Cause]:
    fitted = fits.all()
    if not fitted:
        shown = fits.first()
        if shown is None:
            return []
        fitted = [shown]
    worst = max(fitted, key=lambda fit: fit.residual)
    cause = f.NONLINEAR.cause(evidence=worst.evidence(), weights=worst.table(), measured="")
    return [_measured(cause, fitted, evidence.scenario, evidence.reference, evidence.got)]


def _unexplained_loss(evidence: Evidence) -> Cause:
    truth = evidence.reference.ranks[0].losses
    reported = evidence.reported(0)
    steps = ", ".join(
        f"step {s}: {reported[s]:.6g} vs {float(truth[s]):.6g}" for s in range(evidence.steps)
    )
    return f.LOSS_UNEXPLAINED.cause(
        evidence=f"rank 0 reported vs the {evidence.whole}: {steps}", unit=evidence.unit
    )


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


def _first_fit(scenario: Scenario, got: Trace) -> WeightFit | None:
    """Rank 0's fit at step 0, to show the weights when nothing else explains the run."""
    observed = observed_gradients(scenario, got, 0)[0]
    if observed is None:
        return None
    with one_thread():
        return fit_gradient(scenario, observed, 0, rank=0)


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
