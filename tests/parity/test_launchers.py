"""Launchers besides torchrun (issue 63): ``--launcher accelerate`` (accelerate launch),
``--launcher fabric`` (fabric run), ``--launcher srun``, each followed by options of its own,
start every layout as that launcher starts a job; a launcher that is not installed is a usage
error naming how to get it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_verify.parity.launchers import Launcher, parse_launcher
from ddp_verify.parity.layouts import Layout, LayoutError
from ddp_verify.parity.recording import Recording
from ddp_verify.parity.run import run_parity
from ddp_verify.world.ports import free_port
from tests.frontends.in_process import ddp_verify_here

SCRIPTS = Path(__file__).resolve().parents[2] / "fixtures" / "scripts"
ACCELERATE = ["python", str(SCRIPTS / "accelerate_loop.py"), "--grad-accum", "{grad_accum}",
              "--batch-size", "{micro_batch}"]  # fmt: skip
FABRIC_CLI = ["python", str(SCRIPTS / "fabric_loop.py"), "--configured-by", "cli",
              "--grad-accum", "{grad_accum}", "--batch-size", "{micro_batch}"]  # fmt: skip


def _group_sizes(directory: Path) -> list[int | None]:
    return [rank["meta"]["group_size"] for rank in Recording.load(directory).ranks]


def test_accelerate_launch_starts_each_layout(tmp_path):
    pytest.importorskip("accelerate", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(
        ACCELERATE,
        layouts=[Layout(2, 2)],
        steps=2,
        global_batch=16,
        launcher="accelerate",
        keep=tmp_path,
    )
    assert result.exit_code == 0, result.report
    # Started by accelerate launch (its torchrun path at 2 processes, the script plainly at
    # one), the recorder in every rank.
    assert _group_sizes(tmp_path / "2x2") == [2, 2]
    assert _group_sizes(tmp_path / "1x1") == [None]
    # accelerate launch's own flags, and its torchrun path only where there are ranks to join.
    (two,), _ = parse_launcher("accelerate").commands(Layout(2, 2), 1, port=1, run_id="r")
    (one,), _ = parse_launcher("accelerate").commands(Layout(1, 4), 1, port=1, run_id="r")
    assert two[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in two
    assert "--multi_gpu" not in one and one[-2:] == ["-m", "ddp_verify.parity.boot"]


def test_accelerate_launch_still_finds_a_missing_division(tmp_path):
    pytest.importorskip("accelerate", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(
        [*ACCELERATE, "--variant", "plain-backward"],
        layouts=[Layout(1, 2)],
        steps=2,
        global_batch=8,
        launcher="accelerate",
    )
    assert result.exit_code == 1, result.report
    assert result.verdict.causes[0].reading == "scale:A", result.report


def test_fabric_run_starts_a_script_the_cli_configures(tmp_path):
    pytest.importorskip("lightning", reason="the frameworks extra: pip install -e '.[frameworks]'")
    # fabric run's own flag after the name: the reference gets the DDP strategy too, so its
    # loader gets the same DistributedSampler as the layouts'.
    cli = ddp_verify_here("parity", "--launcher", "fabric --strategy ddp", "--layouts", "2x2",
                          "--global-batch", "16", "--steps", "2", "--json", "--keep",
                          str(tmp_path), "--", *FABRIC_CLI, cwd=tmp_path)  # fmt: skip
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["verdict"] == "equivalent"
    assert _group_sizes(tmp_path / "2x2") == [2, 2]


@pytest.mark.slow
def test_a_script_for_fabric_run_under_plain_torchrun_never_formed_a_world():
    pytest.importorskip("lightning", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(FABRIC_CLI, layouts=[Layout(2, 1)], steps=2, global_batch=16)
    assert result.exit_code == 1, result.report
    assert result.verdict.causes[0].pattern == "launch:no-group", result.report


def test_srun_gives_every_task_the_layout_and_the_boot_maps_slurms_variables(tmp_path):
    # What --launcher srun starts: one srun for the whole layout, one task a rank.
    launcher = parse_launcher("torchrun")
    assert launcher.local
    srun = Launcher("srun", ("--partition", "debug"))
    (argv,), env = srun.commands(Layout(4, 1), 2, port=12345, run_id="r")
    assert argv[:9] == ["srun", "--nodes", "2", "--ntasks", "4", "--ntasks-per-node", "2",
                        "--kill-on-bad-exit=1", "--partition"]  # fmt: skip
    assert argv[-3:] == [sys.executable, "-m", "ddp_verify.parity.boot"]
    assert env == {"MASTER_PORT": "12345"} and not srun.local
    # Each task as srun starts it (Slurm's variables, none of torchrun's): the boot gives the
    # script torchrun's, and the two tasks form one real process group.
    script = SCRIPTS / "plain_ddp.py"
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    base.update(
        SLURM_NTASKS="2", SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="127.0.0.1", MASTER_PORT=str(free_port()), DDP_VERIFY_STEPS="1",
        DDP_VERIFY_RECORD=str(tmp_path), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
    )  # fmt: skip
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "ddp_verify.parity.boot", str(script), "--batch-size", "4"],
            env={**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
    ]
    for task in tasks:
        out, _ = task.communicate(timeout=120)
        assert task.returncode == 0, out.decode(errors="replace")
    assert _group_sizes(tmp_path) == [2, 2]


@pytest.mark.skipif(shutil.which("srun") is None, reason="no Slurm here: srun is not on PATH")
def test_srun_starts_each_layout_inside_an_allocation(tmp_path):
    command = ["python", str(SCRIPTS / "plain_ddp.py"), "--grad-accum", "{grad_accum}",
               "--batch-size", "{micro_batch}"]  # fmt: skip
    result = run_parity(
        command, layouts=[Layout(2, 1)], steps=2, global_batch=16, launcher="srun", keep=tmp_path
    )
    assert result.exit_code == 0, result.report
    assert _group_sizes(tmp_path / "2x1") == [2, 2]


@pytest.mark.skipif(shutil.which("srun") is not None, reason="srun is on PATH here")
def test_a_launcher_that_is_not_here_is_a_usage_error_naming_how_to_get_it(tmp_path):
    cli = ddp_verify_here("parity", "--launcher", "srun", "--layouts", "2x1", "--",
                          "python", str(SCRIPTS / "plain_ddp.py"), cwd=tmp_path)  # fmt: skip
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "--launcher srun: srun is not installed here" in cli.stderr
    assert "Slurm allocation" in cli.stderr
    with pytest.raises(LayoutError, match="--launcher is empty"):
        parse_launcher("  ")
