"""A command's end: ``cleanup.exit_now`` does what the interpreter's own exit does for the
command (threads joined, ``atexit`` handlers run, buffered output flushed, the exit code
kept) and skips the teardown of every module, which once torch is imported costs a second
of CPU and more. Real interpreters, their output through pipes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The start of a script whose interpreter writes "torn down" to stderr if it tears its
# modules down at the end (tests/frontends/test_cli.py and tests/parity/test_agent.py too).
TEARDOWN_MARKER = """
import os, sys


class Marker:
    # Alive in a module until the interpreter tears its modules down, if it does.
    def __del__(self):
        os.write(2, b"torn down")


sys.modules["marker"] = type(sys)("marker")
sys.modules["marker"].alive = Marker()
"""
SCRIPT = (
    TEARDOWN_MARKER
    + """
import atexit, threading, time

from ddp_verify.world import cleanup

atexit.register(lambda: sys.stdout.write(" atexit ran"))
thread = threading.Thread(target=lambda: (time.sleep(0.2), sys.stdout.write(" thread done")))
thread.start()
sys.stdout.write("buffered")
{end}
"""
)


def _ended(end: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # block-buffered
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(end=end)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("end", "torn_down"),
    [("sys.exit(3)", True), ("cleanup.exit_now(3)", False)],
    ids=["sys.exit", "exit_now"],
)
def test_exit_now_ends_as_the_interpreter_would_less_the_teardown(end, torn_down):
    result = _ended(end)
    assert result.returncode == 3, result.stderr
    # The thread finished before the atexit handlers ran, and the buffer reached the pipe.
    assert result.stdout == "buffered thread done atexit ran"
    assert ("torn down" in result.stderr) is torn_down, result.stderr
