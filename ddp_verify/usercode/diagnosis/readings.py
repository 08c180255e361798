"""What least-squares weights show, in the words of :mod:`ddp_verify.usercode.findings`:
which ranks and micro-batches counted for how much, with the numbers (:mod:`.weights`'s).
The diagnosis's catch-all: it names weights that no row of :mod:`.axes` predicts (some
micro-batches dropped, ranks weighted alike but wrongly), and shows the fitted weights as
the evidence of every gradient cause.
"""

from __future__ import annotations

import dataclasses

from ...engine.scenario import Scenario
from ...engine.trace import Trace
from .. import findings as f
from ..findings import Cause
from .evidence import observed_gradients, starts_of
from .weights import WeightFit, close_for, fit_gradient, residual_for

__all__ = [
    "Reading",
    "bounds",
    "explain_fit",
    "gradient_causes",
    "gradient_fits",
    "readings",
]


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else unit + "s"


def _near(value: float, target: float, close: float, scale: float | None = None) -> bool:
    return abs(value - target) <= close * (abs(target) if scale is None else scale) + 1e-15


@dataclasses.dataclass(frozen=True)
class Reading:
    """One explanation of fitted weights: its finding's code, its words, which reading of
    the code it is (``scale:W``) and the other readings the same weights fit (``scale:N``
    where every rank holds one sample)."""

    code: str
    words: str
    reading: str = ""
    alternatives: tuple[str, ...] = ()


def explain_fit(fit: WeightFit, close: float) -> list[tuple[str, str]]:
    """``(code, words)`` for what is wrong with ``fit``'s weights, most telling first; empty
    when every item counted ``1/N``.

    Example::

        explain_fit(fit, 1e-3)
        # [('ranks:world', "gradients averaged over ranks by the world size, ...")]
    """
    return [(r.code, r.words) for r in readings(fit, close)]


def readings(fit: WeightFit, close: float) -> list[Reading]:
    """:func:`explain_fit`'s findings as :class:`Reading`, each with the other readings its
    numbers fit on this scenario (which a scenario where they part must tell apart).

    Example::

        readings(fit, 1e-3)[0].alternatives  # ('scale:N',)
    """
    n = len(fit.groups)
    if all(_near(fit.ratio(i), 1.0, close, 1.0) for i in range(n)):
        return []
    unit, world = fit.unit, fit.world_size
    ranks = sorted({g.rank for g in fit.groups})
    ratios = [fit.ratio(i) for i in range(n)]
    if max(ratios) - min(ratios) <= close * max(1.0, abs(max(ratios))):
        k = ratios[0]
        total = sum(g.items for g in fit.groups)
        micro = {sum(1 for g in fit.groups if g.rank == r) for r in ranks}
        m = micro.pop() if len(micro) == 1 else 0
        # Every count ratio the factor matches, the plainest first.
        fitting = [
            (key, why)
            for key, holds, why in (
                ("W", world > 1 and _near(k, world, close), f.SUMMED_NOT_DIVIDED_BY_WORLD),
                ("1/W", world > 1 and _near(k, 1 / world, close), f.DIVIDED_TWICE),
                (
                    "N",
                    total > 1 and _near(k, total, close),
                    f.SUMMED_OVER_ITEMS.format(n=total, unit=unit),
                ),
                (
                    "N/W",
                    world > 1 and _near(k, total / world, close),
                    f.SUMMED_THEN_WORLD.format(n=total, unit=unit, world=world),
                ),
                ("M", m > 1 and _near(k, m, close), f.MICRO_NOT_DIVIDED.format(m=m)),
                ("1/M", m > 1 and _near(k, 1 / m, close), f.MICRO_DIVIDED_TWICE.format(m=m)),
            )
            if holds
        ]
        key, why = fitting[0] if fitting else ("", f.SCALED)
        return [
            Reading(
                f.SCALE.code,
                f.SCALE.says(why=why, unit=unit, factor=k),
                f"{f.SCALE.code}:{key}" if key else f.SCALE.code,
                tuple(f"{f.SCALE.code}:{other}" for other, _ in fitting[1:]),
            )
        ]
    found: list[Reading] = []
    totals = {r: fit.rank_total(r) for r in ranks}
    shares = {r: fit.rank_items(r) * fit.expected for r in ranks}
    # Micro-batches first: a dropped one also shrinks its rank's total, which is then no
    # mistake of its own; the ranks' weighting is wrong only if the items that did count
    # counted other than 1/N.
    found.extend(_micro_patterns(fit, totals, close))
    counted = [i for i in range(n) if not _near(ratios[i], 0.0, close, 1.0)]
    surviving_right = all(_near(ratios[i], 1.0, close, 1.0) for i in counted)
    wrong_totals = any(not _near(totals[r], shares[r], close, max(shares.values())) for r in ranks)
    if wrong_totals and not (found and surviving_right):
        found.append(_rank_pattern(fit, totals, shares, close))
    return found


def _rank_pattern(
    fit: WeightFit, totals: dict[int, float], shares: dict[int, float], close: float
) -> Reading:
    unit, world, me = fit.unit, fit.world_size, fit.rank
    ranks = sorted(totals)
    nonzero = [r for r in ranks if not _near(totals[r], 0.0, close, 1.0)]
    wrong = [r for r in ranks if not _near(totals[r], shares[r], close, max(shares.values()))]
    numbers = "; ".join(
        f"rank {r}'s {fit.rank_items(r)} {_plural(unit, fit.rank_items(r))} counted "
        f"{totals[r]:.4g} in all instead of {shares[r]:.4g}"
        for r in wrong
    )
    if nonzero == [me] and fit.world_size > 1:
        return Reading(
            f.RANKS_OWN.code,
            f"gradients never synchronised: rank {me}'s gradient is made of its own {unit}s "
            f"only ({numbers})",
        )
    if len(nonzero) == 1 and fit.world_size > 1:
        words = f.RANKS_ONE.says(source=nonzero[0], where=f"rank {me}")
        return Reading(f.RANKS_ONE.code, f"{words} ({numbers})")
    values = list(totals.values())
    same = max(values) - min(values) <= close * max(abs(v) for v in values)
    rows = {r: sum(g.samples for g in fit.groups if g.rank == r) for r in ranks}
    by_rows = {r: rows[r] / sum(rows.values()) for r in ranks}
    total = sum(fit.rank_items(r) for r in ranks)
    tokens = f.PER_RANK_DENOMINATOR.format(unit=unit) if unit in f.COUNTED_UNITS else ""
    # Every weighting of the ranks the totals fit; where ranks hold as many samples, the
    # world size's is the plainest, and a scenario where they part tells which it is.
    fitting = [
        (finding, words)
        for finding, holds, words in (
            (
                f.RANKS_WORLD,
                same and _near(values[0], 1 / world, close),
                f"{f.RANKS_WORLD.says(unit=unit)}{tokens}: {numbers}",
            ),
            (
                f.RANKS_SAMPLES,
                unit == "token" and all(_near(totals[r], by_rows[r], close) for r in ranks),
                f"{f.RANKS_SAMPLES.says()}: {numbers}",
            ),
            (
                f.RANKS_SUM,
                same and _near(values[0], 1.0, close),
                f"{f.RANKS_SUM.says()}: each rank's mean counted 1 in all instead of its share "
                f"of the {unit}s ({numbers})",
            ),
            (
                f.RANKS_MEANS_OVER_COUNT,
                same and _near(values[0], 1 / total, close),
                f"{f.RANKS_MEANS_OVER_COUNT.says(unit=unit, total=total)} ({numbers})",
            ),
            (
                f.RANKS_EQUAL,
                same,
                f"{f.RANKS_EQUAL.says(value=values[0], unit=unit)} ({numbers})",
            ),
            (f.RANKS_OTHER, True, f"{f.RANKS_OTHER.says()}: {numbers}"),
        )
        if holds
    ]
    (finding, words), others = fitting[0], fitting[1:]
    # The catch-alls (any equal weights, any weights) are no reading of their own.
    catch_all = (f.RANKS_EQUAL, f.RANKS_OTHER)
    return Reading(
        finding.code,
        words,
        alternatives=tuple(o.code for o, _ in others if o not in catch_all),
    )


def _micro_patterns(fit: WeightFit, totals: dict[int, float], close: float) -> list[Reading]:
    """Micro-batches weighted wrongly within a rank, whatever the rank's total."""
    unit = fit.unit
    by_rank: dict[int, list[int]] = {}
    for i, g in enumerate(fit.groups):
        by_rank.setdefault(g.rank, []).append(i)
    found: dict[f.Finding, list[int]] = {}
    details: dict[f.Finding, list[str]] = {}
    # Micro-batches weighted equally where each holds as many samples: weighted by samples too.
    by_samples_too = False
    for rank, indices in by_rank.items():
        total = totals[rank]
        if len(indices) < 2 or _near(total, 0.0, close, 1.0):
            continue
        items = fit.rank_items(rank)
        shares = [fit.fitted[i] * fit.groups[i].items / total for i in indices]
        expected = [fit.groups[i].items / items for i in indices]
        if all(_near(s, e, close, 1.0) for s, e in zip(shares, expected, strict=True)):
            continue
        m = len(indices)
        rows = [fit.groups[i].samples for i in indices]
        if all(_near(s, 1 / m, close, 1.0) for s in shares):
            pattern = f.MICRO_EQUAL
            by_samples_too = by_samples_too or (unit == "token" and len(set(rows)) == 1)
        elif unit == "token" and all(
            _near(s, r / sum(rows), close, 1.0) for s, r in zip(shares, rows, strict=True)
        ):
            pattern = f.MICRO_SAMPLES
        elif all(_near(s, 0.0, close, 1.0) for s in shares[:-1]) and _near(shares[-1], 1, close):
            pattern = f.MICRO_LAST_ONLY
        elif any(_near(s, 0.0, close, 1.0) for s in shares):
            pattern = f.MICRO_DROPPED
        else:
            pattern = f.MICRO_OTHER
        found.setdefault(pattern, []).append(rank)
        details.setdefault(pattern, []).append(
            f"rank {rank}: "
            + ", ".join(
                f"micro-batch {j} ({fit.groups[i].items} {_plural(unit, fit.groups[i].items)}) "
                f"{s:.3g} of the rank instead of {e:.3g}"
                for j, (i, s, e) in enumerate(zip(indices, shares, expected, strict=True))
            )
        )

    def words(finding: f.Finding) -> str:
        if finding is f.MICRO_EQUAL and unit in f.COUNTED_UNITS:
            return f.MICRO_EQUAL_COUNTED.format(unit=unit)
        return finding.says()

    def alternatives(finding: f.Finding) -> tuple[str, ...]:
        if finding is f.MICRO_EQUAL and by_samples_too and f.MICRO_SAMPLES not in found:
            return (f.MICRO_SAMPLES.code,)
        return ()

    order = (f.MICRO_LAST_ONLY, f.MICRO_EQUAL, f.MICRO_SAMPLES, f.MICRO_DROPPED, f.MICRO_OTHER)
    return [
        Reading(p.code, f"{words(p)}: {'; '.join(details[p])}", alternatives=alternatives(p))
        for p in order
        if p in found
    ]


def bounds(scenario: Scenario, compressed: bool) -> tuple[float, float]:
    """How close a weight must be, and how small the residual, for this run: a comm hook
    may compress (float16 rounds each contribution by 2^-11 and the sum again), which moves
    fitted weights by a few parts in a thousand to a percent."""
    close, limit = close_for(scenario.dtype), residual_for(scenario.dtype)
    return (max(close, 3e-2), max(limit, 5e-2)) if compressed else (close, limit)


def gradient_fits(scenario: Scenario, got: Trace, *, compressed: bool = False) -> list[WeightFit]:
    """Every rank's fit at the first step whose gradients some rank got wrong (empty when
    no step's gradient can be read or every one is right)."""
    close, limit = bounds(scenario, compressed)
    for step in range(got.steps):
        observed = observed_gradients(scenario, got, step)
        if any(g is None for g in observed):
            return []
        starts = starts_of(scenario, got, step)
        fits = [
            fit_gradient(
                scenario,
                g,  # type: ignore[arg-type]
                step,
                rank=r,
                starts=starts,
                compressed=compressed,
            )
            for r, g in enumerate(observed)
        ]
        if any(explain_fit(fit, close) or fit.residual > limit for fit in fits):
            return fits
    return []


def gradient_causes(
    scenario: Scenario, fits: list[WeightFit], *, compressed: bool = False
) -> list[Cause]:
    """What the fitted weights say is wrong with the gradients, one cause per finding (said
    once when every rank shows it), most telling first; a cause saying the gradient is not a
    weighted sum of the micro-batches' when the fit does not hold."""
    if not fits:
        return []
    close, limit = bounds(scenario, compressed)
    if any(fit.residual > limit for fit in fits):
        worst = max(fits, key=lambda fit: fit.residual)
        return [f.NONLINEAR.cause(evidence=worst.evidence(), weights=worst.table(), measured="")]
    per_rank = [(fit, readings(fit, close)) for fit in fits]
    patterns = [tuple(r.code for r in found) for _, found in per_rank]
    if len(fits) > 1 and all(p == (f.RANKS_OWN.code,) for p in patterns):
        first = fits[0]
        evidence = "; ".join(fit.evidence() for fit in fits)
        return [f.RANKS_OWN.cause(evidence=evidence, weights=first.table(), unit=first.unit)]
    sources = {_only_source(fit, close) for fit in fits}
    if len(fits) > 1 and len(sources) == 1 and None not in sources:
        (source,) = sources
        last = fits[-1]
        return [
            f.RANKS_ONE.cause(
                f": the other ranks' {last.unit}s counted 0",
                evidence=last.evidence(),
                weights=last.table(),
                source=source,
                where="every rank",
            )
        ]
    unsynced = _unsynced(fits, close)
    if unsynced is not None:
        local, shared = unsynced
        last = fits[-1]
        return [
            f.MICRO_UNSYNCED.cause(
                evidence="; ".join(fit.evidence() for fit in fits),
                weights=last.table(),
                local=", ".join(map(str, local)),
                shared=", ".join(map(str, shared)),
            )
        ]
    seen: dict[str, Cause] = {}
    for fit, found in per_rank:
        for reading in found:
            pattern = reading.code
            if pattern in seen:
                continue
            same = all(pattern in p for p in patterns)
            where = "" if same or len(fits) == 1 else f" (on rank {fit.rank})"
            seen[pattern] = Cause(
                reading.words + where,
                "gradient",
                pattern,
                fit.evidence(),
                fit.table(),
                reading=reading.reading,
                alternatives=reading.alternatives,
            )
    causes = list(seen.values())
    if causes and not all(fit.identifiable for fit in fits):
        causes = [
            dataclasses.replace(
                c,
                evidence=c.evidence + " (the micro-batches' gradients are linearly dependent "
                "here, at the run's precision, so other weights would explain it as well)",
            )
            for c in causes
        ]
    return causes


def _unsynced(fits: list[WeightFit], close: float) -> tuple[list[int], list[int]] | None:
    """The micro-batches every rank kept to itself and those it combined across ranks, where
    the weights show that on every rank: its own micro-batches all counted, the other ranks'
    counted for some micro-batch indices and 0 for the others, the same on every rank."""
    if len(fits) < 2:
        return None
    kept: set[int] | None = None
    combined: set[int] | None = None
    for fit in fits:
        shared: set[int] = set()
        local: set[int] = set()
        for i, g in enumerate(fit.groups):
            zero = _near(fit.ratio(i), 0.0, close, 1.0)
            if g.rank == fit.rank:
                if zero:
                    return None  # a micro-batch of its own left out: another mistake
                continue
            (local if zero else shared).add(g.micro)
        if not local or not shared or local & shared:
            return None
        if kept is not None and (kept != local or combined != shared):
            return None
        kept, combined = local, shared
    assert kept is not None and combined is not None
    return sorted(kept), sorted(combined)


def _only_source(fit: WeightFit, close: float) -> int | None:
    """The one rank whose items carry every weight in ``fit``, if there is one."""
    ranks = sorted({g.rank for g in fit.groups})
    nonzero = [r for r in ranks if not _near(fit.rank_total(r), 0.0, close, 1.0)]
    return nonzero[0] if len(nonzero) == 1 else None
