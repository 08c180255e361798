"""Ranks forked from the fork server: fresh where it matters, reaped, and never left behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from ddp_verify.world import RankError, World
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
        with pytest.raises(RankError, match=r"ranks? 0(, 1)? died"):
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


_THREADED_PRELOAD = """
from ddp_verify.world import World, forkserver

with World(2, preload=("starts_a_thread",)) as world:
    print(world.start_method, *world.run(lambda: 1 + 1))
print(forkserver._disabled)
"""


def test_a_fork_server_made_threaded_by_a_preload_is_not_forked_from(tmp_path):
    # fork() copies one thread: a lock another thread held would stay locked in every rank.
    # The server checks after its imports and the world spawns its ranks instead (in a fresh
    # process here: the refusal holds for the rest of the process's life).
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _THREADED_PRELOAD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},  # importable by the server too
    )
    first, *why = done.stdout.splitlines()
    assert first.split() == ["spawn", "2", "2"], done.stdout + done.stderr
    assert "the fork server has 2 threads after its imports; it must have 1" in "".join(why)


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


def test_a_preload_found_only_on_the_controllers_path_of_now_keeps_the_fork_server(
    tmp_path, monkeypatch
):
    # The tests' directories join sys.path at collection, after the server started: it looks
    # where the controller looks. A preload it still cannot import is the ranks' to report;
    # the server goes on forking (giving up would spawn every later rank of the session).
    (tmp_path / "late_module.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def has_it() -> bool:
        import sys

        return "late_module" in sys.modules

    with World(2, preload=("late_module",)) as world:
        assert world.run(has_it) == [True, True]
        assert world.start_method == "fork server"
    with (
        pytest.raises(Exception, match="No module named 'never_there'"),
        World(2, preload=("never_there",), start_timeout=60) as world,
    ):
        world.run(has_it)
    with World(2) as world:
        world.run(has_it)
        assert world.start_method == "fork server"
