"""The pieces of a launched rank, each on its own, with a real TCPStore and real threads (each
thread one rank with its own connection, as each launched process has): the agreement, the
watchdog, and the process group that both modes form and re-form."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddp_verify.world.agreement import Agreement, Late, OutOfStep, WorldBroken
from ddp_verify.world.runtime import Group, run_job
from ddp_verify.world.watchdog import Watchdog, request_stacks

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture
def store():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    yield master


def client(master: Any) -> Any:
    return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=TIMEOUT)


def on_ranks(size: int, master: Any, work: Callable[[int, Any], Any]) -> list[Any]:
    """``work(rank, its own store connection)`` on ``size`` threads; results or exceptions."""
    results: list[Any] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank, client(master))
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_ranks_agree_on_everyones_value_again_and_again(store):
    def agree(rank: int, connection: Any) -> list[Any]:
        agreement = Agreement(connection, rank, 3)
        deadline = time.monotonic() + 20
        return [agreement.agree(f"round {i}", rank * 10 + i, deadline=deadline) for i in range(4)]

    results = on_ranks(3, store, agree)
    assert results == [[[i, 10 + i, 20 + i] for i in range(4)]] * 3


def test_ranks_at_different_points_are_out_of_step_on_every_rank(store):
    def agree(rank: int, connection: Any) -> Any:
        agreement = Agreement(connection, rank, 2)
        agreement.agree("test_a" if rank == 0 else "test_b", None, deadline=time.monotonic() + 20)

    results = on_ranks(2, store, agree)
    assert all(isinstance(r, OutOfStep) for r in results), results
    assert "rank 0 is at 'test_a', rank 1 at 'test_b'" in str(results[0])


def test_a_rank_that_never_posts_is_late_and_a_broken_world_stops_the_rest(store):
    agreement = Agreement(client(store), 0, 2)
    started = time.monotonic()
    with pytest.raises(Late) as late:
        agreement.agree("step", 1, deadline=time.monotonic() + 1.0)
    assert (late.value.tag, late.value.late, late.value.dead) == ("step", [1], [])
    assert time.monotonic() - started < 10  # at its deadline, not the store's time-out
    agreement.break_("rank 1 hung")
    # Rank 1 arrives afterwards: rank 0's post is there, then at its next agreement nobody
    # else comes, and it learns the world is broken instead of waiting out its deadline.
    other = Agreement(client(store), 1, 2)
    assert other.agree("step", 1, deadline=time.monotonic() + 5) == [1, 1]
    started = time.monotonic()
    with pytest.raises(WorldBroken, match="rank 1 hung"):
        other.agree("next", 1, deadline=time.monotonic() + 20)
    assert time.monotonic() - started < 5


def _busy_in_a_loop(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.01)  # where the stuck thread is


def test_the_watchdog_beats_gives_its_stack_and_ends_a_stuck_rank(store):
    stop = threading.Event()
    worker = threading.Thread(target=_busy_in_a_loop, args=(stop,))
    worker.start()
    ended: list[tuple[str, bool]] = []
    watchdog = Watchdog(
        client(store),
        1,
        activity=lambda: ("test_stuck", time.monotonic()),
        broken=lambda: "",
        main_thread=worker.ident,
        on_stuck=lambda reason, lost: ended.append((reason, lost)),
        beat_s=0.05,
        stuck_exit_wait_s=0.5,
    )
    watchdog.start()
    try:
        agreement = Agreement(client(store), 0, 2)
        first = agreement.beat_of(1)
        time.sleep(0.3)
        assert agreement.beat_of(1) > first  # its heart beats
        cut, full = request_stacks(client(store), [1], wait_s=5.0)[1]
        assert cut.startswith("busy with test_stuck for")
        assert (
            "in _busy_in_a_loop" in cut and "time.sleep(0.01)  # where the stuck thread is" in cut
        )
        assert "threading.py" in full and "threading.py" not in cut
        # The others give up on the world while this rank is still busy: it is ended.
        agreement.break_("rank 1 did not finish test_stuck")
        deadline = time.monotonic() + 10
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ended == [("rank 1 did not finish test_stuck", False)]
    finally:
        watchdog.stop()
        stop.set()
        worker.join()


def test_a_group_forms_reforms_by_generation_and_is_abandoned(store):
    group = Group("gloo", client(store), rank=0, size=1, timeout_s=30.0, prefix="test/")
    try:
        group.form()
        assert dist.is_initialized() and dist.get_world_size() == 1
        group.reform()
        assert group.generation == 1 and dist.is_initialized()
        t = torch.ones(2)
        dist.all_reduce(t)  # the new generation's group works
        assert t.tolist() == [1.0, 1.0]
        group.abandon()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exits(code: int) -> None:
    raise SystemExit(code)


def test_a_job_that_exits_raises_or_returns_what_cannot_travel_is_said_the_same_in_both_modes():
    exited = run_job(_exits, (3,), {})
    assert (exited.ok, exited.error_kind, exited.exit_code) == (False, "died", 3)
    assert exited.error_summary.startswith("exited with code 3 without a result")
    raised = run_job(int, ("x",), {})
    assert raised.error_kind == "raised" and raised.error_summary.startswith("raised ValueError")
    unpicklable = run_job(threading.Lock, (), {})
    assert unpicklable.error_kind == "unpicklable result"
    assert run_job(max, (1, 2), {}).ok
    with pytest.raises(KeyboardInterrupt):
        run_job(_raise_interrupt, (), {})


def _raise_interrupt() -> None:
    raise KeyboardInterrupt
