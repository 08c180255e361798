"""Data and metrics across ranks: what ``DistributedSampler`` hands each rank, and how per-rank
metric sums and counts are aggregated. The functions ending in ``_on_rank`` are jobs that run
on every rank of a world; the others check their results in the controller.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
import torch.distributed as dist

from ..world.runtime import rank_device


def sampler_epochs_on_rank(
    length: int, *, shuffle: bool, seed: int, drop_last: bool, epochs: int, set_epoch: bool
) -> list[list[int]]:
    """This rank's indices from ``DistributedSampler`` over a dataset of ``length`` items, for
    each of ``epochs`` epochs, calling ``set_epoch`` before each or not."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(length), shuffle=shuffle, seed=seed, drop_last=drop_last)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        orders.append([int(i) for i in sampler])
    return orders


@dataclasses.dataclass(frozen=True)
class Shards:
    """How one epoch's indices fell on the ranks: ``duplicates`` counts indices handed out more
    than once (the padding ``drop_last=False`` adds), ``missing`` those handed to no rank."""

    per_rank: list[list[int]]
    duplicates: int
    missing: int

    @classmethod
    def of(cls, per_rank: list[list[int]], length: int) -> Shards:
        seen = Counter(i for shard in per_rank for i in shard)
        duplicates = sum(count - 1 for count in seen.values())
        return cls(per_rank, duplicates, length - len(seen))


def metric_values(length: int, seed: int) -> torch.Tensor:
    """A per-sample metric (a loss, say) for a dataset of ``length`` samples, float64."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(length, generator=generator, dtype=torch.float64) * 4


@dataclasses.dataclass(frozen=True)
class Aggregates:
    """The dataset mean as one rank sees it after each way of aggregating (None where the way
    delivers to rank 0 only), and the mean of per-rank means."""

    all_reduce: float
    reduce: float | None
    all_gather_object: float
    gather_object: float | None
    mean_of_means: float


def aggregate_metric_on_rank(sizes: tuple[int, ...], seed: int) -> Aggregates:
    """This rank's shard of :func:`metric_values` (``sizes[rank]`` samples, rank-major), its
    sum and count aggregated four ways, and the mean of the ranks' means."""
    rank = dist.get_rank()
    # On the world's device, as a training loop's metrics are: nccl reduces CUDA tensors only.
    values = metric_values(sum(sizes), seed).to(rank_device())
    start = sum(sizes[:rank])
    local = values[start : start + sizes[rank]]
    count = torch.tensor(float(len(local)), dtype=torch.float64, device=local.device)
    pair = torch.stack([local.sum(), count])

    reduced_all = pair.clone()
    dist.all_reduce(reduced_all)
    reduced_to_0 = pair.clone()
    dist.reduce(reduced_to_0, dst=0)
    gathered: list[tuple[float, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (float(local.sum()), len(local)))
    collected: list[tuple[float, int] | None] | None = (
        [None] * dist.get_world_size() if rank == 0 else None
    )
    dist.gather_object((float(local.sum()), len(local)), collected, dst=0)
    means = local.mean().reshape(1)
    dist.all_reduce(means)

    def mean(pairs: list[tuple[float, int] | None]) -> float:
        return sum(p[0] for p in pairs if p) / sum(p[1] for p in pairs if p)

    return Aggregates(
        all_reduce=float(reduced_all[0] / reduced_all[1]),
        reduce=float(reduced_to_0[0] / reduced_to_0[1]) if rank == 0 else None,
        all_gather_object=mean(gathered),
        gather_object=mean(collected) if collected is not None else None,
        mean_of_means=float(means[0]) / dist.get_world_size(),
    )
