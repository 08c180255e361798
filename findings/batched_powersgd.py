"""batched_powerSGD_hook fails its first compressed step with a bare AssertionError: it
passes a 2-D matrix to powerSGD_hook._orthogonalize, which asserts a batch of 3-D matrices.

    python findings/batched_powersgd.py    # AssertionError (torch 2.13.0, gloo, CPU)

With the default start_powerSGD_iter=1_000 a run fails at its 1,000th iteration.
Found by ``pytest --pyargs ddp_verify.conformance`` (test_comm_hooks.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powersgd
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(torch.nn.Linear(8, 8))
    state = powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=2,  # the default is 1_000
        use_error_feedback=True,
        warm_start=True,
    )
    ddp.register_comm_hook(state, powersgd.batched_powerSGD_hook)
    for step in range(3):
        torch.manual_seed(rank + 10 * step)
        ddp(torch.randn(4, 8)).sum().backward()
        if rank == 0:
            print(f"step {step} done")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
