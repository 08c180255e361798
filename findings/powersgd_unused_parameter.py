"""powerSGD_hook + DDP(find_unused_parameters=True) + a parameter forward never uses:
the ranks call collectives of different sizes and gloo aborts.

    python findings/powersgd_unused_parameter.py          # aborts (torch 2.13.0, gloo, CPU)
    python findings/powersgd_unused_parameter.py --used   # the same without the unused layer

Found by ``pytest --pyargs ddp_verify.conformance`` (test_comm_hooks.py).
"""

import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powersgd
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


class Model(torch.nn.Module):
    def __init__(self, with_unused: bool) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        if with_unused:
            self.unused = torch.nn.Linear(4, 2)  # never called in forward
        self.b = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def run(rank: int, port: int, with_unused: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Model(with_unused), find_unused_parameters=with_unused)
    state = powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=16,
        start_powerSGD_iter=0,
        min_compression_rate=0,
        use_error_feedback=False,
        warm_start=False,
    )
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    for step in range(2):
        torch.manual_seed(rank + 10 * step)
        ddp(torch.randn(2, 3)).sum().backward()
    if rank == 0:
        print("finished without error")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port, "--used" not in sys.argv), nprocs=2)
