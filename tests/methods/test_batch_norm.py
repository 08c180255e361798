"""BatchNorm under data parallelism: DDP normalises each rank's micro-batch by its own
statistics (documented; it differs from full-batch training), and the diagnosis says so;
SyncBatchNorm uses the global batch's statistics (CUDA only in torch)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ddp_verify import EquivalenceError, check
from ddp_verify.engine.compare import compare
from ddp_verify.engine.reference import train_per_batch_statistics, train_reference
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.strategies import models, scenarios
from ddp_verify.engine.tolerances import Float64Tolerance
from ddp_verify.methods import ddp
from tests.user_code import load

SYNC_BATCH_NORM = ModelSpec(in_features=2, hidden=(3,), batch_norm="sync")


@pytest.mark.parametrize("world_size", [2], indirect=True, ids=lambda n: f"ws{n}")
@settings(max_examples=10)
@given(data=st.data())
def test_ddp_with_batch_norm_diverges_exactly_as_documented(world, data):
    # Every rank's micro-batch normalised by its own statistics, weighted by its share: DDP
    # matches that to float64 rounding, and differs from the full batch's statistics.
    scenario = data.draw(
        scenarios(
            world_size=world.size,
            min_samples=2,  # BatchNorm needs two samples to have a variance
            models=models(kinds=("mlp",), batch_norm="batch", features=False),
        ).filter(lambda s: all(m >= 2 for step in s.schedule for sizes in step for m in sizes))
    )
    got = ddp().run(scenario, world)
    per_batch = train_per_batch_statistics(scenario)
    assert compare(per_batch, got, scenario, Float64Tolerance()) is None
    # Where the statistics make no difference (every unit behind a BatchNorm dead under ReLU,
    # say: seen with seed 34669), there is no divergence to show.
    reference = train_reference(scenario)
    assume(compare(reference, per_batch, scenario, Float64Tolerance()) is not None)
    assert compare(reference, got, scenario, Float64Tolerance()) is not None


def test_the_diagnosis_names_batch_norm_for_correct_synchronisation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sample_weighted = load("grad_sync").sample_weighted
    with pytest.raises(EquivalenceError) as info:
        check(
            sample_weighted,
            kind="grad-sync",
            world_size=2,
            max_examples=20,
            seed=0,
            min_samples=2,
            max_micro_batches=1,
            models=models(kinds=("mlp",), batch_norm="batch", features=False),
        )
    assert info.value.causes[0].pattern == "batch-norm"
    assert "SyncBatchNorm" in info.value.cause


def test_sync_batch_norm_on_a_cpu_world_is_refused_with_the_reason():
    scenario = Scenario(
        world_size=2,
        schedule=(((2,), (3,)),),
        model=SYNC_BATCH_NORM,
    )
    from ddp_verify.frontends.verifying import VerifyingWorld
    from ddp_verify.world import RankError

    with VerifyingWorld(2) as world, pytest.raises(RankError, match="SyncBatchNorm runs on GPUs"):
        ddp().run(scenario, world)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 1,
    reason="SyncBatchNorm runs on CUDA tensors only (torch raises for CPU); no GPU here",
)
def test_sync_batch_norm_is_equivalent_to_the_full_batch_with_uneven_batches():
    from ddp_verify.frontends.verifying import VerifyingWorld

    with VerifyingWorld(2, device="cuda") as world:
        for schedule in ((((2,), (3,)),), (((4,), (2,)), ((3,), (5,)))):
            scenario = Scenario(
                world_size=2,
                schedule=schedule,
                model=SYNC_BATCH_NORM,
            )
            world.assert_equivalent(ddp(), scenario)
