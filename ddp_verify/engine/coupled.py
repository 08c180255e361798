"""The coupled-loss kind's harness: pairs of views encoded by a tiny encoder of its own (two
towers, or one for both views), each pair's hard negatives, and the loss parameters a
contrastive loss learns (open_clip's ``logit_scale``, SigLIP's ``logit_bias``).

A coupled scenario is a :class:`~.scenario.Scenario` with ``loss="coupled"`` and a
``ModelSpec(kind="towers")``: its schedule counts pairs, and a rank may hold none. Its
reference is the user's own loss on the whole global batch: the same run on a world of one
rank holding every rank's pairs in rank order (:func:`whole_micro_batches`), so nothing about
the loss is assumed.

Example::

    >>> from ddp_verify.engine.scenario import ModelSpec, Scenario
    >>> scenario = Scenario(world_size=2, schedule=(((1,), (2,)),), loss="coupled",
    ...                     model=ModelSpec(kind="towers", in_features=3, hidden=(),
    ...                                     out_features=4))
    >>> whole = whole_micro_batches(scenario, 0, pairs(scenario)[0])
    >>> [f.shape for f in features(build_towers(scenario), whole[0])]
    [torch.Size([3, 4]), torch.Size([3, 4])]
"""

from __future__ import annotations

import torch
from torch import nn

from .models import torch_dtype
from .scenario import LEARNED_PARAMETERS, Scenario

__all__ = [
    "LEARNED",
    "Pairs",
    "Towers",
    "build_towers",
    "features",
    "pairs",
    "rank_micro_batches",
    "whole_micro_batches",
]

# The loss parameters the harness's model learns, where the loss asks for them by name, and
# where each starts: moderate values, whether the loss exponentiates them or not.
LEARNED: dict[str, float] = dict(zip(LEARNED_PARAMETERS, (1.0, -1.0), strict=True))

# One micro-batch: the first view, the second, and the hard negatives (n, K, in_features).
Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Towers(nn.Module):
    """A linear tower per view (one shared by both where ``towers=1``), the hard negatives
    encoded by the second view's, and the learned loss parameters the spec names."""

    def __init__(self, in_features: int, out_features: int, towers: int, learned: tuple[str, ...]):
        super().__init__()
        self.tower_a = nn.Linear(in_features, out_features)
        self.tower_b = self.tower_a if towers == 1 else nn.Linear(in_features, out_features)
        for name in learned:
            self.register_parameter(name, nn.Parameter(torch.tensor(LEARNED[name])))

    def forward(
        self, a: torch.Tensor, b: torch.Tensor, negatives: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        encoded = self.tower_b(negatives)
        return (
            self.tower_a(a),
            self.tower_b(b),
            *(encoded[:, k] for k in range(negatives.shape[1])),
        )


def build_towers(
    scenario: Scenario, dtype: str | None = None, device: torch.device | str | None = None
) -> Towers:
    """The scenario's encoder with its seeded initial weights, in ``dtype`` (default: the
    scenario's), drawn on the CPU and then moved to ``device``."""
    spec = scenario.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(scenario.seed)
        model = Towers(spec.in_features, spec.out_features, spec.towers, spec.learned)
    return model.to(device=device or "cpu", dtype=torch_dtype(dtype or scenario.dtype))


def pairs(
    scenario: Scenario, dtype: str | None = None, device: torch.device | str | None = None
) -> list[Pairs]:
    """Each step's global batch of pairs, the same on every rank and here: the second view a
    mix of the first plus noise (so positives resemble each other), the negatives drawn
    apart."""
    generator = torch.Generator().manual_seed(scenario.seed + 1)
    spec, float_type = scenario.model, torch_dtype(dtype or scenario.dtype)
    size = spec.in_features
    mix = torch.randn(size, size, generator=generator, dtype=torch.float64)
    steps = []
    for step in range(scenario.steps):
        n = scenario.global_batch(step)
        a = torch.randn(n, size, generator=generator, dtype=torch.float64)
        b = a @ mix / size**0.5 + 0.5 * torch.randn(n, size, generator=generator, dtype=a.dtype)
        negatives = torch.randn(n, spec.negatives, size, generator=generator, dtype=a.dtype)
        moved = (t.to(device=device or "cpu", dtype=float_type) for t in (a, b, negatives))
        steps.append(tuple(moved))
    return steps


def rank_micro_batches(scenario: Scenario, step: int, rank: int, batch: Pairs) -> list[Pairs]:
    """``rank``'s micro-batches of pairs at ``step``, cut from the step's global ``batch``."""
    start = scenario.offset(step, rank)
    pieces = []
    for size in scenario.schedule[step][rank]:
        pieces.append(tuple(t[start : start + size] for t in batch))
        start += size
    return pieces


def features(model: nn.Module, batch: Pairs) -> tuple[torch.Tensor, ...]:
    """What the loss is handed for ``batch``: the first view's features, the second's, then
    one tensor per hard negative."""
    return tuple(model(*batch))


def whole_micro_batches(scenario: Scenario, step: int, batch: Pairs) -> list[Pairs]:
    """The micro-batches of ``step`` on a world of one rank holding every rank's pairs, in
    rank order: its micro-batch ``m`` is every rank's micro-batch ``m`` laid end to end
    (every rank of a coupled scenario holds as many micro-batches)."""
    per_rank = [
        rank_micro_batches(scenario, step, rank, batch) for rank in range(scenario.world_size)
    ]
    return [
        tuple(torch.cat(parts) for parts in zip(*pieces, strict=True))
        for pieces in zip(*per_rank, strict=True)
    ]
