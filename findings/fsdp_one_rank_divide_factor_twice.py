"""fully_shard over a mesh of one rank divides the gradient by set_gradient_divide_factor's
factor twice when the reduction is a plain sum (set_force_sum_reduction_for_comms(True), or a
dtype that risks overflow such as float64 or float16): the one-rank path copies the gradient
divided by the factor, then the post-division divides by it again. A single-GPU FSDP2 run (or
an HSDP mesh whose shard dimension is 1) with a custom divide factor trains on gradient / f**2.

    python findings/fsdp_one_rank_divide_factor_twice.py   # 0.25 where 0.5 is right (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_fsdp.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=1)
    for force_sum in (False, True):
        model = torch.nn.Linear(1, 1, bias=False).double()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        model.set_gradient_divide_factor(2.0)
        model.set_force_sum_reduction_for_comms(force_sum)
        model(torch.ones(1, 1, dtype=torch.float64)).sum().backward()  # gradient 1
        got = model.weight.grad.full_tensor().item()
        print(f"float64, force_sum={force_sum}: gradient {got} (1 / 2.0 = 0.5 expected)")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=1)
