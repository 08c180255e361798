"""Code that computes in a lower precision inside is measured and held to that precision:
no false alarm on correct code that upcasts (Hugging Face's losses) or all-reduces in float32,
and a mistake is still found at float32's bound."""

from __future__ import annotations

import pytest

from ddp_verify import EquivalenceError, VerifyingWorld, check
from ddp_verify.usercode.adapters import adapt
from ddp_verify.usercode.precision import measured_precision, probe_scenario
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
