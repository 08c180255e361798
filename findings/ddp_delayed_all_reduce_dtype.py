"""DDP with ``delay_all_reduce_named_params`` (and ``param_to_hook_all_reduce``) fails on a
model whose parameters are not in the default dtype: the buffer the delayed gradients live in
is allocated with ``torch.zeros(n, device=...)``, in float32, and assigning its views as a
float64 (or bfloat16) parameter's gradient raises.

    python findings/ddp_delayed_all_reduce_dtype.py   # RuntimeError (torch 2.13.0, gloo, CPU)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_ddp_options.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for dtype in (torch.float32, torch.float64):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).to(dtype)
        named = list(model.named_parameters())
        ddp = DistributedDataParallel(
            model, param_to_hook_all_reduce=named[0][1], delay_all_reduce_named_params=named[1:]
        )
        for _ in range(2):
            ddp(torch.ones(2, 3, dtype=dtype)).sum().backward()
        if rank == 0:
            print(f"{dtype}: trained")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
