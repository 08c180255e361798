"""``full_tensor()`` of a ``fully_shard``-ed parameter with no elements (a dimension of size 0)
raises ``RuntimeError: Expected cond to be True, but got False`` when its rows divide evenly
among the ranks ((2, 0) or (4, 0) at two ranks), and gives the full shape otherwise ((1, 0),
(3, 0)); on a one-rank mesh it gives (0, 0) for any rows. FSDP2 narrows every empty shard to
no rows, (0, 0) on every rank, where an even sharding's spec expects (rows / ranks, 0);
``distribute_tensor`` of the same tensor gives the expected shards, and its ``full_tensor()``
works.

    python findings/fsdp_empty_parameter_full_tensor.py   # torch 2.13.0, gloo, 2 ranks

Found by ``pytest --pyargs ddp_verify.conformance`` (test_fsdp.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    for rows in (1, 2, 3, 4):
        model = torch.nn.Linear(1, 1)
        model.empty = torch.nn.Parameter(torch.zeros(rows, 0), requires_grad=False)
        fully_shard(model, mesh=mesh)
        local = tuple(model.empty.to_local().shape)
        try:
            full = tuple(model.empty.full_tensor().shape)
        except RuntimeError as exc:
            full = f"RuntimeError: {exc}"
        print(f"rank {rank}: ({rows}, 0) local shard {local}, full_tensor() {full}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
