"""FSDP2 (``fully_shard``) against the reference, where the installed torch runs it on the
backend in use; otherwise skipped with torch's own reason."""

from __future__ import annotations

import pytest

from ddp_verify.engine.scenario import Scenario
from ddp_verify.engine.strategies import scenarios
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
