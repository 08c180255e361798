"""``torch.max(x, 1, out=(values, indices))`` on a DTensor cut by rows where a rank holds no
row (one row over 2 ranks), the out tensors laid out as the result is (cut by rows):
sharding propagation of ``aten.max.dim_max`` finds no strategy for the out tensors and
raises "min() arg is an empty sequence" on every rank. The same call without ``out``, and
with ``out`` where every rank holds a row, works.

    python findings/dtensor_max_out_empty_shard.py   # the error (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_dtensor.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    mesh = init_device_mesh("cpu", (2,))
    for rows in (2, 1):
        x = distribute_tensor(torch.arange(rows * 3.0).reshape(rows, 3), mesh, [Shard(0)])
        plain = torch.max(x, 1).values.full_tensor().tolist()
        values = torch.empty_like(x[:, 0])
        indices = torch.empty_like(x[:, 0], dtype=torch.long)
        try:
            torch.max(x, 1, out=(values, indices))
            got = f"out: {values.full_tensor().tolist()}"
        except RuntimeError as exc:
            got = f"out: RuntimeError: {str(exc).splitlines()[0]}"
        print(f"rank {rank}, {rows} rows: without out {plain}; {got}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
