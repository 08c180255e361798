"""On GPUs: worlds that train on CUDA tensors (nccl, and gloo with ranks sharing GPUs), and
nccl's failure contract. Every test skips where the GPUs it needs are not visible, and says
so; benchmarks/gpu_check.sh runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings

from ddp_verify import VerifyingWorld
from ddp_verify.engine.strategies import scenarios
from ddp_verify.methods import ddp, manual_allreduce
from ddp_verify.world import DeviceUnavailable, FailureKind, RankError, World, rank_device
from tests.processes import wait_gone

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs(gpus: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        gpus > GPUS, reason=f"needs {gpus} visible GPU(s); {GPUS} visible here"
    )


FEW = settings(
    max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def nccl_world():
    # As many ranks as GPUs (nccl's one per rank), at most 4.
    with VerifyingWorld(min(max(GPUS, 1), 4), backend="nccl", timeout=30) as world:
        yield world


@pytest.fixture(scope="module")
def shared_gpu_world():
    # gloo on CUDA tensors: four ranks, sharing the GPUs round-robin.
    with VerifyingWorld(4, device="cuda", timeout=60) as world:
        yield world


def _placement() -> tuple[str, str, bool]:
    t = torch.ones(2, device=rank_device())
    dist.all_reduce(t)
    return str(rank_device()), str(t.device), torch.backends.cudnn.allow_tf32


@needs(1)
def test_nccl_ranks_train_on_their_own_gpu(nccl_world):
    got = nccl_world.run(_placement)
    assert got == [(f"cuda:{r}", f"cuda:{r}", False) for r in range(nccl_world.size)]
    # The helper that measures float32's tolerance runs on a GPU too, outside the group.
    assert nccl_world.helper.run(_where) == ["cuda:0"]


def _where() -> str:
    return str(rank_device())


@needs(1)
def test_gloo_ranks_share_the_gpus_round_robin(shared_gpu_world):
    got = [where for where, _, _ in shared_gpu_world.run(_placement)]
    assert got == [f"cuda:{r % GPUS}" for r in range(4)]
    expected = "one GPU per rank" if GPUS >= 4 else "4 ranks share"
    assert expected in shared_gpu_world.placement


@needs(1)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_ddp_and_all_reduce_on_nccl_match_the_cpu_reference(nccl_world, dtype):
    @FEW
    @given(scenarios(world_size=nccl_world.size, dtypes=(dtype,), max_micro_batches=3))
    def check(scenario):
        nccl_world.assert_equivalent(ddp(), scenario)
        nccl_world.assert_equivalent(manual_allreduce(), scenario)

    check()


@needs(1)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ddp_on_gloo_with_cuda_tensors_matches_and_the_bug_is_still_caught(shared_gpu_world, dtype):
    @FEW
    @given(scenarios(world_size=4, dtypes=(dtype,), max_micro_batches=3))
    def check(scenario):
        shared_gpu_world.assert_equivalent(ddp(), scenario)

    check()
    from ddp_verify import Scenario

    uneven = Scenario(world_size=4, schedule=(((1,), (1,), (1,), (5,)),), dtype=dtype)
    outcome = shared_gpu_world.check_equivalent(manual_allreduce(weighting="world"), uneven)
    assert not outcome.equivalent


@needs(1)
def test_a_raising_rank_on_nccl_is_reported_and_the_next_job_runs(nccl_world):
    def fails():
        if dist.get_rank() == 0:
            raise ValueError("boom on the GPU rank")
        return 0

    with pytest.raises(RankError, match="boom on the GPU rank") as caught:
        nccl_world.run(fails)
    assert caught.value.failures[0].kind is FailureKind.RAISED
    assert nccl_world.run(_placement)[0][0] == "cuda:0"  # a fresh world answers


def _stuck_on_the_gpu() -> float:
    # A kernel that spins for minutes, then a collective queued behind it: .item() waits on
    # the GPU, inside CUDA, where only the controller's time-out can end it.
    torch.cuda._sleep(1 << 40)
    t = torch.ones(1, device=rank_device())
    dist.all_reduce(t)
    return t.item()


@needs(1)
def test_a_rank_stuck_on_the_gpu_is_reported_with_its_stack_and_releases_the_gpu():
    with World(1, backend="nccl", timeout=5) as world:
        pids = world.pids
        with pytest.raises(RankError) as caught:
            world.run(_stuck_on_the_gpu)
        report = str(caught.value)
        assert caught.value.failures[0].kind is FailureKind.TIMED_OUT, report
        assert "_stuck_on_the_gpu" in report  # where it waited
        assert wait_gone(pids, timeout=15) == []  # nothing left holding the GPU
        assert world.run(lambda: torch.cuda.is_available()) == [True]


def _only_rank_0_reduces() -> None:
    t = torch.ones(1, device=rank_device())
    if dist.get_rank() == 0:
        dist.all_reduce(t)
        t.item()


@needs(2)
def test_a_hung_nccl_collective_is_reported_within_the_timeout_and_the_next_world_runs():
    with World(2, backend="nccl", timeout=5) as world:
        pids = world.pids
        with pytest.raises(RankError) as caught:
            world.run(_only_rank_0_reduces)
        kinds = {f.rank: f.kind for f in caught.value.failures}
        assert kinds[0] is FailureKind.TIMED_OUT, str(caught.value)
        assert "_only_rank_0_reduces" in str(caught.value)
        assert wait_gone(pids, timeout=15) == []
        assert world.run(dist.get_rank) == [0, 1]


def _mismatched() -> float:
    t = torch.ones(3 if dist.get_rank() == 0 else 5, device=rank_device())
    dist.all_reduce(t)
    return t.sum().item()


@needs(1)
def test_a_mismatched_collective_on_cuda_tensors_fails_loudly_and_the_next_job_runs():
    # Two ranks: nccl where there are two GPUs, gloo sharing one otherwise.
    backend = "nccl" if GPUS >= 2 else "gloo"
    with World(2, backend=backend, device="cuda", timeout=10, debug=True) as world:
        with pytest.raises(RankError) as caught:
            world.run(_mismatched)
        assert caught.value.failures, str(caught.value)
        assert world.run(dist.get_rank) == [0, 1]


@needs(1)
def test_nccl_with_more_ranks_than_gpus_is_refused_at_once():
    world = World(GPUS + 1, backend="nccl")
    with pytest.raises(DeviceUnavailable, match=f"needs {GPUS + 1} GPUs, {GPUS} visible"):
        world.start()
    assert world.pids == []
