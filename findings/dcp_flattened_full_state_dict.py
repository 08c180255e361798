"""set_state_dict with StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
raises ``KeyError: 'param_groups.0.params.0'`` on a fully_shard model: the optimizer state dict
that get_state_dict gave with the same options cannot be loaded back. Each option alone works.

    python findings/dcp_flattened_full_state_dict.py   # KeyError (torch 2.13.0, gloo, CPU)

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
    for full, flatten in ((True, False), (False, True), (True, True)):
        options = StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=flatten)
        model = fully_shard(torch.nn.Linear(4, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        set_state_dict(model, optimizer, model_state_dict=model_state,
                       optim_state_dict=optimizer_state, options=options)  # fmt: skip
        if rank == 0:
            print(f"full_state_dict={full}, flatten_optimizer_state_dict={flatten}: loaded")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
