"""Ending a session with a signal, as CI runners and schedulers do, leaves nothing behind:
SIGTERM, SIGINT and SIGHUP to the command or a pytest session end it through its clean-up
(no temporary file or directory of ours, no process); after a SIGKILL the ranks and the fork
server still end, and the next session removes what the dead one left. Real processes, real
signals, a private temporary directory per test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.world.listening import descendants
from tests.world.test_listening import PYTEST_FILE, SLOW_SYNC

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLI = [sys.executable, "-m", "ddp_verify", "check", "slow.py:sync", "--kind", "grad-sync",
       "--world-size", "2", "--max-examples", "100", "--json"]  # fmt: skip
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--world-size", "2",
          "test_slow.py"]  # fmt: skip
# The packaged suite, run as framework teams run it (pytest.main inside the command).
CONFORMANCE = [sys.executable, "-m", "ddp_verify", "conformance", "--world-size", "2", "--",
               "-p", "no:cacheprovider", "-n", "0"]  # fmt: skip
# One handler serves every front end (world/cleanup.py): CI sends SIGTERM to each (and
# test_plugin SIGINT to a pytest session); tox -e slow sends every signal to every one.
SLOW = pytest.mark.slow
SLOW_SIGNALS = pytest.mark.parametrize(
    "signum",
    [
        signal.SIGTERM,
        pytest.param(signal.SIGINT, marks=SLOW),
        pytest.param(signal.SIGHUP, marks=SLOW),
    ],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)


def _started(command: list[str], tmp_path) -> tuple[subprocess.Popen, set[int], dict]:
    """``command`` running with its own temporary directory, once its world is up (the
    controller, a fork server and two ranks): the process, its tree and its environment."""
    (tmp_path / "slow.py").write_text(SLOW_SYNC)
    (tmp_path / "test_slow.py").write_text(PYTEST_FILE)
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    tree: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        tree = descendants(proc.pid)
        if len(tree) >= 4 and any(p.name.startswith("ddp_verify-world") for p in temp.iterdir()):
            return proc, tree, env
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the world never came up: {proc.communicate(timeout=30)[1][-2000:]}")


def _ours(env: dict) -> list[str]:
    return sorted(p for p in os.listdir(env["TMPDIR"]) if p.startswith("ddp_verify-"))


def _gone(pids: set[int], seconds: float = 30.0) -> set[int]:
    """The pids of ``pids`` still running after ``seconds`` (zombies count as gone)."""
    deadline = time.monotonic() + seconds
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _running(p)}
        time.sleep(0.1)
    return alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    ("signum", "code"),
    [
        (signal.SIGTERM, 143),
        pytest.param(signal.SIGINT, 130, marks=SLOW),
        pytest.param(signal.SIGHUP, 143, marks=SLOW),
    ],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_a_signal_to_the_command_leaves_no_file_and_no_process(signum, code, tmp_path):
    proc, tree, env = _started(CLI, tmp_path)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    verdict = __import__("json").loads(out)
    assert verdict["verdict"] == ("interrupted" if signum == signal.SIGINT else "terminated")
    assert not _gone(tree - {proc.pid}), "processes left behind"
    assert _ours(env) == [], "temporary files left behind"


@pytest.mark.parametrize(
    ("signum", "command"),
    [
        (signal.SIGTERM, PYTEST),
        # SIGINT to a pytest session is also test_plugin's test_interrupting_pytest (in CI);
        # SIGHUP goes through the SIGTERM handler, and a swallowed one is
        # test_a_terminating_signal_whose_exception_was_swallowed_still_stops_the_next_job.
        pytest.param(signal.SIGINT, PYTEST, marks=SLOW),
        pytest.param(signal.SIGHUP, PYTEST, marks=SLOW),
        # The conformance command ends its pytest session through the same handler as a
        # pytest session (SIGTERM to one in CI): tox -e slow runs these.
        pytest.param(signal.SIGTERM, CONFORMANCE, marks=SLOW),
        pytest.param(signal.SIGINT, CONFORMANCE, marks=SLOW),
        pytest.param(signal.SIGHUP, CONFORMANCE, marks=SLOW),
    ],
    ids=[
        "pytest-SIGTERM",
        "pytest-SIGINT",
        "pytest-SIGHUP",
        "conformance-SIGTERM",
        "conformance-SIGINT",
        "conformance-SIGHUP",
    ],
)
def test_a_signal_to_a_pytest_session_leaves_no_file_and_no_process(signum, command, tmp_path):
    proc, tree, env = _started(command, tmp_path)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    said = "KeyboardInterrupt" if signum == signal.SIGINT else f"terminated by signal {int(signum)}"
    assert proc.returncode != 0 and said in out + err, (out + err)[-2000:]
    assert not _gone(tree - {proc.pid}), "processes left behind"
    assert _ours(env) == [], "temporary files left behind"


def test_after_a_sigkill_the_world_ends_and_the_next_session_cleans_up(tmp_path):
    proc, tree, env = _started(CLI, tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    assert not _gone(tree - {proc.pid}), "ranks or fork server outlived a killed controller"
    left = _ours(env)
    assert left and all(f"-{proc.pid}-" in name for name in left)  # nothing ran to remove them
    # The next session's first world removes what the dead one left (its pid is gone), and
    # its own files with it when it ends.
    again = subprocess.run(
        [*CLI[:-2], "2", "--json"], cwd=tmp_path, env=env, capture_output=True, timeout=300,
        text=True,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert _ours(env) == []


GC_CALLBACK = """
import gc, os, signal, sys, time
from ddp_verify.world import cleanup

cleanup.ends_cleanly()
fired = []


def callback(phase, info):
    # hypothesis keeps such a callback: a signal handled in there raises where the exception
    # is only reported as ignored
    if phase == "start" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.{name})
        time.sleep(0.05)


gc.callbacks.append(callback)
try:
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.01)
    print("went on")
except KeyboardInterrupt as exc:
    print("ended:", type(exc).__name__)
"""


@pytest.mark.parametrize(
    ("name", "raised"), [("SIGTERM", "Terminated"), ("SIGINT", "KeyboardInterrupt")]
)
def test_a_signal_inside_a_garbage_collector_callback_is_not_lost(name, raised):
    done = subprocess.run(
        [sys.executable, "-c", GC_CALLBACK.format(name=name)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == f"ended: {raised}", done.stdout + done.stderr


PARITY_SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "plain_ddp.py"


@SLOW_SIGNALS
def test_a_signal_to_a_parity_run_leaves_no_file_and_no_process(signum, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    command = [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "2x2", "--json",
               "--global-batch", "16", "--", "python", str(PARITY_SCRIPT), "--grad-accum",
               "{grad_accum}", "--batch-size", "{micro_batch}", "--steps", "50"]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # Once a layout's ranks run: the launcher and its ranks are the command's descendants.
    deadline = time.monotonic() + 120
    tree: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        tree |= descendants(proc.pid)
        if len(tree) >= 3:
            break
        time.sleep(0.1)
    assert len(tree) >= 3, "the layout's ranks never started"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    verdict = json.loads(out)
    assert verdict["verdict"] == ("interrupted" if signum == signal.SIGINT else "terminated")
    assert proc.returncode == (130 if signum == signal.SIGINT else 143), err[-2000:]
    assert not _gone(tree), "the layout's launcher or ranks were left behind"
    assert _ours(env) == [], "temporary files left behind"


SWALLOWED = """
import os, signal, time

# Code under test that goes on after any exception, as some libraries' retry loops do: the
# signal's exception is raised in here and lost.
try:
    os.kill(os.getpid(), signal.{name})
    time.sleep(5)
except BaseException:
    pass
"""

SWALLOWED_THEN_A_JOB = (
    """
import signal
from ddp_verify.world import World, cleanup

# As a shell starts a command: under nohup SIGHUP comes ignored, and ends_cleanly leaves it so.
for terminating in cleanup.TERMINATING:
    signal.signal(terminating, signal.SIG_DFL)

cleanup.ends_cleanly()
world = World(1, process_group=False)
world.run(os.getpid)
"""
    + SWALLOWED
    + """
try:
    world.run(os.getpid)
    print("went on")
except KeyboardInterrupt as exc:
    print("ended:", type(exc).__name__)
finally:
    world.close()
"""
)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("SIGTERM", "ended: Terminated"),
        ("SIGHUP", "ended: Terminated"),
        # Python's own semantics: a KeyboardInterrupt that code catches is handled, and the
        # program goes on (a test of the user's Ctrl-C handling does exactly that).
        ("SIGINT", "went on"),
    ],
)
def test_a_terminating_signal_whose_exception_was_swallowed_still_stops_the_next_job(
    name, said, tmp_path
):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    script = "import os\n" + SWALLOWED_THEN_A_JOB.format(name=name)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.strip() == said, done.stdout + done.stderr
    assert _ours(env) == []


def test_a_signal_the_caller_ignores_stays_ignored(tmp_path):
    # nohup starts a command with SIGHUP ignored: a front end must not undo that.
    script = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from ddp_verify.world import cleanup\n"
        "cleanup.ends_cleanly()\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "time.sleep(0.2)\n"
        "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stdout + done.stderr


def test_a_signal_whose_exception_a_test_swallowed_still_ends_the_session(tmp_path):
    (tmp_path / "test_swallow.py").write_text(
        "def test_swallows():\n"
        + "".join(f"    {line}\n" for line in SWALLOWED.format(name="SIGTERM").splitlines())
        + "\n\ndef test_after():\n    print('ran after the signal')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-s", "-rA",
         "test_swallow.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "terminated by signal 15" in out, out[-2000:]
    assert "ran after the signal" not in out and "PASSED test_swallow.py::test_after" not in out


def test_a_test_that_catches_its_own_sigint_does_not_end_the_session(tmp_path):
    # A test of the user's own Ctrl-C handling: the KeyboardInterrupt is caught where Python
    # delivers it, and the session goes on to the next test.
    (tmp_path / "test_ctrl_c.py").write_text(
        "import os, signal, time\n"
        "import pytest\n\n"
        "def test_ctrl_c():\n"
        "    with pytest.raises(KeyboardInterrupt):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(5)\n\n"
        "def test_after():\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-rA",
         "test_ctrl_c.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "PASSED test_ctrl_c.py::test_after" in out, out[-2000:]
