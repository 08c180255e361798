"""What each sample (or token) effectively counted for: the numbers (the words are
:mod:`ddp_verify.usercode.explain`'s).

At a step, every rank starts from known parameters, and what a data-parallel step leaves in
``.grad`` is (for the linear mistakes: weightings, sums, dropped micro-batches, another rank's
gradient) a weighted sum of the micro-batches' mean-loss gradients there; the loss a rank
reports is likewise a weighted sum of the micro-batches' mean losses. The correct weighting
gives each loss item (sample, or token that counts) ``1/N`` of the global batch's ``N``.

:func:`fit_gradient` fits the gradient's weights by least squares over the micro-batches'
float64 gradients, whatever form the code took. :func:`fit_losses` holds the loss a rank
reports, one number per step, against every weighting of ranks (by share, 1/world size,
summed, its own only, item sums) and micro-batches (by items, equally, last only), carried
over steps or not.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..engine.models import (
    build_data,
    build_model,
    count_items,
    loss_function,
    micro_batches,
    one_thread,
)
from ..engine.scenario import Scenario
from ..engine.tolerances import by_roundoff
from ..engine.trace import Trace

Params = Mapping[str, torch.Tensor]

# How close (relative) a weight must come to a pattern's to be that pattern, as measured: the
# fit of a float64 run is exact to ~1e-12; float32 gradients carry ~1e-6 of rounding; bfloat16
# ~1e-2. Other dtypes get theirs from the unit roundoff (engine.tolerances.by_roundoff).
CLOSE = {"float64": 1e-3, "float32": 1e-3, "bfloat16": 3e-2}
# A fit explains the gradient when what it leaves over is below this share of it.
RESIDUAL = {"float64": 1e-6, "float32": 1e-3, "bfloat16": 5e-2}
# A reported loss is reproduced by a weighting when it is this close (relative) at every step.
LOSS_RTOL = {"float64": 1e-7, "float32": 1e-4, "bfloat16": 3e-2}


def close_for(dtype: str) -> float:
    """:data:`CLOSE` for ``dtype``, derived where it was not measured."""
    return by_roundoff(dtype, CLOSE)


def residual_for(dtype: str) -> float:
    """:data:`RESIDUAL` for ``dtype``, derived where it was not measured."""
    return by_roundoff(dtype, RESIDUAL)


@dataclasses.dataclass(frozen=True)
class Group:
    """One micro-batch of one rank at the fitted step: ``items`` loss items (samples, or
    tokens that count)."""

    rank: int
    micro: int
    items: int
    samples: int = 0


@dataclasses.dataclass(frozen=True)
class WeightFit:
    """The per-item weight each micro-batch carried in one rank's gradient at ``step``.

    ``expected`` is ``1/N`` for every group; ``residual`` is the share of the observed
    gradient that no weighting of the micro-batches explains (near 0: the fit holds);
    ``identifiable`` is False when the micro-batches' gradients are linearly dependent, so
    that other weights would explain it as well.
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


def unit_of(scenario: Scenario) -> str:
    """What a loss item is in ``scenario``: ``token`` or ``sample``."""
    return "token" if scenario.loss == "tokens" else "sample"


def _model_at(scenario: Scenario, params: Params | None) -> torch.nn.Module:
    model = build_model(scenario, "float64")
    if params is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in params:
                    p.copy_(params[name].detach().to("cpu", torch.float64))
    return model


def group_terms(
    scenario: Scenario, step: int = 0, starts: Sequence[Params | None] | None = None
) -> tuple[list[Group], torch.Tensor, list[float]]:
    """Every micro-batch of ``step`` (rank-major): its mean-loss gradient, float64, as the
    columns of a ``(parameters, groups)`` matrix, and its mean loss, each at the parameters
    its rank started the step from (``starts[rank]``; the initial ones where None).

    Example::

        groups, columns, losses = group_terms(scenario)
    """
    with one_thread():
        inputs, targets = build_data(scenario, "float64")[step]
        loss_fn = loss_function(scenario)
        groups, columns, losses = [], [], []
        for rank in range(scenario.world_size):
            model = _model_at(scenario, None if starts is None else starts[rank])
            for micro, (x, y) in enumerate(micro_batches(scenario, step, rank, (inputs, targets))):
                model.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                columns.append(flatten(model, {n: p.grad for n, p in model.named_parameters()}))
                losses.append(float(loss.detach()))
                groups.append(Group(rank, micro, count_items(scenario, y), len(y)))
    return groups, torch.stack(columns, dim=1), losses


def group_gradients(scenario: Scenario, step: int = 0) -> tuple[list[Group], torch.Tensor]:
    """The groups and gradient columns of :func:`group_terms` at the initial parameters."""
    groups, columns, _ = group_terms(scenario, step)
    return groups, columns


def fit_gradient(
    scenario: Scenario,
    observed: Mapping[str, torch.Tensor | None],
    step: int = 0,
    *,
    rank: int = 0,
    starts: Sequence[Params | None] | None = None,
) -> WeightFit:
    """The weights that explain ``observed`` (``rank``'s ``.grad`` by parameter name at
    ``step``, every rank having started it from ``starts``) as a weighted sum of the
    micro-batches' mean gradients.

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
        matrix_rank = int(torch.linalg.matrix_rank(columns))
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


def observed_gradients(scenario: Scenario, got: Trace, step: int) -> list[dict | None]:
    """Each rank's gradient at ``step``: recorded, or (SGD at step 0, for step functions that
    keep their gradients to themselves) read back from the update, ``(p0 - p1) / lr`` less
    the weight decay. None where neither can be had (Adam's update is not linear in it)."""
    if got.ranks[0].grads is not None and len(got.ranks[0].grads) > step:
        return [rank.grads[step] for rank in got.ranks]  # type: ignore[index]
    if step != 0 or scenario.optimizer.name != "sgd":
        return [None] * len(got.ranks)
    start = dict(build_model(scenario, "float64").named_parameters())
    lr, decay = scenario.optimizer.lr, scenario.optimizer.weight_decay
    found: list[dict | None] = []
    for rank in got.ranks:
        grads = {}
        for name, after in rank.params[0].items():
            if not start[name].requires_grad:
                continue
            before = start[name].detach()
            after = after.to("cpu", torch.float64)
            moved = before - after
            # A parameter that did not move had no gradient: SGD skips it, decay included.
            grads[name] = (
                moved / lr - decay * before if bool(moved.any()) else torch.zeros_like(moved)
            )
        found.append(grads)
    return found


def starts_of(scenario: Scenario, got: Trace, step: int) -> list[Params | None]:
    """The parameters each rank started ``step`` from (the initial ones at step 0)."""
    if step == 0:
        return [None] * scenario.world_size
    # A one-process trace (the reference's) stands for every rank.
    return [
        got.ranks[min(r, len(got.ranks) - 1)].params[step - 1] for r in range(scenario.world_size)
    ]


# Reported-loss weightings: how ranks, then micro-batches within a rank, are weighted, and
# whether the value carries over steps. Simplest (fewest mistakes) first.
LOSS_RANKS = ("share", "own", "sum", "world", "items")
LOSS_MICROS = ("items", "equal", "last")


@dataclasses.dataclass(frozen=True)
class LossWeighting:
    """How a reported loss weighted ranks (``share`` is right) and micro-batches (``items``
    is right), and whether it carried over steps."""

    ranks: str
    micro: str
    carried: bool

    @property
    def wrong(self) -> tuple[str, ...]:
        """What it got wrong: its ranks', micro-batches' and carrying choices, as named."""
        return tuple(
            choice
            for choice, is_wrong in (
                (self.ranks, self.ranks != "share"),
                (self.micro, self.micro != "items"),
                ("carry", self.carried),
            )
            if is_wrong
        )


def fit_losses(scenario: Scenario, got: Trace) -> list[tuple[LossWeighting, ...]]:
    """Per rank, the simplest weightings of the micro-batches' mean losses (at the parameters
    each rank really had) that reproduce every step of the loss it reported: the first is the
    one to name, the others fit as well on this scenario; empty for a rank that no weighting
    tried reproduces.

    Example::

        fit_losses(scenario, got)   # [(LossWeighting('own', 'items', False),), ...]
    """
    terms = [group_terms(scenario, s, starts_of(scenario, got, s)) for s in range(got.steps)]
    rtol = by_roundoff(scenario.dtype, LOSS_RTOL)
    tried = sorted(
        (LossWeighting(*c) for c in itertools.product(LOSS_RANKS, LOSS_MICROS, (False, True))),
        key=lambda w: len(w.wrong),
    )
    found: list[tuple[LossWeighting, ...]] = []
    for r, rank in enumerate(got.ranks):
        fitting = [w for w in tried if _reproduces(w, terms, r, rank.losses, rtol)]
        found.append(tuple(w for w in fitting if len(w.wrong) == len(fitting[0].wrong)))
    return found


def _reproduces(
    weighting: LossWeighting,
    terms: list[tuple[list[Group], torch.Tensor, list[float]]],
    rank: int,
    reported: Sequence[float],
    rtol: float,
) -> bool:
    total = 0.0
    for s, (groups, _, losses) in enumerate(terms):
        weights = _loss_weights(groups, rank, weighting.ranks, weighting.micro)
        value = sum(w * ell for w, ell in zip(weights, losses, strict=True))
        total = total + value if weighting.carried else value
        if abs(reported[s] - total) > rtol * max(abs(total), 1e-3):
            return False
    return True


def _loss_weights(groups: list[Group], rank: int, ranks_mode: str, micro_mode: str) -> list[float]:
    total = sum(g.items for g in groups)
    counts: dict[int, int] = {}
    pieces: dict[int, int] = {}
    for g in groups:
        counts[g.rank] = counts.get(g.rank, 0) + g.items
        pieces[g.rank] = pieces.get(g.rank, 0) + 1
    last = {g.rank: g.micro for g in groups}
    world = len(counts)
    weights = []
    for g in groups:
        rank_weight = {
            "share": counts[g.rank] / total,
            "own": 1.0 if g.rank == rank else 0.0,
            "sum": 1.0,
            "world": 1 / world,
            "items": float(counts[g.rank]),
        }[ranks_mode]
        micro_weight = {
            "items": g.items / counts[g.rank],
            "equal": 1 / pieces[g.rank],
            "last": 1.0 if g.micro == last[g.rank] else 0.0,
        }[micro_mode]
        weights.append(rank_weight * micro_weight)
    return weights


def flatten(model: torch.nn.Module, grads: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
    """``grads`` as one float64 vector, in ``model``'s parameter order; a missing gradient
    counts as zeros."""
    parts = []
    for name, p in model.named_parameters():
        g = grads.get(name)
        parts.append(
            torch.zeros(p.numel(), dtype=torch.float64)
            if g is None
            else g.detach().to("cpu", torch.float64).reshape(-1)
        )
    return torch.cat(parts)
