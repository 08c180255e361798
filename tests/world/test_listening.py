"""A world on one machine listens on nothing another host can reach: every TCP socket any of
its processes (controller, fork server, ranks, helper) listens on is loopback, for the
command line, check() and a pytest session alike. Real processes, read from /proc while the
world runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.world.listening import descendants, is_loopback, listening

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SLOW_SYNC = textwrap.dedent(
    """
    import time

    import torch
    import torch.distributed as dist


    def sync(model, num_samples):
        # Right, and slow enough for the test to look at the world while it runs.
        time.sleep(0.2)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(num_samples)
                dist.all_reduce(p.grad)
        total = torch.tensor([float(num_samples)], dtype=torch.float64)
        dist.all_reduce(total)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(total.item())
    """
)

CHECK_SCRIPT = textwrap.dedent(
    """
    import ddp_verify
    from slow import sync

    ddp_verify.check(sync, kind="grad-sync", world_size=2, max_examples=100, seed=0)
    """
)

PYTEST_FILE = textwrap.dedent(
    """
    import time


    def test_runs_a_while(world):
        world.run(time.sleep, 20)
    """
)


def _watch(
    command: list[str], cwd, processes: int, seconds: float = 60.0, ready: Path | None = None
) -> dict[str, int]:
    """Run ``command``, and once ``processes`` processes of its tree exist (and the file
    ``ready``, where given), collect what they listen on for a few seconds; then end it."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: dict[str, int] = {}

    def up() -> bool:
        return len(descendants(proc.pid)) >= processes and (ready is None or ready.exists())

    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not up():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        assert up(), "the world never came up"
        until = time.monotonic() + 3.0
        while time.monotonic() < until and proc.poll() is None:
            seen.update(listening(proc.pid))
            time.sleep(0.1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return seen


# One world code behind every front end: CI runs the plugin's, tox -e slow the other two.
@pytest.mark.parametrize(
    "front_end",
    [
        pytest.param("cli", marks=pytest.mark.slow),
        pytest.param("check", marks=pytest.mark.slow),
        "pytest",
    ],
)
def test_every_listening_socket_of_a_running_world_is_loopback(front_end, tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_SYNC)
    (tmp_path / "run_check.py").write_text(CHECK_SCRIPT)
    (tmp_path / "test_slow.py").write_text(PYTEST_FILE)
    command = {
        "cli": [sys.executable, "-m", "ddp_verify", "check", "slow.py:sync", "--kind",
                "grad-sync", "--world-size", "2", "--max-examples", "100"],
        "check": [sys.executable, "run_check.py"],
        "pytest": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "--world-size", "2", "test_slow.py"],
    }[front_end]  # fmt: skip
    # The controller, the fork server and two ranks at least.
    seen = _watch(command, tmp_path, processes=4)
    assert seen, "no listening socket seen: gloo's own listeners should be there"
    outside = {address: pid for address, pid in seen.items() if not is_loopback(address)}
    assert not outside, f"listening beyond loopback: {outside}"


NCCL_TEST = textwrap.dedent(
    """
    import pathlib
    import time

    import torch
    import torch.distributed as dist

    from ddp_verify.world import rank_device


    def _all_reduce_then_wait(ready):
        t = torch.ones(1, device=rank_device())
        dist.all_reduce(t)  # NCCL's communicator, and its sockets, exist from here on
        torch.cuda.synchronize()
        pathlib.Path(ready).touch()
        time.sleep(20)


    def test_runs_nccl_a_while(world):
        world.run(_all_reduce_then_wait, str(pathlib.Path.cwd() / "ready"))
    """
)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a visible GPU (nccl); none visible here"
)
def test_an_nccl_world_listens_on_loopback_only(tmp_path):
    # NCCL's bootstrap and proxy listen on the interface NCCL_SOCKET_IFNAME names; by default
    # NCCL picks the first non-loopback one, reachable from other hosts.
    (tmp_path / "test_nccl.py").write_text(NCCL_TEST)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
               "--ddp-backend", "nccl", "--world-size", "1", "test_nccl.py"]  # fmt: skip
    seen = _watch(command, tmp_path, processes=3, seconds=120.0, ready=tmp_path / "ready")
    assert seen, "no listening socket seen: NCCL's bootstrap should be there"
    outside = {address: pid for address, pid in seen.items() if not is_loopback(address)}
    assert not outside, f"listening beyond loopback: {outside}"
