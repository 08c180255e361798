"""Code that keeps state between calls: the check replays its counterexample on a fresh world,
says so with both results, and the reproducer it writes calls the code as often as the fresh
world needed to fail, and fails when run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddp_verify import EquivalenceError, check
from tests.user_code import load

steps = load("real_style/stateful_steps")
cached = load("real_style/cached_grad_sync")


def _fails_at_its_second_call(script):
    """The reproducer calls the code twice, as the fresh world needed, and fails (exit 1)."""
    assert "REPEATS = 2" in script.read_text()
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(call 2 of 2)" in result.stdout


def test_state_kept_between_calls_is_named_and_its_reproducer_fails(tmp_path, monkeypatch):
    # The running loss is right on a fresh import and wrong from the second call on: replayed
    # in a fresh process once, the counterexample would pass, contradicting the check.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(steps.step_with_running_loss, kind="wrapped-step", world_size=2, max_examples=10)
    error = caught.value
    first = error.causes[0]
    assert first.pattern == "state:carried", error.cause
    assert "replayed on a fresh world" in first.text, first.text
    assert "the first call gave loss" in first.text and "(equivalent)" in first.text
    assert "it fails from call 2 of this scenario on" in first.text
    assert "the search's call gave" in first.evidence, first.evidence
    _fails_at_its_second_call(tmp_path / error.reproducer)


def test_state_that_does_not_change_once_warm_is_found_by_the_fresh_world(tmp_path, monkeypatch):
    # Its first call averages, every later call sums: two calls on warm ranks agree, so only
    # a fresh world shows the difference (and a reproducer calling it once would pass).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(cached.sync_with_cached_buffer, kind="grad-sync", world_size=2, max_examples=10)
    error = caught.value
    assert [c.pattern for c in error.causes][:2] == ["state:carried", "scale"], error.cause
    assert "(equivalent)" in error.causes[0].text
    assert "gradient '" in error.causes[0].evidence, error.causes[0].evidence
    _fails_at_its_second_call(tmp_path / error.reproducer)


def test_code_without_state_is_not_said_to_keep_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wrapped = load("real_style/ddp_steps")
    with pytest.raises(EquivalenceError) as caught:
        check(wrapped.divide_by_accumulation_steps, kind="wrapped-step", world_size=2)
    assert "state:carried" not in [c.pattern for c in caught.value.causes]
    assert "REPEATS = 1" in (tmp_path / caught.value.reproducer).read_text()
