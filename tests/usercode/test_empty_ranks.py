"""Ranks that hold no sample in a step (issue 62): drawn where a kind's contract holds there,
trained by the harness as a rank of real training would be (its loss 0 over nothing, a zero
gradient, a count of 0), and a NaN from 0/0 named as such."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import find, settings

from ddp_verify import NotEquivalent, Scenario, VerifyingWorld, check
from ddp_verify.engine.scenario import ModelSpec
from ddp_verify.engine.strategies import scenarios
from ddp_verify.methods import ddp, manual_allreduce
from ddp_verify.methods.equivalence import check_equivalent
from ddp_verify.usercode.adapters import adapt

EMPTY_FIRST = Scenario(
    world_size=2, schedule=(((0,), (3,)), ((2,), (1,))), model=ModelSpec(hidden=(3,))
)


def weighted(model, num_samples):
    total = torch.tensor([float(num_samples)], dtype=torch.float64)
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(num_samples)
            dist.all_reduce(p.grad)
            p.grad.div_(total.item())


def renormalised(model, num_samples):
    # Sample-weighted, right, but the gradient first turned into its sum and back into the
    # rank's own mean: 0/0 on a rank with nothing.
    n = torch.tensor(float(num_samples), dtype=torch.float64)
    total = n.reshape(1).clone()
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(n).div_(n).mul_(n)
            dist.all_reduce(p.grad)
            p.grad.div_(total.item())


@pytest.fixture(scope="module")
def world2():
    with VerifyingWorld(2) as world:
        yield world


def test_a_step_may_leave_a_rank_without_samples_but_not_every_rank():
    assert EMPTY_FIRST.samples(0) == [0, 3]
    with pytest.raises(ValueError, match="some rank must hold a sample"):
        Scenario(world_size=2, schedule=(((0,), (0,)),))
    with pytest.raises(ValueError, match="at least one micro-batch"):
        Scenario(world_size=2, schedule=(((), (1,)),))


def test_empty_ranks_are_drawn_and_shrink_away():
    alone = find(scenarios(world_size=1, empty_ranks=True), lambda s: True)
    assert alone.samples(0) == [1]  # one rank holds every sample
    found = find(
        scenarios(world_size=2, empty_ranks=True),
        lambda s: 0 in s.samples(0),
        settings=settings(database=None, max_examples=200),
    )
    assert found.samples(0) in ([0, 1], [1, 0])
    simplest = find(scenarios(world_size=2, empty_ranks=True), lambda s: True)
    assert 0 not in simplest.samples(0)


def test_the_harness_trains_a_rank_without_samples_as_real_training_does(world2):
    assert check_equivalent(world2, ddp(), EMPTY_FIRST).equivalent
    assert check_equivalent(world2, manual_allreduce(), EMPTY_FIRST).equivalent
    assert check_equivalent(world2, adapt(weighted, "grad-sync"), EMPTY_FIRST).equivalent
    assert not check_equivalent(world2, manual_allreduce(weighting="world"), EMPTY_FIRST).equivalent


def test_a_division_by_a_rank_count_of_zero_is_named_as_such(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(renormalised, kind="grad-sync", world_size=2, seed=0, max_examples=50)
    causes = info.value.verdict.causes
    assert causes[0].pattern == "nan:empty-rank", [c.pattern for c in causes]
    assert "holds no sample at step 0" in causes[0].text
