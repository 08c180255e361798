"""torch.distributed.nn.functional.all_gather over a subgroup fails in its backward on gloo
on every rank of a subgroup that does not hold global rank 0: the gradient goes back through
_AlltoAll, whose gloo path scatters from ``src=i`` with ``i`` the group's rank, where
``dist.scatter`` takes a global rank (ValueError: Global rank 0 is not part of group).

    python findings/differentiable_all_gather_subgroup_gloo.py   # ValueError (torch 2.13.0)

The forward is right; with NCCL _AlltoAll calls all_to_all instead and the backward works.
Found by ``pytest --pyargs ddp_verify.conformance`` (test_differentiable_collectives.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.nn import functional


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    group, _ = dist.new_subgroups(group_size=2)  # ranks [0, 1] and [2, 3]
    x = torch.full((2,), float(rank), requires_grad=True)
    gathered = functional.all_gather(x, group=group)
    sum(t.sum() for t in gathered).backward()
    print(f"rank {rank}: gradient {x.grad.tolist()} (expected [2.0, 2.0])")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=4)
