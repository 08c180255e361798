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
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(data, shuffle=False)
    for x, y in DataLoader(data, batch_size=8 // dist.get_world_size(), sampler=sampler):
        time.sleep(0.2)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    """
)


def test_every_listening_socket_of_a_parity_run_is_loopback(tmp_path):
    (tmp_path / "slow_train.py").write_text(SLOW_TRAIN)
    command = [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "2x1", "--steps", "4",
               "--", "python", "slow_train.py"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 120
        # The reference's one process, then torchrun's agent and its two ranks: all of it.
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
    assert len(seen) >= 3, seen
    outside = {address: pid for address, pid in seen.items() if not is_loopback(address)}
    assert not outside, f"listening beyond loopback: {outside}"
