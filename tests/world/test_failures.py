"""The failure contract, with real rank processes: raise, hang, die, mismatch, controller death."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from ddp_verify.world import Category, FailureKind, RankError, RankFailure, World
from ddp_verify.world.errors import debug_hint
from tests.processes import alive, default_sigint, wait_gone

# A job's timeout far beyond what these tests need: a failure that the world reports as soon
# as the others had their second to report (not when the job's time is up) comes in well
# inside it. Only the hang test waits a timeout out, a short one of its own.
TIMEOUT = 120.0
HANG_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def world2():
    with World(2, timeout=TIMEOUT) as world:
        yield world


def _fail(world: World, job, timeout: float | None = None) -> RankError:
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        world.run_job(job, timeout=timeout)
    info.value.elapsed = time.monotonic() - start
    return info.value


def _assert_reported_without_waiting_for_the_timeout(error: RankError) -> None:
    # The job's own timeout is the promise; half of it leaves a minute of margin.
    assert error.elapsed < TIMEOUT / 2, f"reported after {error.elapsed:.0f} s"
    assert FailureKind.TIMED_OUT not in {f.kind for f in error.failures}, str(error)


def _assert_relaunched_and_usable(world: World, old_pids: list[int]) -> None:
    assert wait_gone(old_pids, timeout=5) == [], "ranks of the failed world are still running"
    assert world.run(dist.get_rank) == [0, 1]
    assert set(world.pids).isdisjoint(old_pids)


def raise_on_rank_1():
    if dist.get_rank() == 1:
        print("rank 1 about to fail")
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes


def test_a_raising_rank_fails_fast_names_the_rank_and_kills_the_stuck(world2):
    old = world2.pids
    error = _fail(world2, raise_on_rank_1)
    _assert_reported_without_waiting_for_the_timeout(error)
    assert error.ranks == [1]
    first, second = error.failures
    assert (first.rank, first.kind, first.category) == (1, FailureKind.RAISED, Category.RAISED)
    assert "ValueError: boom on rank 1" in first.details
    assert "raise_on_rank_1" in first.details
    assert (second.rank, second.kind) == (0, FailureKind.STUCK)
    assert "all_reduce" in second.details  # where it waited
    message = str(error)
    # The failing rank's traceback and output come before the stuck rank's report.
    assert message.index("ValueError: boom on rank 1") < message.index("rank 0 was still")
    assert "rank 1 about to fail" in message
    assert error.world_relaunched
    _assert_relaunched_and_usable(world2, old)


def hang_on_rank_0():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 skips it: rank 0 waits forever
    else:
        time.sleep(60)


def test_a_hang_times_out_with_every_ranks_stack_then_relaunches(world2):
    old = world2.pids
    error = _fail(world2, hang_on_rank_0, timeout=HANG_TIMEOUT)
    assert error.elapsed >= HANG_TIMEOUT  # never reported before its time
    assert {f.kind for f in error.failures} == {FailureKind.TIMED_OUT}
    assert {f.category for f in error.failures} == {Category.HUNG}
    stacks = {f.rank: f.details for f in error.failures}
    assert "all_reduce" in stacks[0] and "hang_on_rank_0" in stacks[0]
    assert "sleep" in stacks[1] or "hang_on_rank_0" in stacks[1]
    assert "watch" not in stacks[0]  # the rank's own watchdog thread is left out
    assert f"did not finish within the {HANG_TIMEOUT:g} s timeout" in str(error)
    assert debug_hint() in str(error)
    _assert_relaunched_and_usable(world2, old)


def one_all_reduce_more_on_rank_0():
    for _ in range(2 if dist.get_rank() == 0 else 1):
        dist.all_reduce(torch.ones(3))


def ddp_steps_apart():
    # As a no_sync() that does not hold: rank 0 all-reduces in a backward rank 1 keeps local.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    steps = 3 if dist.get_rank() == 0 else 2
    for _ in range(steps):
        model(torch.ones(2, 3)).sum().backward()
    dist.all_reduce(torch.ones(4))  # the size of DDP's bucket: gloo sees nothing wrong


def receive_from_each_other():
    dist.recv(torch.ones(1), src=1 - dist.get_rank())


@pytest.mark.parametrize(
    ("job", "finished"),
    [
        (one_all_reduce_more_on_rank_0, [1]),
        (ddp_steps_apart, [1]),
        (receive_from_each_other, []),
    ],
    ids=["all-reduce", "ddp", "both-waiting"],
)
def test_a_collective_mismatch_is_reported_without_waiting_for_the_timeout(world2, job, finished):
    old = world2.pids
    error = _fail(world2, job)
    _assert_reported_without_waiting_for_the_timeout(error)
    waiting = [f for f in error.failures if f.kind is FailureKind.DEADLOCKED]
    assert [f.rank for f in waiting] == [r for r in (0, 1) if r not in finished], str(error)
    assert {f.category for f in waiting} == {Category.COLLECTIVE_MISMATCH}
    assert "called different collectives, or different numbers of them" in str(error)
    if finished:
        assert "rank(s) 1 had finished the job" in str(error)
    assert job.__name__ in waiting[0].details  # where it waits
    _assert_relaunched_and_usable(world2, old)


def compute_then_all_reduce(seconds: float):
    # Rank 1 computes (or sleeps) while rank 0 waits for it in the all-reduce: slow, not stuck.
    if dist.get_rank() == 1:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            torch.ones(64, 64) @ torch.ones(64, 64)
    dist.all_reduce(torch.ones(1))
    return dist.get_rank()


def sleep_then_all_reduce(seconds: float):
    if dist.get_rank() == 1:
        time.sleep(seconds)
    dist.all_reduce(torch.ones(1))
    return dist.get_rank()


@pytest.mark.parametrize("job", [compute_then_all_reduce, sleep_then_all_reduce])
def test_a_rank_that_takes_its_time_is_waited_for(world2, job):
    from ddp_verify.world.deadlock import IDLE_S

    assert world2.run(job, 2 * IDLE_S + 1) == [0, 1]


def segfault():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.all_reduce(torch.ones(1))


def hard_exit():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def soft_exit():
    if dist.get_rank() == 1:
        sys.exit(3)
    dist.all_reduce(torch.ones(1))


def shape_mismatch():
    dist.all_reduce(torch.ones(4 if dist.get_rank() == 0 else 8))


@pytest.mark.parametrize(
    ("job", "dead_rank", "summary", "category"),
    [
        (segfault, 1, "died: killed by SIGSEGV", Category.DIED),
        (hard_exit, 1, "exited with code 3 without a result", Category.DIED),
        (soft_exit, 1, "exited with code 3 without a result", Category.DIED),
        # gloo aborts the rank whose receive did not fit: a mismatch, said on its stderr.
        (shape_mismatch, 0, "died: killed by SIGABRT", Category.COLLECTIVE_MISMATCH),
    ],
    ids=["segfault", "os._exit", "sys.exit", "gloo-abort"],
)
def test_a_dying_rank_is_reported_with_how_it_died(world2, job, dead_rank, summary, category):
    old = world2.pids
    error = _fail(world2, job)
    _assert_reported_without_waiting_for_the_timeout(error)
    assert error.ranks == [dead_rank]
    assert error.failures[0].rank == dead_rank
    assert error.failures[0].summary == summary
    assert error.failures[0].category is category
    assert error.in_collectives
    # The peer that lost it in the all-reduce, where it reports at all, is a consequence.
    assert all(f.category is Category.LOST_PEER for f in error.failures[1:] if f.consequence)
    assert f"rank {dead_rank} {summary}" in str(error).splitlines()[0]
    _assert_relaunched_and_usable(world2, old)


def test_gloo_abort_points_to_debug_mode(world2):
    error = _fail(world2, shape_mismatch)
    assert "--ddp-debug" in str(error) and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in str(error)
    # gloo's own words are kept (they differ between torch releases: "collective mismatch"
    # lately, "op.preamble.length <= op.nbytes" in 2.6; the exception is the same).
    assert "gloo::EnforceNotMet" in error.failures[0].stderr


def test_sys_exit_traceback_is_kept_in_stderr(world2):
    error = _fail(world2, soft_exit)
    assert "SystemExit: 3" in error.failures[0].stderr


def op_mismatch():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(3))
    else:
        dist.broadcast(torch.ones(3), src=0)


def test_debug_mode_names_mismatched_collectives_without_hanging():
    with World(2, timeout=TIMEOUT, debug=True) as world:
        error = _fail(world, op_mismatch)
        assert "Detected mismatch between collectives" in str(error)
        # Classified from torch's words, not from the hint (which debug mode leaves out).
        assert {f.category for f in error.failures} == {Category.COLLECTIVE_MISMATCH}
        assert error.in_collectives
        _assert_reported_without_waiting_for_the_timeout(error)
        assert "BROADCAST" in str(error) and "ALLREDUCE" in str(error)
        assert debug_hint() not in str(error)


def test_a_rank_killed_between_jobs_is_reported_on_the_next_job(world2):
    victim = world2.pids[1]
    os.kill(victim, signal.SIGKILL)
    assert wait_gone([victim]) == []
    error = _fail(world2, lambda: dist.barrier())
    _assert_reported_without_waiting_for_the_timeout(error)
    assert error.failures[0].rank == 1
    assert error.failures[0].summary == "died: killed by SIGKILL"
    assert world2.run(dist.get_rank) == [0, 1]


def test_failure_output_is_shown_per_rank(world2):
    def noisy():
        print(f"stdout of {dist.get_rank()}")
        print(f"stderr of {dist.get_rank()}", file=sys.stderr)
        raise RuntimeError(f"failed on {dist.get_rank()}")

    error = _fail(world2, noisy)
    report = str(error)
    for r in (0, 1):
        assert f"── rank {r} stdout ──\n  stdout of {r}" in report
        assert f"── rank {r} stderr ──\n  stderr of {r}" in report
        assert f"RuntimeError: failed on {r}" in report


@pytest.fixture(scope="module")
def world3():
    # Three ranks: the fewest that make a span (ranks 0-2).
    with World(3, timeout=TIMEOUT) as world:
        yield world


def test_ranks_that_fail_alike_are_reported_once(world3):
    def same_everywhere():
        raise ValueError("the same on every rank")

    report = str(_fail(world3, same_everywhere))
    assert report.count("━━") == 1, report
    assert "failed on a world of 3 (gloo): ranks 0-2 raised ValueError: the same" in report
    assert "━━ ranks 0-2 raised ValueError: the same on every rank\n  Traceback" in report


def test_ranks_that_fail_differently_are_each_reported(world2):
    def own_words():
        raise ValueError(f"rank {dist.get_rank()}'s own")

    report = str(_fail(world2, own_words))
    assert report.count("━━") == 2, report
    headline = report.splitlines()[0]
    for r in (0, 1):
        assert f"rank {r} raised ValueError: rank {r}'s own" in headline, headline


_CONTROLLER = textwrap.dedent(
    """
    import os, sys, time
    from ddp_verify.world import World
    world = World(2).start()
    with open(sys.argv[1] + ".part", "w") as f:
        f.write(" ".join(map(str, world.pids)))
    os.rename(sys.argv[1] + ".part", sys.argv[1])  # whole, or not there
    time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killing_the_controller_leaves_no_rank_alive(sig, tmp_path):
    written = tmp_path / "pids"
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, str(written)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while not written.exists() and controller.poll() is None:
            assert time.monotonic() < deadline, "the controller never started its world"
            time.sleep(0.1)
        pids = [int(p) for p in written.read_text().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        controller.send_signal(sig)
        controller.wait(timeout=10)
        assert wait_gone(pids, timeout=5) == []
    finally:
        controller.kill()
        controller.wait()


def test_a_rank_error_survives_pickling_with_everything_it_reports():
    # Errors cross process boundaries (pytest-xdist workers, users' own pools).
    error = RankError(
        "job",
        3,
        "gloo",
        [RankFailure(2, FailureKind.RAISED, "raised ValueError: bad")],
        world_relaunched=True,
        hint="a hint",
        finished=[0, 1],
    )
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.finished == [0, 1] and copy.ranks == [2]


def test_a_broken_peer_reported_before_the_death_that_broke_it_is_a_consequence():
    # Reports arrive in any order: a rank's "connection reset" can come in before the EOF of
    # the rank whose abort caused it (seen in CI with a gloo shape mismatch).
    from ddp_verify.world.failures import mark_consequences

    lost = RankFailure(1, FailureKind.RAISED, "raised RuntimeError: Connection reset by peer")
    died = RankFailure(0, FailureKind.DIED, "died: killed by SIGABRT")
    mark_consequences([lost, died])
    assert lost.consequence and not died.consequence
    alone = RankFailure(1, FailureKind.RAISED, "raised RuntimeError: Connection reset by peer")
    mark_consequences([alone])
    assert not alone.consequence  # nothing else to blame: it is the news
