"""The reference shares no code with what the conformance suite gates: it trains with the
engine's own optimizers and clipping (ddp_verify/engine/optimizers.py), so a torch.optim or
clip_grad_norm_ that refuses to run leaves it untouched; and those rules are the published
ones, checked by hand on numbers small enough to follow."""

from __future__ import annotations

import pytest
import torch

from ddp_verify.engine.optimizers import ReferenceOptimizer, clip_total_norm
from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import ModelSpec, OptimizerSpec, Scenario


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_the_reference_trains_without_torch_optim_or_its_clipping(monkeypatch, name):
    def refuse(*args, **kwargs):
        raise AssertionError("the reference used what the conformance suite gates")

    monkeypatch.setattr(torch.optim.Optimizer, "__init__", refuse)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", refuse)
    monkeypatch.setattr(torch.nn.utils.clip_grad, "clip_grad_norm_", refuse)
    spec = OptimizerSpec(
        name, lr=0.05, momentum=0.9 if name == "sgd" else 0.0, max_norm=0.01, lr_decay=0.5
    )
    scenario = Scenario(
        world_size=2, schedule=(((2,), (1,)), ((1,), (2,))), model=ModelSpec(), optimizer=spec
    )
    trace = train_reference(scenario)
    assert len(trace.ranks[0].params) == 2
    # It trained: the parameters moved at each step.
    first, second = trace.ranks[0].params
    assert any(not torch.equal(first[n], second[n]) for n in first)


def test_sgd_with_momentum_and_decay_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    optimizer = ReferenceOptimizer(
        OptimizerSpec("sgd", lr=0.1, momentum=0.5, weight_decay=0.2), [p]
    )
    p.grad = torch.tensor([2.0], dtype=torch.float64)
    optimizer.step()  # g = 2 + 0.2 * 1 = 2.2; b = 2.2; p = 1 - 0.22
    assert float(p.detach()) == pytest.approx(0.78)
    p.grad = torch.tensor([2.0], dtype=torch.float64)
    optimizer.step()  # g = 2 + 0.2 * 0.78 = 2.156; b = 0.5 * 2.2 + 2.156 = 3.256
    assert float(p.detach()) == pytest.approx(0.78 - 0.3256)


def test_a_decaying_learning_rate_by_hand():
    # lr_decay 0.5: steps of 0.1, 0.05 and 0.025 times a gradient of 1 (a scheduler's LambdaLR).
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    optimizer = ReferenceOptimizer(OptimizerSpec("sgd", lr=0.1, lr_decay=0.5), [p])
    for _ in range(3):
        p.grad = torch.tensor([1.0], dtype=torch.float64)
        optimizer.step()
    assert float(p.detach()) == pytest.approx(1.0 - 0.1 - 0.05 - 0.025, abs=1e-15)


def test_adam_first_step_moves_each_entry_by_the_learning_rate():
    # At step 1 the bias-corrected moments are g and g^2: the update is lr * g / (|g| + eps).
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float64))
    optimizer = ReferenceOptimizer(OptimizerSpec("adam", lr=0.01), [p])
    p.grad = torch.tensor([3.0, -0.5], dtype=torch.float64)
    optimizer.step()
    assert p.detach().tolist() == pytest.approx([1.0 - 0.01, -1.0 + 0.01], rel=1e-9)


def test_adamw_decays_the_parameter_apart_from_the_gradient():
    p = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    optimizer = ReferenceOptimizer(OptimizerSpec("adamw", lr=0.1, weight_decay=0.5), [p])
    p.grad = torch.tensor([4.0], dtype=torch.float64)
    optimizer.step()  # p = 2 * (1 - 0.05) - 0.1 * 4 / (4 + eps)
    assert float(p.detach()) == pytest.approx(1.9 - 0.1, rel=1e-9)


def test_clipping_scales_only_gradients_above_the_bound():
    small = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    small.grad = torch.tensor([0.03, 0.04], dtype=torch.float64)  # norm 0.05
    assert clip_total_norm([small], 1.0) == pytest.approx(0.05)
    assert small.grad.tolist() == [0.03, 0.04]  # left alone, never scaled up
    big = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    big.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    clip_total_norm([big], 1.0)
    assert float(big.grad.norm()) == pytest.approx(1.0, rel=1e-6)
