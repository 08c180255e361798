"""DDP's delayed all-reduce (``delay_all_reduce_named_params`` with
``param_to_hook_all_reduce``) starts ``dist.all_reduce(..., async_op=True)`` on the delayed
gradients' buffer and never waits for it: right after ``backward()`` the ranks can read (and
an optimizer step) a buffer the all-reduce has not finished writing, so the ranks' gradients
disagree. Read again a moment later, they agree.

    python findings/ddp_delayed_all_reduce_not_waited.py   # disagreement (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_ddp_options.py).
"""

import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def disagree(tensor: torch.Tensor) -> bool:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return any(not torch.equal(g, gathered[0]) for g in gathered)


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    named = list(model.named_parameters())
    delayed = [(n, p) for n, p in named if not n.startswith("0.")]  # after the first layer
    ddp = DistributedDataParallel(
        model, param_to_hook_all_reduce=named[0][1], delay_all_reduce_named_params=delayed
    )
    at_once = later = 0
    for step in range(20):
        model.zero_grad()
        torch.manual_seed(rank * 100 + step)
        ddp(torch.randn(4, 8)).pow(2).sum().backward()
        grad = model[2].weight.grad.clone()
        at_once += disagree(grad)
        time.sleep(0.2)
        later += disagree(model[2].weight.grad.clone())
    if rank == 0:
        print(f"ranks disagree right after backward in {at_once} of 20 steps, "
              f"0.2 s later in {later}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=4)
