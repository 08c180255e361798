"""A DeviceMesh made from a tensor of the ranks in another order than their own,
``DeviceMesh("cpu", torch.tensor([1, 0]))`` (its documentation: the tensor's entries are the
global ranks, laid out as the devices are). ``get_coordinate()`` puts rank 1 at place 0 and
rank 0 at place 1, but ``distribute_tensor(..., [Shard(0)])`` gives rank 0 shard 0 and rank 1
shard 1 (the group's ranks, sorted), and a DTensor assembled with ``from_local`` from the
shard of each rank's coordinate comes back whole out of order: [2, 3, 0, 1] for
``arange(4)``.

    python findings/device_mesh_permuted_order.py   # out of order (torch 2.13.0, gloo, CPU)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_device_mesh.py).
"""

import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = DeviceMesh("cpu", torch.tensor([1, 0]))
    full = torch.arange(4.0)
    (place,) = mesh.get_coordinate()
    held = distribute_tensor(full, mesh, [Shard(0)]).to_local().tolist()
    whole = DTensor.from_local(full.chunk(2)[place], mesh, [Shard(0)]).full_tensor().tolist()
    time.sleep(rank)  # one rank's lines after the other's
    print(f"rank {rank}: coordinate {place}, distribute_tensor's shard {held} "
          f"(shard {place} is {full.chunk(2)[place].tolist()}); from_local by coordinate, "
          f"whole: {whole}", flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
