"""``ZeroRedundancyOptimizer``: each rank steps the optimizer state of its shard of the
parameters and broadcasts them; training must stay equivalent to the unsharded optimizer's."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from ddp_verify.conformance import jobs, refusal_jobs
from ddp_verify.conformance.closed_forms import assert_every_rank_and_step
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.engine.strategies import optimizers, scenarios
from ddp_verify.world import RankError


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_zero_redundancy_optimizer_matches_the_reference(world, data_parallel, prove, optimizer):
    method = data_parallel(zero=True)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            # A scheduler edits the param_groups ZeRO exposes (one or two of them, each with
            # its own learning rate): its shards must follow them.
            optimizers=optimizers(names=(optimizer,), schedules=True, groups=True),
            dtypes=("float64", "float32"),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_zero_with_parameters_as_bucket_view_matches_the_reference(world, data_parallel, prove):
    # Parameters packed into one flat buffer per rank, broadcast bucket by bucket.
    method = data_parallel(zero={"parameters_as_bucket_view": True})
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            optimizers=optimizers(names=("adam", "sgd")),
            dtypes=("float64", "float32"),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_zero_with_a_param_group_added_after_construction_matches_the_reference(
    world, data_parallel, prove
):
    # add_param_group re-partitions the parameters over the ranks: the group added later must
    # step with its own settings, on the rank that now owns each of its parameters.
    method = data_parallel(zero={"add_param_group": True})
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=2,
            optimizers=optimizers(names=("adam", "sgd"), groups=True).filter(
                lambda o: o.param_groups == 2
            ),
            dtypes=("float64",),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_zero_with_clip_grad_norm_clips_by_the_global_norm(world, data_parallel, prove):
    # Every rank holds the averaged gradients when ZeRO steps: clipping them all before the
    # sharded step clips by the full batch's norm.
    method = data_parallel(zero=True)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            optimizers=optimizers(names=("adam", "sgd"), clip=True),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_zero_resumes_from_its_consolidated_state(world, data_parallel, prove):
    # consolidate_state_dict() on rank 0, saved, loaded by every rank into a fresh optimizer
    # (each takes its shard, in its param group): training goes on as if never interrupted.
    def check(scenario):
        method = data_parallel(zero=True, resume_at=scenario.steps - 1)
        world.assert_equivalent(method, scenario)

    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=2,
            optimizers=optimizers(names=("adam", "sgd"), groups=True),
        ).filter(lambda s: s.steps >= 2),
        check,
    )


def sgd_steps(starts, gradients, momentum, lr=0.5, trainable=None):
    """SGD with momentum (torch's form: the first buffer is the gradient itself) from
    ``starts`` through ``gradients`` (one list of tensors' values per step): the flattened
    parameters after each step. ``trainable[t][i]``: whether tensor i has a gradient at step
    t (a frozen one has none: SGD leaves it, and its momentum buffer, as they are)."""
    params = [list(p) for p in starts]
    buffers: list[list[float] | None] = [None] * len(params)
    after = []
    for t, step in enumerate(gradients):
        for i, gradient in enumerate(step):
            if trainable is not None and not trainable[t][i]:
                continue
            previous = buffers[i]
            buffer = (
                list(gradient)
                if previous is None
                else [momentum * b + g for b, g in zip(previous, gradient, strict=True)]
            )
            buffers[i] = buffer
            params[i] = [x - lr * b for x, b in zip(params[i], buffer, strict=True)]
        after.append([x for p in params for x in p])
    return after


def test_the_sgd_oracle_steps_with_torchs_momentum():
    # lr 0.5, momentum 0.5: buffers 2 then 0.5*2+4 = 5; parameters 10-1 = 9, then 9-2.5.
    assert sgd_steps([[10.0]], [[[2.0]], [[4.0]]], momentum=0.5) == [[9.0], [6.5]]
    # Frozen at the first step: no buffer yet, so the second step's is its gradient, 4.
    frozen_first = [[False], [True]]
    assert sgd_steps([[10.0]], [[[2.0]], [[4.0]]], 0.5, trainable=frozen_first) == [[10.0], [8.0]]


def test_zero_over_a_subgroup_steps_and_broadcasts_within_that_group(world, prove):
    # process_group: each group of consecutive ranks shards the optimizer among its own ranks,
    # broadcasts the stepped parameters within the group and consolidates its state there.
    # Every group's ranks hold the same parameters and gradients (ZeRO itself does not average
    # them), different groups different ones: each group must end where plain SGD on its own
    # values ends. Closed form: small integers, lr 0.5, momentum 0 or 0.5.
    size = world.size
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    values = st.integers(-8, 8).map(float)

    @st.composite
    def draw(draw_):
        group_size = draw_(st.sampled_from(divisors))
        shapes = draw_(st.lists(st.integers(1, 3), min_size=1, max_size=4))
        groups = size // group_size

        def per_group():
            tensors = st.tuples(*(st.lists(values, min_size=n, max_size=n) for n in shapes))
            return st.lists(tensors.map(list), min_size=groups, max_size=groups)

        starts = draw_(per_group())
        gradients = draw_(st.lists(per_group(), min_size=1, max_size=3))
        momentum = draw_(st.sampled_from((0.0, 0.5)))
        # The state consolidated under a default device that is not the parameters' (a
        # device context, as scripts that build models on a device use): meta, which holds no
        # data, so a shard received on the default device rather than the parameters' fails.
        default = draw_(st.sampled_from((None, "meta")))
        # consolidate_state_dict(to=...) may name any rank of the group.
        to = draw_(st.integers(0, group_size - 1))
        return starts, gradients, group_size, momentum, draw_(st.booleans()), default, to

    def check(case):
        starts, gradients, group_size, momentum, bucket_view, default, to = case
        results = world.run(
            jobs.zero_in_a_group, starts, gradients, group_size, momentum, bucket_view,
            default_device=default, to=to,
        )  # fmt: skip
        said = (
            f"ZeroRedundancyOptimizer(SGD, lr=0.5, momentum={momentum}, process_group=<"
            f"{group_size} consecutive ranks>, parameters_as_bucket_view={bucket_view})"
            + (f", consolidated under torch.device({default!r})" if default else "")
            + f", consolidate_state_dict(to={to})"
        )
        want = [
            sgd_steps(starts[g], [step[g] for step in gradients], momentum)
            for g in range(len(starts))
        ]
        assert_every_rank_and_step(
            [got["after"] for got in results],
            lambda rank, step: want[rank // group_size][step],
            lambda rank, step: (
                f"{said}: rank {rank}'s parameters after step {step} are not its group's SGD step."
            ),
        )
        # consolidate_state_dict(to=to) gathers the shards within the group, to its rank `to`:
        # SGD's momentum buffers, b <- momentum * b + g from b = g (none at momentum 0).
        for rank, got in enumerate(results):
            group = rank // group_size
            if rank % group_size != to:
                assert got["consolidated"] is None, f"{said}: rank {rank} is not its group's {to}"
                continue
            buffers: dict[int, list[float]] = {}
            if momentum:
                for index in range(len(starts[group])):
                    for step in gradients:
                        g = step[group][index]
                        b = buffers.get(index)
                        buffers[index] = (
                            g
                            if b is None
                            else [momentum * x + y for x, y in zip(b, g, strict=True)]
                        )
            assert got["consolidated"] == {"buffers": buffers, "lr": [0.5]}, (
                f"{said}: the state consolidated on rank {rank} (its group's {to}) is "
                f"{got['consolidated']}, expected {{'buffers': {buffers}, 'lr': [0.5]}}"
            )

    # The whole world one group, its state consolidated under the meta device: never left to
    # chance.
    whole = ([[[1.0], [2.0]]], [[[[1.0], [-1.0]]], [[[2.0], [3.0]]]], size, 0.5, False, "meta", 0)
    # And consolidated on the world's last rank: never left to chance either.
    last = ([[[1.0], [2.0]]], [[[[1.0], [-1.0]]]], size, 0.5, False, None, size - 1)
    prove(draw(), check, examples=[whole, last])


def test_zero_shards_every_parameter_once_by_sorted_greedy_packing(world, prove):
    # Documented: each parameter belongs to a single rank, packed by a sorted-greedy
    # algorithm so that each local optimizer updates about 1 / world_size of them. Largest
    # first, each to the least-loaded rank: the ranks' totals then differ by at most the
    # largest parameter, and no rank's is left empty while another holds two.
    size = world.size

    def check(sizes):
        owned = world.run(jobs.zero_partition, sizes)
        held = sorted(i for mine in owned for i in mine)
        assert held == list(range(len(sizes))), (
            f"ZeroRedundancyOptimizer over parameters of {sizes} elements: the ranks' local "
            f"optimizers hold {owned}, not every parameter once"
        )
        totals = [sum(sizes[i] for i in mine) for mine in owned]
        assert max(totals) - min(totals) <= max(sizes), (
            f"ZeroRedundancyOptimizer over parameters of {sizes} elements on {size} ranks: "
            f"the shards hold {totals} elements ({owned}), not packed greedily (their totals "
            f"differ by more than the largest parameter)"
        )

    prove(
        st.lists(st.integers(1, 6), min_size=1, max_size=8),
        check,
        examples=[[3] * (2 * size)],
    )


def test_zero_follows_trainability_changed_between_its_steps(world, prove):
    # "Changing parameter trainability at run time" (ZeRO's documentation of
    # _build_param_buckets): a parameter frozen (requires_grad=False, no gradient) or unfrozen
    # between steps is stepped by its owner only while it has a gradient, and every rank must
    # then hold the owner's value: with parameters_as_bucket_view the buckets each owner
    # broadcasts are rebuilt to hold the parameters trainable now. Closed form: plain SGD
    # (lr 0.5) where each tensor steps only while trainable, its momentum buffer kept frozen.
    size = world.size
    values = st.integers(-8, 8).map(float)

    @st.composite
    def draw(draw_):
        shapes = draw_(st.lists(st.integers(1, 3), min_size=1, max_size=size + 1))
        tensors = st.tuples(*(st.lists(values, min_size=n, max_size=n) for n in shapes))
        steps = draw_(st.integers(2, 3))
        masks = st.lists(st.booleans(), min_size=len(shapes), max_size=len(shapes))
        return (
            [draw_(tensors.map(list))],
            [[draw_(tensors.map(list))] for _ in range(steps)],
            draw_(st.lists(masks, min_size=steps, max_size=steps)),
            draw_(st.sampled_from((0.0, 0.5))),
            draw_(st.booleans()),
        )

    def check(case):
        starts, gradients, trainable, momentum, bucket_view = case
        results = world.run(
            jobs.zero_in_a_group, starts, gradients, size, momentum, bucket_view, trainable
        )
        said = (
            f"ZeroRedundancyOptimizer(SGD, lr=0.5, momentum={momentum}, "
            f"parameters_as_bucket_view={bucket_view}), trainable tensors by step {trainable}"
        )
        want = sgd_steps(starts[0], [step[0] for step in gradients], momentum, trainable=trainable)
        assert_every_rank_and_step(
            [got["after"] for got in results],
            lambda rank, step: want[step],
            lambda rank, step: (
                f"{said}: rank {rank}'s parameters after step {step} are not the SGD step of "
                "the tensors trainable then."
            ),
        )

    # One one-element tensor a rank (each rank owns one), the last rank's frozen when ZeRO is
    # built and unfrozen for the second step, in buckets: never left to chance.
    unfrozen = [[True] * (size - 1) + [False], [True] * size]
    ones = [[1.0]] * size
    prove(draw(), check, examples=[([ones], [[ones], [ones]], unfrozen, 0.0, True)])


# What torch says where it refuses overlap_with_ddp's hooks (hook_with_zero_step).
GLOO_REFUSED = "Gloo backend using Overlapping DDP with ZeRO may meet hangs"
WARM_UP = 2  # iterations that do not update, documented for static_graph=False


def test_zero_overlapped_with_ddp_steps_inside_the_hook_after_its_warm_up(world, prove):
    _overlapped(world, prove, shard_buckets=False)


@known_torch_issue(
    "ZeRO's overlap with shard_buckets=True cuts a DDP bucket before the parameter that "
    "reaches its size threshold, into more pieces than there are ranks to take them, and "
    "asserts 'All indices are disallowed' (one rank and a bucket of two parameters)",
    raises=RankError,
    match=r"All indices are disallowed",
    repro="findings/zero_overlap_shard_buckets.py",
)
def test_zero_overlapped_with_ddp_sharding_its_buckets(world, prove):
    _overlapped(world, prove, shard_buckets=True)


def _overlapped(world, prove, shard_buckets: bool) -> None:
    # overlap_with_ddp=True: ZeRO steps inside DDP's communication hook, on the averaged
    # gradients of the buckets it owns, and broadcasts them. The first two iterations do not
    # update (DDP's buckets are not final until the second forward: documented); every one
    # after is an SGD step on the mean gradient. Closed form: small integers, lr 0.5.
    if world.backend == "gloo":
        pytest.skip(f"torch refuses it on gloo: {GLOO_REFUSED!r} (pytorch#62300)")
    size = world.size
    values = st.integers(-8, 8).map(float)

    @st.composite
    def draw(draw_):
        shapes = draw_(st.lists(st.integers(1, 3), min_size=1, max_size=4))
        tensors = st.tuples(*(st.lists(values, min_size=n, max_size=n) for n in shapes))
        starts = list(draw_(tensors))
        steps = draw_(st.integers(WARM_UP + 1, WARM_UP + 3))
        per_rank = st.lists(tensors.map(list), min_size=size, max_size=size)
        gradients = draw_(st.lists(per_rank, min_size=steps, max_size=steps))
        # one bucket for all, or (a cap smaller than any parameter) one per parameter
        cap = draw_(st.sampled_from((25.0, 1e-6)))
        return starts, gradients, draw_(st.booleans()), shard_buckets, cap

    def check(case):
        starts, gradients, interleaved, shard_buckets, cap = case
        results = world.run(jobs.zero_overlapped_with_ddp, *case)
        hook = "hook_with_zero_step" + ("_interleaved" if interleaved else "")
        said = (
            f"ZeroRedundancyOptimizer(SGD, lr=0.5, overlap_with_ddp=True) in DDP(bucket_cap_mb="
            f"{cap})'s {hook}(allreduce_hook, shard_buckets={shard_buckets})"
        )
        params = [x for p in starts for x in p]
        trajectory = []
        for t, step in enumerate(gradients):
            if t >= WARM_UP:
                mean = [sum(column) / size for column in zip(*(
                    [x for g in rank for x in g] for rank in step), strict=True)]  # fmt: skip
                params = [p - 0.5 * g for p, g in zip(params, mean, strict=True)]
            trajectory.append(params)
        assert_every_rank_and_step(
            results,
            lambda rank, step: trajectory[step],
            lambda rank, step: (
                f"{said}: rank {rank}'s parameters after iteration {step} are not "
                + ("the starting ones (warm-up)" if step < WARM_UP else "an SGD step on the mean")
                + f" (every rank's trajectory: {results})."
            ),
            rtol=1e-6,
            atol=1e-6,
        )

    prove(draw(), check)


ZERO_REFUSED = {
    "a tensor for the parameters": r"TypeError: `params` argument should be an iterable of "
    r"Tensors",
    "no parameters": r"ValueError: ZeroRedundancyOptimizer got an empty parameter list",
    "a group without params": r"ValueError: Each parameter group passed-in via `params` must "
    r"have a 'params' key",
    "parameters of two dtypes": r"ValueError: ZeroRedundancyOptimizer only supports using the "
    r"same dense type",
    "a functional optimizer without overlap": r"ValueError: Passing in a functional optimizer",
    "state_dict before it was consolidated": r"RuntimeError: Optimizer state has not been "
    r"consolidated on this rank",
    **{
        f"{method} with overlap_with_ddp before DDP's buckets are rebuilt": r"RuntimeError: "
        r"This method should not be called until this ZeroRedundancyOptimizer instance has "
        r"been fully initialized"
        for method in ("consolidate_state_dict", "state_dict", "load_state_dict")
    },
}


def test_every_construction_and_call_zero_refuses_is_refused(world):
    # A regression that stops refusing lets a run go on with what ZeRO cannot shard (mixed
    # dtypes), or hands back a state that was never gathered.
    results = world.run(refusal_jobs.zero_refusals)
    refusal_jobs.assert_refused(results, ZERO_REFUSED, "ZeroRedundancyOptimizer")
