"""torch's ``fully_shard`` (FSDP2), trained by the data-parallel loop that trains DDP."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace
from .base import DistributedMethod
from .loop import RankRun, train_data_parallel


class FullyShard(DistributedMethod):
    """``fully_shard`` on the model: each rank keeps a shard of every parameter; gradients are
    reduce-scattered (averaged over the world), so each micro-batch's loss is scaled by
    ``world_size * m / N`` as for DDP, and accumulation turns gradient synchronisation off for
    all but a step's last micro-batch. The trace records full tensors (gathered from the
    shards)."""

    name = "fully_shard()"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard as shard

        run = RankRun(scenario)
        # The world's device, said outright: by default FSDP2 takes a CUDA mesh wherever CUDA
        # is available, and would move a CPU world's model to a GPU.
        mesh = init_device_mesh(run.device.type, (run.world_size,))
        shard(run.model, mesh=mesh)
        optimizer = run.optimizer(run.model.parameters())
        return train_data_parallel(
            run, run.model, optimizer, no_sync=lambda: _without_gradient_sync(run.model)
        )


@contextlib.contextmanager
def _without_gradient_sync(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2's counterpart of DDP's ``no_sync()``."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def fully_shard() -> FullyShard:
    """FSDP2's ``fully_shard``. Every forward all-gathers parameters, so scenarios need equal
    micro-batch counts per rank (``scenarios(same_micro_batch_counts=True)``).

    Example::

        world.assert_equivalent(fully_shard(), scenario)
    """
    return FullyShard()
