"""The diagnosis on real worlds: every cause found, gradients and losses explained apart,
what is not linear said as such, and "no known mistake" only for what fits nothing, with the
fitted weights shown. Causes are judged by their fitted weights (tests/usercode/patterns.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.methods.equivalence import check_equivalent
from ddp_verify.usercode.adapters import adapt
from ddp_verify.usercode.diagnosis import likely_causes
from ddp_verify.usercode.findings import NO_KNOWN_MISTAKE
from tests.user_code import load
from tests.usercode.patterns import weights_show

# Uneven over ranks (4 and 3 samples) and within them, as many micro-batches on each rank.
FULLER = Scenario(
    world_size=2,
    schedule=(((1, 3), (2, 1)), ((2, 1), (1, 1))),
    model=ModelSpec(in_features=2, hidden=(3,)),
)
ONE_STEP = Scenario(
    world_size=2, schedule=(((1,), (3,)), ((2,), (2,))), model=ModelSpec(in_features=2, hidden=(3,))
)


def diagnose(world, fn, kind, scenario):
    outcome = check_equivalent(world, adapt(fn, kind), scenario)
    assert not outcome.equivalent
    return likely_causes(kind, scenario, outcome.reference, outcome.got)


def sample_weighted_then_nudged(model, num_samples):
    """Right gradients; then it moves the parameters itself (a stray in-place edit)."""
    load("grad_sync").sample_weighted(model, num_samples)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)


def sign_of_the_mean(model, num_samples):
    """Synchronises correctly, then keeps only each gradient's sign (signSGD): not a
    weighting of the samples at all."""
    load("grad_sync").sample_weighted(model, num_samples)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.copy_(p.grad.sign())


def world_mean_and_rank_zero_loss(local_loss, num_samples):
    """Reports the loss averaged over ranks by the world size (a logging helper)."""
    total = local_loss.detach().clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


@pytest.mark.parametrize("world_size", [2], indirect=True, ids=["ws2"])
def test_a_nanogpt_loop_has_its_three_mistakes_named(world):
    causes = diagnose(
        world, load("real_style/nanogpt_steps").gpt_accumulation, "wrapped-step", FULLER
    )
    found = {c.pattern: c for c in causes}
    # Micro-batches weighted equally, ranks averaged by the world size, the logged loss the
    # rank's own last micro-batch: each found, the gradient's before the loss's.
    assert {"micro:equal", "ranks:world", "loss:local", "loss:last-only"} <= set(found)
    for pattern in ("micro:equal", "ranks:world"):
        assert weights_show(pattern, list(found[pattern].weights), 2)
    subjects = [c.subject for c in causes]
    assert subjects == sorted(subjects, key=lambda s: s != "gradient")


@pytest.mark.parametrize("world_size", [2], indirect=True, ids=["ws2"])
def test_a_gradient_mistake_does_not_hide_a_loss_mistake_nor_the_other_way(world):
    # Gradients summed over ranks (not divided) and the rank's own loss reported.
    causes = diagnose(world, _sum_and_local, "step", ONE_STEP)
    assert [c.subject for c in causes] == ["gradient", "loss"]
    assert causes[0].pattern == "ranks:sum" and weights_show(
        "ranks:sum", list(causes[0].weights), 2
    )
    assert causes[1].pattern == "loss:local"
    # A loss helper alone: the gradients are the harness's (right), only the loss is named.
    only_loss = diagnose(world, world_mean_and_rank_zero_loss, "loss", ONE_STEP)
    assert [c.pattern for c in only_loss] == ["loss:world"]


def _sum_and_local(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    n = sum(len(x) for x, _ in micro_batches)
    local = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y) * len(x) / n
        loss.backward()
        local += loss.item()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    optimizer.step()
    return local


@pytest.mark.parametrize("world_size", [2], indirect=True, ids=["ws2"])
def test_what_is_not_a_weighting_is_said_with_the_weights_anyway(world):
    [cause] = [
        c
        for c in diagnose(world, sign_of_the_mean, "grad-sync", ONE_STEP)
        if c.subject == "gradient"
    ]
    assert cause.pattern == "nonlinear"
    assert "not a weighted sum" in cause.text and cause.weights


@pytest.mark.parametrize("world_size", [2], indirect=True, ids=["ws2"])
def test_no_known_mistake_only_when_gradients_and_loss_are_right(world):
    [cause] = diagnose(world, sample_weighted_then_nudged, "grad-sync", ONE_STEP)
    assert cause.text.startswith(NO_KNOWN_MISTAKE)
    assert "correct weighting" in cause.text
    # The fitted weights are shown anyway: every sample counted 1/N.
    assert cause.weights and all(
        abs(row["weight"] - row["expected"]) < 1e-9 for row in cause.weights
    )
