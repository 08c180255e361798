"""The pytest plugin, driven through pytester: outcomes and the words users read."""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Imported here, before any in-process pytester run: pytester restores sys.modules after each
# run, and torch's C extension cannot be imported a second time into one process.
import torch

import ddp_verify.world  # noqa: F401
from tests.processes import default_sigint, descendants, wait_gone

QUIET = ["-p", "no:cacheprovider", "-W", "ignore:Failed to initialize NumPy:UserWarning"]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*QUIET, *args)


def test_report_header_names_sizes_backend_and_torch(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = run(pytester, "--world-size", "2,4")
    header = [line for line in result.stdout.lines if line.startswith("ddp_verify:")]
    assert len(header) == 1, result.stdout.str()
    assert fnmatch.fnmatch(
        header[0], "ddp_verify: world sizes 2,4, backend gloo, device cpu, timeout 60 s, torch 2.*"
    ), header[0]


def test_spawned_ranks_are_said_in_the_header_and_a_failed_fork_server_in_the_summary(
    pytester, monkeypatch
):
    pytester.makepyfile(
        """
        import pytest
        from ddp_verify.world import forkserver

        def test_the_fork_server_fails_meanwhile():
            forkserver.disable("it stopped answering")

        @pytest.mark.distributed
        def test_runs_on_spawned_ranks(rank):
            assert rank in (0, 1)
        """
    )
    spawned = pytester.runpytest_subprocess(
        *QUIET, "--world-size", "2", "-n", "0", "-p", "no:randomly"
    )
    spawned.assert_outcomes(passed=2)
    spawned.stdout.fnmatch_lines(
        ["*ddp_verify: ranks were spawned after the fork server failed: it stopped answering"]
    )
    pytester.makepyfile(test_plain="def test_nothing(): pass")
    told = pytester.runpytest_subprocess(*QUIET, "test_plain.py", "-n", "0")
    assert "ranks are spawned" not in told.stdout.str()
    monkeypatch.setenv("DDP_VERIFY_FORK_SERVER", "0")
    told = pytester.runpytest_subprocess(*QUIET, "test_plain.py", "-n", "0")
    told.stdout.fnmatch_lines(["*ranks are spawned, not forked (DDP_VERIFY_FORK_SERVER=0)*"])


def test_distributed_tests_run_on_every_rank_with_fixtures(pytester):
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.fixture
        def base():
            return {"values": torch.arange(3.0)}

        @pytest.mark.distributed
        def test_sum(rank, world_size, base):
            assert dist.get_rank() == rank and dist.get_world_size() == world_size == 3
            t = base["values"] * (rank + 1)
            dist.all_reduce(t)
            assert torch.equal(t, base["values"] * 6)
            open(f"ran-on-rank{rank}", "w").close()  # ranks work in the controller's directory

        @pytest.mark.distributed
        def test_uses_torch_directly():
            assert dist.is_initialized() and dist.get_backend() == "gloo"
        """
    )
    result = run(pytester, "--world-size", "3", "-v")
    result.assert_outcomes(passed=2)
    ran = sorted(p.name for p in pytester.path.glob("ran-on-rank*"))
    assert ran == ["ran-on-rank0", "ran-on-rank1", "ran-on-rank2"]


def test_fixture_values_are_shipped_not_recomputed_on_ranks(pytester):
    pytester.makepyfile(
        """
        import os, pytest

        @pytest.fixture
        def controller_pid():
            return os.getpid()

        def parent_of(pid):
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])

        @pytest.mark.distributed
        def test_pid(controller_pid):
            assert controller_pid != os.getpid()
            # Spawned by the controller, or forked by the fork server it started.
            assert controller_pid in (os.getppid(), parent_of(os.getppid()))
        """
    )
    run(pytester, "--world-size", "2").assert_outcomes(passed=1)


def test_a_failing_rank_is_named_with_its_assertion_and_output(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_only_rank_0_is_happy(rank):
            print(f"checking rank {rank}")
            value = rank * 10
            assert value == 0
        """
    )
    result = run(pytester, "--world-size", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_only_rank_0_is_happy failed on a world of 2 (gloo): "
            "rank 1 raised AssertionError: assert 10 == 0",
            "*rank 1 raised AssertionError*",
            "  Traceback (most recent call last):",
            '    File "*test_a_failing_rank_is_named_with_its_assertion_and_output.py", line 7, '
            "in test_only_rank_0_is_happy",
            "      assert value == 0",
            "  AssertionError: assert 10 == 0",
            "Finished the job normally: rank 0.",
            "*Captured stdout rank 0 call*",
            "checking rank 0",
            "*Captured stdout rank 1 call*",
            "checking rank 1",
        ]
    )
    assert "During handling of the above exception" not in result.stdout.str()
    # The harness's frames are cut, as pytest cuts its own.
    assert "_run_test_on_rank" not in result.stdout.str()


def test_full_trace_shows_the_harness_frames_of_rank_tracebacks_and_stacks(pytester):
    pytester.makepyfile(
        """
        import time, pytest

        @pytest.mark.distributed
        def test_raises(rank):
            assert rank == 0

        @pytest.mark.distributed(timeout=2)
        def test_hangs(rank):
            time.sleep(60 if rank == 0 else 0)

        def test_world_run(world):
            def job():
                raise ValueError("from the job")
            world.run(job)
        """
    )
    cut = run(pytester, "--world-size", "2")
    cut.assert_outcomes(failed=3)
    full = run(pytester, "--world-size", "2", "--full-trace")
    full.assert_outcomes(failed=3)
    # What delivered each job: the rank's loop, the plugin's runner, the fork server.
    for harness in ("in run_job", "in _run_test_on_rank", "forkserver.py"):
        assert harness not in cut.stdout.str()
        assert harness in full.stdout.str()
    # The world.run() of a test says the same in full.
    full.stdout.fnmatch_lines(["*ValueError: from the job", "*in run_job*"], consecutive=False)
    assert full.stdout.str().count("in run_job") >= 3


def test_world_size_list_parametrizes_and_marker_overrides(pytester):
    pytester.makepyfile(
        """
        import pytest, torch.distributed as dist

        @pytest.mark.distributed
        def test_each(world_size):
            assert dist.get_world_size() == world_size

        @pytest.mark.distributed(world_size=3)
        def test_three():
            assert dist.get_world_size() == 3

        def test_world(world):
            assert len(world.run(dist.get_rank)) == world.size

        def test_plain():
            pass
        """
    )
    result = run(pytester, "--world-size", "2,4", "-v")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines_random(
        [
            "*test_each[[]ws2[]] PASSED*",
            "*test_each[[]ws4[]] PASSED*",
            "*test_three[[]ws3[]] PASSED*",
            "*test_world[[]ws2[]] PASSED*",
            "*test_world[[]ws4[]] PASSED*",
            "*test_plain PASSED*",
        ]
    )


def test_world_size_from_ini_and_env_with_command_line_first(pytester, monkeypatch):
    pytester.makeini("[pytest]\nddp_world_size = 3\n")
    pytester.makepyfile(
        """
        import pytest, torch.distributed as dist

        @pytest.mark.distributed
        def test_size(world_size):
            assert world_size == dist.get_world_size()
            print("SIZE", world_size)
        """
    )
    run(pytester, "-rP").stdout.fnmatch_lines(["SIZE 3"])
    monkeypatch.setenv("DDP_VERIFY_WORLD_SIZE", "2")
    run(pytester, "-rP").stdout.fnmatch_lines(["SIZE 2"])
    run(pytester, "-rP", "--world-size", "1").stdout.fnmatch_lines(["SIZE 1"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "zero"], "--world-size expects a positive integer or a comma-separated*"),
        (["--world-size", "2,0"], "--world-size expects*got '2,0'"),
        (["--ddp-timeout", "-1"], "--ddp-timeout expects a positive number of seconds*"),
        (["--ddp-preload", "my-team.patch"], "--ddp-preload expects importable module names*"),
        (["--ddp-preload", "no_module_here"], "--ddp-preload: no module named 'no_module_here'*"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, message):
    pytester.makepyfile("def test_nothing(): pass")
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_preloaded_modules_are_imported_by_every_rank_before_its_first_job(pytester):
    # The module records the process that imported it: every rank has it (forked from a
    # server that imported it, or importing it itself), and the controller never does.
    pytester.makepyfile(
        rank_patch="import os\nIMPORTED_BY = os.getpid()\n",
        test_preload="""
        import os, sys, pytest

        @pytest.mark.distributed
        def test_ranks_have_it(rank):
            assert "rank_patch" in sys.modules, f"rank {rank} did not import rank_patch"

        def test_the_controller_does_not():
            assert "rank_patch" not in sys.modules
        """,
    )
    result = run(pytester, "--ddp-preload", "rank_patch", "--world-size", "2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["ddp_verify: *ranks preload rank_patch*"])
    pytester.makeini("[pytest]\nddp_preload = rank_patch\n")
    run(pytester, "--world-size", "2").assert_outcomes(passed=2)


def test_bad_env_world_size_names_the_variable(pytester, monkeypatch):
    pytester.makepyfile("def test_nothing(): pass")
    monkeypatch.setenv("DDP_VERIFY_WORLD_SIZE", "four")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*DDP_VERIFY_WORLD_SIZE expects a positive integer*'four'*"])


def test_plain_pytest_does_not_import_torch(pytester):
    pytester.makepyfile(
        """
        import sys

        def test_no_torch():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess(*QUIET)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["ddp_verify: world size 2, backend gloo*"])


def test_distributed_test_cannot_take_the_world_fixture(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_confused(world):
            pass
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot also take the 'world' fixture*rank*world_size*"])


def test_bad_marker_world_size_is_a_usage_error(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed(world_size="many")
        def test_x():
            pass
        """
    )
    result = run(pytester)
    result.stdout.fnmatch_lines(["*@pytest.mark.distributed(world_size=...) expects*'many'*"])
    assert result.ret != 0


def test_skip_and_xfail_inside_ranks(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_skips():
            pytest.skip("no GPU feature here")

        @pytest.mark.distributed
        def test_imperative_xfail():
            pytest.xfail("known gap")

        @pytest.mark.distributed
        @pytest.mark.xfail(reason="rank 1 is wrong", strict=True)
        def test_marked_xfail(rank):
            assert rank == 0

        @pytest.mark.distributed
        @pytest.mark.xfail(raises=ZeroDivisionError, strict=True)
        def test_xfail_raises(rank):
            1 / 0

        @pytest.mark.distributed
        @pytest.mark.xfail(raises=ZeroDivisionError, strict=True)
        def test_xfail_other_error_fails(rank):
            raise KeyError(rank)
        """
    )
    result = run(pytester, "--world-size", "2", "-rsx")
    result.assert_outcomes(skipped=1, xfailed=3, failed=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skip_and_xfail_inside_ranks.py:3: no GPU*"])


def test_a_hang_is_reported_after_the_timeout_with_stacks(pytester):
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.distributed
        def test_hangs(rank):
            if rank == 0:
                dist.all_reduce(torch.ones(1))

        @pytest.mark.distributed
        def test_next_one_is_fine(rank, world_size):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world_size
        """
    )
    result = run(pytester, "--world-size", "2", "--ddp-timeout", "2")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*rank 0 did not finish within the 2 s timeout; killed",
            "*where it waits (most recent call last):",
            '*File "*test_a_hang_is_reported_after_the_timeout_with_stacks.py", line 6, '
            "in test_hangs",
            "*dist.all_reduce(torch.ones(1))",
            "*in all_reduce",
            "*rerun with --ddp-debug*",
        ]
    )


def test_marker_timeout_overrides_the_option(pytester):
    pytester.makepyfile(
        """
        import time, pytest

        @pytest.mark.distributed(timeout=1)
        def test_slow():
            time.sleep(30)
        """
    )
    result = run(pytester, "--world-size", "2", "--ddp-timeout", "100")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*did not finish within the 1 s timeout*"])


def test_ddp_debug_names_the_mismatched_collective(pytester):
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.distributed
        def test_mismatch(rank):
            dist.all_reduce(torch.ones(4 if rank == 0 else 8))

        @pytest.mark.distributed
        def test_debug_env():
            import os
            assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
        """
    )
    plain = run(pytester, "--world-size", "2")
    plain.assert_outcomes(failed=2)
    plain.stdout.fnmatch_lines(["*killed by SIGABRT*", "*rerun with --ddp-debug*"])
    debug = run(pytester, "--world-size", "2", "--ddp-debug")
    debug.assert_outcomes(failed=1, passed=1)
    debug.stdout.fnmatch_lines(["*Detected mismatch between collectives*Tensor shapes*"])


def test_unpicklable_fixture_is_a_clear_error(pytester):
    pytester.makepyfile(
        """
        import threading, pytest

        @pytest.fixture
        def lock():
            return threading.Lock()

        @pytest.mark.distributed
        def test_lock(lock):
            pass
        """
    )
    result = run(pytester, "--world-size", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "fixture 'lock' (lock) of test_lock cannot be sent to the ranks: TypeError*",
            "Fixture values are resolved once in the controller*",
        ]
    )


def test_destroy_process_group_in_a_test_is_harmless(pytester):
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.distributed
        def test_cleans_up_like_a_script():
            dist.barrier()
            dist.destroy_process_group()

        @pytest.mark.distributed
        def test_after(world_size):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world_size
        """
    )
    run(pytester, "--world-size", "2").assert_outcomes(passed=2)


def test_given_with_the_world_fixture_has_no_health_check_complaint(pytester):
    pytester.makepyfile(
        """
        import torch, torch.distributed as dist
        from hypothesis import given, settings, strategies as st

        def total(v):
            t = torch.tensor([float(v)])
            dist.all_reduce(t)
            return t.item()

        @settings(max_examples=15)
        @given(v=st.integers(-5, 5))
        def test_sum(world, v):
            assert world.run(total, v) == [float(v * world.size)] * world.size
        """
    )
    run(pytester, "--world-size", "2").assert_outcomes(passed=1)


def test_rank_fixture_outside_distributed_tests_says_what_to_do(pytester):
    pytester.makepyfile("def test_x(rank): pass")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'rank' fixture exists only in @pytest.mark.distributed*"])


def test_nccl_without_gpus_skips_with_the_reason(pytester):

    if torch.cuda.device_count() >= 2:
        pytest.skip("GPUs are visible here")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_x():
            pass
        """
    )
    result = run(pytester, "--world-size", "2", "--ddp-backend", "nccl", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*nccl needs one GPU per rank*needs 2 GPUs*visible*"])


def test_capture_disabled_echoes_rank_output_with_prefixes(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_talk(rank):
            print("hello")
        """
    )
    result = run(pytester, "--world-size", "2", "-s")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    said = [line for line in result.stdout.lines if line.endswith("hello")]
    assert sorted(line.split("] ")[0].split("[")[-1] for line in said) == ["rank 0", "rank 1"]


def test_xdist_workers_each_get_their_own_worlds(pytester):
    pytester.makepyfile(
        """
        import os, pytest, torch, torch.distributed as dist

        @pytest.mark.parametrize("i", range(4))
        @pytest.mark.distributed
        def test_sum(i, rank, world_size):
            t = torch.tensor([float(i)])
            dist.all_reduce(t)
            assert t.item() == i * world_size
        """
    )
    result = pytester.runpytest_subprocess(*QUIET, "-n", "2", "--world-size", "2")
    result.assert_outcomes(passed=4)


FAILING_TESTS = 50


def test_failing_tests_reuse_one_fork_server_and_processes_stay_flat(pytester):
    # Every failure relaunches the world, each time under another PYTEST_CURRENT_TEST: the
    # relaunch must fork from the session's one fork server, not start (and keep) a new one.
    pytester.makeconftest(
        """
        import os

        def _children():
            parents = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    if fields[0] != "Z":
                        parents[int(entry)] = int(fields[1])
            direct = [p for p, parent in parents.items() if parent == os.getpid()]
            below, frontier = [], list(direct)
            while frontier:
                pid = frontier.pop()
                below.append(pid)
                frontier += [p for p, parent in parents.items() if parent == pid]
            return len(direct), len(below)

        def pytest_runtest_logfinish(nodeid):
            with open("counts.txt", "a") as f:
                f.write("%d %d\\n" % _children())
        """
    )
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.parametrize("i", range({FAILING_TESTS}))
        @pytest.mark.distributed
        def test_fails(i, rank):
            if rank == 1:
                raise ValueError(i)
        """
    )
    result = pytester.runpytest_subprocess(*QUIET, "--world-size", "2", "-q")
    result.assert_outcomes(failed=FAILING_TESTS)
    counts = [tuple(map(int, line.split())) for line in (pytester.path / "counts.txt").open()]
    assert len(counts) == FAILING_TESTS
    children = [c for c, _ in counts]
    processes = [d for _, d in counts]
    # The controller's one child is the fork server; below it, at most the world's 2 ranks and
    # its helper process.
    assert max(children) == 1, f"the controller's children grew: {children}"
    assert max(processes) <= 4, f"processes under the controller grew: {processes}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupting_pytest_leaves_no_rank_behind(pytester, sig):
    pytester.makepyfile(
        """
        import os, time, pytest

        @pytest.mark.distributed
        def test_long(rank):
            open(f"started{rank}", "w").close()
            time.sleep(120)
        """
    )
    log = pytester.path / "pytest.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *QUIET, "--world-size", "2", "-q"],
            cwd=pytester.path,
            stdout=out,
            stderr=subprocess.STDOUT,
            # If it ever fails to exit, SIGABRT below makes it print where every thread is.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            preexec_fn=default_sigint,
        )
    try:
        started = [pytester.path / f"started{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(p.exists() for p in started), "the test body never ran:\n" + log.read_text()
        processes = descendants(proc.pid)
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)
            proc.wait(timeout=30)
            pytest.fail(f"pytest did not exit within 60 s of {sig.name}:\n{log.read_text()}")
        assert wait_gone(processes, timeout=10) == [], log.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_a_failing_property_shows_the_shrunk_scenario_and_the_divergence(pytester):
    pytester.makepyfile(
        """
        from hypothesis import given, settings, strategies as st
        from ddp_verify.methods import manual_allreduce
        from ddp_verify.strategies import scenarios

        @settings(max_examples=30, deadline=None, database=None)
        @given(data=st.data())
        def test_world_average(world, data):
            scenario = data.draw(scenarios(world_size=world.size))
            world.assert_equivalent(manual_allreduce(weighting="world"), scenario)
        """
    )
    result = run(pytester, "--world-size", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*manual_allreduce(weighting='world') is not equivalent to single-process full-batch*",
            "*First divergence: step 0 of 1, *",
            "*Mismatched elements: *",
            "*Greatest absolute difference: *",
            "*Reproduce with: Scenario(world_size=2, schedule=(((?,), (?,)),), "
            "model=ModelSpec(in_features=1))",
            "*Draw 1: Scenario(world_size=2, schedule=(((?,), (?,)),), "
            "model=ModelSpec(in_features=1))",
        ]
    )
    assert "rank 0: 1  rank 1: 2" in result.stdout.str() or "rank 0: 2  rank 1: 1" in (
        result.stdout.str()
    )


def test_device_options_ini_and_env_and_what_ranks_receive(pytester, monkeypatch):
    # --ddp-device, then DDP_VERIFY_DEVICE, then ini ddp_device; the header says where the ranks
    # train and the ranks train there (here on the CPU: tests/world/test_cuda.py has GPUs).
    pytester.makeini("[pytest]\nddp_device = cpu\nddp_start_timeout = 45\n")
    pytester.makepyfile(
        """
        import pytest, torch
        from ddp_verify.world import rank_device

        @pytest.mark.distributed
        def test_where(rank):
            assert rank_device() == torch.device("cpu")
            assert not torch.backends.cudnn.allow_tf32

        def test_world(world):
            assert (world.device, world.start_timeout) == ("cpu", 45.0)
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["ddp_verify: world size 2, backend gloo, device cpu, timeout*"])
    monkeypatch.setenv("DDP_VERIFY_DEVICE", "gpu")
    bad = run(pytester)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*DDP_VERIFY_DEVICE expects one of cpu, cuda, got 'gpu'*"])
    nccl_on_cpu = run(pytester, "--ddp-backend", "nccl", "--ddp-device", "cpu")
    assert nccl_on_cpu.ret == pytest.ExitCode.USAGE_ERROR
    nccl_on_cpu.stderr.fnmatch_lines(["*nccl reduces CUDA tensors only*"])


def test_cuda_without_a_gpu_skips_distributed_tests_with_the_reason(pytester):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed
        def test_on_gpus():
            raise AssertionError("never runs without a GPU")

        def test_plain():
            pass
        """
    )
    result = run(pytester, "--ddp-device", "cuda", "--ddp-allow-tf32", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "ddp_verify: world size 2, backend gloo, device cuda (no GPU visible: distributed "
            "tests skip), timeout*",
            "*device 'cuda' asked for, but no GPU is visible here*",
        ]
    )


def test_check_in_a_test_runs_on_the_sessions_world_unless_told_otherwise(pytester):
    pytester.makepyfile(
        """
        import ddp_verify
        from ddp_verify.frontends import session
        from fixtures.grad_sync import sample_weighted

        def test_session_world(world):
            verdict = ddp_verify.check(sample_weighted, kind="grad-sync", max_examples=3)
            assert verdict.world_size == 3
            # The session's own world, the one the fixture gives: no second world started.
            assert session.current().get() is world
            assert verdict.report.splitlines()[-1] == (
                "World: the pytest session's, 3 ranks (--world-size 3); "
                "check(world_size=N) runs on a world of its own"
            )

        def test_a_world_size_of_its_own():
            verdict = ddp_verify.check(
                sample_weighted, kind="grad-sync", max_examples=3, world_size=2
            )
            assert verdict.world_size == 2
            assert "World:" not in verdict.report
        """
    )
    pytester.syspathinsert(str(Path(__file__).resolve().parents[2]))
    result = run(pytester, "--world-size", "3", "-n", "0")
    result.assert_outcomes(passed=2)


def test_a_failing_check_is_shown_under_its_public_name_with_its_cause_in_the_summary(
    pytester, monkeypatch
):
    # The short summary once read "ddp_verify.usercode.verdict.NotEquivalent: ..." cut at the
    # terminal's width, before the kind, the function or a cause. (A wide terminal: pytest
    # cuts the line to its width, or not at all under CI.)
    monkeypatch.setenv("COLUMNS", "400")
    pytester.makepyfile(
        test_sync="""
        import ddp_verify
        from fixtures.grad_sync import average_gradients

        def test_sync():
            ddp_verify.check(average_gradients, kind="grad-sync", max_examples=25, seed=0)
        """
    )
    pytester.syspathinsert(str(Path(__file__).resolve().parents[2]))
    result = run(pytester, "--world-size", "2", "-n", "0", "-rf")
    result.assert_outcomes(failed=1)
    summary = [line for line in result.outlines if line.startswith("FAILED ")]
    assert len(summary) == 1, result.outlines
    assert summary[0].startswith(
        "FAILED test_sync.py::test_sync - ddp_verify.NotEquivalent: grad-sync "
        "average_gradients is not equivalent: gradients averaged over ranks by the world size"
    ), summary[0]
    # The report itself names the exception the user imports, and nothing internal.
    result.stdout.fnmatch_lines(["E   *ddp_verify.NotEquivalent: *is not equivalent*"])
    assert "ddp_verify.usercode" not in result.stdout.str()
