"""The diagnosis's axes: every choice a data-parallel computation makes, one row each.

A hypothesis about the user's code is one choice per axis its kind owns. Each row names its
axis, the choice, the finding a report makes of it (none for the correct choice), what it costs
to believe (0 right, 1 a named mistake; more where the row fits a free number, as a catch-all
does), and how it weights the loss items: the linear axes predict in closed form from the
micro-batches' gradient and loss columns (:mod:`.engine`). Adding a cause is adding a row.

Example::

    >>> [c.name for c in rows("ranks")][:3]
    ['share', 'world', 'sum']
    >>> choice("scale", "W").reading
    'scale:W'
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

from .. import findings as f

__all__ = [
    "GRADIENT_AXES",
    "LOSS_AXES",
    "Choice",
    "Context",
    "Group",
    "added",
    "applicable",
    "choice",
    "rows",
]


@dataclasses.dataclass(frozen=True)
class Group:
    """One micro-batch of one rank at a step: ``items`` loss items (samples, or tokens that
    count, or sequences that count), ``samples`` rows (blank sequences among them, under a
    sequence mean); ``width``, its padded width where its items are tokens (its longest
    sequence's last counted position), and ``constant``, the declared objective's constant
    (``seq-mean-token-sum-norm:C``), 0 where none."""

    rank: int
    micro: int
    items: int
    samples: int = 0
    width: int = 0
    constant: float = 0.0


@dataclasses.dataclass(frozen=True)
class Context:
    """What a row's weight may depend on: the step's groups, the rank whose result is
    predicted (``observer``) and, for rows about one rank, that rank (``source``)."""

    groups: tuple[Group, ...]
    observer: int = 0
    source: int = 0

    @property
    def world(self) -> int:
        return len({g.rank for g in self.groups})

    @property
    def total(self) -> int:
        return sum(g.items for g in self.groups)

    def items(self, rank: int) -> int:
        return sum(g.items for g in self.groups if g.rank == rank)

    def rows(self, rank: int | None = None) -> int:
        return sum(g.samples for g in self.groups if rank is None or g.rank == rank)

    def pieces(self, rank: int) -> int:
        return sum(1 for g in self.groups if g.rank == rank)

    def last(self, rank: int) -> int:
        return max(g.micro for g in self.groups if g.rank == rank)

    @property
    def constant(self) -> float:
        """The declared objective's constant, 0 where none."""
        return self.groups[0].constant if self.groups else 0.0

    def micro_counts(self) -> set[int]:
        return {self.pieces(r) for r in {g.rank for g in self.groups}}


# A row's weight: of a group (ranks and micro-batch axes), or of the whole (a scale: None
# where the factor is fitted, a free number).
GroupWeight = Callable[[Context, Group], float]
Factor = Callable[[Context], "float | None"]


@dataclasses.dataclass(frozen=True)
class Choice:
    """One choice on one axis. ``finding``: the code a report makes of it ("" for the right
    choice); ``cost``: 0 right, 1 a named mistake, more for a row that fits a free number;
    ``weight``/``factor``: how it weights (see :data:`GroupWeight`, :data:`Factor`);
    ``words``: what the choice is, where the finding's own words need it said (a scale's
    count ratio); ``per_rank``: one row per source rank (rank S's gradient used on all);
    ``free``: the row fixes which items count, not how much (fitted), as a rank's own
    gradient does when DDP-style training has already scaled it; ``tokens``: only where
    samples and tokens part; ``unit``: only where the loss items are that unit
    (``"sequence"``); ``accumulating``: only where some rank holds several micro-batches;
    ``sums``: only under a declared sum."""

    axis: str
    name: str
    finding: str = ""
    cost: float = 1.0
    weight: GroupWeight | None = None
    factor: Factor | None = None
    words: str = ""
    per_rank: bool = False
    free: bool = False
    tokens: bool = False
    unit: str = ""
    accumulating: bool = False
    sums: bool = False

    @property
    def right(self) -> bool:
        return not self.finding

    @property
    def reading(self) -> str:
        """How a report names this reading: the finding, with the row where the finding
        has several (``scale:W``)."""
        if self.axis in ("scale", "report-scale"):
            return f"{self.finding}:{self.name}"
        return self.finding


# The weightings the gradient's and the reported loss's axes share, named once.
def _share(c: Context, g: Group) -> float:
    return c.items(g.rank) / c.total


def _by_world(c: Context, g: Group) -> float:
    return 1 / c.world


def _summed(c: Context, g: Group) -> float:
    return 1.0


def _over_count(c: Context, g: Group) -> float:
    return 1 / c.total


def _own(c: Context, g: Group) -> float:
    return float(g.rank == c.observer)


def _by_items(c: Context, g: Group) -> float:
    return g.items / c.items(g.rank)


def _equally(c: Context, g: Group) -> float:
    return 1 / c.pieces(g.rank)


def _last_only(c: Context, g: Group) -> float:
    return float(g.micro == c.last(g.rank))


def _shares(c: Context, g: Group) -> float:
    # Under a declared sum the columns are each group's mean times the step's items, so the
    # right weight of a rank is its share; weighting its sum by its share again squares it.
    return _share(c, g) ** 2


RANKS: tuple[Choice, ...] = (
    Choice("ranks", "share", cost=0.0, weight=_share),
    Choice("ranks", "world", f.RANKS_WORLD.code, weight=_by_world),
    Choice("ranks", "sum", f.RANKS_SUM.code, weight=_summed),
    Choice(
        "ranks",
        "means-over-count",
        f.RANKS_MEANS_OVER_COUNT.code,
        weight=_over_count,
    ),
    Choice(
        "ranks",
        "samples",
        f.RANKS_SAMPLES.code,
        weight=lambda c, g: c.rows(g.rank) / c.rows(),
        tokens=True,
    ),
    Choice("ranks", "shares", f.RANKS_SHARES.code, weight=_shares, sums=True),
    Choice(
        "ranks",
        "own",
        f.RANKS_OWN.code,
        weight=_own,
        free=True,
        cost=1.5,
    ),
    Choice(
        "ranks",
        "one",
        f.RANKS_ONE.code,
        weight=lambda c, g: float(g.rank == c.source),
        per_rank=True,
        free=True,
        cost=1.5,
    ),
)

MICRO: tuple[Choice, ...] = (
    Choice("micro", "items", cost=0.0, weight=_by_items),
    Choice(
        "micro",
        "equal",
        f.MICRO_EQUAL.code,
        weight=_equally,
        accumulating=True,
    ),
    # zero_grad() inside the loop keeps the last micro-batch as the loop weighted it: the
    # whole rank's weight (a plain mean loss), its share of the rank's items, or 1/M (a loss
    # divided by the accumulation steps). One finding: the weight is the loop's, not a
    # second mistake.
    *(
        Choice("micro", name, f.MICRO_LAST_ONLY.code, weight=weight, accumulating=True)
        for name, weight in (
            ("last", _last_only),
            ("last-by-items", lambda c, g: _last_only(c, g) * _by_items(c, g)),
            ("last-equally", lambda c, g: _last_only(c, g) * _equally(c, g)),
        )
    ),
    Choice(
        "micro",
        "samples",
        f.MICRO_SAMPLES.code,
        weight=lambda c, g: g.samples / c.rows(g.rank),
        tokens=True,
        accumulating=True,
    ),
    # A sequence mean over the micro-batch's rows, blank sequences counted (TRL's grpo
    # .mean(), a size(0)): each micro-batch counted equally, its sequences that count
    # items / rows of it. With one micro-batch per rank it is the rank's own such mean.
    # The declared constant replaced by each micro-batch's padded width (verl's fallback,
    # loss_mask.shape[-1]): each counted C / width times what it should. Without a declared
    # constant the row weights as the right one does, at a mistake's cost: never chosen.
    Choice(
        "micro",
        "padded-width",
        f.MICRO_WIDTH.code,
        weight=lambda c, g: _by_items(c, g) * (c.constant / g.width if c.constant else 1.0),
        unit="sequence",
    ),
    Choice(
        "micro",
        "rows",
        f.MICRO_ROWS.code,
        weight=lambda c, g: (g.items / g.samples if g.samples else 0.0) / c.pieces(g.rank),
        unit="sequence",
    ),
)


def _one_micro_count(c: Context) -> float | None:
    counts = c.micro_counts()
    return float(counts.pop()) if len(counts) == 1 else float("nan")


# Factors that are a ratio of counts say what was divided by what (N: the step's loss items,
# W: the world size, M: the micro-batches each rank holds); "k" is any other, fitted.
SCALE: tuple[Choice, ...] = (
    Choice("scale", "1", cost=0.0, factor=lambda c: 1.0),
    Choice(
        "scale", "W", f.SCALE.code, factor=lambda c: c.world, words=f.SUMMED_NOT_DIVIDED_BY_WORLD
    ),
    Choice("scale", "1/W", f.SCALE.code, factor=lambda c: 1 / c.world, words=f.DIVIDED_TWICE),
    Choice("scale", "N", f.SCALE.code, factor=lambda c: c.total, words=f.SUMMED_OVER_ITEMS),
    Choice(
        "scale", "1/N", f.SCALE.code, factor=lambda c: 1 / c.total, words=f.DIVIDED_BY_COUNT_TWICE
    ),
    Choice(
        "scale", "N/W", f.SCALE.code, factor=lambda c: c.total / c.world, words=f.SUMMED_THEN_WORLD
    ),
    Choice(
        "scale",
        "M",
        f.SCALE.code,
        factor=_one_micro_count,
        words=f.MICRO_NOT_DIVIDED,
        accumulating=True,
    ),
    Choice(
        "scale",
        "1/M",
        f.SCALE.code,
        factor=lambda c: 1 / _one_micro_count(c),  # type: ignore[operator]
        words=f.MICRO_DIVIDED_TWICE,
        accumulating=True,
    ),
    # Any other factor: fitted, so it costs more than a count ratio that fits as well.
    Choice("scale", "k", f.SCALE.code, cost=1.5, factor=lambda c: None, words=f.SCALED),
)

# The reported loss: the same axes, weighting the micro-batches' mean losses.
REPORT_RANKS: tuple[Choice, ...] = (
    Choice("report-ranks", "share", cost=0.0, weight=_share),
    Choice(
        "report-ranks",
        "own",
        f.LOSS_LOCAL.code,
        weight=_own,
    ),
    Choice("report-ranks", "sum", f.LOSS_SUM.code, weight=_summed),
    Choice("report-ranks", "world", f.LOSS_WORLD.code, weight=_by_world),
    Choice(
        "report-ranks",
        "items",
        f.LOSS_ITEM_SUM.code,
        weight=lambda c, g: float(c.items(g.rank)),
    ),
    Choice(
        "report-ranks",
        "means-over-count",
        f.LOSS_MEANS_OVER_COUNT.code,
        weight=_over_count,
    ),
    Choice("report-ranks", "shares", f.LOSS_SHARES.code, weight=_shares, sums=True),
)
REPORT_MICRO: tuple[Choice, ...] = (
    Choice("report-micro", "items", cost=0.0, weight=_by_items),
    Choice(
        "report-micro",
        "equal",
        f.LOSS_MICRO_EQUAL.code,
        weight=_equally,
        accumulating=True,
    ),
    Choice(
        "report-micro",
        "last",
        f.LOSS_LAST_ONLY.code,
        weight=_last_only,
        accumulating=True,
    ),
)
REPORT_CARRY: tuple[Choice, ...] = (
    Choice("report-carry", "reset", cost=0.0),
    Choice("report-carry", "carried", f.LOSS_CARRIED.code),
)
REPORT_SCALE: tuple[Choice, ...] = (
    Choice("report-scale", "1", cost=0.0, factor=lambda c: 1.0),
    Choice("report-scale", "W", f.LOSS_SCALED.code, factor=lambda c: c.world, words=f.TIMES_WORLD),
    Choice(
        "report-scale",
        "1/W",
        f.LOSS_SCALED.code,
        factor=lambda c: 1 / c.world,
        words=f.DIVIDED_BY_WORLD_TWICE,
    ),
    Choice(
        "report-scale",
        "1/N",
        f.LOSS_SCALED.code,
        factor=lambda c: 1 / c.total,
        words=f.LOSS_DIVIDED_BY_COUNT_TWICE,
    ),
    Choice("report-scale", "k", f.LOSS_SCALED.code, cost=1.5, factor=lambda c: None),
)

# How precisely the code computes: a hypothesis consistent only within a lower format's
# tolerance says the code computes in it inside (``logits.float()``), which is no mistake
# but costs a little, so that one consistent as run is preferred.
PRECISION: tuple[Choice, ...] = (
    Choice("precision", "as-run", cost=0.0),
    Choice("precision", "float32", cost=0.25),
)

# The axes each subject's hypotheses choose on, in the order a report names them.
GRADIENT_AXES = ("ranks", "micro", "scale")
LOSS_AXES = ("report-ranks", "report-micro", "report-carry", "report-scale")

_ROWS: dict[str, list[Choice]] = {}
for _rows in (
    RANKS,
    MICRO,
    SCALE,
    REPORT_RANKS,
    REPORT_MICRO,
    REPORT_CARRY,
    REPORT_SCALE,
    PRECISION,
):
    for _row in _rows:
        _ROWS.setdefault(_row.axis, []).append(_row)


def rows(axis: str) -> tuple[Choice, ...]:
    """Every choice on ``axis``, the right one first.

    Example::

        >>> rows("report-carry")[1].finding
        'loss:carried'
    """
    return tuple(_ROWS[axis])


@contextlib.contextmanager
def added(row: Choice) -> Iterator[Choice]:
    """``row`` is a choice of its axis while the block runs: a cause is one row.

    Example::

        with added(Choice("scale", "2", "scale", factor=lambda c: 2.0, words="doubled")):
            causes = likely_causes(kind, scenario, reference, got)
    """
    if any(r.name == row.name for r in _ROWS.get(row.axis, ())):
        raise ValueError(f"axis {row.axis!r} already has a choice {row.name!r}")
    _ROWS.setdefault(row.axis, []).append(row)
    try:
        yield row
    finally:
        _ROWS[row.axis].remove(row)


def choice(axis: str, name: str) -> Choice:
    """The row ``name`` of ``axis``; a ``KeyError`` for none.

    Example::

        >>> choice("ranks", "world").finding
        'ranks:world'
    """
    for row in _ROWS.get(axis, ()):
        if row.name == name:
            return row
    raise KeyError(f"no choice {name!r} on axis {axis!r}")


def applicable(
    rows: Sequence[Choice], *, tokens: bool, accumulates: bool, unit: str = "", sums: bool = False
) -> list[Choice]:
    """The rows that can show on a scenario: token rows where samples and tokens part, a
    unit's rows where the loss items are that unit, micro-batch rows where some rank holds
    several, a sum's rows where a sum is declared."""
    return [
        row
        for row in rows
        if (tokens or not row.tokens)
        and (accumulates or not row.accumulating)
        and (not row.unit or row.unit == unit)
        and (sums or not row.sums)
    ]
