"""Users' own models: factories checked before anything runs, refused with the reason, and
trained on real worlds (every rank builds from the seed; the reference in float64)."""

from __future__ import annotations

import pytest
from hypothesis.errors import InvalidArgument

from ddp_verify import EquivalenceError, check
from ddp_verify.engine.models import build_data, build_model, item_counts
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.strategies import scenarios
from ddp_verify.engine.user_models import UserModelError, inspect_user_model
from tests.user_code import FIXTURES, load
from tests.usercode.patterns import weights_show

MODELS = load("user_models")
PATH = FIXTURES / "user_models.py"


def factory(name: str) -> str:
    return f"{PATH}:{name}"


@pytest.mark.parametrize("name", [n for n, why in MODELS.EXPECTED.items() if why is not None])
def test_a_factory_that_cannot_be_checked_is_refused_with_the_reason(name):
    with pytest.raises(UserModelError, match=MODELS.EXPECTED[name]):
        inspect_user_model(factory(name))
    # The strategy refuses it the hypothesis way, at once.
    with pytest.raises(InvalidArgument, match=MODELS.EXPECTED[name]):
        scenarios(world_size=2, model=factory(name))


def test_a_factory_that_does_not_import_names_the_module():
    with pytest.raises(UserModelError, match="cannot import the model factory's module"):
        inspect_user_model("no_such_module_here:make")
    with pytest.raises(UserModelError, match="has no callable 'missing'"):
        inspect_user_model(factory("missing"))
    with pytest.raises(UserModelError, match="MODULE:FACTORY"):
        inspect_user_model("just_a_module")


def test_the_loss_follows_from_the_targets():
    assert inspect_user_model(factory("tiny_lm")) == "tokens"
    assert inspect_user_model(factory("tiny_classifier")) == "cross_entropy"


def test_every_build_from_one_seed_is_identical_and_tokens_are_counted():
    scenario = Scenario(
        world_size=2,
        schedule=(((2,), (3,)),),
        model=ModelSpec(kind="user", factory=factory("tiny_lm")),
        loss="tokens",
        seed=7,
    )
    a, b = build_model(scenario), build_model(scenario)
    assert all(
        (p == q).all()
        for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    _, labels = build_data(scenario)[0]
    counted = item_counts(scenario)[0]
    assert sum(map(sum, counted)) == int((labels != -100).sum()) < labels.numel()


def test_a_user_model_trains_on_a_real_world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sync = load("real_style/token_grad_sync")
    result = check(
        sync.weight_by_tokens,
        kind="grad-sync",
        world_size=2,
        max_examples=10,
        seed=0,
        model=factory("tiny_lm"),
    )
    assert result.examples == 10
    with pytest.raises(EquivalenceError) as info:
        check(
            load("real_style/unusual_grad_sync").flat_buffer_mean,
            kind="grad-sync",
            world_size=2,
            max_examples=25,
            seed=0,
            model=factory("tiny_lm"),
        )
    error = info.value
    assert error.scenario.model.factory == factory("tiny_lm")
    [world] = [c for c in error.causes if c.pattern == "ranks:world"]
    assert weights_show("ranks:world", list(world.weights), 2)
    assert "tokens" in world.text
