"""set_state_dict(..., options=StateDictOptions(full_state_dict=True)) raises
``AssertionError: Expected device to be set`` for an optimizer that keeps no tensor state
(SGD without momentum): it looks for the device in the optimizer's own state tensors and finds
none. The same checkpoint loads with full_state_dict=False, and with momentum.

    python findings/dcp_full_state_dict_stateless_optimizer.py   # AssertionError (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_fsdp.py).
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    options = StateDictOptions(full_state_dict=True)
    for momentum in (0.9, 0.0):
        model = fully_shard(torch.nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        set_state_dict(model, optimizer, model_state_dict=model_state,
                       optim_state_dict=optimizer_state, options=options)  # fmt: skip
        if rank == 0:
            print(f"momentum={momentum}: loaded")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
