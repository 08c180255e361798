"""torch's DistributedDataParallel, with sample-weighted losses for uneven batches."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..scenario import Scenario
from ..trace import RankTrace
from .base import DistributedMethod
from .loop import RankRun


class DDP(DistributedMethod):
    """DDP with ``no_sync()`` on all but each rank's last micro-batch of a step.

    DDP averages gradients over the world size, which is the global mean only when every rank
    holds as many samples as the others. Scaling each micro-batch's mean loss by
    ``world_size * m / N`` (m samples in the micro-batch, N in the global batch) makes the
    average sample-weighted, so uneven batches and accumulation give the global mean gradient.
    """

    def __init__(self, **ddp_kwargs: Any) -> None:
        self.ddp_kwargs = ddp_kwargs
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(ddp_kwargs.items()))
        self.name = f"ddp({args})"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        kwargs = dict(self.ddp_kwargs)
        # A parameter forward never uses is an error for DDP unless it is told to look for it.
        kwargs.setdefault("find_unused_parameters", scenario.model.unused)
        ddp = DistributedDataParallel(run.model, **kwargs)
        self.prepare(ddp)
        optimizer = run.optimizer(ddp.parameters())
        for step in range(scenario.steps):
            optimizer.zero_grad(set_to_none=True)
            batches = run.micro_batches(step)
            weight = run.world_size / run.global_samples(step)
            local_sum = torch.zeros((), dtype=torch.float64)
            for j, (inputs, targets) in enumerate(batches):
                last = j == len(batches) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    loss = run.loss_fn(ddp(inputs), targets)
                    (loss * (len(inputs) * weight)).backward()
                local_sum += loss.detach().double() * len(inputs)
            dist.all_reduce(local_sum)
            run.record_gradients()
            optimizer.step()
            run.record_step(local_sum / run.global_samples(step))
        return run.trace

    def prepare(self, ddp: DistributedDataParallel) -> None:
        """Adjust the wrapped model before training (a subclass registers a comm hook here)."""


def ddp(**ddp_kwargs: Any) -> DDP:
    """torch's DistributedDataParallel; ``ddp_kwargs`` go to its constructor.

    Example::

        world.assert_equivalent(ddp(bucket_cap_mb=1), scenario)
    """
    return DDP(**ddp_kwargs)
