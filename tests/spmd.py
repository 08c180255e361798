"""Start real launched jobs from tests: ``torchrun`` (standalone, or several node agents on
127.0.0.1 with the c10d rendezvous), or processes given the launcher's variables by hand.

Every job is bounded in time and killed with its whole process group if it outlives it; the
pids of the ranks a job started can be collected to check that none is left behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_verify.world.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
# torchrun's own chatter on stderr (its start banner, its failure summary) is not the report.
JOB_TIMEOUT_S = 300.0


@dataclasses.dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def environment(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # A test run under xdist or pytest must not leak its own identity into the job.
        if not k.startswith(("PYTEST_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))
        and k not in ("GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def torchrun(
    args: list[str],
    *,
    cwd: Path,
    nproc: int = 4,
    timeout: float = JOB_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Job:
    """``torchrun --standalone --nproc-per-node N ARGS`` (torchrun is
    ``python -m torch.distributed.run``: the same interpreter as the tests')."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *args,
    ]
    return finish(start(command, cwd, env), timeout)


def torchrun_nodes(
    args: list[str],
    *,
    cwd: Path,
    nodes: int = 2,
    nproc: int = 2,
    timeout: float = JOB_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> list[Job]:
    """``nodes`` torchrun agents on this machine, joined by the c10d rendezvous on a free
    loopback port: a multi-node job on one machine (``env``: every agent's environment)."""
    endpoint = f"127.0.0.1:{free_port()}"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id=ddp-verify-test-{os.getpid()}",
        "--local-addr=127.0.0.1",
        *args,
    ]
    agents = [start(command, cwd, env) for _ in range(nodes)]
    deadline = time.monotonic() + timeout
    return [finish(a, max(1.0, deadline - time.monotonic())) for a in agents]


def by_hand(args: list[str], *, cwd: Path, size: int, timeout: float = 120.0) -> list[Job]:
    """``size`` processes started with torchrun's variables set by hand (no launcher watches
    them: nobody tears the others down when one dies)."""
    port = free_port()
    procs = []
    for rank in range(size):
        env = environment(
            RANK=str(rank),
            WORLD_SIZE=str(size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(start([sys.executable, *args], cwd, env))
    deadline = time.monotonic() + timeout
    return [finish(p, max(1.0, deadline - time.monotonic())) for p in procs]


def start(command: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env or environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> Job:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the launched job outlived {timeout:g} s:\n{out[-3000:]}\n{err[-3000:]}")
    return Job(proc.returncode, out, err)


def json_document(text: str) -> dict:
    """The one JSON document a command printed (rank 0's), ignoring nothing else: any other
    line on stdout is an error."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON document on stdout, got:\n{text}"
    return json.loads(lines[0])


def ranks_left(pid_dir: Path) -> list[int]:
    """The rank processes (each wrote its pid into ``pid_dir``) still alive."""
    from tests.processes import wait_gone

    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert pids, "no rank wrote its pid: the job never ran"
    return wait_gone(pids, timeout=10.0)
