"""Lossy is not wrong: a compressing comm hook held to its format's rounding bound when the
user says it compresses on purpose, and named as compression when the user does not."""

from __future__ import annotations

import pytest

from ddp_verify import EquivalenceError, check
from ddp_verify.usercode.kinds import KindError
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
