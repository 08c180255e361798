"""DDP's experimental mixed precision (``mixed_precision=_MixedPrecision(param_dtype=bfloat16,
reduce_dtype=float32)``) leaves the *first* backward's gradients zero: the weight's gradient
should be the ranks' mean of outer(loss weights, inputs) (exact here: small integers, up to
bfloat16's rounding of the inputs), and is, from the second backward on. The optimizer's
first step moves nothing. Prints what DDP leaves in ``.grad`` next to what it should be, with
and without the policy.

    python findings/ddp_mixed_precision_gradient.py nccl 1   # needs CUDA (events)
    python findings/ddp_mixed_precision_gradient.py gloo 2   # ranks sharing one GPU

On an H200 with torch 2.11.0+cu130, both print "step 0: grad ... [[0.0, 0.0, 0.0], ...]" with
the policy and the mean without it. Found by ``pytest --pyargs ddp_verify.conformance
--ddp-backend nccl --world-size 1`` (test_ddp_options.py).
"""

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _MixedPrecision


def run(rank: int, port: int, backend: str, size: int) -> None:
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    x = torch.tensor([[255.0 * (rank + 1), 1.0, 3.0]], device=device)
    c = torch.tensor([[1.0, 3.0]], device=device)
    want = sum(torch.outer(c[0], torch.tensor([255.0 * (r + 1), 1.0, 3.0], device=device))
               for r in range(size)) / size  # fmt: skip
    for policy in (None, _MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)):
        model = torch.nn.Linear(3, 2, bias=False).to(device)
        ddp = DistributedDataParallel(model, device_ids=[device.index], mixed_precision=policy)
        for step in range(2):
            model.zero_grad()
            y = ddp(x.to(model.weight.dtype))
            (y * c.to(y.dtype)).sum().backward()
            torch.cuda.synchronize()
            if rank == 0:
                print(f"{backend} x{size} mixed_precision={policy is not None} step {step}: "
                      f"grad {model.weight.grad.dtype} {model.weight.grad.tolist()} "
                      f"want {want.tolist()}", flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    backend = sys.argv[1] if len(sys.argv) > 1 else "nccl"
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port, backend, size), nprocs=size)
