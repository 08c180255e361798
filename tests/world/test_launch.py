"""Reading a launched job's environment: torchrun's variables, srun's, and what does not add
up. The variables are the ones those launchers set; nothing is launched here."""

from __future__ import annotations

import pytest

from ddp_verify.world.launch import Launched, LaunchError, detect, first_host

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29511",
    "TORCHELASTIC_RUN_ID": "none",
}
# What srun -N 2 -n 4 sets on the task with global rank 2 (second node, first task there).
SRUN = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_JOB_ID": "48213",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}


def test_nothing_outside_a_launcher():
    assert detect({"PATH": "/usr/bin", "SLURM_JOB_ID": "1"}) is None


def test_torchrun_says_where_this_process_stands():
    assert detect(TORCHRUN) == Launched("torchrun", 3, 4, 1, "127.0.0.1", 29511)
    assert detect(TORCHRUN).init_method == "tcp://127.0.0.1:29511"


def test_srun_gives_the_first_host_and_a_port_every_task_agrees_on():
    launched = detect(SRUN)
    assert (launched.launcher, launched.rank, launched.world_size, launched.local_rank) == (
        "slurm",
        2,
        4,
        0,
    )
    assert launched.master_addr == "gpu07"
    assert launched.master_port == detect({**SRUN, "SLURM_PROCID": "0"}).master_port
    assert detect({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}).init_method == (
        "tcp://head:1234"
    )


def test_torchrun_wins_when_srun_starts_torchrun():
    # srun launching one torchrun per node: the processes torchrun starts are the ranks.
    assert detect({**SRUN, **TORCHRUN}).launcher == "torchrun"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node001", "node001"),
        ("gpu[07-09,12]", "gpu07"),
        ("gpu[3,5],cpu[1-2]", "gpu3"),
        ("rack1-n[08-10]-ib", "rack1-n08-ib"),
        ("a,b", "a"),
    ],
)
def test_first_host_of_a_node_list(nodelist, first):
    assert first_host(nodelist) == first


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({**TORCHRUN, "RANK": "4"}, "rank 4 of a world of 4"),
        ({**TORCHRUN, "WORLD_SIZE": "four"}, "WORLD_SIZE='four'"),
        ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "has no MASTER_ADDR"),
        ({k: v for k, v in SRUN.items() if k != "SLURM_JOB_NODELIST"}, "no SLURM_JOB_NODELIST"),
        ({**SRUN, "SLURM_JOB_NODELIST": "gpu[07"}, "cannot read the Slurm node list"),
    ],
    ids=["rank-outside", "not-a-number", "no-address", "no-nodelist", "bad-nodelist"],
)
def test_an_environment_that_does_not_add_up_says_what(environ, words):
    with pytest.raises(LaunchError, match=words.replace("[", r"\[")):
        detect(environ)
