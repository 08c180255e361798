"""A check's verdict is one object, complete when check() returns or raises it: the same
document ``ddp-verify check --json`` prints, the same exit code."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from ddp_verify import CodeFailed, EquivalenceError, NotEquivalent, check
from ddp_verify.methods.equivalence import HarnessError
from ddp_verify.usercode.findings import Cause
from ddp_verify.usercode.kinds import KindError
from ddp_verify.usercode.verdict import JSON_FIELDS, Status, Verdict, verdict_for
from ddp_verify.world import JobPicklingError, WorldStartError
from ddp_verify.world.cleanup import Terminated
from tests.user_code import load

grad_sync = load("grad_sync")


def test_an_equivalent_check_returns_its_verdict_as_the_command_prints_it():
    verdict = check(grad_sync.sample_weighted, kind="grad-sync", world_size=2, max_examples=4)
    assert (verdict.status, verdict.exit_code, verdict.examples) == (Status.EQUIVALENT, 0, 4)
    assert verdict.equivalent and verdict.cause is None and verdict.seconds > 0
    document = json.loads(json.dumps(verdict.to_json()))
    assert document.keys() == JSON_FIELDS.keys()
    assert document["verdict"] == "equivalent" and document["call"] == verdict.call
    assert verdict.report.startswith("sample_weighted (grad-sync): equivalent on 4 generated")
    # Where its time went: no failure, so no shrinking.
    assert [name for name, _ in verdict.timeline] == [
        "layout",
        "precision",
        "first_example",
        "report",
    ]
    assert document["timeline"]["report"] == round(verdict.seconds, 3)


def test_a_counterexample_is_raised_complete(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(grad_sync.average_gradients, kind="grad-sync", world_size=2, seed=0)
    error = info.value
    verdict = error.verdict
    assert isinstance(error, EquivalenceError)
    assert (verdict.status, verdict.exit_code) == (Status.NOT_EQUIVALENT, 1)
    # Everything the report says is in the verdict, not assigned after the raise.
    assert str(error) == verdict.report
    assert error.causes == verdict.causes and verdict.causes
    assert error.cause == verdict.causes[0].text
    assert f"Likely cause: {verdict.cause}" in verdict.report
    assert (tmp_path / verdict.reproducer).is_file()
    assert 1 <= verdict.found_at <= verdict.examples
    assert error.scenario == verdict.scenario and verdict.scenario.world_size == 2
    document = verdict.to_json()
    assert document["likely_causes"][0]["pattern"] == verdict.causes[0].pattern
    assert document["scenario"] == repr(verdict.scenario)
    assert document["found_at"] == verdict.found_at
    # The milestones in the order reached: what shrinking and the diagnosis took is readable.
    names = [name for name, _ in verdict.timeline]
    assert names == ["layout", "precision", "first_example", "first_failure", "shrunk", "report"]
    seconds = [at for _, at in verdict.timeline]
    assert seconds == sorted(seconds) and seconds[-1] == round(verdict.seconds, 3)
    # It crosses process boundaries whole (pytest-xdist, users' own pools).
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, NotEquivalent) and copy.verdict.to_json() == document
    # The report is rendered from the verdict's data when read, never stored as text (issue
    # 61: it was assembled by splitting the error's message).
    assert verdict.message == ""
    ours = dataclasses.replace(verdict, causes=(Cause("a cause of our own", "gradient", "x"),))
    assert "\nLikely cause: a cause of our own\n" in ours.report
    assert ours.summary == "grad-sync average_gradients is not equivalent: a cause of our own"
    assert ours.report.splitlines()[0] == verdict.report.splitlines()[0]


steps = load("step")
loss = load("loss")


@pytest.mark.parametrize(
    "fn,kind,training",
    [
        # A right step whose logged loss is a running total: training matched.
        (steps.running_total_never_reset, "step", "equivalent"),
        # zero_grad() inside the accumulation loop: training itself differs.
        (steps.zero_grad_inside_loop, "step", "not-equivalent"),
        # A loss reducer's result is all it does: its mistake is never "only the loss".
        (loss.mean_of_rank_means, "loss", "not-equivalent"),
    ],
)
def test_a_verdict_says_whether_training_itself_matched(fn, kind, training, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(fn, kind=kind, world_size=2, seed=0, max_examples=30)
    verdict = info.value.verdict
    assert verdict.to_json()["training"] == training
    said = "Training is equivalent: gradients and parameters match the reference at every step"
    assert (said in verdict.report) == (training == "equivalent"), verdict.report


def fails_on_rank_1(model):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 gives up")


def test_code_that_fails_is_an_error_verdict():
    with pytest.raises(CodeFailed) as info:
        check(fails_on_rank_1, kind="grad-sync", world_size=2, max_examples=3)
    verdict = info.value.verdict
    assert (verdict.status, verdict.exit_code) == (Status.ERROR, 1)
    assert verdict.to_json()["verdict"] == "error" and verdict.scenario is not None
    assert "rank 1 raised RuntimeError: rank 1 gives up" in verdict.report
    # Rendered from the ranks' failure itself, which travels with the verdict.
    assert verdict.message == "" and verdict.failure is not None
    assert verdict.summary.startswith(
        "grad-sync fails_on_rank_1 failed to run: rank 1 raised RuntimeError: rank 1 gives up"
    ), verdict.summary
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.verdict.report == verdict.report


@pytest.mark.parametrize(
    ("exc", "status", "words"),
    [
        (KindError("not a grad-sync"), Status.USAGE_ERROR, "ddp-verify: error: not a grad"),
        (JobPicklingError("a lock"), Status.USAGE_ERROR, "ddp-verify: error: a lock"),
        (WorldStartError("no ranks"), Status.HARNESS_ERROR, "harness error: no ranks"),
        (HarnessError("reference"), Status.HARNESS_ERROR, "harness error: reference"),
        (KeyboardInterrupt(), Status.INTERRUPTED, "ddp-verify: interrupted"),
        (Terminated(15), Status.TERMINATED, "ddp-verify: terminated by signal 15"),
        (ZeroDivisionError("ours"), Status.HARNESS_ERROR, "internal error, please report it"),
    ],
    ids=["kind", "pickling", "world-start", "harness", "interrupt", "terminated", "internal"],
)
def test_every_other_exception_has_its_verdict_and_exit_code(exc, status, words):
    verdict = verdict_for(exc, target="sync.py:sync", kind="grad-sync")
    assert verdict.status is status and verdict.exit_code == status.exit_code
    assert verdict.report.startswith(words) or words in verdict.report
    assert verdict.to_json()["target"] == "sync.py:sync"


def test_exit_codes_are_the_documented_ones():
    assert {s.value: s.exit_code for s in Status} == {
        "equivalent": 0,
        "not-equivalent": 1,
        "error": 1,
        "usage-error": 2,
        "harness-error": 3,
        "interrupted": 130,
        "terminated": 143,
    }
    assert Verdict(Status.USAGE_ERROR, message="x").to_json().keys() == JSON_FIELDS.keys()
