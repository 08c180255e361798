"""How the conformance suite runs a property (``prove``): a hang ends the test at the first
time-out, unshrunk; a failure that matches a known issue is not shrunk; a wrapper with its
own comm hook skips the hook tests and the first failure of a buggy one names it."""

from __future__ import annotations

import pytest

# Imported before any in-process pytester run (torch's extension cannot be imported twice).
import torch  # noqa: F401

import ddp_verify.world  # noqa: F401

pytest_plugins = ["pytester"]

QUIET = ["-p", "no:cacheprovider", "-W", "ignore::UserWarning", "--hypothesis-seed", "0"]
CONFTEST = """
from ddp_verify.conformance.conftest import *  # noqa: F403 (the suite's fixtures and hooks)
"""

HANGING = """
import time
import torch.distributed as dist
from hypothesis import strategies as st

CALLS = []

def rank_1_hangs(value):
    if dist.get_rank() == 1:
        time.sleep(60)
    return value

def test_a_property_whose_job_hangs(world, prove):
    def check(value):
        CALLS.append(value)
        world.run(rank_1_hangs, value)

    try:
        prove(st.integers(0, 100), check)
    finally:
        print(f"CHECKED {len(CALLS)} TIMES")
"""


def test_a_hang_fails_the_test_at_the_first_time_out_without_shrinking(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_hangs=HANGING)
    result = pytester.runpytest_subprocess(
        *QUIET, "--world-size", "2", "--ddp-timeout", "3", "-n", "0", "-s", timeout=120
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CHECKED 1 TIMES*",
            "*RankError*rank 1 did not finish within the 3 s timeout*",
            "*in rank_1_hangs*",
            "FAILED test_hangs.py::test_a_property_whose_job_hangs*",
        ],
        consecutive=False,
    )
    assert "Falsifying example" not in result.stdout.str()


SIBLINGS = """
import time
import pytest
import torch.distributed as dist
from hypothesis import strategies as st


def job(hangs):
    if hangs and dist.get_rank() == 1:
        time.sleep(60)
    return hangs


@pytest.mark.parametrize("hangs", [True, False, True], ids=["first", "sound", "again"])
def test_siblings(world, prove, hangs):
    prove(st.just(hangs), lambda value: world.run(job, value))
"""


def test_after_one_test_waits_out_the_time_out_its_siblings_wait_a_quarter(pytester):
    # The first parametrization hangs and waits the whole 8 s; the next ones (same test
    # function) get max(5 s, a quarter) per job: a sound one still passes, a hanging one
    # fails after 5 s, saying why it was not given the whole time-out.
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_siblings=SIBLINGS)
    result = pytester.runpytest_subprocess(
        *QUIET, "--world-size", "2", "--ddp-timeout", "8", "-n", "0", "-rf", timeout=180
    )
    result.assert_outcomes(failed=2, passed=1)
    text = result.stdout.str()
    first, _, again = text.partition("test_siblings[again]")
    assert "did not finish within the 8 s timeout" in first
    assert "did not finish within the 5 s timeout" in again
    assert "Not waited out again: test_siblings.py::test_siblings[first]" in again
    assert "8 s job time-out, so this test's jobs had 5 s each" in again


WRAPPERS = """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def summing_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def with_its_own_hook(module, **kwargs):
    '''A team's wrapper that registers its own (summing, so wrong) comm hook.'''
    wrapped = DistributedDataParallel(module, **kwargs)
    wrapped.register_comm_hook(None, summing_hook)
    return wrapped


def always_finding_unused(module, **kwargs):
    '''Plain DDP that always looks for unused parameters: correct.'''
    kwargs["find_unused_parameters"] = True
    return DistributedDataParallel(module, **kwargs)
"""


def run_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(team_wrappers=WRAPPERS)
    pytester.syspathinsert()
    return pytester.runpytest_subprocess(
        *QUIET,
        "--pyargs",
        "ddp_verify.conformance",
        "--world-size",
        "2",
        "-n",
        "0",
        *args,
        timeout=300,
    )


def test_a_wrapper_with_its_own_comm_hook_skips_the_hook_tests_and_fails_first_on_its_bug(
    pytester,
):
    result = run_suite(
        pytester,
        "--ddp-wrapper",
        "team_wrappers:with_its_own_hook",
        "-x",
        "-rsf",
        "-k",
        "test_comm_hooks or test_ddp_option_keeps",
        "--conformance-examples",
        "3",
    )
    text = result.stdout.str()
    assert "register_comm_hook can only be called once" not in text
    result.stdout.fnmatch_lines(
        [
            "*team_wrappers:with_its_own_hook() is not equivalent to single-process full-batch*",
            "*SKIPPED*test_comm_hooks.py*team_wrappers:with_its_own_hook registers its own "
            "communication hook (summing_hook)*so allreduce_hook cannot be checked on it*",
            "FAILED *test_ddp_options.py::*",
        ],
        consecutive=False,
    )
    assert result.parseoutcomes()["failed"] == 1  # -x: the first failure is the bug's


# A correct wrapper against one known torch issue: tox -e slow (CI's time; the marks'
# own behaviour is tests/conformance/test_known.py's).
@pytest.mark.slow
def test_a_correct_wrapper_that_finds_unused_parameters_meets_the_known_powersgd_issue(
    pytester,
):
    # Through the wrapper, every PowerSGD test meets the known find_unused_parameters issue:
    # it reads as that issue (expected), not as the wrapper's failure.
    result = run_suite(
        pytester,
        "--ddp-wrapper",
        "team_wrappers:always_finding_unused",
        "-k",
        # The comm hooks' PowerSGD properties (test_surface's ids name powerSGD_hook too).
        "powersgd and test_comm_hooks",
        "-rxXf",
        "--ddp-timeout",
        "20",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()[-3000:]
    # Seven: full rank (and wider than two, for two PowerSGD states), batched at full rank,
    # rank 1, the defaults, and with unused parameters.
    assert outcomes.get("xfailed", 0) + outcomes.get("passed", 0) == 7
    assert outcomes.get("xfailed", 0) >= 3


# A correct wrapper against one known torch issue: tox -e slow (CI's time; the marks'
# own behaviour is tests/conformance/test_known.py's).
@pytest.mark.slow
def test_a_correct_wrapper_meets_reentrant_checkpointing_as_ddp_documents_it(pytester):
    # find_unused_parameters=True with reentrant checkpointing is unsupported by DDP's own
    # docstring: skipped with that reason, not failed ("Expected to mark a variable ready only
    # once"); the non-reentrant form, which DDP supports without limits, still runs.
    result = run_suite(
        pytester,
        "--ddp-wrapper",
        "team_wrappers:always_finding_unused",
        "-k",
        "activation_checkpointing",
        "-rsf",
        "--conformance-examples",
        "3",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()[-3000:]
    # The dropout-recompute property too: its reentrant form skipped, its other form passed.
    assert outcomes.get("skipped") == 3 and outcomes.get("passed") == 3, outcomes
    result.stdout.fnmatch_lines(
        ["*SKIPPED*always_finding_unused: reentrant activation checkpointing*DDP documents*"]
    )


@pytest.mark.slow
def test_a_correct_wrapper_passes_the_whole_suite_without_tripping_x(pytester):
    # The issue's plain-DDP wrapper, every test, stopping at the first failure: none. What
    # it meets is skipped with DDP's documented reason or reads as a known torch issue.
    result = run_suite(
        pytester, "--ddp-wrapper", "team_wrappers:always_finding_unused", "-x", "-rfE"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()[
        -3000:
    ]
    assert outcomes.get("passed", 0) >= 50, outcomes


def test_the_first_example_of_a_property_accumulates_unevenly_where_its_scenarios_can():
    # So that a regression of accumulation (no_sync() that syncs anyway) fails the property
    # at its first job: checked before any drawn example.
    from hypothesis import strategies as st

    from ddp_verify.conformance.conftest import _accumulating_first
    from ddp_verify.engine.strategies import scenarios

    (uneven,) = _accumulating_first(scenarios(world_size=4, max_micro_batches=3))
    assert any(len({len(sizes) for sizes in step}) > 1 for step in uneven.schedule)
    # Where every rank of a step runs as many micro-batches (fully_shard): one that accumulates.
    (even,) = _accumulating_first(
        scenarios(world_size=4, max_micro_batches=3, same_micro_batch_counts=True)
    )
    assert all(len({len(sizes) for sizes in step}) == 1 for step in even.schedule)
    assert any(len(sizes) > 1 for step in even.schedule for sizes in step)
    # Nothing to add where nothing accumulates, or nothing is a scenario; the same on every
    # call (every rank of a launched job adds the same example).
    assert _accumulating_first(scenarios(world_size=2, max_micro_batches=1)) == []
    assert _accumulating_first(st.tuples(st.integers(), st.integers())) == []
    assert _accumulating_first(scenarios(world_size=4, max_micro_batches=3)) == [uneven]
