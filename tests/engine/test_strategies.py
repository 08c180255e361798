"""Strategies: valid draws, InvalidArgument for impossible bounds, shrinking to the simplest."""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ddp_verify.engine.scenario import ModelSpec, OptimizerSpec
from ddp_verify.engine.strategies import (
    accumulation_schedules,
    batch_splits,
    models,
    optimizers,
    scenarios,
)

# Derandomized: a find() whose shrinking depends on the draw of the day is a flaky test.
FIND = settings(database=None, max_examples=300, derandomize=True)


@given(split=batch_splits(world_size=3, min_samples=2, max_samples=5))
def test_batch_splits_respect_bounds(split):
    assert len(split) == 3 and all(2 <= n <= 5 for n in split)


@given(split=batch_splits(world_size=4, even=True))
def test_even_splits_are_even(split):
    assert len(set(split)) == 1


@given(
    schedule=accumulation_schedules(world_size=2, max_samples=5, max_micro_batches=3, max_steps=2)
)
def test_schedules_cut_each_rank_into_nonempty_micro_batches(schedule):
    assert 1 <= len(schedule) <= 2
    for per_rank in schedule:
        assert len(per_rank) == 2
        for sizes in per_rank:
            assert 1 <= len(sizes) <= 3 and all(m >= 1 for m in sizes) and sum(sizes) <= 5


@given(
    schedule=accumulation_schedules(
        world_size=3,
        min_samples=2,
        max_samples=4,
        max_micro_batches=3,
        same_micro_batch_counts=True,
    )
)
def test_same_micro_batch_counts_keep_counts_equal_but_sizes_free(schedule):
    for per_rank in schedule:
        assert len({len(sizes) for sizes in per_rank}) == 1
        assert all(all(m >= 1 for m in sizes) and 2 <= sum(sizes) <= 4 for sizes in per_rank)


def test_same_micro_batch_counts_still_find_uneven_micro_batches():
    def uneven_accumulation(schedule):
        per_rank = schedule[0]
        return len(per_rank[0]) > 1 and len({sizes for sizes in per_rank}) > 1

    found = find(
        accumulation_schedules(world_size=2, same_micro_batch_counts=True),
        uneven_accumulation,
        settings=FIND,
    )
    assert len(found) == 1 and sorted(found[0]) in ([(1, 1), (1, 2)], [(1, 1), (2, 1)])


@given(scenario=scenarios(world_size=3, dtypes=("float64", "float32")))
def test_scenarios_are_valid_for_their_world(scenario):
    assert scenario.world_size == 3
    if scenario.loss == "cross_entropy":
        assert scenario.model.out_features >= 2


def test_scenarios_shrink_to_the_simplest_case():
    simplest = find(
        scenarios(world_size=4, dtypes=("float64", "float32")), lambda s: True, settings=FIND
    )
    assert simplest.steps == 1
    assert simplest.schedule == (((1,), (1,), (1,), (1,)),)
    assert simplest.model == ModelSpec(in_features=1, hidden=(2,), out_features=1)
    assert simplest.optimizer == OptimizerSpec()
    assert (simplest.loss, simplest.dtype, simplest.seed) == ("mse", "float64", 0)


def test_an_uneven_split_shrinks_to_one_extra_sample():
    found = find(batch_splits(world_size=4), lambda s: len(set(s)) > 1, settings=FIND)
    assert sorted(found) == [1, 1, 1, 2]


def test_accumulation_shrinks_to_two_micro_batches_of_one():
    def accumulates(schedule):
        return any(len(sizes) > 1 for per_rank in schedule for sizes in per_rank)

    found = find(accumulation_schedules(world_size=2), accumulates, settings=FIND)
    assert len(found) == 1
    assert sorted(found[0]) == [(1,), (1, 1)] or sorted(found[0]) == [(1, 1), (1, 1)]


@given(spec=models(kinds=("conv",), features=False))
def test_model_kinds_and_features_can_be_restricted(spec):
    assert spec.kind == "conv"
    assert not (spec.layernorm or spec.tied or spec.unused or spec.frozen or spec.buffer)


@given(spec=optimizers(names=("adam",), weight_decay=False))
def test_optimizers_can_be_restricted(spec):
    assert spec.name == "adam" and spec.weight_decay == 0 and spec.momentum == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: batch_splits(world_size=0), "world_size=0 must be an integer of at least 1"),
        (lambda: batch_splits(world_size=2, min_samples=0), "min_samples=0"),
        (lambda: batch_splits(world_size=2, min_samples=3, max_samples=2), "max_samples=2"),
        (lambda: accumulation_schedules(world_size=2, max_micro_batches=0), "max_micro_batches"),
        (lambda: accumulation_schedules(world_size=2, max_steps=0), "max_steps=0"),
        (lambda: scenarios(world_size=2, dtypes=("float16",)), "dtypes has ['float16']"),
        (lambda: scenarios(world_size=2, dtypes="float64"), "dtypes must be a non-empty"),
        (lambda: scenarios(world_size=2, losses=()), "losses must be a non-empty"),
        (lambda: models(kinds=("rnn",)), "kinds has ['rnn']"),
        (lambda: models(max_width=1), "max_width=1"),
        (lambda: models(kinds=("transformer",), aside=True), "aside applies to mlp"),
        (lambda: optimizers(names=("lbfgs",)), "names has ['lbfgs']"),
    ],
)
def test_impossible_arguments_raise_invalid_argument(make, message):
    with pytest.raises(InvalidArgument) as info:
        make()
    assert message in str(info.value)


def test_scenarios_note_the_drawn_scenario():
    notes = []

    @settings(database=None, max_examples=1)
    @given(st.data())
    def inner(data):
        scenario = data.draw(scenarios(world_size=2))
        notes.append(scenario)
        raise AssertionError("show me the notes")

    with pytest.raises(AssertionError) as info:
        inner()
    assert "Scenario: world_size=2" in "\n".join(getattr(info.value, "__notes__", []))


@given(models(kinds=("mlp",), min_width=3, max_width=4, min_out_features=3, max_out_features=3))
def test_min_width_keeps_every_weight_matrix_wider_than_two(spec):
    assert spec.in_features >= 3 and all(3 <= h <= 4 for h in spec.hidden)


def test_min_width_above_max_width_is_refused():
    with pytest.raises(InvalidArgument, match="min_width=5 is above max_width=4"):
        models(min_width=5, max_width=4).example()
