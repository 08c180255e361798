"""DDP's delayed all-reduce (``delay_all_reduce_named_params`` with
``param_to_hook_all_reduce``) runs on every backward, inside ``no_sync()`` too: a rank that
accumulates two micro-batches calls two all-reduces where a rank with one calls one, and the
ranks' collectives no longer match (gloo aborts with "op.preamble.length <= op.nbytes", or the
ranks wait until the time-out below).

    python findings/ddp_delayed_all_reduce_no_sync.py   # abort or time-out (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_ddp_options.py).
"""

import datetime
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=10))  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    named = list(model.named_parameters())
    ddp = DistributedDataParallel(
        model, param_to_hook_all_reduce=named[0][1], delay_all_reduce_named_params=named[2:]
    )
    if rank == 0:  # two micro-batches, the first without synchronising
        with ddp.no_sync():
            ddp(torch.ones(2, 3)).sum().backward()
    ddp(torch.ones(2, 3)).sum().backward()
    dist.barrier()
    print(f"rank {rank}: the step finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
