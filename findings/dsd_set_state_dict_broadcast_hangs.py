"""set_state_dict with StateDictOptions(full_state_dict=True, broadcast_from_rank0=True): rank 0
passes the full state, the other ranks empty dicts (the option says rank 0's is broadcast).
set_state_dict computes ``optim_only=not model_state_dict``, so on the other ranks the model
is not handled and its broadcast is skipped, while rank 0 broadcasts: the ranks wait on each
other until the group's time-out (10 s here). set_model_state_dict and
set_optimizer_state_dict called apart load.

    python findings/dsd_set_state_dict_broadcast_hangs.py   # time-out (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_state_dict.py).
"""

import datetime
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard


def run(rank: int, port: int, together: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=10))  # fmt: skip
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    model = fully_shard(torch.nn.Linear(4, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    if rank != 0:
        model_state, optimizer_state = {}, {}
    try:
        if together:
            set_state_dict(model, optimizer, model_state_dict=model_state,
                           optim_state_dict=optimizer_state, options=options)  # fmt: skip
        else:
            set_model_state_dict(model, model_state, options=options)
            set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
        print(f"rank {rank}: {'set_state_dict' if together else 'apart'}: loaded", flush=True)
    except RuntimeError as exc:
        print(f"rank {rank}: {'set_state_dict' if together else 'apart'}: {exc}"[:160], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    for together in (False, True):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free_port = s.getsockname()[1]
        mp.spawn(run, args=(free_port, together), nprocs=2)
