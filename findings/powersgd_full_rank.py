"""powerSGD_hook at full rank distorts the gradient of a binary classifier's head.

The head's weight gradient under 2-class cross-entropy has rank 1 (each sample's output
gradient is (a, -a)). With matrix_approximation_rank >= 2 the hook orthogonalises two columns
by Gram-Schmidt (used for ranks <= 2); the second column's residual is rounding noise, which is
normalised into a unit vector that is not orthogonal to the first, so the projection counts
part of the gradient's direction twice: here each row is scaled by ~0.92 or ~1.10; in the
scenario the suite shrank to, by 2.0. No epsilon fixes it (0 and 1e-30: x2.0, 1e-8: x1.9).

    python findings/powersgd_full_rank.py   # torch 2.13.0, gloo, CPU

Found by ``pytest --pyargs ddp_verify.conformance`` (test_comm_hooks.py), shrunk to: world
size 2, one sample per rank, mlp 1->[2]->2, cross-entropy.
"""

import socket

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powersgd
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def gradient(rank: int, hook: bool) -> torch.Tensor:
    torch.manual_seed(0)
    head = torch.nn.Linear(2, 2).double()
    ddp = DistributedDataParallel(head)
    if hook:
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=2,  # = both sides of the 2x2 weight: full rank
            start_powerSGD_iter=0,
            min_compression_rate=0,
            use_error_feedback=False,
            warm_start=False,
        )
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(1, 2, generator=generator, dtype=torch.float64)
    y = torch.tensor([rank % 2])
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    return head.weight.grad.clone()


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    plain, compressed = gradient(rank, hook=False), gradient(rank, hook=True)
    if rank == 0:
        print("allreduce  :", plain.flatten().tolist())
        print("powerSGD r2:", compressed.flatten().tolist())
        print("ratio      :", (compressed / plain).flatten().tolist())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
