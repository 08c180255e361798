"""Ranks forked from the fork server: fresh where it matters, reaped, and never left behind."""

from __future__ import annotations

import os
import random
import signal

import pytest

from ddp_verify.world import RankError, World, forkserver
from tests.processes import alive, wait_gone


def _who() -> tuple[int, int, str | None, float]:
    return os.getpid(), os.getppid(), os.environ.get("DDP_VERIFY_TEST_MARK"), random.random()


def test_ranks_are_forked_and_get_the_environment_of_now(monkeypatch):
    monkeypatch.setenv("DDP_VERIFY_TEST_MARK", "set after import")
    with World(2) as world:
        assert world.start_method == "fork server"
        (pid0, parent0, mark0, r0), (pid1, parent1, mark1, r1) = world.run(_who)
    assert pid0 != pid1 and parent0 == parent1 != os.getpid()
    assert mark0 == mark1 == "set after import"
    assert r0 != r1  # Python's random is reseeded per rank, as a spawned process would be


def test_without_the_fork_server_ranks_are_spawned(monkeypatch):
    monkeypatch.setenv("DDP_VERIFY_FORK_SERVER", "0")
    with World(2) as world:
        assert world.start_method == "spawn"
        assert {parent for _, parent, _, _ in world.run(_who)} == {os.getpid()}


def test_a_killed_fork_server_takes_its_ranks_and_the_world_recovers(tmp_path):
    # A set-up of its own (PYTHON* variables choose the server): killing the session's shared
    # server would take every other world's ranks with it.
    with World(2, timeout=10, env={"PYTHONPATH": str(tmp_path)}) as world:
        server_pid = world.run(_who)[0][1]
        ranks = world.pids
        os.kill(server_pid, signal.SIGKILL)
        assert wait_gone([server_pid, *ranks]) == []
        with pytest.raises(RankError, match="rank 0 died"):
            world.run(_who)
        # Relaunched from a new server.
        assert world.run(_who)[0][1] not in (server_pid, os.getpid())
    assert not alive(server_pid)


def test_preloaded_modules_are_imported_once_before_the_first_job():
    def imported() -> bool:
        import sys

        return "torch._dynamo" in sys.modules

    with World(2, preload=("torch._dynamo",)) as world:
        assert world.run(imported) == [True, True]


def test_the_fork_server_refuses_to_fork_from_a_threaded_process():
    # Checked in the server after its imports; here, the check itself.
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="threads after its imports"):
            forkserver._assert_single_threaded()
    finally:
        stop.set()
        thread.join()


def test_a_rank_gets_variables_its_server_did_not_start_with():
    # Variables torch sets on itself do not choose the server, so a rank's environment is
    # the server's start-up environment plus the difference, applied in the rank.
    def cache_dir() -> str | None:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    with World(2) as world:
        server = world.run(_who)[0][1]
    with World(2, env={"TORCHINDUCTOR_CACHE_DIR": "/tmp/ddp_verify-test-cache"}) as world:
        assert world.run(_who)[0][1] == server  # the same server
        assert world.run(cache_dir) == ["/tmp/ddp_verify-test-cache"] * 2
