"""SPMD mode through its front ends, on real launched jobs: ``torchrun -m pytest``, two torchrun
node agents joined by the c10d rendezvous on this machine, ``ddp-verify check`` under torchrun,
and the failure contract (a raising rank, a hung collective, a stuck and a dead rank, tests
collected differently, a world size that does not fit)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.spmd import (
    ROOT,
    by_hand,
    environment,
    json_document,
    ranks_left,
    torchrun,
    torchrun_nodes,
)

PYTEST = ["-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q"]

# Each rank writes its pid, so a test can check that none is left behind.
PID_CONFTEST = """
import os
from pathlib import Path

def pytest_configure(config):
    pids = Path(__file__).parent / "pids"
    pids.mkdir(exist_ok=True)
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    (pids / f"{rank}.pid").write_text(str(os.getpid()))
"""


def write(directory: Path, **files: str) -> Path:
    for name, text in files.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(text))
    (directory / "conftest.py").write_text(PID_CONFTEST)
    return directory


def reports(text: str) -> list[str]:
    """pytest's final summary lines (``3 passed in 2.1s``) in ``text``."""
    return re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*? in [\d.]+s.*)$", text, re.M)


@pytest.mark.slow
def test_examples_run_once_on_a_world_of_the_launched_size(tmp_path: Path) -> None:
    job = torchrun([*PYTEST, str(ROOT / "examples" / "test_seed_patterns.py")], cwd=tmp_path)
    assert job.returncode == 0, job.output
    # One report, rank 0's, for one world of 4 ranks (not one session per process).
    assert len(reports(job.stdout)) == 1, job.stdout
    assert reports(job.stdout)[0].startswith("5 passed"), job.stdout


def test_two_node_agents_form_one_world_and_rank_0_reports(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_nodes="""
        import torch.distributed as dist

        def test_one_world_across_agents(world):
            assert world.size == 4
            ranks = world.run(lambda: dist.get_rank())
            assert ranks == [0, 1, 2, 3]

        """,
    )
    # The examples' generated DDP check, across the two agents.
    examples = str(ROOT / "examples" / "test_ddp_equivalence.py")
    jobs = torchrun_nodes(
        [*PYTEST, "test_nodes.py", examples, "-k", "one_world or test_ddp_matches", "-rA", "-v"],
        cwd=tmp_path,
    )
    assert [j.returncode for j in jobs] == [0, 0], [j.output for j in jobs]
    summaries = [reports(j.stdout) for j in jobs]
    # Exactly one agent holds rank 0, and only its output has the report.
    assert sorted(len(s) for s in summaries) == [0, 1], summaries
    reporting = next(j for j, s in zip(jobs, summaries, strict=True) if s)
    assert "2 passed" in reports(reporting.stdout)[0]
    assert "rank 0 of 4 on 2 nodes" in reporting.stdout
    assert ranks_left(tmp_path / "pids") == []


@pytest.mark.parametrize(
    ("function", "verdict"),
    [
        ("summed_not_divided", "not-equivalent"),
        pytest.param("sample_weighted", "equivalent", marks=pytest.mark.slow),
    ],
)
def test_check_under_torchrun_gives_the_fork_modes_verdict(
    tmp_path: Path, function: str, verdict: str
) -> None:
    target = f"{ROOT / 'fixtures' / 'grad_sync.py'}:{function}"
    args = ["check", target, "--kind", "grad-sync", "--max-examples", "10", "--seed", "3"]
    launched = torchrun(["-m", "ddp_verify.frontends.cli", *args, "--json"], cwd=tmp_path)
    forked = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddp_verify.frontends.cli",
            *args,
            "--world-size",
            "4",
            "--json",
            "--launch",
            "fork",
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    spmd, fork = json_document(launched.stdout), json_document(forked.stdout)
    assert spmd["verdict"] == fork["verdict"] == verdict, (spmd["report"], fork["report"])
    assert spmd["world_size"] == 4
    assert launched.returncode == forked.returncode == (0 if verdict == "equivalent" else 1)
    # The same search: the same shrunk counterexample and cause.
    assert spmd["scenario"] == fork["scenario"]
    assert spmd["likely_cause"] == fork["likely_cause"]


def test_a_coupled_loss_under_torchrun_is_held_to_its_one_rank_world(tmp_path: Path) -> None:
    # The reference is the code on a one-rank world, which a rank of the job forks: the same
    # counterexample and cause as a forked world's.
    target = f"{ROOT / 'fixtures' / 'real_style' / 'open_clip_losses.py'}:clip_loss_default"
    args = ["check", target, "--kind", "coupled-loss", "--even-batches", "--max-examples", "5",
            "--seed", "0", "--json"]  # fmt: skip
    launched = torchrun(["-m", "ddp_verify.frontends.cli", *args], cwd=tmp_path, nproc=2)
    forked = subprocess.run(
        [sys.executable, "-m", "ddp_verify.frontends.cli", *args, "--world-size", "2",
         "--launch", "fork"],
        cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    spmd, fork = json_document(launched.stdout), json_document(forked.stdout)
    assert spmd["verdict"] == fork["verdict"] == "not-equivalent", spmd["report"]
    assert launched.returncode == forked.returncode == 1
    assert spmd["scenario"] == fork["scenario"]
    assert spmd["likely_causes"][0]["pattern"] == "coupled:local-gradient", spmd["report"]


def test_a_raising_rank_fails_the_test_on_every_rank_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        test_raise="""
        import pytest, torch, torch.distributed as dist
        from hypothesis import Phase, given, settings, strategies as st

        @pytest.mark.distributed
        def test_raise_mid_collective(rank):
            if rank == 3:
                raise ValueError("rank 3 gives up before the collective")
            dist.all_reduce(torch.ones(1))

        # No explain phase here (its traced reruns of world jobs took 7 of this test's 10 s);
        # the test below keeps hypothesis's default phases.
        @settings(max_examples=60, database=None, phases=[p for p in Phase if p != Phase.explain])
        @given(st.integers(0, 100))
        def test_one_rank_fails_some_examples(world, n):
            def job(n):
                assert not (dist.get_rank() == 2 and n > 40), f"rank 2 rejects {n}"
            world.run(job, n)

        @given(st.integers(0, 100))
        def test_local_failure_on_rank_1(n):
            assert not (dist.get_rank() == 1 and n > 60), f"rank 1 alone rejects {n}"

        def test_after_the_failures(world):
            # The group was formed anew: collectives work again.
            def total():
                t = torch.ones(1)
                dist.all_reduce(t)
                return t.item()
            assert world.run(total) == [4.0] * 4
        """,
    )
    job = torchrun([*PYTEST, "test_raise.py", "--ddp-log-dir", "logs"], cwd=tmp_path)
    assert job.returncode == 1, job.output
    (summary,) = reports(job.stdout)
    assert summary.startswith("3 failed, 1 passed"), summary
    out = job.stdout
    # The raising rank's traceback, the others named as consequences.
    assert "rank 3 raised ValueError: rank 3 gives up before the collective" in out
    # It names the test's file, line and source; the harness's frames are cut.
    assert 'test_raise.py", line 8, in test_raise_mid_collective' in out
    assert 'raise ValueError("rank 3 gives up before the collective")' in out
    assert "_run_test_on_rank" not in out and "in run_job" not in out
    assert "failed in a collective as a consequence" in out
    # hypothesis shrank in lockstep to the smallest failing example, the same on every rank.
    assert "rank 2 rejects 41" in out and "n=41," in out
    assert "rank 1 alone rejects 61" in out and "[ddp_verify] raised on rank 1 of 4" in out
    assert "n=61," in out
    assert "Hypothesis found 2 distinct failures" not in out
    # Other ranks stayed quiet, and logged their own session.
    assert len(reports(out)) == 1
    for rank in (1, 2, 3):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert reports(log)[0].startswith("3 failed, 1 passed"), log[-2000:]
    assert ranks_left(tmp_path / "pids") == []


# A rank the watchdog ends with its stack is test_a_stuck_rank_is_reported_with_its_stack_and_ended
# (in CI), and the watchdog's beats are test_spmd_parts': CI leaves this one.
@pytest.mark.slow
def test_a_hung_collective_ends_the_job_with_the_report(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_hang="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.distributed
        def test_mismatched_collective(rank):
            dist.all_reduce(torch.ones(1))
            if rank == 1:
                dist.all_reduce(torch.ones(1))  # the others never join this one

        def test_never_runs(world):
            world.run(lambda: None)
        """,
    )
    job = torchrun([*PYTEST, "test_hang.py", "--ddp-timeout", "5"], cwd=tmp_path)
    assert job.returncode == 1, job.output
    out = job.stdout
    assert "rank 1 raised RuntimeError" in out and "Timed out" in out
    assert "The process group cannot be trusted any more." in out
    assert "the launched world can no longer be trusted after this failure; the job ends" in out
    assert "1 failed in" in reports(out)[0]
    assert "test_never_runs" not in out
    assert ranks_left(tmp_path / "pids") == []


def test_a_stuck_rank_is_reported_with_its_stack_and_ended(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_stuck="""
        import time, torch.distributed as dist

        def test_stuck_rank(world):
            def job():
                if dist.get_rank() == 2:
                    while True:
                        time.sleep(0.05)  # stuck here
            world.run(job)

        def test_never_runs(world):
            world.run(lambda: None)
        """,
    )
    job = torchrun([*PYTEST, "test_stuck.py", "--ddp-timeout", "4"], cwd=tmp_path)
    assert job.returncode == 1, job.output
    out = job.stdout
    assert "rank 2 did not finish" in out
    # Its stack, from its watchdog: where it was stuck, from the test down, as a traceback.
    lines = out.splitlines()
    at = next(
        i for i, line in enumerate(lines) if "its main thread (most recent call last)" in line
    )
    assert [line.strip() for line in lines[at + 1 : at + 6]] == [
        f'E           File "{tmp_path / "test_stuck.py"}", line 9, in test_stuck_rank',
        "E             world.run(job)",
        f'E           File "{tmp_path / "test_stuck.py"}", line 8, in job',
        "E             time.sleep(0.05)  # stuck here",
        "E       Finished the job normally: ranks 0, 1, 3.",
    ]
    assert "test_never_runs" not in out
    assert ranks_left(tmp_path / "pids") == []


# The fork mode's --full-trace is test_plugin's (in CI), and the launcher's cut frames are
# test_a_raising_rank_fails_the_test_on_every_rank_and_the_session_goes_on: CI leaves this one.
@pytest.mark.slow
def test_full_trace_under_a_launcher_shows_the_harness_frames(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_full="""
        import pytest

        @pytest.mark.distributed
        def test_raise(rank):
            assert rank != 1, "rank 1 is out"
        """,
    )
    job = torchrun([*PYTEST, "test_full.py", "--full-trace"], cwd=tmp_path, nproc=2)
    assert job.returncode == 1, job.output
    assert "AssertionError: rank 1 is out" in job.stdout
    # The SPMD runner and the plugin's test runner, between the test and the assertion.
    for harness in ("in run_job", "in _run_test_on_rank", 'test_full.py", line 6, in test_raise'):
        assert harness in job.stdout, job.stdout
    assert ranks_left(tmp_path / "pids") == []


def test_a_dead_rank_ends_the_job_and_rank_0_says_what_was_running(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_death="""
        import os, time, torch.distributed as dist

        def test_a_rank_dies(world):
            def job():
                if dist.get_rank() == 3:
                    os._exit(7)
                time.sleep(2)
            world.run(job)
        """,
    )
    job = torchrun([*PYTEST, "test_death.py"], cwd=tmp_path)
    assert job.returncode != 0
    # torchrun ends the job at the death; rank 0 says where it was when that happened.
    assert "rank 0 was terminated by torchrun" in job.stdout, job.output
    assert "exitcode  : 7" in job.stderr
    assert ranks_left(tmp_path / "pids") == []


@pytest.mark.slow
def test_a_dead_rank_without_a_launcher_to_end_the_job_is_named(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_death="""
        import os, time, torch.distributed as dist

        def test_a_rank_dies(world):
            def job():
                if dist.get_rank() == 2:
                    os._exit(7)
            world.run(job)
        """,
    )
    jobs = by_hand([*PYTEST, "test_death.py", "--ddp-launch", "spmd"], cwd=tmp_path, size=3)
    assert [j.returncode for j in jobs] == [1, 1, 7], [j.output for j in jobs]
    assert "rank 2 stopped answering" in jobs[0].stdout, jobs[0].output
    assert ranks_left(tmp_path / "pids") == []


@pytest.mark.slow
def test_tests_collected_differently_on_some_rank_are_a_usage_error(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_collect="""
        import os, pytest

        @pytest.mark.parametrize("n", range(1 + (os.environ["RANK"] == "2")))
        def test_rank_dependent(n):
            pass
        """,
    )
    job = torchrun([*PYTEST, "test_collect.py"], cwd=tmp_path)
    # torchrun exits 1 when a rank fails; each rank's own exit code is in its report.
    assert job.returncode == 1 and "exitcode  : 4" in job.stderr, job.output
    assert "collected different tests" in job.stderr
    assert (
        "rank 2: 2 tests" in job.stderr and "only there: test_collect.py::test_rank" in job.stderr
    )


@pytest.mark.slow
def test_a_world_size_that_differs_from_the_launched_one_is_a_usage_error(
    tmp_path: Path,
) -> None:
    write(tmp_path, test_size="def test_x(world):\n    pass\n")
    job = torchrun([*PYTEST, "test_size.py", "--world-size", "3"], cwd=tmp_path, nproc=2)
    assert job.returncode == 1 and "exitcode  : 4" in job.stderr, job.output
    assert "asks for world size 3, but torchrun launched 2 processes" in job.stderr
    job = torchrun([*PYTEST, "test_size.py", "--world-size", "1,2", "-rs"], cwd=tmp_path, nproc=2)
    assert job.returncode == 0, job.output
    assert "1 passed, 1 skipped" in reports(job.stdout)[0]
    assert "this job was launched with 2 ranks, so a world of 1 cannot run in it" in job.stdout


def test_spmd_without_a_launcher_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--ddp-launch", "spmd", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*SPMD mode (launch mode spmd) needs a launcher's environment*"])


@pytest.mark.slow
def test_a_group_the_users_conftest_formed_is_used_and_junit_is_rank_0s(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_adopt="""
        import torch, torch.distributed as dist

        def same_group():
            import conftest
            return dist.group.WORLD is conftest.GROUP

        def test_the_users_group_is_the_worlds(world):
            assert world.run(same_group) == [True] * 4

        def test_collectives_on_it(world):
            def total():
                t = torch.ones(1)
                dist.all_reduce(t)
                return t.item()
            assert world.run(total) == [4.0] * 4
        """,
    )
    # The user's conftest forms the group at import, before the plugin looks for one.
    conftest = tmp_path / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        + "GROUP = dist.group.WORLD\n"
    )
    job = torchrun(
        [*PYTEST, "-v", "test_adopt.py", "--junitxml", "report.xml", "--ddp-log-dir", "logs"],
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.output
    assert "2 passed" in reports(job.stdout)[0]
    # One JUnit file, written by rank 0; the others' logs show none was written there.
    assert "generated xml file" in job.stdout
    assert 'tests="2"' in (tmp_path / "report.xml").read_text()
    for rank in (1, 2, 3):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "2 passed" in log and "generated xml file" not in log, log


@functools.cache
def _slurm_cluster() -> str | None:
    """Why a real ``srun`` cannot run here, or None when it can."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return (
            "no Slurm here (srun is not installed); Debian's slurm-wlm and "
            "tests/slurm/one_machine_cluster.sh give a one-machine cluster"
        )
    try:
        states = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=5
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        states = []
    if not any(s.rstrip("*") in ("idle", "mix") for s in states):
        return (
            "Slurm is installed but no node is up (tests/slurm/one_machine_cluster.sh starts one)"
        )
    return None


@pytest.mark.skipif(_slurm_cluster() is not None, reason=str(_slurm_cluster()))
def test_srun_runs_one_session_on_a_world_of_its_tasks(tmp_path: Path) -> None:
    write(
        tmp_path,
        test_srun="""
        import os, torch, torch.distributed as dist

        def test_tasks_are_the_ranks(world):
            assert world.size == 4
            assert world.run(lambda: int(os.environ["SLURM_PROCID"])) == [0, 1, 2, 3]

        def test_collective(world):
            def total():
                t = torch.ones(1)
                dist.all_reduce(t)
                return t.item()
            assert world.run(total) == [4.0] * 4
        """,
    )
    done = subprocess.run(
        [
            "srun",
            "-n",
            "4",
            "--overcommit",
            "--kill-on-bad-exit=1",
            "--time=5",
            sys.executable,
            *PYTEST,
            "-v",
            "test_srun.py",
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(reports(done.stdout)) == 1 and "2 passed" in reports(done.stdout)[0]
    assert "SPMD under slurm: this is rank 0 of 4" in done.stdout
    assert ranks_left(tmp_path / "pids") == []


def test_check_refuses_an_unknown_launch_mode_before_anything_starts() -> None:
    import ddp_verify

    with pytest.raises(ValueError, match="launch= expects one of auto, fork, spmd, got 'mpi'"):
        ddp_verify.check(lambda model: None, kind="grad-sync", launch="mpi")
