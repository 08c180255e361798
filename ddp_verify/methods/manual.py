"""Manual gradient averaging with all_reduce, as the tutorials write it and as it should be."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace
from ..world.runtime import rank_device
from .base import DistributedMethod
from .loop import RankRun, train_local_then_sync

WEIGHTINGS = ("samples", "world")


class ManualAllReduce(DistributedMethod):
    """Local backward of the rank's mean loss, then one all-reduce of every gradient.

    ``weighting="samples"``: each rank's gradient and loss weighted by its share of the global
    batch, ``sum_i n_i * g_i / N``: the global mean for any split. ``weighting="world"``: the
    plain mean over ranks of the source documents, ``sum_i g_i / world_size``: right only when
    every rank holds as many samples as the others. Under a declared sum (``objective="sum"``)
    ``"samples"`` adds the ranks' summed gradients, and ``"world"`` averages them.
    """

    def __init__(self, weighting: str = "samples") -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting
        self.name = f"manual_allreduce(weighting={weighting!r})"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        params = run.trainable()

        def average(step: int, local_sum: torch.Tensor) -> float | None:
            n = run.local_normaliser(step)
            if self.weighting == "samples":
                scale, divisor = float(n), float(run.global_normaliser(step))
            else:
                scale, divisor = 1.0, float(run.world_size)
            # A rank with no sample reports a mean of 0, its sum's (not 0/0).
            return all_reduce_weighted(params, scale, divisor, local_sum / max(n, 1))

        return train_local_then_sync(run, average)


def all_reduce_weighted(
    params: list[torch.Tensor], scale: float, divisor: float, loss: torch.Tensor | None = None
) -> float | None:
    """``sum over ranks (scale * x) / divisor`` for every gradient (and ``loss``, if given) in
    one flat all-reduce; returns the reduced loss. ``None`` gradients (unused parameters) stay
    ``None``."""
    with_grad = [p for p in params if p.grad is not None]
    dtype = with_grad[0].grad.dtype if with_grad else torch.float64
    pieces = [p.grad.reshape(-1) for p in with_grad]
    if loss is not None:
        pieces.append(loss.to(dtype).reshape(1))
    # On the gradients' device: nccl reduces CUDA tensors only.
    flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=rank_device())
    flat.mul_(scale)
    dist.all_reduce(flat)
    flat.div_(divisor)
    offset = 0
    for p in with_grad:
        numel = p.numel()
        p.grad.copy_(flat[offset : offset + numel].view_as(p.grad))
        offset += numel
    return flat[-1].item() if loss is not None else None


def manual_allreduce(weighting: str = "samples") -> ManualAllReduce:
    """Local backward, then an all-reduce of the gradients weighted by ``weighting``.

    Example::

        world.assert_equivalent(manual_allreduce(weighting="samples"), scenario)
    """
    return ManualAllReduce(weighting)
