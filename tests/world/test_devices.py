"""Devices a world trains on: the choice, how ranks sit on GPUs, what is refused and how fast,
and a world whose ranks cannot join (reported with where they were, never waited out twice).

Everything here runs without a GPU; tests/world/test_cuda.py holds what needs one.
"""

from __future__ import annotations

import time

import pytest
import torch

from ddp_verify.usercode.search import search
from ddp_verify.world import DeviceUnavailable, World, WorldStartError
from ddp_verify.world.backends import (
    check_device,
    default_device,
    gpu_of,
    placement,
    require_devices,
)
from tests.processes import wait_gone
from tests.user_code import load

average_gradients = load("grad_sync").average_gradients


def _record(calls: list[tuple[int, str]]):
    return lambda tried, phase: calls.append((tried, phase))


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")


def test_the_backend_chooses_the_default_device_and_nccl_refuses_the_cpu():
    assert (default_device("gloo"), default_device("nccl")) == ("cpu", "cuda")
    assert check_device("gloo", None) == "cpu"
    assert check_device("gloo", "cuda") == "cuda"
    assert check_device("nccl", None) == "cuda"
    with pytest.raises(ValueError, match="nccl reduces CUDA tensors only"):
        check_device("nccl", "cpu")
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, got 'tpu'"):
        check_device("gloo", "tpu")
    with pytest.raises(ValueError, match="nccl reduces CUDA tensors only"):
        World(2, backend="nccl", device="cpu")


def test_ranks_share_gpus_round_robin_and_the_header_words_say_so():
    assert [gpu_of(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [gpu_of(r, 3) for r in range(5)] == [0, 1, 2, 0, 1]
    assert placement(4, "cuda", 1) == "cuda, 4 ranks share 1 GPU"
    assert placement(4, "cuda", 2) == "cuda, 4 ranks share 2 GPUs round-robin"
    assert placement(2, "cuda", 8) == "cuda, one GPU per rank (2 of 8)"
    assert placement(4, "cpu", 0) == "cpu"


@NO_GPU
def test_cuda_without_a_gpu_is_refused_at_once_and_starts_nothing():
    for backend, words in [
        ("gloo", "no GPU is visible here.*use --ddp-device cpu"),
        ("nccl", "nccl needs one GPU per rank.*0 visible here; use --ddp-backend gloo"),
    ]:
        world = World(2, backend=backend, device="cuda")
        with pytest.raises(DeviceUnavailable, match=words):
            world.start()
        assert world.pids == [] and world.launches == 0
    with pytest.raises(DeviceUnavailable, match="no GPU is visible"):
        require_devices("gloo", 1, "cuda")
    assert require_devices("gloo", 64, "cpu") == 0


def _where_and_tf32():
    import torch

    from ddp_verify.world import rank_device

    return (
        str(rank_device()),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_ranks_and_helper_train_where_the_world_says_with_tf32_as_asked(allow_tf32):
    # cuDNN allows TF32 by default: a world turns it off unless asked, on every rank and on
    # the helper that measures float32's tolerance.
    with World(2, allow_tf32=allow_tf32) as world:
        expected = ("cpu", allow_tf32, allow_tf32)
        assert world.run(_where_and_tf32) == [expected, expected]
        assert world.helper.run(_where_and_tf32) == [expected]
        assert world.helper.device == "cpu" and world.placement == "cpu"


SLOW_START = """
import pathlib, time

pathlib.Path({marker!r}).write_text("importing")
time.sleep(120)
"""


def test_a_world_whose_ranks_never_join_says_where_they_are_and_is_not_waited_out_twice(
    tmp_path, monkeypatch
):
    # A rank stuck at start (here, in an import; on GPUs, in an NCCL communicator's set-up)
    # fails the start after start_timeout with that rank's stack; asking again re-raises the
    # same failure instead of waiting another start_timeout, until retry_start().
    marker = tmp_path / "rank-started"
    (tmp_path / "slow_start_module.py").write_text(SLOW_START.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    # Spawned ranks import the preload themselves (a fork server would import it before
    # forking, and hang there instead of in the rank).
    monkeypatch.setenv("DDP_VERIFY_FORK_SERVER", "0")
    world = World(1, preload=["slow_start_module"], start_timeout=2.0)
    try:
        world.launch()
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the rank never reached its preload"
        pids = world.pids
        with pytest.raises(WorldStartError) as first:
            world.start()
        report = str(first.value)
        assert "rank 0 did not join within 2 s" in report
        assert "rank 0 stack (still starting)" in report
        where = f'  File "{tmp_path / "slow_start_module.py"}", line 5, in <module>\n'
        assert where + "    time.sleep(120)\n" in report
        assert wait_gone(pids, timeout=10) == []
        with pytest.raises(WorldStartError) as again:
            world.run(lambda: None)
        assert again.value is first.value
        # A search stops at it after one example, rather than letting hypothesis shrink it.
        tried: list[tuple[int, str]] = []
        with pytest.raises(WorldStartError) as in_search:
            search(average_gradients, kind="grad-sync", world=world, progress=_record(tried))
        assert in_search.value is first.value and tried == [(1, "searching")]
        world.retry_start()
        assert world._start_failure is None
    finally:
        world.close()
