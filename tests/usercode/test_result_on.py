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


def test_result_on_is_for_helpers_that_return_a_result():
    with pytest.raises(KindError, match="result_on='rank0' applies to loss, reduce, reduce-dict"):
        check(lambda model: None, kind="grad-sync", world_size=2, result_on="rank0")


@pytest.mark.parametrize(
    ("kind", "fn", "words"),
    [
        ("reduce", lambda tensor: tensor.item(), "must return a tensor of the shape it was given"),
        ("reduce", lambda tensor: tensor.reshape(1), "must return a tensor of the shape"),
        ("reduce-dict", lambda metrics: metrics["loss"], "must return a dict with the keys"),
        ("reduce", lambda losses: losses[0], "must return a list or tuple of one tensor"),
    ],
    ids=["number", "reshaped", "not-a-dict", "not-a-list"],
)
def test_a_helper_that_changes_the_form_is_a_usage_error(kind, fn, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KindError, match=words):
        check(fn, kind=kind, world_size=2, max_examples=3, seed=0)
