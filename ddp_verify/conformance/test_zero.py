"""``ZeroRedundancyOptimizer``: each rank steps the optimizer state of its shard of the
parameters and broadcasts them; training must stay equivalent to the unsharded optimizer's."""

from __future__ import annotations

import pytest

from ddp_verify.engine.strategies import optimizers, scenarios


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
