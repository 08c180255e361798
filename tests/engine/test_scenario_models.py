"""Scenarios and the deterministic builders: validation, description, identical rebuilds."""

from __future__ import annotations

import pytest
import torch

from ddp_verify.engine.models import build_data, build_model, build_optimizer, loss_function
from ddp_verify.engine.scenario import ModelSpec, OptimizerSpec, Scenario

ALL_FEATURES = ModelSpec(
    hidden=(3, 2), layernorm=True, tied=True, unused=True, frozen=True, buffer=True
)


def scenario(**changes) -> Scenario:
    base = {"world_size": 2, "schedule": (((2, 1), (3,)), ((1,), (1, 1)))}
    return Scenario(**{**base, **changes})


def test_samples_offsets_and_flags():
    s = scenario()
    assert s.steps == 2
    assert s.samples(0) == [3, 3] and s.samples(1) == [1, 2]
    assert s.global_batch(1) == 3 and s.offset(1, 1) == 1
    assert not s.even and s.accumulates
    assert scenario(schedule=(((2,), (2,)),)).even


def test_repr_is_compact_and_evaluable():
    s = scenario(model=ModelSpec(kind="conv", tied=True), optimizer=OptimizerSpec("adam"))
    text = repr(s)
    assert "dtype" not in text and "seed" not in text  # defaults left out
    assert eval(text) == s


def test_describe_shows_every_rank_and_micro_batch():
    text = scenario(model=ALL_FEATURES).describe()
    assert "world_size=2, 2 step(s)" in text
    assert "mlp 2→[3, 2]→1 tanh +layernorm +tied +unused +frozen +buffer" in text
    assert "step 0: rank 0: 2+1  rank 1: 3" in text
    assert "step 1: rank 0: 1  rank 1: 1+1" in text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": ()}, "at least one step"),
        ({"schedule": (((1,),),)}, "step 0 lists 1 ranks, the world has 2"),
        ({"schedule": (((1,), ()),)}, "step 0, rank 1: every rank needs at least one"),
        # A rank may hold no sample (issue 62), but some rank must, and no size is negative.
        ({"schedule": (((0,), (0,)),)}, "step 0: some rank must hold a sample"),
        ({"schedule": (((1,), (-1,)),)}, "step 0, rank 1"),
        ({"loss": "hinge"}, "loss must be one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"loss": "cross_entropy"}, "at least 2 outputs"),
    ],
)
def test_impossible_scenarios_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        scenario(**changes)


def test_impossible_specs_are_rejected():
    with pytest.raises(ValueError, match="model kind"):
        ModelSpec(kind="rnn")
    with pytest.raises(ValueError, match="need at least one hidden layer"):
        ModelSpec(hidden=(), tied=True)
    with pytest.raises(ValueError, match="momentum applies to sgd only"):
        OptimizerSpec("adam", momentum=0.9)


@pytest.mark.parametrize("kind", ["mlp", "conv", "embedding"])
def test_builds_are_identical_and_dtypes_share_initial_values(kind):
    s = scenario(model=ModelSpec(kind=kind, hidden=(3,), buffer=True))
    a, b = build_model(s), build_model(s)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    f32 = build_model(s, "float32")
    for p64, p32 in zip(a.parameters(), f32.parameters(), strict=True):
        assert p32.dtype == torch.float32 and torch.equal(p64, p32.double())
    x64, _ = build_data(s)[0]
    x32, _ = build_data(s, "float32")[0]
    if x64.is_floating_point():
        assert torch.equal(x64, x32.double())
    outputs = a(x64)
    assert outputs.shape == (s.global_batch(0), 1)


def test_structural_features_do_what_they_say():
    model = build_model(scenario(model=ALL_FEATURES))
    names = dict(model.named_parameters())
    assert model.tied_a.weight is model.tied_b.weight
    assert "tied_b.weight" not in names  # shared: listed once
    assert not model.frozen.weight.requires_grad
    assert "scale" in dict(model.named_buffers())
    x, y = build_data(scenario(model=ALL_FEATURES))[0]
    loss_function(scenario()).forward(model(x), y).backward()
    assert model.unused.weight.grad is None
    assert model.frozen.weight.grad is None
    assert model.tied_a.weight.grad is not None


def test_cross_entropy_data_has_class_targets():
    s = scenario(loss="cross_entropy", model=ModelSpec(kind="embedding", out_features=3))
    inputs, targets = build_data(s)[0]
    assert inputs.dtype == torch.int64 and targets.dtype == torch.int64
    assert int(targets.max()) < 3
    assert loss_function(s)(build_model(s)(inputs), targets).ndim == 0


@pytest.mark.parametrize(
    "spec",
    [
        OptimizerSpec(),
        OptimizerSpec("sgd", 0.05, 0.9, 0.01),
        OptimizerSpec("adam"),
        OptimizerSpec("adamw", weight_decay=0.01),
    ],
)
def test_optimizers_are_built_with_their_settings(spec):
    opt = build_optimizer(spec, [torch.nn.Parameter(torch.zeros(1))])
    group = opt.param_groups[0]
    assert group["lr"] == spec.lr and group["weight_decay"] == spec.weight_decay
    assert type(opt).__name__.lower() == spec.name


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_sum_and_none_reductions_count_samples_as_the_mean_does(loss):
    scenario = Scenario(
        world_size=1,
        schedule=(((5,),),),
        model=ModelSpec(out_features=3),
        loss=loss,
    )
    inputs, targets = build_data(scenario)[0]
    output = build_model(scenario)(inputs)
    mean = loss_function(scenario)(output, targets)
    per_sample = loss_function(scenario, "none")(output, targets)
    assert per_sample.shape == (5,)
    torch.testing.assert_close(per_sample.mean(), mean)
    torch.testing.assert_close(loss_function(scenario, "sum")(output, targets), 5 * mean)
    with pytest.raises(ValueError, match="reduction must be one of"):
        loss_function(scenario, "max")


def test_autocast_lowers_the_forward_of_a_float32_model_only():
    scenario = Scenario(world_size=1, schedule=(((3,),),), dtype="float32", autocast="bfloat16")
    inputs, _ = build_data(scenario)[0]
    assert build_model(scenario)(inputs).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")  # left when the forward returns
    # The exact reference is float64, which autocast leaves alone.
    inputs64, _ = build_data(scenario, "float64")[0]
    assert build_model(scenario, "float64")(inputs64).dtype == torch.float64
    assert "autocast to bfloat16" in scenario.describe()
    with pytest.raises(ValueError, match="autocast lowers a float32 model's forward"):
        Scenario(world_size=1, schedule=(((3,),),), autocast="bfloat16")


def test_an_optimizer_with_max_norm_clips_the_total_gradient_norm_before_each_step():
    weight = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = build_optimizer(OptimizerSpec("sgd", lr=1.0, max_norm=0.5), [weight])
    weight.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5
    optimizer.step()
    assert torch.allclose(weight.detach(), torch.tensor([-0.3, -0.4], dtype=torch.float64))
    assert "gradients clipped to norm 0.5" in OptimizerSpec(max_norm=0.5).describe()
    with pytest.raises(ValueError, match="max_norm must be positive"):
        OptimizerSpec(max_norm=0.0)
