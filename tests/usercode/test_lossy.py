"""Lossy is not wrong: a compressing comm hook held to its format's rounding bound when the
user says it compresses on purpose, and named as compression when the user does not."""

from __future__ import annotations

import re

import pytest

from ddp_verify import EquivalenceError, check
from ddp_verify.strategies import models
from ddp_verify.usercode.kinds import KIND, KindError
from tests.user_code import load

hooks = load("real_style/comm_hooks")


def test_torchs_fp16_hook_is_lossy_by_design_within_float16s_bound(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verdict = check(
        hooks.fp16_compress_hook,
        kind="comm-hook",
        world_size=2,
        max_examples=15,
        seed=0,
        lossy="fp16",
    )
    assert (verdict.examples, verdict.lossy) == (15, "float16")


def test_a_compressing_hook_with_a_real_bug_is_still_caught_under_lossy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            hooks.half_precision_sum,
            kind="comm-hook",
            world_size=2,
            max_examples=15,
            seed=0,
            lossy="fp16",
        )
    assert "float16 compression" in str(caught.value)  # the bound it was held to
    assert "summed across ranks but not divided" in caught.value.cause


def test_lossy_applies_to_comm_hooks_only():
    # Called from Python: the message spells the argument as Python does.
    with pytest.raises(KindError, match=r"lossy applies to comm hooks \(kind='comm-hook'\)"):
        check(lambda model: None, kind="grad-sync", world_size=2, lossy="fp16")
    with pytest.raises(KindError, match="lossy must be one of fp16, bf16"):
        check(hooks.fp16_compress_hook, kind="comm-hook", world_size=2, lossy="int8")


stateful = load("real_style/stateful_hooks")


def test_lowrank_is_held_to_exact_equivalence_with_the_state_it_is_given(tmp_path, monkeypatch):
    # A low-rank hook at full rank must be exact: no bound, the user's state.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KindError, match="give its state with hook_state"):
        check(stateful.group_average, kind="comm-hook", world_size=2, lossy="lowrank")
    verdict = check(
        stateful.group_average,
        kind="comm-hook",
        world_size=2,
        max_examples=5,
        seed=0,
        lossy="lowrank",
        hook_state=stateful.counting_state,
    )
    assert verdict.lossy == "low rank at full rank"
    with pytest.raises(EquivalenceError) as caught:
        check(
            stateful.group_sum,
            kind="comm-hook",
            world_size=2,
            max_examples=10,
            seed=0,
            lossy="lowrank",
            hook_state=stateful.counting_state,
        )
    assert "float64 rounding" in str(caught.value)  # held to exact equivalence, no bound


powersgd = load("real_style/powersgd_hooks")


@pytest.mark.parametrize(("lossy", "world_size"), [(None, 2), ("bf16", 4), ("lowrank", 2)])
def test_a_low_rank_approximation_is_named_as_such_and_never_passes_as_rounding(
    lossy, world_size, tmp_path, monkeypatch
):
    # PowerSGD at rank 1 (torch's uneven-inputs test's state): named a low-rank approximation
    # with the matrix, both ranks and the relative error, whatever --lossy says. Held to
    # bfloat16's bound at 4 ranks it passed, one element 118% off (the bound pools later
    # steps by their largest contribution): a low-rank gradient is never rounding.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            powersgd.powerSGD_hook,
            kind="comm-hook",
            world_size=world_size,
            max_examples=30,
            seed=0,
            lossy=lossy,
            hook_state=powersgd.rank_one_from_step_one,
            # Without unused parameters: torch's PowerSGD issue with them may end the search
            # first (timing decides; a fresh-clone CI met it here), and it has its own test.
            models=models(max_width=8, excluded_features=("unused",)),
        )
    cause = caught.value.causes[0]
    assert cause.pattern == "lowrank", caught.value.cause
    assert re.search(r"has rank 1 where the full-batch gradient's has rank [2-9]", cause.text)
    assert re.search(r"relative error \d", cause.text)
    assert "bfloat16" not in cause.text and "lossy='lowrank'" in cause.text


def test_a_known_torch_issue_is_named_in_the_check_with_the_option_that_avoids_it(
    tmp_path, monkeypatch
):
    # PowerSGD with a parameter forward never uses meets torch's PowerSGD x
    # find_unused_parameters issue (the conformance suite marks it): the check names it, and
    # the option that avoids it, spelled for check(). Whether the issue or the low rank ends
    # a search first is timing's: each step races (findings/powersgd_unused_parameter.py
    # aborts about 2 runs in 3), so the scenarios train several steps, each a chance to meet
    # it, and a search that ends on the low rank names it, never a pass, and another seed
    # tries again (a loaded CI once found the low rank first at all of seeds 0-2 with one
    # step allowed).
    monkeypatch.chdir(tmp_path)
    errors = []
    for seed in range(8):
        with pytest.raises(EquivalenceError) as caught:
            check(
                powersgd.powerSGD_hook,
                kind="comm-hook",
                world_size=2,
                max_examples=10,
                seed=seed,
                timeout=10,
                hook_state=powersgd.compressing_everything,
                models=models(required_features=("unused",)),
                several_steps=True,
                max_steps=4,
            )
        if caught.value.verdict.status.value != "error":
            assert caught.value.causes[0].pattern == "lowrank", caught.value.cause
            continue
        errors.append(caught.value)
        break
    assert errors, "the known torch issue was met at none of seeds 0-7"
    assert errors[0].causes[0].pattern == "torch:powersgd-unused"
    assert "models=models(excluded_features=('unused',))" in errors[0].cause


def test_a_rank_one_powersgd_from_step_one_is_caught_within_25_examples_under_bf16(
    tmp_path, monkeypatch
):
    # Issue 35's false pass: under --lossy bf16 only a weight matrix whose gradient lost rank
    # tells a low-rank hook from rounding, and PowerSGD leaves a matrix of 4 x 4 or less exact.
    # Seed 9 passed all 25 examples on models up to 4 wide (models=models() still does); the
    # lossy default draws them up to 8 wide. Where a model with an unused parameter comes
    # first, torch's known PowerSGD issue may end the search instead (timing decides): named
    # as torch's, never a pass.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            powersgd.powerSGD_hook,
            kind="comm-hook",
            world_size=4,
            max_examples=25,
            seed=9,
            lossy="bf16",
            hook_state=powersgd.rank_one_from_step_one,
        )
    cause = caught.value.causes[0]
    assert cause.pattern in ("lowrank", "torch:powersgd-unused"), caught.value.cause
    if cause.pattern == "lowrank":
        assert caught.value.found_at <= 25
        assert caught.value.scenario.steps >= 2  # the state compresses from the second step


def test_a_gradient_float16_flushes_to_zero_is_rounding_not_a_low_rank_approximation():
    # Found by `ddp-verify check ... fp16_compress_hook --lossy fp16`: at the second step of
    # this scenario every gradient is below float16's normal range, the hook's compressed
    # parts underflow to zero, and the zero matrix (rank 0) was taken for a low-rank
    # approximation and held to exact equivalence: a false counterexample whose own cause
    # said "within float16's rounding".
    from ddp_verify.engine.compression import CompressionTolerance
    from ddp_verify.engine.scenario import ModelSpec, Scenario
    from ddp_verify.frontends.verifying import VerifyingWorld
    from ddp_verify.methods.equivalence import check_equivalent
    from ddp_verify.usercode.adapters import adapt
    from ddp_verify.usercode.diagnosis.structural import low_rank_cause

    scenario = Scenario(
        world_size=4,
        schedule=(((1,), (1,), (4,), (4,)), ((1,), (1,), (1,), (1,))),
        model=ModelSpec(kind="conv", in_features=3, layernorm=True, frozen=True, buffer=True),
        seed=23702,
    )
    method = adapt(hooks.fp16_compress_hook, "comm-hook")
    with VerifyingWorld(4) as world:
        outcome = check_equivalent(
            world, method, scenario, tolerance=CompressionTolerance(scenario, "float16")
        )
    assert outcome.equivalent, outcome.report()  # within float16's bound
    # Read as exact arithmetic, the flushed gradient has lost rank; read under float16, whose
    # underflow explains it, it has not.
    assert low_rank_cause(KIND["comm-hook"], outcome.reference, outcome.got) is not None
    assert low_rank_cause(KIND["comm-hook"], outcome.reference, outcome.got, fmt="float16") is None


def test_a_low_rank_approximation_inside_bfloat16s_bound_is_never_called_rounding():
    # Found by `ddp-verify check powerSGD_hook --hook-state ...:rank_one_from_step_one`: rank
    # 1 on a 3 x 8 gradient lands inside bfloat16's (loose) bound, and the diagnosis named it
    # "lossy compression (bfloat16 rounding)", where the docs promise low rank never is.
    from ddp_verify.engine.scenario import ModelSpec, Scenario
    from ddp_verify.frontends.verifying import VerifyingWorld
    from ddp_verify.methods.equivalence import check_equivalent
    from ddp_verify.usercode.adapters import adapt
    from ddp_verify.usercode.diagnosis.structural import lossy_compression, low_rank_cause

    powersgd = load("real_style/powersgd_hooks")
    scenario = Scenario(
        world_size=4,
        schedule=(((1,), (1,), (1,), (1,)), ((1,), (1,), (1,), (1,))),
        model=ModelSpec(kind="conv", hidden=(3,)),
    )
    method = adapt(powersgd.powerSGD_hook, "comm-hook", hook_state=powersgd.rank_one_from_step_one)
    with VerifyingWorld(4) as world:
        outcome = check_equivalent(world, method, scenario)
    assert not outcome.equivalent
    low_rank = low_rank_cause(KIND["comm-hook"], outcome.reference, outcome.got)
    assert low_rank is not None and "has rank 1 where" in low_rank.text
    assert lossy_compression(KIND["comm-hook"], scenario, outcome.reference, outcome.got) is None


def test_a_torch_issue_met_on_the_way_is_left_out_and_the_search_goes_on(tmp_path, monkeypatch):
    # Issue 60: at world size 4 under bf16, seeds 1, 2, 5, 8, 18 and 19 of 20 ended on torch's
    # PowerSGD x unused-parameter issue before the hook's own mistake: an error verdict about
    # torch, the low-rank approximation never reported. Met once, models with an unused
    # parameter are left out of the draws and the search goes on to the user's code.
    # Models with an unused parameter drawn first (the simplest of the two branches): the
    # issue is met before the hook's own mistake. Whether gloo aborts on the ranks' mismatched
    # collectives depends on timing (a CI run under load once went through), so each seed
    # must end on the hook's mistake, and one of three must have met the issue on the way.
    monkeypatch.chdir(tmp_path)
    unused_first = models(max_width=8, required_features=("unused",)) | models(
        max_width=8, excluded_features=("unused",)
    )
    met = []
    for seed in (2, 3, 4):
        with pytest.raises(EquivalenceError) as caught:
            check(
                powersgd.powerSGD_hook,
                kind="comm-hook",
                world_size=2,
                max_examples=25,
                seed=seed,
                timeout=10,
                lossy="bf16",
                hook_state=powersgd.rank_one_from_step_one,
                models=unused_first,
            )
        verdict = caught.value.verdict
        assert verdict.status.value == "not-equivalent", verdict.report
        assert verdict.causes[0].pattern == "lowrank", verdict.report
        assert len(verdict.notes) <= 1, verdict.notes
        if verdict.notes:
            (note,) = verdict.notes
            assert note.startswith("torch's known PowerSGD issue") and "went on without" in note
            assert verdict.to_json()["notes"] == [note] and f"Note: {note}" in verdict.report
            met.append(seed)
            break
    assert met, "no seed met torch's PowerSGD issue on the way: the mechanism went untried"


@pytest.mark.slow
def test_a_stateful_hooks_mistake_is_caught_within_25_examples_on_20_seeds():
    # benchmarks/stateful_power.py: rank-1 PowerSGD from its second iteration, bf16, world
    # size 4; every one of 20 seeds must name the low-rank approximation within 25 examples.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "stateful_power.py"
    spec = importlib.util.spec_from_file_location("stateful_power", path)
    assert spec is not None and spec.loader is not None
    stateful_power = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stateful_power)
    assert stateful_power.main(["--seeds", "20", "--examples", "25", "--world-size", "4"]) == 0
