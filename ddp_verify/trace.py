"""The trace: what a method's run produced, step by step and rank by rank."""

from __future__ import annotations

import dataclasses

import torch

Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass
class RankTrace:
    """One rank's record: per step the global loss it reports, its gradients just before the
    optimizer step (``None`` where the method cannot show them) and its parameters after it."""

    losses: list[float] = dataclasses.field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] | None = dataclasses.field(default_factory=list)
    params: list[Tensors] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Trace:
    """Every rank's record of one run of one method; the reference has a single "rank"."""

    method: str
    ranks: list[RankTrace]

    @property
    def steps(self) -> int:
        return len(self.ranks[0].params)

    @property
    def has_grads(self) -> bool:
        return all(r.grads is not None and len(r.grads) == self.steps for r in self.ranks)


def parameters(model: torch.nn.Module) -> Tensors:
    """A detached copy of every parameter, by name (shared parameters once)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """A copy of every trainable parameter's gradient, ``None`` where it has none."""
    return {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }
