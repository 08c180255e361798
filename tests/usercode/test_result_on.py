"""Helpers whose result is on rank 0 only, and the shapes reduce helpers must keep."""

from __future__ import annotations

import pytest

from ddp_verify import EquivalenceError, check
from ddp_verify.usercode.kinds import KindError
from tests.user_code import load

dicts = load("real_style/reduce_dict_helpers")
tensors = load("real_style/reduce_helpers")


def test_a_reduce_onto_rank_0_is_held_to_the_global_mean_there(tmp_path, monkeypatch):
    # detectron2-style reduce_dict averages by the world size on rank 0: with rank 0's result
    # the only one checked, the search still finds its uneven-batch bug and names it.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            dicts.reduce_dict,
            kind="reduce-dict",
            world_size=2,
            max_examples=25,
            seed=0,
            result_on="rank0",
        )
    assert "unweighted mean of rank means" in caught.value.cause
    assert "(result on rank0)" in str(caught.value)
    verdict = check(
        tensors.reduce_tensor_weighted,
        kind="reduce",
        world_size=2,
        max_examples=10,
        seed=0,
        result_on="rank0",
    )
    assert verdict.examples == 10


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_a_reduce_onto_rank_0_is_recognised_at_every_world_size(world_size, tmp_path, monkeypatch):
    # detectron2's reduce_dict (dist.reduce to rank 0): at 2 ranks rank 1 keeps its own loss,
    # but from 4 ranks on gloo's reduce is a tree and the inner ranks hold partial sums. Both
    # are what a reduce onto rank 0 leaves: the cause is named at every size.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(dicts.reduce_dict, kind="reduce-dict", world_size=world_size, max_examples=10, seed=0)
    assert caught.value.causes[0].pattern == "loss:rank0-only", caught.value.cause


def test_a_sum_every_rank_holds_is_not_read_as_a_reduce_onto_rank_0(tmp_path, monkeypatch):
    # Every rank holds the sum: a partial sum of all ranks, but rank 0's too.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(tensors.sum_tensor, kind="reduce", world_size=4, max_examples=10, seed=0)
    assert "loss:rank0-only" not in [c.pattern for c in caught.value.causes]
    assert "summed across ranks but not divided" in caught.value.cause


def test_a_list_helper_may_return_one_tensor_of_the_lists_values(tmp_path, monkeypatch):
    # Megatron's average_losses_across_data_parallel_group([loss]) returns one tensor.
    monkeypatch.chdir(tmp_path)
    helpers = load("real_style/list_helpers")
    with pytest.raises(EquivalenceError) as caught:
        check(helpers.average_losses_as_one_tensor, kind="reduce", world_size=2, max_examples=10)
    assert "Called as: average_losses_as_one_tensor([tensor[]])" in str(caught.value)
    assert "unweighted mean of rank means" in caught.value.cause


def test_result_on_is_for_helpers_that_return_a_result():
    with pytest.raises(KindError, match="result_on='rank0' applies to loss, reduce, reduce-dict"):
        check(lambda model: None, kind="grad-sync", world_size=2, result_on="rank0")


@pytest.mark.parametrize(
    ("kind", "fn", "words"),
    [
        ("reduce", lambda tensor: tensor.item(), "must return a tensor of the shape it was given"),
        ("reduce", lambda tensor: tensor.reshape(1), "must return a tensor of the shape"),
        ("reduce-dict", lambda metrics: metrics["loss"], "must return a dict with the keys"),
        (
            "reduce",
            lambda losses: [losses[0], losses[0]],
            "must return a list of one tensor or a tensor of its one value, got list",
        ),
    ],
    ids=["number", "reshaped", "not-a-dict", "not-a-list"],
)
def test_a_helper_that_changes_the_form_is_a_usage_error(kind, fn, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KindError, match=words):
        check(fn, kind=kind, world_size=2, max_examples=3, seed=0)
