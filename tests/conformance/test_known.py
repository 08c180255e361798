"""Known torch issues are matched by their signature (kind, message, torch versions): any other
failure fails, and a pass where the issue is expected says to drop the mark."""

from __future__ import annotations

import pytest
import torch

from ddp_verify.conformance.known import KnownIssue, failure_text, version_tuple
from ddp_verify.world import RankError
from ddp_verify.world.errors import FailureKind, RankFailure

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from ddp_verify.conformance.conftest import pytest_configure, pytest_runtest_makereport

@pytest.fixture
def conformance_examples():
    return 2  # fewer scenarios than the default search
"""
TESTS = """
import pytest
from ddp_verify.conformance.known import known_torch_issue

ISSUE = dict(what="the reducer asserts", raises=RuntimeError, match=r"expect_autograd_hooks_")

@known_torch_issue(**ISSUE)
def test_the_issue_itself():
    raise RuntimeError("expect_autograd_hooks_ INTERNAL ASSERT FAILED at reducer.cpp")

@known_torch_issue(**ISSUE)
def test_another_crash_of_the_same_type():
    raise RuntimeError("the wrapper's own bug: bucket sizes disagree")

@known_torch_issue(**ISSUE)
def test_fixed_in_this_torch():
    pass

@known_torch_issue(**ISSUE, flaky=True)
def test_a_timing_dependent_issue_may_pass():
    pass

@known_torch_issue(what="gloo aborts", raises=RuntimeError, match=r"gloo::EnforceNotMet")
def test_the_signature_in_a_ranks_captured_output(request):
    # A rank aborted while its peer hung: the abort is only in what the ranks printed.
    request.node.add_report_section("call", "stderr rank 1", "abort: gloo::EnforceNotMet")
    raise RuntimeError("rank 0 did not finish within the 30 s timeout; killed")

@known_torch_issue(**ISSUE)
def test_a_short_search_that_misses_the_issue_is_no_proof_of_a_fix(conformance_examples):
    assert conformance_examples == 2

ABORT = dict(what="gloo aborts", raises=RuntimeError, match=r"gloo::EnforceNotMet", flaky=True)

@known_torch_issue(**ISSUE)
@known_torch_issue(**ABORT)
def test_either_of_two_issues_may_be_the_one_met():
    raise RuntimeError("terminate called: gloo::EnforceNotMet")

@known_torch_issue(**ABORT)
def test_a_gating_test_with_a_timing_issue_mark_still_fails_on_a_wrong_answer():
    raise AssertionError("gradient off by 2x")

@known_torch_issue(**ISSUE, fixed_in="1.0")
def test_outside_its_versions_a_failure_is_a_failure():
    raise RuntimeError("expect_autograd_hooks_ INTERNAL ASSERT FAILED at reducer.cpp")
"""


def test_a_failure_is_the_known_issue_only_by_its_signature(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_marked=TESTS)
    result = pytester.runpytest("-p", "no:ddp_verify", "-n", "0", "-rxXf")
    result.assert_outcomes(passed=2, failed=4, xfailed=3)
    result.stdout.fnmatch_lines(
        [
            "*XFAIL*test_the_issue_itself - known torch issue: the reducer asserts*",
            "*XFAIL*test_the_signature_in_a_ranks_captured_output - known torch issue: gloo*",
            "*XFAIL*test_either_of_two_issues_may_be_the_one_met - known torch issue: gloo*",
            "*FAILED*test_another_crash_of_the_same_type*",
            "*FAILED*test_fixed_in_this_torch*",
            "*FAILED*test_a_gating_test_with_a_timing_issue_mark_still_fails_on_a_wrong_answer*",
            "*FAILED*test_outside_its_versions_a_failure_is_a_failure*",
        ]
    )
    text = result.stdout.str()
    assert "is not the known torch issue the test is marked with" in text
    assert f"no longer reproduces on torch {torch.__version__}" in text
    assert "Drop the mark, or bound it with fixed_in=" in text


def test_versions_compare_by_their_release_numbers() -> None:
    assert version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert version_tuple("2.14.1+cu128") > version_tuple("2.14")
    assert version_tuple("2.12.0a0+git1234") < version_tuple("2.13")
    issue = KnownIssue("x", (RuntimeError,), "x", since="2.13", fixed_in="2.14.1")
    assert [issue.applies_to(v) for v in ("2.12.1", "2.13.0+cpu", "2.14.0", "2.14.1")] == [
        False,
        True,
        True,
        False,
    ]


def test_an_issue_known_on_some_backends_is_inert_on_the_others() -> None:
    issue = KnownIssue("x", (RuntimeError,), "x", backends=("gloo",))
    assert issue.applies_to("2.13.0", "gloo")
    assert not issue.applies_to("2.13.0", "nccl")
    assert issue.applies_to("2.13.0")  # backend unknown: the version decides
    assert KnownIssue("x", (RuntimeError,), "x").applies_to("2.13.0", "nccl")


def test_an_issue_known_at_some_world_sizes_is_inert_at_the_others() -> None:
    issue = KnownIssue("x", (RuntimeError,), "x", world_sizes=(1,))
    assert issue.applies_to("2.13.0", "gloo", 1)
    assert not issue.applies_to("2.13.0", "gloo", 2)
    assert issue.applies_to("2.13.0", "gloo")  # size unknown: the version decides


def test_a_ranks_failure_is_searched_in_every_ranks_output() -> None:
    # An abort's message is only in the dead rank's stderr: the signature is found there.
    died = RankFailure(
        rank=0,
        kind=FailureKind.DIED,
        summary="killed by SIGABRT",
        stderr="terminate called after throwing an instance of 'gloo::EnforceNotMet'",
    )
    error = RankError("ddp", 2, "gloo", [died], world_relaunched=True)
    issue = KnownIssue("gloo aborts", (RankError,), r"gloo::EnforceNotMet")
    assert "gloo::EnforceNotMet" in failure_text(error)
    assert issue.matches(error)
    assert not issue.matches(RuntimeError("gloo::EnforceNotMet"))  # not a rank's failure


def test_the_powersgd_unused_parameter_issue_reads_as_the_issue_when_it_hangs_too() -> None:
    # The same mismatched collectives either abort gloo or leave the ranks waiting inside
    # PowerSGD's all-reduce until the timeout (seen in CI): both are the known issue, and a
    # timeout anywhere else is not.
    from ddp_verify.conformance.test_comm_hooks import FINDING_UNUSED

    issue = FINDING_UNUSED.mark.args[0]

    def hung(where: str) -> RankError:
        stuck = RankFailure(
            rank=0,
            kind=FailureKind.TIMED_OUT,
            summary="did not finish within the 20 s timeout; killed",
            details=f'  File "{where}", line 589, in unpack_uncompressed_tensors\n    .wait()[0]',
        )
        return RankError("ddp", 2, "gloo", [stuck], world_relaunched=True)

    site = "/site-packages/torch/distributed/algorithms/ddp_comm_hooks/"
    assert issue.matches(hung(site + "powerSGD_hook.py"))
    assert not issue.matches(hung(site + "default_hooks.py"))
