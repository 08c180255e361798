"""World.run on real rank processes: results, shipping by value, reuse, output, options."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from ddp_verify.world import (
    BackendUnavailable,
    FailureKind,
    JobPicklingError,
    RankError,
    World,
    WorldError,
)
from tests.processes import wait_gone


@pytest.fixture(scope="module")
def world2():
    with World(2, timeout=20) as world:
        yield world


def _rank_sum(scale: float) -> float:
    t = torch.tensor([scale * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def test_results_come_back_in_rank_order(world2):
    assert world2.run(dist.get_rank) == [0, 1]
    assert world2.run(dist.get_world_size) == [2, 2]


def test_args_kwargs_closures_lambdas_and_partials(world2):
    offset = 10

    def closure(x, *, y):
        return dist.get_rank() + x + y + offset

    assert world2.run(closure, 1, y=2) == [13, 14]
    assert world2.run(lambda: dist.get_rank() * 2) == [0, 2]
    assert world2.run(functools.partial(_rank_sum, 1.0)) == [3.0, 3.0]


def test_collectives_work_across_ranks(world2):
    assert world2.run(_rank_sum, 2.0) == [6.0, 6.0]


def test_tensors_travel_both_ways(world2):
    out = world2.run(lambda t: t * (dist.get_rank() + 1), torch.arange(3.0))
    torch.testing.assert_close(out[1], torch.tensor([0.0, 2.0, 4.0]))


def test_world_is_reused_not_respawned(world2):
    pids = world2.pids
    launches = world2.launches
    for _ in range(20):
        world2.run(lambda: None)
    assert world2.pids == pids
    assert world2.launches == launches


def _mark(value: str | None) -> str | None:
    # A process-wide trace of earlier jobs, as a user's module global would be.
    if value is not None:
        os.environ["DDP_VERIFY_TEST_MARK"] = value
    return os.environ.get("DDP_VERIFY_TEST_MARK")


def test_restart_replaces_the_ranks_with_processes_that_carry_nothing_over(world2):
    assert world2.run(_mark, "set") == ["set", "set"]
    pids = world2.pids
    assert world2.restart() is True
    assert set(world2.pids).isdisjoint(pids)
    assert wait_gone(pids, timeout=5) == []
    assert world2.run(_mark, None) == [None, None]
    assert world2.run(_rank_sum, 1.0) == [3.0, 3.0]  # the new ranks form a group


def test_each_rank_has_one_thread(world2):
    assert world2.run(torch.get_num_threads) == [1, 1]


def test_functions_from_modules_the_ranks_cannot_import(world2, tmp_path):
    source = tmp_path / "private_helpers_xyz.py"
    source.write_text("def triple(x):\n    return 3 * x\n")
    spec = importlib.util.spec_from_file_location("private_helpers_xyz", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["private_helpers_xyz"] = module
    try:
        spec.loader.exec_module(module)
        assert world2.run(module.triple, 5) == [15, 15]
    finally:
        del sys.modules["private_helpers_xyz"]


def test_ranks_follow_the_controller_cwd(world2, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert world2.run(os.getcwd) == [str(tmp_path)] * 2


def test_unpicklable_argument_fails_before_anything_is_sent_and_names_it(world2):
    launches, pids = world2.launches, world2.pids
    unpicklable = r"positional argument 0 \(lock\).*cannot be pickled"
    with pytest.raises(JobPicklingError, match=unpicklable):
        world2.run(lambda lock: None, threading.Lock())
    with pytest.raises(JobPicklingError, match=r"argument 'handle'"):
        world2.run(lambda handle: None, handle=threading.Lock())
    # Nothing was sent: the same ranks, never relaunched.
    assert (world2.launches, world2.pids) == (launches, pids)
    assert world2.run(dist.get_rank) == [0, 1]


def test_a_world_cannot_be_sent_to_its_ranks(world2):
    with pytest.raises(JobPicklingError, match="a World cannot be sent to its ranks"):
        world2.run(lambda w: None, world2)


def test_unpicklable_result_is_a_clear_error_and_keeps_the_world(world2):
    pids = world2.pids
    with pytest.raises(RankError, match="cannot be pickled back") as info:
        world2.run(threading.Lock)
    assert {f.kind for f in info.value.failures} == {FailureKind.UNPICKLABLE_RESULT}
    assert not info.value.world_relaunched
    assert world2.pids == pids
    assert world2.run(dist.get_rank) == [0, 1]


def test_destroying_the_process_group_is_repaired_before_the_next_job(world2):
    assert world2.run(dist.destroy_process_group) == [None, None]
    assert world2.run(dist.is_initialized) == [True, True]
    assert world2.run(_rank_sum, 1.0) == [3.0, 3.0]


def test_output_is_captured_per_rank(world2):
    world2.take_output()

    def speak():
        print(f"hello from {dist.get_rank()}")
        print(f"warning from {dist.get_rank()}", file=sys.stderr)

    world2.run(speak)
    (out0, err0), (out1, err1) = world2.take_output()
    assert out0 == "hello from 0\n" and out1 == "hello from 1\n"
    assert "warning from 0" in err0 and "warning from 1" in err1
    assert world2.take_output() == [("", ""), ("", "")]


def test_close_leaves_no_process():
    world = World(2).start()
    pids = world.pids
    world.close()
    assert wait_gone(pids, timeout=5) == []
    assert world.pids == []


def test_one_rank_world():
    with World(1) as world:
        assert world.run(lambda: (dist.get_rank(), dist.get_world_size())) == [(0, 1)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "positive integer"),
        ({"size": 2, "backend": "mpi"}, "backend must be one of gloo, nccl"),
        ({"size": 2, "timeout": 0}, "timeouts must be positive"),
        ({"size": 2, "threads_per_rank": 0}, "threads_per_rank"),
    ],
)
def test_impossible_options_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        World(**kwargs)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="GPUs are visible here")
def test_nccl_without_gpus_says_why():
    world = World(2, backend="nccl")
    with pytest.raises(BackendUnavailable, match=r"needs 2 GPUs, \d+ visible"):
        world.start()
    assert world.pids == []


def test_a_shipped_object_is_unpickled_once_per_rank_and_keeps_its_state(world2):
    # What check() relies on to send a method with the user's code once, not per example.
    from ddp_verify.world.protocol import Shipped

    seen: list[int] = []

    def remember(value: int) -> int:
        seen.append(value)
        return len(seen)

    shipped = Shipped(remember)

    def call(fn, value):
        return fn(value)

    assert world2.run(call, shipped, 1) == [1, 1]
    assert world2.run(call, shipped, 2) == [2, 2]
    # The same bytes again are the same object on the ranks; other bytes are a new one.
    assert world2.run(call, Shipped(remember), 3) == [3, 3]
    seen.append(0)  # changes what a fresh pickle holds
    assert world2.run(call, Shipped(remember), 4) == [2, 2]


def test_the_helper_runs_jobs_outside_the_process_group_and_closes_with_its_world():
    world = World(2).start()
    helper = world.helper
    assert helper.run(dist.is_initialized) == [False]
    assert world.run(dist.is_initialized) == [True, True]  # the ranks' group is untouched
    (pid,) = helper.pids
    assert pid not in world.pids and world.helper is helper
    world.close()
    assert wait_gone([pid], timeout=5) == []


def test_a_failing_helper_job_names_the_helper_and_the_helper_recovers(world2):
    with pytest.raises(RankError, match="failed on the helper process of a world of 2"):
        world2.helper.run(lambda: 1 / 0)
    assert world2.helper.run(lambda: "again") == ["again"]


def test_a_closed_worlds_helper_is_not_started_again():
    world = World(2).start()
    world.helper.start()
    world.close()
    with pytest.raises(WorldError, match="this world was closed"):
        world.helper.run(lambda: None)


def test_modules_that_subclass_the_module_type_travel_by_name(world2):
    # torch.backends.cudnn is a CudnnModule in sys.modules, which plain cloudpickle refuses:
    # a job that reads cuDNN's settings must still reach the ranks.
    def settings():
        return type(torch.backends.cudnn).__name__, torch.backends.cudnn.allow_tf32

    assert world2.run(settings) == [("CudnnModule", False)] * 2
