"""DefaultSavePlanner(enable_plan_caching=True) keeps its cached plans in class-level dicts
keyed by the planner's class name: a save over a subgroup (here each rank's own group of one)
caches a plan list of that group's size, and the next caching save over the world reuses it,
scattering one plan to two ranks. gloo refuses ("Incorrect input list size 1. Input list size
should be 2"); the other rank is left in the collective.

    python findings/dcp_plan_cache_across_groups.py   # RuntimeError on rank 0 (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_checkpoint.py). A cache key per
planner was proposed in https://github.com/pytorch/pytorch/pull/158767 (not merged).
"""

import socket
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import DefaultSavePlanner


def run(rank: int, port: int, directory: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    own = [dist.new_group([0]), dist.new_group([1])][rank]
    dcp.save({"a": torch.ones(2)}, checkpoint_id=f"{directory}/rank{rank}", process_group=own,
             planner=DefaultSavePlanner(enable_plan_caching=True))  # fmt: skip
    print(f"rank {rank}: saved over its own group")
    dcp.save({"b": torch.ones(3)}, checkpoint_id=f"{directory}/world",
             planner=DefaultSavePlanner(enable_plan_caching=True))  # fmt: skip
    print(f"rank {rank}: saved over the world")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port, tempfile.mkdtemp()), nprocs=2)
