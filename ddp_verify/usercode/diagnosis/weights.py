"""What each sample (or token) effectively counted for, fitted by least squares: the numbers
a report shows where no row of :mod:`.axes` names the weighting (the words are
:mod:`.readings`').

At a step, every rank starts from known parameters, and what a data-parallel step leaves in
``.grad`` is (for the linear mistakes: weightings, sums, dropped micro-batches, another rank's
gradient) a weighted sum of the micro-batches' mean-loss gradients there. The correct
weighting gives each loss item (sample, or token that counts) ``1/N`` of the global batch's
``N``. :func:`fit_gradient` fits those weights over the micro-batches' float64 gradients,
whatever form the code took.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...engine.models import build_model, one_thread
from ...engine.scenario import Scenario
from .evidence import Group, Params, flatten, group_terms, tolerance, unit_of


def close_for(dtype: str) -> float:
    """How close (relative) a fitted weight must come to a pattern's: the tolerance table's."""
    return tolerance(dtype).close


def determined_for(dtype: str, *, compressed: bool = False) -> float:
    """The smallest ratio of a fit's singular values (smallest to largest) at which its
    weights are determined to a pattern's closeness, given the rounding a ``dtype`` gradient
    carries (``compressed``: by a hook that may compress it): below it, they are not (the fit
    is rank-deficient at that precision).

    Example::

        >>> determined_for("float64") < determined_for("float32") < determined_for("bfloat16")
        True
    """
    at = tolerance(dtype, compressed=compressed)
    return at.noise / at.close


def residual_for(dtype: str) -> float:
    """The share of a gradient a fit may leave unexplained: the tolerance table's."""
    return tolerance(dtype).residual


@dataclasses.dataclass(frozen=True)
class WeightFit:
    """The per-item weight each micro-batch carried in one rank's gradient at ``step``.

    ``expected`` is ``1/N`` for every group; ``residual`` is the share of the observed
    gradient that no weighting of the micro-batches explains (near 0: the fit holds);
    ``identifiable`` is False when the micro-batches' gradients are linearly dependent at the
    observed gradient's precision (:func:`determined_for`), so that other weights would
    explain it as well.
    """

    world_size: int
    rank: int
    step: int
    groups: tuple[Group, ...]
    fitted: tuple[float, ...]
    expected: float
    residual: float
    identifiable: bool
    unit: str = "sample"

    def ratio(self, index: int) -> float:
        return self.fitted[index] / self.expected

    def rank_total(self, rank: int) -> float:
        """The weight rank ``rank``'s items carried together (its share of the gradient)."""
        return sum(
            w * g.items for w, g in zip(self.fitted, self.groups, strict=True) if g.rank == rank
        )

    def rank_items(self, rank: int) -> int:
        return sum(g.items for g in self.groups if g.rank == rank)

    def table(self) -> tuple[dict[str, Any], ...]:
        """Every group's fitted and expected per-item weight, for reports and ``--json``."""
        return tuple(
            {
                "rank": g.rank,
                "micro_batch": g.micro,
                "items": g.items,
                "weight": w,
                "expected": self.expected,
            }
            for g, w in zip(self.groups, self.fitted, strict=True)
        )

    def evidence(self) -> str:
        per = ", ".join(
            f"rank {g.rank} mb {g.micro}: {g.items} x {w:.4g}"
            for g, w in zip(self.groups, self.fitted, strict=True)
        )
        return (
            f"weights fitted to rank {self.rank}'s gradient at step {self.step} (per {self.unit}, "
            f"expected {self.expected:.4g} each; residual {self.residual:.1e}): {per}"
        )


def fit_gradient(
    scenario: Scenario,
    observed: Mapping[str, torch.Tensor | None],
    step: int = 0,
    *,
    rank: int = 0,
    starts: Sequence[Params | None] | None = None,
    compressed: bool = False,
) -> WeightFit:
    """The weights that explain ``observed`` (``rank``'s ``.grad`` by parameter name at
    ``step``, every rank having started it from ``starts``) as a weighted sum of the
    micro-batches' mean gradients; ``compressed``: it came through a comm hook that may
    compress it, whose rounding the weights inherit too.

    Example::

        fit = fit_gradient(outcome.scenario, outcome.got.ranks[3].grads[0], rank=3)
        print(explain_fit(fit, 1e-3))
    """
    groups, columns, _ = group_terms(scenario, step, starts)
    with one_thread():
        model = build_model(scenario, "float64")
        target = flatten(model, observed).to(torch.float64)
        solution = torch.linalg.lstsq(columns, target.unsqueeze(1), driver="gelsd").solution
        coefficients = solution.squeeze(1)
        scale = float(target.norm()) or 1.0
        residual = float((columns @ coefficients - target).norm()) / scale
        # Weights are determined to a pattern's closeness only where the observed gradient's
        # rounding, amplified by how near the micro-batches' gradients come to dependence,
        # stays below it: a fit at a float32 counterexample of a one-feature model is not.
        determined = determined_for(scenario.dtype, compressed=compressed)
        matrix_rank = int(torch.linalg.matrix_rank(columns, rtol=determined))
        if matrix_rank < len(groups):
            # Many weightings explain it equally well, and least squares picks the smallest,
            # not the true one: the simplest structured weighting that explains it instead.
            structured = _structured(groups, rank, columns, target, residual_for(scenario.dtype))
            if structured is not None:
                coefficients, residual = structured
    total = sum(g.items for g in groups)
    return WeightFit(
        world_size=scenario.world_size,
        rank=rank,
        step=step,
        groups=tuple(groups),
        fitted=tuple(float(c) / g.items for c, g in zip(coefficients, groups, strict=True)),
        expected=1 / total,
        residual=residual,
        identifiable=matrix_rank == len(groups),
        unit=unit_of(scenario),
    )


def _structured(
    groups: list[Group], rank: int, columns: torch.Tensor, target: torch.Tensor, limit: float
) -> tuple[torch.Tensor, float] | None:
    """Each group's total weight under the simplest weighting of ranks (by share, 1/world
    size, summed, over the global count, this rank alone, one rank alone; or the right one
    scaled) and of micro-batches within a rank (by items, equally, last only, by samples) that
    explains ``target`` to within ``limit``; None if none does."""
    items = torch.tensor([float(g.items) for g in groups], dtype=torch.float64)
    rows = torch.tensor([float(g.samples or g.items) for g in groups], dtype=torch.float64)
    ranks = sorted({g.rank for g in groups})
    of = torch.tensor([g.rank for g in groups])
    per_rank = {r: (of == r) for r in ranks}
    last = torch.tensor(
        [g.micro == max(h.micro for h in groups if h.rank == g.rank) for g in groups],
        dtype=torch.float64,
    )
    total = float(items.sum())

    def micro(mode: str) -> torch.Tensor:
        weights = {"items": items, "equal": torch.ones_like(items), "last": last, "samples": rows}
        share = torch.zeros(len(groups), dtype=torch.float64)
        for mask in per_rank.values():
            share[mask] = weights[mode][mask] / weights[mode][mask].sum()
        return share

    def by_rank(mode: str) -> torch.Tensor:
        out = torch.zeros(len(groups), dtype=torch.float64)
        for r, mask in per_rank.items():
            held = float(items[mask].sum())
            value = {
                "share": held / total,
                "world": 1 / len(ranks),
                "sum": 1.0,
                "means-over-count": 1 / total,
                "own": 1.0 if r == rank else 0.0,
            }.get(mode)
            if value is None:  # "one:S": rank S's alone
                value = 1.0 if r == int(mode.split(":")[1]) else 0.0
            out[mask] = value
        return out

    scale = float(target.norm()) or 1.0
    modes = ["share", "world", "sum", "means-over-count", "own"] + [f"one:{r}" for r in ranks]
    for micro_mode in ("items", "equal", "last", "samples"):
        for rank_mode in modes:
            coefficients = by_rank(rank_mode) * micro(micro_mode)
            explained = columns @ coefficients
            if rank_mode == "share" and micro_mode == "items":
                # The right weighting, scaled by k (summed, not averaged: k = world size).
                k = float(explained @ target) / (float(explained @ explained) or 1.0)
                coefficients, explained = coefficients * k, explained * k
            residual = float((explained - target).norm()) / scale
            if residual <= limit:
                return coefficients, residual
    return None
