"""What each sample effectively counted for: a gradient explained as a weighted sum.

At a scenario's first step every rank starts from the same parameters, and what a data-parallel
step leaves in ``.grad`` is (for the linear mistakes: weightings, sums, dropped micro-batches,
another rank's gradient) a weighted sum of the micro-batches' mean-loss gradients there. The
correct weighting gives each sample ``1/N`` of the global batch of ``N``. Fitting the weights
(least squares over the reference's per-micro-batch gradients, float64) says which samples,
micro-batches or ranks counted for how much, in numbers, whatever form the code took.

Issue 16 groundwork: :func:`fit_gradient` and :meth:`WeightFit.deviations` are tested on their
own; the diagnosis does not call them yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

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

# Weights closer than this (relative to 1/N) to what they should be count as right.
_CLOSE = 1e-3


@dataclasses.dataclass(frozen=True)
class Group:
    """One micro-batch of one rank at the fitted step."""

    rank: int
    micro: int
    samples: int


@dataclasses.dataclass(frozen=True)
class WeightFit:
    """The per-sample weight each micro-batch's samples carried in one observed gradient.

    ``expected`` is ``1/N`` for every group; ``residual`` is the share of the observed
    gradient that no weighting of the micro-batches explains (near 0: the fit holds);
    ``identifiable`` is False when the micro-batches' gradients are linearly dependent, so
    that other weights would explain it as well.
    """

    world_size: int
    groups: tuple[Group, ...]
    fitted: tuple[float, ...]
    expected: float
    residual: float
    identifiable: bool

    def ratio(self, index: int) -> float:
        return self.fitted[index] / self.expected

    def deviations(self) -> list[str]:
        """What is wrong with the weights, in words with the numbers, most telling first
        (empty when every sample counted ``1/N``).

        Example::

            fit.deviations()
            # ['rank 3\\'s 2 samples counted 0.125 each instead of 0.2 (weighted by 1/world
            #   size, not by its share of the batch)']
        """
        wrong = [i for i in range(len(self.groups)) if abs(self.ratio(i) - 1) > _CLOSE]
        if not wrong:
            return []
        ratios = [self.ratio(i) for i in range(len(self.groups))]
        if max(ratios) - min(ratios) <= _CLOSE * max(1.0, abs(max(ratios))):
            factor = ratios[0]
            why = (
                " (summed across ranks, not averaged)"
                if abs(factor - self.world_size) <= _CLOSE * self.world_size
                else ""
            )
            return [f"every sample counted {factor:.4g}x what it should{why}"]
        found = []
        zero = [i for i in wrong if abs(self.ratio(i)) <= _CLOSE]
        micros = {self.groups[i].micro for i in zero}
        for micro in sorted(micros):
            ranks = [self.groups[i].rank for i in zero if self.groups[i].micro == micro]
            holders = {g.rank for g in self.groups if g.micro == micro}
            who = (
                "every rank"
                if set(ranks) == holders and len(holders) > 1
                else ("rank " + ", ".join(map(str, ranks)))
            )
            found.append(f"micro-batch {micro} of {who} counted 0")
        for rank in sorted({self.groups[i].rank for i in wrong if i not in zero}):
            mine = [i for i in range(len(self.groups)) if self.groups[i].rank == rank]
            weights = [self.fitted[i] for i in mine]
            if max(weights) - min(weights) > _CLOSE * self.expected:
                continue  # uneven within the rank: said per micro-batch below
            samples = sum(self.groups[i].samples for i in mine)
            weight = weights[0]
            share = 1 / (self.world_size * samples)
            why = (
                " (weighted by 1/world size, not by its share of the batch)"
                if abs(weight - share) <= _CLOSE * share
                else ""
            )
            found.append(
                f"rank {rank}'s {samples} sample{'s' if samples > 1 else ''} counted "
                f"{weight:.4g} each instead of {self.expected:.4g}{why}"
            )
        said = {g.rank for g in self.groups} if found else set()
        for i in wrong:
            if i in zero or (self.groups[i].rank in said and found):
                continue
            g = self.groups[i]
            found.append(
                f"micro-batch {g.micro} of rank {g.rank} counted {self.fitted[i]:.4g} per "
                f"sample instead of {self.expected:.4g}"
            )
        if not self.identifiable:
            found.append(
                "(the micro-batches' gradients are linearly dependent here, so other weights "
                "would explain it as well)"
            )
        return found


def group_gradients(scenario: Scenario, step: int = 0) -> tuple[list[Group], torch.Tensor]:
    """Every micro-batch of ``step`` (rank-major) and its mean-loss gradient at the step's
    starting parameters, float64, as the columns of a ``(parameters, groups)`` matrix.

    Only step 0 starts from parameters every correct run shares.

    Example::

        groups, columns = group_gradients(scenario)
    """
    if step != 0:
        raise ValueError("only step 0 starts from the parameters every rank shares")
    with one_thread():
        model = build_model(scenario, "float64")
        inputs, targets = build_data(scenario, "float64")[step]
        loss_fn = loss_function(scenario)
        groups, columns = [], []
        for rank in range(scenario.world_size):
            for micro, (x, y) in enumerate(micro_batches(scenario, step, rank, (inputs, targets))):
                model.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                columns.append(_flat(model, {n: p.grad for n, p in model.named_parameters()}))
                groups.append(Group(rank, micro, count_items(scenario, y)))
    return groups, torch.stack(columns, dim=1)


def fit_gradient(
    scenario: Scenario, observed: Mapping[str, torch.Tensor | None], step: int = 0
) -> WeightFit:
    """The weights that explain ``observed`` (one rank's ``.grad`` by parameter name after
    ``step``) as a weighted sum of the micro-batches' mean gradients.

    Example::

        fit = fit_gradient(outcome.scenario, outcome.got.ranks[3].grads[0])
        print(fit.deviations())
    """
    groups, columns = group_gradients(scenario, step)
    with one_thread():
        model = build_model(scenario, "float64")
        target = _flat(model, observed).to(torch.float64)
        solution = torch.linalg.lstsq(columns, target.unsqueeze(1), driver="gelsd").solution
        coefficients = solution.squeeze(1)
        explained = columns @ coefficients
        scale = float(target.norm()) or 1.0
        residual = float((explained - target).norm()) / scale
        rank = int(torch.linalg.matrix_rank(columns))
    total = sum(g.samples for g in groups)
    return WeightFit(
        world_size=scenario.world_size,
        groups=tuple(groups),
        fitted=tuple(float(c) / g.samples for c, g in zip(coefficients, groups, strict=True)),
        expected=1 / total,
        residual=residual,
        identifiable=rank == len(groups),
    )


def _flat(model: torch.nn.Module, grads: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
    # Parameters in the model's order; a missing gradient counts as zeros.
    parts = []
    for name, p in model.named_parameters():
        g = grads.get(name)
        parts.append(
            torch.zeros(p.numel(), dtype=torch.float64)
            if g is None
            else g.detach().to("cpu", torch.float64).reshape(-1)
        )
    return torch.cat(parts)
