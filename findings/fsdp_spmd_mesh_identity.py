"""fully_shard(dp_mesh_dims=...) refuses a model distributed on a DeviceMesh equal to one made
earlier in the process: DTensor caches what its operators return by value, and a DeviceMesh
compares equal to another of the same ranks and names, so the parameters of a model given to
``distribute_module(model, mesh)`` carry the *earlier*, equal mesh object; fully_shard's SPMD
path checks the mesh by identity and raises "Expected param's DTensor mesh to be the same mesh
passed to fully_shard, but got different mesh objects". A process that builds its mesh twice
(a test per model, a rebuilt model after a restart) cannot use dp_mesh_dims with the new one.

    python findings/fsdp_spmd_mesh_identity.py   # ValueError on the second mesh (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_fsdp.py, before its meshes were kept
per process).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import DataParallelMeshDims, fully_shard
from torch.distributed.tensor import distribute_module


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    first = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    distribute_module(torch.nn.Linear(2, 2), first)  # any earlier DTensor model on it
    second = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    model = torch.nn.Linear(2, 2)
    distribute_module(model, second)
    carried = [p.device_mesh is second for p in model.parameters()]
    print(f"rank {rank}: meshes equal {first == second}; parameters on the second: {carried}")
    try:
        fully_shard(model, mesh=second, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
        print(f"rank {rank}: fully_shard accepted the model")
    except ValueError as exc:
        print(f"rank {rank}: ValueError: {exc}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
