"""ZeroRedundancyOptimizer overlapped with DDP (``overlap_with_ddp=True`` and
``hook_with_zero_step(..., shard_buckets=True)``) asserts "All indices are disallowed" when it
assigns DDP's buckets to ranks: it cuts a bucket *before* the parameter that reaches its size
threshold (the model's size over the world size), so a bucket of about that size becomes more
pieces than there are ranks, each rank may take one piece of a bucket, and the last piece has
none left. One rank and a ``Linear`` (weight and bias in one bucket) is enough; so is, by the
same arithmetic, two ranks and one bucket of three equal parameters.

    python findings/zero_overlap_shard_buckets.py   # needs CUDA (the hooks refuse gloo)

On an H200 with torch 2.11.0+cu130: "AssertionError: All indices are disallowed" in the
third iteration's backward. Found by ``pytest --pyargs ddp_verify.conformance --ddp-backend
nccl --world-size 1`` (test_zero.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def run(rank: int, port: int) -> None:
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=1)
    torch.cuda.set_device(0)
    model = torch.nn.Linear(2, 2).cuda()
    ddp = DistributedDataParallel(model, device_ids=[0])
    zero = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, lr=0.5
    )
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero, shard_buckets=True))
    for iteration in range(3):
        zero.zero_grad()
        try:
            ddp(torch.ones(1, 2, device="cuda")).sum().backward()
            print(f"iteration {iteration}: backward ran")
        except AssertionError as exc:
            print(f"iteration {iteration}: AssertionError: {exc}")
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=1)
