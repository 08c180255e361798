"""Check that data-parallel training on this machine computes what single-process training
computes. Copy this file into your project and run:

    pytest --world-size 4 test_ddp_equivalence.py

Each example is a generated scenario: a small model, per-rank micro-batch sizes for a few steps
(uneven splits and gradient accumulation included), a loss, an optimizer and a dtype.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_verify.methods import ddp, manual_allreduce
from ddp_verify.strategies import scenarios

# One example trains on every rank and in the controller: tens of milliseconds, more than
# hypothesis's default deadline allows on a busy machine.
EXAMPLES = settings(max_examples=40, deadline=None)


def draw_scenario(data: st.DataObject, world_size: int):
    # Drawn inside the test, because the world's size comes from --world-size.
    return data.draw(
        scenarios(world_size=world_size, max_micro_batches=3, dtypes=("float64", "float32"))
    )


@EXAMPLES
@given(data=st.data())
def test_ddp_matches_single_process_training(world, data):
    world.assert_equivalent(ddp(), draw_scenario(data, world.size))


@EXAMPLES
@given(data=st.data())
def test_small_ddp_buckets_change_nothing(world, data):
    world.assert_equivalent(ddp(bucket_cap_mb=0.0001), draw_scenario(data, world.size))


@EXAMPLES
@given(data=st.data())
def test_sample_weighted_all_reduce_matches_single_process_training(world, data):
    world.assert_equivalent(manual_allreduce(weighting="samples"), draw_scenario(data, world.size))
