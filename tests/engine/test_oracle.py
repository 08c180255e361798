"""The reference shares no code with what the conformance suite gates: it trains with the
engine's own optimizers and clipping (ddp_verify/engine/optimizers.py), so a torch.optim or
clip_grad_norm_ that refuses to run leaves it untouched; and those rules are the published
ones, checked by hand on numbers small enough to follow."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ddp_verify.engine.optimizers import ReferenceOptimizer, clip_total_norm, param_groups
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


def test_two_param_groups_by_hand():
    # The matrix steps with the spec's lr and weight decay, the bias (one-dimensional) with
    # half the lr and none: g = 1 + 0.5 * 2 = 2 for the matrix, 1 for the bias.
    matrix = torch.nn.Parameter(torch.full((1, 1), 2.0, dtype=torch.float64))
    bias = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    spec = OptimizerSpec("sgd", lr=0.1, weight_decay=0.5, param_groups=2)
    optimizer = ReferenceOptimizer(spec, [bias, matrix])
    for p in (matrix, bias):
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert float(matrix.detach()) == pytest.approx(2.0 - 0.1 * 2.0)
    assert float(bias.detach()) == pytest.approx(2.0 - 0.05 * 1.0)


def test_param_groups_put_vectors_apart_and_leave_none_empty():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    one, two = OptimizerSpec("adamw", weight_decay=0.01), OptimizerSpec("adamw", param_groups=2)
    assert [len(g.params) for g in param_groups(one, model.parameters())] == [4]
    groups = param_groups(dataclasses.replace(two, weight_decay=0.01), model.parameters())
    assert [[tuple(p.shape) for p in g.params] for g in groups] == [[(2, 3)], [(2,), (2,), (2,)]]
    assert [(g.lr, g.weight_decay) for g in groups] == [(0.1, 0.01), (0.05, 0.0)]
    # A model of vectors only: one group, the second's settings.
    only = param_groups(two, [torch.nn.Parameter(torch.zeros(3))])
    assert [(len(g.params), g.lr) for g in only] == [(1, 0.05)]
    with pytest.raises(ValueError, match="param_groups must be 1 or 2"):
        OptimizerSpec(param_groups=3)


def test_an_output_left_out_of_the_loss_leaves_its_head_untouched():
    # ModelSpec(aside=True): forward returns two outputs, the loss takes the first; the
    # second's head gets no gradient, so even with weight decay nothing moves it.
    spec = OptimizerSpec("adamw", lr=0.05, weight_decay=0.01)
    scenario = Scenario(
        world_size=2,
        schedule=(((2,), (1,)), ((1,), (2,))),
        model=ModelSpec(aside=True),
        optimizer=spec,
    )
    trace = train_reference(scenario)
    first, second = trace.ranks[0].params
    assert torch.equal(first["aside.weight"], second["aside.weight"])
    assert not torch.equal(first["head.weight"], second["head.weight"])
