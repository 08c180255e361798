"""A parity layout's agent (``python -m ddp_verify.parity.agent``) is torchrun's: the same
arguments start the same ranks and give the same exit code, and it ends without tearing
torch's modules down. Real torchrun launches on loopback."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from tests.world.test_exit import TEARDOWN_MARKER

# The agent run as its module, in an interpreter holding an object that says so if the
# interpreter tears its modules down at the end.
MARKED = TEARDOWN_MARKER + textwrap.dedent(
    """
    import runpy

    sys.argv = ["agent", *sys.argv[1:]]
    runpy.run_module("ddp_verify.parity.agent", run_name="__main__")
    """
)
RANKS = textwrap.dedent(
    """
    import os, sys

    rank = int(os.environ["RANK"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']}", flush=True)
    if rank == int(sys.argv[1]):
        raise SystemExit(3)
    """
)


def _agent(tmp_path, failing_rank: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    torchrun = ["--standalone", "--nproc-per-node", "2", "--local-addr", "127.0.0.1"]
    return subprocess.run(
        [sys.executable, "-c", MARKED, *torchrun, str(script), str(failing_rank)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_agent_starts_torchruns_ranks_and_ends_without_its_teardown(tmp_path):
    from ddp_verify.parity.launch import DEFAULT_LAUNCHER

    assert "{python} -m ddp_verify.parity.agent --standalone " in DEFAULT_LAUNCHER
    result = _agent(tmp_path, failing_rank=-1)
    assert result.returncode == 0, result.stderr
    # Both ranks write to one pipe: their lines may interleave, each says itself once.
    assert sorted(re.findall(r"rank \d of 2", result.stdout)) == ["rank 0 of 2", "rank 1 of 2"]
    assert "torn down" not in result.stderr


def test_a_failing_rank_fails_the_agent_as_it_fails_torchrun(tmp_path):
    result = _agent(tmp_path, failing_rank=1)
    assert result.returncode == 1, result.stderr
    assert "ChildFailedError" in result.stderr and "exitcode  : 3" in result.stderr
