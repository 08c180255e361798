"""HierarchicalModelAverager over a process_group smaller than the world waits forever when a
level below it has more than one rank: the averager makes each level's groups with
``new_subgroups(group_size, group=process_group)``, which calls ``new_group`` (collective over
the whole world) for the subgroups of *its* process_group only, so the ranks of different
process_groups create different groups in the same order and most of them never complete
(here six of the eight ranks wait forever). Eight
ranks, process_groups of four, pairs below them (torch 2.13.0):

    python findings/hierarchical_averager_subgroup_hang.py   # "still waiting after 60 s"

With levels of one rank below the process_group (four ranks, process_groups of two) it
averages as documented. Found by ``pytest --pyargs ddp_verify.conformance``
(test_model_averaging.py) while widening its process_group property.
"""

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager,
)

WORLD, GROUP, PAIRS, WAIT_S = 8, 4, 2, 60


def run(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    group, _ = dist.new_subgroups(group_size=GROUP)
    HierarchicalModelAverager({1: PAIRS, 2: GROUP}, process_group=group)
    print(f"rank {rank}: averager built")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    context = mp.start_processes(run, args=(free_port,), nprocs=WORLD, join=False)
    try:
        finished = context.join(timeout=WAIT_S)
    except Exception as exc:  # a rank that raised
        print(f"a rank failed: {exc}")
        sys.exit(1)
    if not finished:
        print(f"still waiting after {WAIT_S} s: the averager's subgroups never formed")
        for process in context.processes:
            process.kill()
        sys.exit(1)
