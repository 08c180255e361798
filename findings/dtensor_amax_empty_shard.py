"""``amax`` over a DTensor dimension sharded so that a rank holds none of it (a one-row
tensor sharded by rows over two ranks) raises ``IndexError: amax(): Expected reduction dim 0
to have non-zero size`` on that rank, while the rank holding the row waits in the reduction
that follows; ``sum`` over the same layout works.

    python findings/dtensor_amax_empty_shard.py   # IndexError on rank 1 (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_dtensor.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    a = distribute_tensor(torch.tensor([[1.0, -2.0]]), mesh, [Shard(0)])
    print(f"rank {rank}: sum over rows {a.sum(0).full_tensor().tolist()}", flush=True)
    print(f"rank {rank}: amax over rows {a.amax(0).full_tensor().tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
