"""Code that keeps state between calls: the check says so, with both results, and the
reproducer it writes calls the code as often as it takes to fail when run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddp_verify import EquivalenceError, check
from tests.user_code import load

steps = load("real_style/stateful_steps")


def test_state_kept_between_calls_is_named_and_its_reproducer_fails(tmp_path, monkeypatch):
    # The running loss is right on a fresh import and wrong from the second call on: replayed
    # in a fresh process once, the counterexample would pass, contradicting the check.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(steps.step_with_running_loss, kind="wrapped-step", world_size=2, max_examples=10)
    error = caught.value
    first = error.causes[0]
    assert first.pattern == "state:carried", error.cause
    assert "gave loss" in first.text and "where the first run gave loss" in first.text
    script = tmp_path / error.reproducer
    assert "REPEATS = 3" in script.read_text()
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(call 2 of 3)" in result.stdout or "(call 3 of 3)" in result.stdout


def test_code_without_state_is_not_said_to_keep_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wrapped = load("real_style/ddp_steps")
    with pytest.raises(EquivalenceError) as caught:
        check(wrapped.divide_by_accumulation_steps, kind="wrapped-step", world_size=2)
    assert "state:carried" not in [c.pattern for c in caught.value.causes]
    assert "REPEATS = 1" in (tmp_path / caught.value.reproducer).read_text()
