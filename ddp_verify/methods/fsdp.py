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
    shards).

    ``replicas=R`` shards over a 2-D mesh instead (HSDP): R groups of world size / R ranks,
    each sharding the model, gradients reduce-scattered in a group and all-reduced across the
    groups. ``reduce_dtype`` (a ``MixedPrecisionPolicy``) reduces gradients in that dtype."""

    def __init__(self, *, replicas: int = 1, reduce_dtype: str | None = None) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.replicas = replicas
        self.reduce_dtype = reduce_dtype
        options = [f"replicas={replicas}"] if replicas > 1 else []
        if reduce_dtype:
            options.append(f"reduce_dtype={reduce_dtype}")
        self.name = f"fully_shard({', '.join(options)})"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.distributed.fsdp import fully_shard as shard

        run = RankRun(scenario)
        if run.world_size % self.replicas:
            raise ValueError(
                f"replicas={self.replicas} does not divide the world size {run.world_size}"
            )
        # The world's device, said outright: by default FSDP2 takes a CUDA mesh wherever CUDA
        # is available, and would move a CPU world's model to a GPU.
        if self.replicas > 1:
            shape = (self.replicas, run.world_size // self.replicas)
            mesh = init_device_mesh(run.device.type, shape, mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(run.device.type, (run.world_size,))
        policy = MixedPrecisionPolicy(
            reduce_dtype=getattr(torch, self.reduce_dtype) if self.reduce_dtype else None
        )
        shard(run.model, mesh=mesh, mp_policy=policy)
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


def fully_shard(*, replicas: int = 1, reduce_dtype: str | None = None) -> FullyShard:
    """FSDP2's ``fully_shard`` (HSDP with ``replicas`` > 1; gradients reduced in
    ``reduce_dtype``). Every forward all-gathers parameters, so scenarios need equal
    micro-batch counts per rank (``scenarios(same_micro_batch_counts=True)``).

    Example::

        world.assert_equivalent(fully_shard(), scenario)
        world.assert_equivalent(fully_shard(replicas=2), scenario)  # a 2 x 2 mesh at size 4
    """
    return FullyShard(replicas=replicas, reduce_dtype=reduce_dtype)
