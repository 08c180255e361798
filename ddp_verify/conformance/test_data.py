"""The data half of the source documents: ``DistributedSampler`` shards, and metric
aggregation across ranks, checked on the world against what one process computes."""

from __future__ import annotations

import math

import pytest
from hypothesis import find, settings
from hypothesis import strategies as st

from ddp_verify.conformance.sharding import (
    Shards,
    aggregate_metric_on_rank,
    metric_values,
    sampler_epochs_on_rank,
)
from ddp_verify.engine.strategies import batch_splits

LENGTHS = st.integers(1, 40)


def _shards(world, length, *, shuffle=True, seed=0, drop_last=False, epochs=1, set_epoch=True):
    per_rank = world.run(
        sampler_epochs_on_rank,
        length,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        epochs=epochs,
        set_epoch=set_epoch,
    )
    return [Shards.of([orders[e] for orders in per_rank], length) for e in range(epochs)]


def test_sampler_with_drop_last_shards_are_disjoint_and_equal(world, prove):
    def check(case):
        length, shuffle, seed = case
        (shards,) = _shards(world, length, shuffle=shuffle, seed=seed, drop_last=True)
        per_rank = length // world.size
        assert all(len(s) == per_rank for s in shards.per_rank), (
            f"DistributedSampler(drop_last=True) over {length} items at world size "
            f"{world.size} must hand every rank {length} // {world.size} = {per_rank}, "
            f"dropping the tail; the ranks got {[len(s) for s in shards.per_rank]}: "
            f"{shards.per_rank}"
        )
        assert shards.duplicates == 0, f"an index went to two ranks: {shards.per_rank}"
        assert shards.missing == length - per_rank * world.size, shards.per_rank

    prove(st.tuples(LENGTHS, st.booleans(), st.integers(0, 2**16)), check)


def test_sampler_without_drop_last_covers_the_dataset_and_pads_with_duplicates(
    world, prove, finding
):
    padded = []

    def check(case):
        length, shuffle, seed = case
        (shards,) = _shards(world, length, shuffle=shuffle, seed=seed, drop_last=False)
        per_rank = math.ceil(length / world.size)
        assert all(len(s) == per_rank for s in shards.per_rank), (
            f"DistributedSampler(drop_last=False) over {length} items at world size "
            f"{world.size} must hand every rank ceil({length} / {world.size}) = {per_rank}, "
            f"padding with repeats; the ranks got {[len(s) for s in shards.per_rank]}: "
            f"{shards.per_rank}"
        )
        assert shards.missing == 0, f"indices handed to no rank: {shards.per_rank}"
        # The padding: every rank gets ceil(N / W) items, so W * ceil(N / W) - N are repeats.
        assert shards.duplicates == per_rank * world.size - length, shards.per_rank
        padded.append((length, shards.duplicates))

    prove(st.tuples(LENGTHS, st.booleans(), st.integers(0, 2**16)), check)
    worst = max(padded, key=lambda p: p[1] / p[0])
    finding(
        f"DistributedSampler(drop_last=False) at world size {world.size}: padding duplicates "
        f"counted in {sum(1 for _, d in padded if d)} of {len(padded)} dataset sizes; worst "
        f"{worst[1]} repeated of {worst[0]} (a metric over the padded shards counts them twice)"
    )


def test_set_epoch_reshuffles_and_forgetting_it_does_not(world, prove):
    def check(case):
        length, seed = case
        with_epoch = _shards(world, length, seed=seed, epochs=3, set_epoch=True)
        without = _shards(world, length, seed=seed, epochs=3, set_epoch=False)
        orders = [tuple(map(tuple, s.per_rank)) for s in with_epoch]
        assert len(set(orders)) == 3, "set_epoch() did not change the order between epochs"
        stale = [tuple(map(tuple, s.per_rank)) for s in without]
        assert len(set(stale)) == 1, "without set_epoch() the order changed between epochs"
        assert stale[0] == orders[0], "epoch 0 differs with and without set_epoch(0)"

    # At least 8 items: 8! orders, so two epochs' permutations do not coincide by chance.
    prove(st.tuples(st.integers(8, 40), st.integers(0, 2**16)), check)


def test_the_seed_decides_the_order_on_every_rank_alike(world, prove):
    # Each rank builds its own sampler with the seed: the same seed must give the same shards
    # (the ranks' shards then partition one permutation), another seed another order.
    def check(case):
        length, seed = case
        (first,) = _shards(world, length, seed=seed)
        (again,) = _shards(world, length, seed=seed)
        (other,) = _shards(world, length, seed=seed + 1)
        assert first.per_rank == again.per_rank, "the same seed gave another order"
        assert (
            first.missing == 0
            and first.duplicates == world.size * math.ceil(length / world.size) - length
        ), f"the ranks' shards are not one permutation's: {first.per_rank}"
        assert other.per_rank != first.per_rank, (
            f"seeds {seed} and {seed + 1} gave the same order {first.per_rank}: the seed is "
            "not used"
        )

    # At least 8 items: two seeds' permutations do not coincide by chance.
    prove(st.tuples(st.integers(8, 40), st.integers(0, 2**16)), check)


def _splits(world):
    return st.tuples(batch_splits(world_size=world.size, max_samples=6), st.integers(0, 2**16))


def test_metric_sums_and_counts_aggregate_to_the_full_dataset_metric(world, prove):
    _needs_numpy()

    def check(case):
        sizes, seed = case
        expected = float(metric_values(sum(sizes), seed).mean())
        results = world.run(aggregate_metric_on_rank, tuple(sizes), seed)
        for rank, got in enumerate(results):
            ways = {"all_reduce": got.all_reduce, "all_gather_object": got.all_gather_object}
            if rank == 0:
                ways |= {"reduce": got.reduce, "gather_object": got.gather_object}
            for way, value in ways.items():
                assert math.isclose(value, expected, rel_tol=1e-12), (
                    f"{way} on rank {rank}: {value!r}, full dataset: {expected!r}, "
                    f"shard sizes {sizes}"
                )

    prove(_splits(world), check)


def test_mean_of_rank_means_is_the_metric_on_even_shards_only(world, peers, prove, finding):
    _needs_numpy()

    def mean_of_means_error(case) -> float:
        sizes, seed = case
        expected = float(metric_values(sum(sizes), seed).mean())
        return abs(
            world.run(aggregate_metric_on_rank, tuple(sizes), seed)[0].mean_of_means - expected
        )

    even = st.tuples(st.integers(1, 6).map(lambda n: (n,) * world.size), st.integers(0, 2**16))

    def exact_on_even(case):
        assert mean_of_means_error(case) <= 1e-12, f"even shards {case[0]}"

    prove(even, exact_on_even)
    # The negative check: on uneven shards the mean of means is not the metric.
    uneven = find(
        _splits(world),
        lambda case: mean_of_means_error(case) > 1e-3,
        settings=settings(max_examples=50, database=None, deadline=None),
    )
    off = mean_of_means_error(uneven)
    finding(
        f"mean of per-rank means differs from the dataset mean on uneven shards; shrunk to "
        f"shard sizes {list(uneven[0])} (seed {uneven[1]}), off by {off:.3g}"
    )


def _needs_numpy() -> None:
    # torch's all_gather_object and gather_object serialise through numpy on the ranks.
    pytest.importorskip("numpy", reason="torch's *_object collectives need numpy")


def test_sampler_without_shuffle_keeps_the_datasets_order(world, prove):
    # shuffle=False: no permutation. Read rank by rank, position by position (how the ranks'
    # batches interleave in the global batch), the shards are the dataset in its order, padded
    # from its start (or cut, with drop_last).
    def check(case):
        length, seed, drop_last = case
        (shards,) = _shards(world, length, shuffle=False, seed=seed, drop_last=drop_last)
        size = world.size
        total = (length // size if drop_last else -(-length // size)) * size
        padded = [i % length for i in range(total)]
        interleaved = [
            shard[position] for position in range(total // size) for shard in shards.per_rank
        ]
        assert interleaved == padded, (
            f"DistributedSampler(shuffle=False, drop_last={drop_last}) over {length} items at "
            f"world size {size} must hand rank r the items r, r + {size}, ... of the dataset "
            f"in its order; the ranks got {shards.per_rank}"
        )

    prove(st.tuples(LENGTHS, st.integers(0, 2**16), st.booleans()), check)


def test_a_sampler_given_its_replicas_and_rank_shards_as_documented(prove):
    # num_replicas and rank given outright (as a loader built before the group, or for
    # another world, does): every rank's shard is what the documented arithmetic says, with
    # no group at all; a rank outside [0, num_replicas) is refused.
    from torch.utils.data.distributed import DistributedSampler

    def check(case):
        length, replicas, shuffle, drop_last, seed = case
        data = list(range(length))
        shards = [
            list(
                DistributedSampler(
                    data,
                    num_replicas=replicas,
                    rank=r,
                    shuffle=shuffle,
                    seed=seed,
                    drop_last=drop_last,
                )
            )
            for r in range(replicas)
        ]
        per_rank = length // replicas if drop_last else -(-length // replicas)
        said = (f"DistributedSampler({length} items, num_replicas={replicas}, shuffle={shuffle},"
                f" drop_last={drop_last}, seed={seed})")  # fmt: skip
        assert [len(s) for s in shards] == [per_rank] * replicas, f"{said}: {shards}"
        # Read rank by rank, position by position, the shards are one order of the dataset
        # (its own order without shuffling; some permutation, the same for every rank, with
        # it), padded from its start or cut to a multiple of the replicas.
        total = per_rank * replicas
        interleaved = [shards[r][i] for i in range(per_rank) for r in range(replicas)]
        order = interleaved[: min(length, total)]
        assert len(set(order)) == len(order) and set(order) <= set(data), f"{said}: {shards}"
        if not shuffle:
            assert order == data[: len(order)], f"{said}: not the dataset's order: {shards}"
        if not drop_last:
            assert sorted(order) == data, f"{said}: the dataset not covered: {shards}"
            padding = interleaved[length:]
            assert padding == (order * (total // max(length, 1) + 1))[: len(padding)], (
                f"{said}: padded with {padding}, not from the start of {order}"
            )
        for bad in (replicas, -1):
            with pytest.raises(ValueError, match=r"Invalid rank"):
                DistributedSampler(data, num_replicas=replicas, rank=bad)

    # An empty dataset too: every rank's shard is empty (nothing to pad from).
    prove(
        st.tuples(
            st.integers(0, 30),
            st.integers(1, 6),
            st.booleans(),
            st.booleans(),
            st.integers(0, 2**16),
        ),
        check,
        examples=[(0, 3, True, False, 0), (2, 4, True, False, 0)],
    )


def test_a_loader_batches_each_ranks_shard_as_documented(prove):
    # DataLoader(batch_size=b, sampler=DistributedSampler(...), drop_last=...) as data-parallel
    # loops build it: its BatchSampler cuts the rank's shard, in order, into batches of b, the
    # last one shorter or dropped (drop_last), and its len() counts them. BatchSampler refuses
    # a batch_size that is not a positive int (0, negative, a bool, a float) and a drop_last
    # that is not a bool, with ValueError, as its code documents.
    from torch.utils.data import BatchSampler, DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def check(case):
        length, replicas, batch, drop_last, shard_drop_last, shuffle = case
        data = list(range(length))
        for rank in range(replicas):
            sampler = DistributedSampler(data, num_replicas=replicas, rank=rank,
                                         shuffle=shuffle, drop_last=shard_drop_last)  # fmt: skip
            shard = list(sampler)
            loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=drop_last)
            want = [shard[i : i + batch] for i in range(0, len(shard), batch)]
            if drop_last and want and len(want[-1]) < batch:
                want.pop()
            got = [b.tolist() for b in loader]
            said = (f"DataLoader({length} items, batch_size={batch}, drop_last={drop_last}, "
                    f"sampler=DistributedSampler(num_replicas={replicas}, rank={rank}, "
                    f"shuffle={shuffle}, drop_last={shard_drop_last}))")  # fmt: skip
            assert got == want, f"{said}: batches {got}, not the shard {shard} cut into {want}"
            assert len(loader) == len(want), f"{said}: len() is {len(loader)}, not {len(want)}"
        for bad in (0, -batch, True, float(batch)):
            with pytest.raises(ValueError, match="batch_size should be a positive integer"):
                BatchSampler(data, bad, drop_last)
        with pytest.raises(ValueError, match="drop_last should be a boolean"):
            BatchSampler(data, batch, int(drop_last))

    prove(
        st.tuples(LENGTHS, st.integers(1, 4), st.integers(1, 6), st.booleans(), st.booleans(),
                  st.booleans()),
        check,
        examples=[(7, 2, 1, False, False, False), (7, 2, 3, True, False, False)],
    )  # fmt: skip
