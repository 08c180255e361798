"""FSDP2 (``fully_shard``) against the reference, where the installed torch runs it on the
backend in use; otherwise skipped with torch's own reason."""

from __future__ import annotations

import pytest

from ddp_verify.engine.scenario import Scenario
from ddp_verify.engine.strategies import optimizers, scenarios
from ddp_verify.methods import fully_shard
from ddp_verify.world import RankError


@pytest.fixture(scope="module")
def fsdp(world):
    method = fully_shard()
    probe = Scenario(world_size=world.size, schedule=(((1,),) * world.size,))
    try:
        world.check_equivalent(method, probe)
    except (RankError, ImportError) as exc:
        first = str(exc).splitlines()[0]
        pytest.skip(f"fully_shard does not run here (torch on {world.backend}): {first}")
    return method


def test_fully_shard_matches_the_reference(world, fsdp, prove):
    # Every forward all-gathers the parameters, so every rank must run as many forwards: equal
    # micro-batch counts per step (their sizes still differ).
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            same_micro_batch_counts=True,
            dtypes=("float64", "float32"),
        ),
        lambda scenario: world.assert_equivalent(fsdp, scenario),
    )


def test_fully_shard_clips_by_the_total_norm_across_shards(world, fsdp, prove):
    # Each rank holds a shard of every gradient (DTensors): clip_grad_norm_ must clip by the
    # norm of the whole model's gradient, not of the shard it holds.
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            same_micro_batch_counts=True,
            optimizers=optimizers(clip=True),
        ),
        lambda scenario: world.assert_equivalent(fsdp, scenario),
    )


@pytest.mark.parametrize("accumulation", ["gradient_sync", "all_reduce"])
def test_hybrid_sharding_on_a_2d_mesh_matches_the_reference(world, fsdp, prove, accumulation):
    # HSDP: 2 replica groups of world size / 2 ranks; gradients reduce-scattered in a group and
    # all-reduced across the groups must still be the full batch's. Accumulation both ways:
    # set_requires_gradient_sync(False) (nothing reduced until the last micro-batch) and
    # set_requires_all_reduce(False) (reduce-scattered every micro-batch, the partial
    # results kept and all-reduced with the last): every micro-batch must count.
    if world.size < 2 or world.size % 2:
        pytest.skip(f"a 2 x N mesh needs an even world size, not {world.size}")
    method = fully_shard(replicas=2, accumulation=accumulation)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            same_micro_batch_counts=True,
            dtypes=("float64", "float32"),
        ).filter(lambda s: any(len(sizes) > 1 for step in s.schedule for sizes in step)),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_mixed_precision_reduction_in_float32_of_a_bfloat16_model(world, fsdp, prove):
    # MixedPrecisionPolicy(reduce_dtype=float32) on a bfloat16 model: gradients upcast for the
    # reduce-scatter, so the result must be within bfloat16's derived tolerance (the rounding
    # of bfloat16 training; the reduction itself only rounds less).
    method = fully_shard(reduce_dtype="float32")
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=2,
            same_micro_batch_counts=True,
            dtypes=("bfloat16",),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_fully_shard_resumes_from_a_distributed_checkpoint(world, fsdp, prove):
    # torch.distributed.checkpoint: every rank saves its shards of the model and optimizer
    # (through get_state_dict, which names each param group's parameters by their fully
    # qualified names), a fresh sharded model loads them, and training goes on as if never
    # interrupted, each param group with its own settings.
    launched = getattr(getattr(world, "member", None), "launched", None)
    if getattr(launched, "nodes", 1) > 1:
        pytest.skip(
            "the checkpoint directory is rank 0's temporary one: across nodes every rank would "
            "need a shared filesystem to read the shards the others wrote"
        )

    def check(scenario):
        world.assert_equivalent(fully_shard(resume_at=scenario.steps - 1), scenario)

    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=2,
            same_micro_batch_counts=True,
            optimizers=optimizers(names=("adam", "sgd"), groups=True),
        ).filter(lambda s: s.steps >= 2),
        check,
    )
