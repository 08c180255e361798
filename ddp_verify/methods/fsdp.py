"""torch's ``fully_shard`` (FSDP2), trained as :mod:`ddp_verify.methods.ddp` trains DDP."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..scenario import Scenario
from ..trace import RankTrace
from .base import DistributedMethod
from .loop import RankRun


class FullyShard(DistributedMethod):
    """``fully_shard`` on the model: each rank keeps a shard of
    every parameter; gradients are reduce-scattered (averaged over the world), so each
    micro-batch's loss is scaled by ``world_size * m / N`` as for DDP, and accumulation turns
    gradient synchronisation off for all but a step's last micro-batch. The trace records full
    tensors (gathered from the shards)."""

    name = "fully_shard()"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        from torch.distributed.fsdp import fully_shard as shard

        run = RankRun(scenario)
        model = run.model
        shard(model)
        optimizer = run.optimizer(model.parameters())
        for step in range(scenario.steps):
            optimizer.zero_grad(set_to_none=True)
            weight = run.world_size / run.global_samples(step)
            batches = run.micro_batches(step)
            local_sum = torch.zeros((), dtype=torch.float64)
            for j, (inputs, targets) in enumerate(batches):
                model.set_requires_gradient_sync(j == len(batches) - 1)
                loss = run.loss_fn(model(inputs), targets)
                (loss * (len(inputs) * weight)).backward()
                local_sum += loss.detach().double() * len(inputs)
            dist.all_reduce(local_sum)
            run.trace.grads.append(_full(model, grads=True))  # type: ignore[union-attr]
            optimizer.step()
            run.trace.losses.append(float(local_sum / run.global_samples(step)))
            run.trace.params.append(_full(model, grads=False))
        return run.trace


def _full(model: torch.nn.Module, *, grads: bool) -> dict[str, torch.Tensor | None]:
    """Every parameter (or its gradient) gathered whole, in the same order on every rank."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        if grads and not p.requires_grad:
            continue
        value = p.grad if grads else p
        if value is None:
            out[name] = None
            continue
        value = value.detach()
        out[name] = (value.full_tensor() if hasattr(value, "full_tensor") else value).clone()
    return out


def fully_shard() -> FullyShard:
    """FSDP2's ``fully_shard``. Every forward all-gathers parameters, so scenarios need equal
    micro-batch counts per rank (``scenarios(same_micro_batch_counts=True)``).

    Example::

        world.assert_equivalent(fully_shard(), scenario)
    """
    return FullyShard()
