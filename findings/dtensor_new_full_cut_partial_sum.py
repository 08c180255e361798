"""``new_full`` and ``new_ones`` on a DTensor cut on one mesh dimension and a partial sum on
another (``(Shard(0), Partial())`` on a 1 x 2 mesh) lay the new tensor out as the input, the
partial sum included: each rank holds the value given, so the new tensor stands for their
sum, twice the value on two ranks. Made from a partial sum alone, the new tensor is
replicated and holds the value; ``new_zeros`` hides it (a sum of zeros).

    python findings/dtensor_new_full_cut_partial_sum.py   # 5.0 and 2.0 (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_dtensor.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (1, 2))
    # The whole tensor is ones: rank 0 holds them, rank 1 zeros, summed over mesh dimension 1.
    local = torch.ones(2, 2) if rank == 0 else torch.zeros(2, 2)
    a = DTensor.from_local(local, mesh, [Shard(0), Partial()], shape=(2, 2), stride=(2, 1))
    full = a.new_full(a.shape, 2.5)
    ones = a.new_ones(a.shape)
    print(f"rank {rank}: new_full(2.5) laid out as {full.placements}: "
          f"{full.full_tensor()[0, 0].item()}", flush=True)  # fmt: skip
    print(f"rank {rank}: new_ones laid out as {ones.placements}: "
          f"{ones.full_tensor()[0, 0].item()}", flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
