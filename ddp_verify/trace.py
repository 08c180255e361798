"""The trace: what a method's run produced, step by step and rank by rank."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass
class RankTrace:
    """One rank's record: per step the global loss it reports, its gradients just before the
    optimizer step (``None`` where the method cannot show them) and its parameters after it."""

    losses: list[float] = dataclasses.field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] | None = dataclasses.field(default_factory=list)
    params: list[Tensors] = dataclasses.field(default_factory=list)

    def __reduce__(self) -> tuple[Any, ...]:
        # A rank sends its trace home after every example: one flat tensor per field pickles
        # many times faster than a small tensor per parameter per step.
        grads, params = self.packed("grads"), self.packed("params")
        return (_unpack_rank_trace, (self.losses, grads, params))

    def packed(self, field: str) -> tuple[Layout, torch.Tensor] | None:
        """``grads`` or ``params`` as ``(layout, flat float64 tensor)``: per step, per tensor,
        its name, shape and dtype, and every value in order (None without gradients)."""
        steps = getattr(self, field)
        # Packed afresh each time: a cached copy would go stale if a tensor were replaced.
        return None if steps is None else _pack(steps)


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


# Per step, per tensor: its name, and its shape and dtype (None for a missing gradient).
Layout = list[list[tuple[str, tuple[int, ...] | None, torch.dtype | None]]]


def step_lengths(layout: Layout) -> list[int]:
    """How many values each step holds in a packed flat tensor."""
    return [sum(_numel(shape) for _, shape, _ in entry if shape is not None) for entry in layout]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count


def _pack(steps: list[dict[str, torch.Tensor | None]]) -> tuple[Layout, torch.Tensor]:
    """Every tensor of every step in one float64 tensor (exact for every float dtype)."""
    layout: Layout = []
    chunks = []
    for record in steps:
        entry: list[tuple[str, tuple[int, ...] | None, torch.dtype | None]] = []
        for name, tensor in record.items():
            if tensor is None:
                entry.append((name, None, None))
            else:
                entry.append((name, tuple(tensor.shape), tensor.dtype))
                chunks.append(tensor.detach().reshape(-1).to(torch.float64))
        layout.append(entry)
    flat = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.float64)
    return layout, flat


def _unpack(packed: tuple[Layout, torch.Tensor] | None) -> list[dict[str, Any]] | None:
    if packed is None:
        return None
    layout, flat = packed
    steps: list[dict[str, Any]] = []
    offset = 0
    for entry in layout:
        record: dict[str, Any] = {}
        for name, shape, dtype in entry:
            if shape is None:
                record[name] = None
                continue
            count = _numel(shape)
            record[name] = flat[offset : offset + count].view(shape).to(dtype)
            offset += count
        steps.append(record)
    return steps


def _unpack_rank_trace(
    losses: list[float],
    grads: tuple[Layout, torch.Tensor] | None,
    params: tuple[Layout, torch.Tensor] | None,
) -> RankTrace:
    return RankTrace(losses, _unpack(grads), _unpack(params) or [])
