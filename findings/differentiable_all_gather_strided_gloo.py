"""torch.distributed.nn.functional.all_gather's backward on gloo gives a wrong gradient where
the gradient reaching it is strided (the gathered tensor used transposed, as attention uses
the keys context parallelism gathers): _AllGather.backward's _AlltoAll allocates its receive
buffers with empty_like of the strided gradients, and gloo's scatter writes into a
non-contiguous output as if it were contiguous (pytorch/pytorch#192920's class of bug). The
functional collectives' all_gather_tensor_autograd is right.

    python findings/differentiable_all_gather_strided_gloo.py   # differs (torch 2.13.0)

Found by ``ddp-verify parity`` on an all-gather context-parallel script, and held by
``pytest --pyargs ddp_verify.conformance`` (test_differentiable_collectives.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.nn import functional


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.arange(6.0).reshape(2, 3).add(10 * rank).requires_grad_()
    weights = torch.arange(12.0).reshape(3, 4)  # the same on both ranks
    stacked = torch.cat(functional.all_gather(x), dim=0)  # 4 x 3
    (stacked.t() * weights).sum().backward()  # the gradient reaching the gather: strided
    # Both ranks' losses are alike, so rank r's rows get twice its rows of weights.T.
    right = 2 * weights.t()[2 * rank : 2 * rank + 2]
    if rank == 0:
        print(f"rank 0's gradient {x.grad.tolist()}, right: {right.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
