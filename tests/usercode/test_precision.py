"""Code that computes in a lower precision inside is measured and held to that precision:
no false alarm on correct code that upcasts (Hugging Face's losses) or all-reduces in float32,
and a mistake is still found at float32's bound."""

from __future__ import annotations

import hypothesis
import pytest

from ddp_verify import EquivalenceError, VerifyingWorld, check
from ddp_verify.strategies import scenarios
from ddp_verify.usercode.adapters import adapt
from ddp_verify.usercode.precision import Precision, measured, measured_precision, probe_scenario
from tests.user_code import load

lm = load("real_style/lm_losses")
fp32 = load("real_style/fp32_grad_sync")
plain = load("grad_sync")


def test_a_loss_that_upcasts_to_float32_is_held_to_float32_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verdict = check(
        lm.masked_lm_loss,
        kind="loss-fn",
        world_size=2,
        max_examples=15,
        seed=0,
        **lm.SCENARIO_BOUNDS,
    )
    assert verdict.precision == "float32"
    assert "Precision: computes in float32: held to float32's measured bound" in verdict.report
    assert verdict.to_json()["precision"] == "float32"


def test_float32_all_reduce_passes_and_its_mistake_is_still_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verdict = check(fp32.allreduce_in_fp32, kind="grad-sync", world_size=2, max_examples=15, seed=0)
    assert verdict.precision == "float32"
    with pytest.raises(EquivalenceError) as caught:
        check(
            fp32.allreduce_in_fp32_by_world_size,
            kind="grad-sync",
            world_size=2,
            max_examples=15,
            seed=0,
        )
    assert "averaged over ranks by the world size" in caught.value.cause
    # The scenarios that isolate other axes are held to float32 too: no rounding read as news.
    assert {c.pattern for c in caught.value.causes} == {"ranks:world"}
    assert "the code computes in float32: held to float32's measured bound" in str(caught.value)


def test_the_probe_tells_float64_code_from_float32_code():
    probe = probe_scenario(2, {})
    assert probe is not None and probe.even and not probe.accumulates and probe.steps == 1
    with VerifyingWorld(2) as world:
        assert measured_precision(world, adapt(plain.sample_weighted, "grad-sync"), probe) is None
        upcast = adapt(fp32.allreduce_in_fp32, "grad-sync")
        assert measured_precision(world, upcast, probe) == "float32"


@pytest.mark.parametrize(
    "bounds",
    [{}, {"losses": ("tokens",), "objective": "token-mean"}, {"max_micro_batches": 3}],
    ids=["default", "tokens", "accumulating-bounds"],
)
def test_the_probe_is_the_simplest_scenario_a_shrink_would_find(bounds):
    # The probe is the first example hypothesis draws; shrinking it changes nothing.
    shrunk = hypothesis.find(
        scenarios(world_size=2, **{**bounds, "even": True, "max_micro_batches": 1, "max_steps": 1}),
        lambda scenario: True,
        settings=hypothesis.settings(database=None, derandomize=True, max_examples=10),
    )
    assert probe_scenario(2, bounds) == shrunk


verl = load("real_style/verl_losses")


def test_float64_code_whose_gradients_cancel_is_read_as_float64():
    # verl's token mean on the probe's tiny transformer: gradients of 1e-5 carry the rounding
    # of terms of 0.1, 1e-12 of their own size: float64's, amplified as float32's is there.
    probe = probe_scenario(2, {"losses": ("tokens",), "objective": "token-mean"})
    with VerifyingWorld(2) as world:
        exact = measured(world, adapt(verl.token_mean_over_global_tokens, "loss-agg"), probe)
        assert exact == Precision(), exact
        guarded = measured(world, adapt(verl.token_mean_with_an_epsilon, "loss-agg"), probe)
    assert guarded.format is None and guarded.scale is not None
    # The epsilon's factor, 1 - 1e-8 / tokens for the probe's few tokens: not rounding.
    assert 1e-10 < 1 - guarded.scale < 1e-8, guarded


def test_an_epsilon_in_a_denominator_is_measured_and_the_report_says_which_bound_covers_it(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    kwargs = {"kind": "loss-agg", "world_size": 2, "max_examples": 10, "seed": 0}
    verdict = check(verl.token_mean_with_an_epsilon, **kwargs)
    assert verdict.precision is None
    said = verdict.to_json()["precision_words"]
    assert said.startswith("computes in float64, its gradients (1 - ") and "epsilon" in said
    assert f"Precision: {said}" in verdict.report
    # Without one, nothing to say: the probe reads float64 and the report has no such line.
    exact = check(verl.token_mean_over_global_tokens, **kwargs)
    assert exact.precision is None and "Precision:" not in exact.report


def test_float32_counts_are_measured_on_the_scenario_that_diverged():
    # 0d3c99d's false alarm at world size 4 ("no known mistake reproduces this divergence"):
    # the even probe's shares (1/4) are exact in float32, this split's (1/6, 3/6) are not,
    # and on the conv model's cancelling gradients float32's rounding of them shows.
    from ddp_verify.engine.scenario import ModelSpec, Scenario
    from ddp_verify.methods.equivalence import check_equivalent
    from ddp_verify.usercode.precision import diverged_precision

    diverged = Scenario(
        world_size=4,
        schedule=(((3,), (1,), (1,), (1,)), ((1,),) * 4, ((1,),) * 4),
        model=ModelSpec(kind="conv", out_features=2, unused=True, frozen=True),
    )
    with VerifyingWorld(4) as world:
        method = adapt(fp32.float32_counts, "grad-sync")
        assert measured_precision(world, method, probe_scenario(4, {})) is None
        outcome = check_equivalent(world, method, diverged)
        assert not outcome.equivalent  # beyond float64's bound: what 0d3c99d reported
        found = diverged_precision(world, diverged, outcome)
        # A mistake is no lower precision's rounding, on the same scenario.
        wrong = adapt(fp32.float32_counts_by_world_size, "grad-sync")
        mistaken = check_equivalent(world, wrong, diverged)
        assert diverged_precision(world, diverged, mistaken).format is None
    assert found.format == "float32"
    words = found.words() or ""
    assert "on an even split but to float32's rounding where step 0's shares 1/6" in words
    assert "counts or weights held in float32" in words


def test_a_search_that_meets_float32_counts_holds_them_to_float32_and_says_so(
    tmp_path, monkeypatch
):
    # Whether a draw shows float32's rounding beyond float64's bound depends on cancellation
    # in its gradients (seed 0 drew one here at 100 examples, not on CI's newer hypothesis):
    # the search must pass either way, and say where it held the code to float32 if it did.
    # The measurement itself is pinned on issue 60's scenario above.
    monkeypatch.chdir(tmp_path)
    verdict = check(fp32.float32_counts, kind="grad-sync", world_size=4, max_examples=100, seed=0)
    assert verdict.examples == 100
    if verdict.precision is not None:
        assert verdict.precision == "float32" and "are not exact in float32" in verdict.report
        assert verdict.to_json()["precision_words"] == verdict.precision_words
    with pytest.raises(EquivalenceError) as caught:
        check(
            fp32.float32_counts_by_world_size,
            kind="grad-sync",
            world_size=4,
            max_examples=25,
            seed=0,
        )
    assert "averaged over ranks by the world size" in caught.value.cause


def test_the_shares_a_scenario_cannot_hold_exactly_in_float32_are_named():
    from ddp_verify.engine.scenario import Scenario
    from ddp_verify.usercode.precision import inexact_shares

    uneven = Scenario(world_size=2, schedule=(((2,), (2,)), ((1, 1), (1,))))
    assert inexact_shares(uneven, "float32") == "step 1's shares 1/3, 2/3 are not exact in float32"
