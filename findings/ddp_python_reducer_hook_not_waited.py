"""DDP with dynamo's Python reducer (``torch._dynamo.config.optimize_ddp = "python_reducer"``,
which pytorch#147123 made apply whether or not the model is compiled) and an eager backward
calls a comm hook from each parameter's post-accumulate-grad hook and never waits on the
future it returns. With ``fp16_compress_hook`` the gradients right after ``backward()`` are
the rank's own (2 on rank 0, 4 on rank 1, where their mean is 3) until the all-reduce's
callback lands, which it may or may not have: an optimizer step taken then trains a rank on
its own gradient. Without a hook, or with
compiled autograd, the mean is there when ``backward()`` returns.

    python findings/ddp_python_reducer_hook_not_waited.py   # rank 0: 2.0 (rank 1: 4.0 or 3.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_comm_hooks.py).
"""

import socket

import torch
import torch._dynamo
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ddp = DDP(model)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ddp(torch.full((2, 3), float(rank + 1))).sum().backward()
    print(f"rank {rank}: weight gradient {model.weight.grad[0, 0].item()} (the mean is 3.0)")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
