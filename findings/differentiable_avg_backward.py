"""torch.distributed.nn.functional.reduce_scatter and reduce with op=ReduceOp.AVG average
forward but pass the gradient back undivided: the input gradient is world-size times the
derivative of an average (all_reduce with AVG is right: its backward averages too).

    python findings/differentiable_avg_backward.py   # 2.0 where 1.0 is right (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_differentiable_collectives.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.nn import functional


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    avg = dist.ReduceOp.AVG
    # the derivative of the ranks' total loss for each input element
    right = {"all_reduce": 2.0, "reduce_scatter": 1.0, "reduce": 1.0}
    for name in ("all_reduce", "reduce_scatter", "reduce"):
        x = torch.ones(2, requires_grad=True)
        if name == "all_reduce":
            y = functional.all_reduce(x, op=avg)
        elif name == "reduce_scatter":
            y = functional.reduce_scatter(torch.empty(1), list(x.chunk(2)), op=avg)
        else:
            y = functional.reduce(x, 0, op=avg)
        # every rank's loss: 2 * its output (the reduce's only on its destination, rank 0)
        (y.sum() * 2 * (1 if name != "reduce" or rank == 0 else 0)).backward()
        if rank == 0:
            print(f"{name}(op=AVG): input gradient {x.grad.tolist()}, right: {right[name]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
