"""The layouts ddp-verify parity starts on this machine listen on nothing another host can
reach: torchrun's rendezvous store, a one-process script's env:// store and gloo's listeners
are all on loopback (torch's TCPStore alone binds every interface; see
ddp_verify/parity/loopback.py). Real launches, read from /proc while they run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.world.listening import is_loopback, listening

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Right at every layout, and slow enough (a step each 0.2 s) to be looked at while it runs.
SLOW_TRAIN = textwrap.dedent(
    """
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    # accelerate launch runs one process plainly, without torchrun's variables.
    grouped = "RANK" in os.environ
    if grouped:
        dist.init_process_group("gloo")
    world, rank = (dist.get_world_size(), dist.get_rank()) if grouped else (1, 0)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    model = torch.nn.Linear(3, 1)
    model = DistributedDataParallel(model) if grouped else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(data, world, rank, shuffle=False)
    for x, y in DataLoader(data, batch_size=8 // world, sampler=sampler):
        time.sleep(0.2)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    """
)


@pytest.mark.parametrize(
    ("launcher", "needs", "servers"),
    [
        # The reference's one process, then torchrun's agent and its two ranks.
        ("torchrun", None, 3),
        # The frameworks' launchers (tox -e slow: CI's 20 minutes go to torchrun's, which
        # parity itself starts): accelerate launch runs the reference plainly (no store), then
        # its torchrun and ranks; fabric run, torchrun's agent.
        pytest.param("accelerate", "accelerate", 2, marks=pytest.mark.slow),
        pytest.param("fabric --strategy ddp", "lightning", 3, marks=pytest.mark.slow),
    ],
)
def test_every_listening_socket_of_a_parity_run_is_loopback(tmp_path, launcher, needs, servers):
    if needs:
        pytest.importorskip(needs, reason="the frameworks extra: pip install -e '.[frameworks]'")
    (tmp_path / "slow_train.py").write_text(SLOW_TRAIN)
    command = [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "2x1", "--steps", "4",
               "--launcher", launcher, "--", "python", "slow_train.py"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(listening(proc.pid))
            time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, (out + err).decode()[-3000:]
    # The stores (the reference's and the agent's) and gloo's listeners were all seen.
    assert len(seen) >= servers, seen
    outside = {address: pid for address, pid in seen.items() if not is_loopback(address)}
    assert not outside, f"listening beyond loopback: {outside}"
