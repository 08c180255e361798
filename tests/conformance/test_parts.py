"""The parts the conformance suite stands on: the compression tolerance catches what it
should, the Join reference tells the two divisors apart, shard bookkeeping counts right."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis.errors import InvalidArgument

from ddp_verify.conformance.sharding import Shards
from ddp_verify.conformance.uneven_batches import JoinRun, check_join, reference_join
from ddp_verify.engine.compression import (
    CompressionTolerance,
    contribution_scales,
    unit_roundoff,
)
from ddp_verify.engine.scenario import ModelSpec, OptimizerSpec, Scenario
from ddp_verify.engine.strategies import models
from ddp_verify.methods import Reference, ddp

# Two ranks whose cross-entropy bias gradients nearly cancel: contributions ~0.5, sum ~0.002.
SCENARIO = Scenario(
    world_size=2,
    schedule=(((1,), (1,)), ((2,), (1,))),
    model=ModelSpec(
        in_features=1, hidden=(4, 3), out_features=2, activation="relu", tied=True, frozen=True
    ),
    loss="cross_entropy",
    seed=3,
)


def fp16_forgets_to_divide(state, bucket):
    """fp16_compress_hook without the division by the world size."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: bucket.buffer().copy_(f.value()[0]))


def fp16_correct(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.fp16_compress_hook(state, bucket)


def test_the_fp16_bound_passes_torchs_hook_and_catches_one_that_forgets_to_divide(world):
    if world.size != 2:
        pytest.skip("the scenario is for two ranks")
    tolerance = CompressionTolerance(SCENARIO, "float16")
    assert world.check_equivalent(
        ddp(comm_hook=fp16_correct), SCENARIO, tolerance=tolerance
    ).equivalent
    outcome = world.check_equivalent(
        ddp(comm_hook=fp16_forgets_to_divide), SCENARIO, tolerance=tolerance
    )
    assert not outcome.equivalent
    assert outcome.mismatch.quantity == "gradient"
    assert "float16 compression" in outcome.report()


def test_contribution_scales_see_what_cancels_across_ranks():
    scales = contribution_scales(SCENARIO)
    grads = Reference("float64").run(SCENARIO).ranks[0].grads[0].values()
    largest = max(float(g.abs().max()) for g in grads if g is not None)
    assert len(scales) == SCENARIO.steps
    # Step 0's gradients are all small (2e-3) because the ranks' shares (0.5) cancel.
    assert scales[0] > 100 * largest


def test_a_compression_bound_is_refused_for_adam_and_unknown_formats():
    adam = Scenario(world_size=2, schedule=(((1,), (1,)),), optimizer=OptimizerSpec("adam"))
    with pytest.raises(ValueError, match="SGD only"):
        CompressionTolerance(adam, "float16")
    with pytest.raises(ValueError, match="format must be one of"):
        CompressionTolerance(SCENARIO, "float8")
    assert unit_roundoff("float16") == 2.0**-11 and unit_roundoff("bfloat16") == 2.0**-8


def _join_run(world_size: int, divide: bool) -> JoinRun:
    scenario = Scenario(world_size=world_size, schedule=(((2,),) * world_size,) * 3, seed=5)
    return JoinRun(scenario, (3,) + (1,) * (world_size - 1), divide)


def test_the_join_reference_tells_the_two_divisors_apart():
    by_initial = reference_join(_join_run(2, True))
    by_active = reference_join(_join_run(2, False))
    assert torch.equal(by_initial[0]["head.weight"], by_active[0]["head.weight"])  # all active
    assert not torch.allclose(by_initial[2]["head.weight"], by_active[2]["head.weight"])


@pytest.mark.parametrize("divide", [True, False])
def test_ddp_under_join_matches_the_reference_for_both_divisors(world, divide):
    check_join(world, _join_run(world.size, divide), ddp())


def test_a_join_reference_for_the_other_divisor_is_caught(world, monkeypatch):
    run = _join_run(world.size, True)
    wrong = _join_run(world.size, False)
    import ddp_verify.conformance.uneven_batches as uneven

    # The ranks train with the default divisor; the controller expects the other one.
    monkeypatch.setattr(uneven, "reference_join", lambda _run: reference_join(wrong))
    with pytest.raises(AssertionError, match="divide_by_initial_world_size=True"):
        check_join(world, run, ddp())


def test_join_runs_refuse_impossible_batch_counts():
    scenario = Scenario(world_size=2, schedule=(((1,), (1,)),) * 2)
    with pytest.raises(ValueError, match="one rank all 2"):
        JoinRun(scenario, (1, 1))


def test_shards_count_padding_duplicates_and_missing_indices():
    shards = Shards.of([[0, 1, 2], [3, 4, 0]], length=6)
    assert (shards.duplicates, shards.missing) == (1, 1)


@given(models(required_features=("unused", "buffer"), excluded_features=("tied",)))
def test_models_have_every_required_feature_and_no_excluded_one(spec):
    assert spec.unused and spec.buffer and not spec.tied


@pytest.mark.parametrize(
    "kwargs",
    [
        {"required_features": ("wings",)},
        {"required_features": ("unused",), "excluded_features": ("unused",)},
        {"required_features": ("unused",), "features": False},
    ],
)
def test_impossible_feature_requests_are_invalid_arguments(kwargs):
    with pytest.raises(InvalidArgument):
        models(**kwargs).example()
