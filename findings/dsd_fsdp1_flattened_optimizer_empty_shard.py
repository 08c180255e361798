"""set_state_dict of an optimizer state flattened (StateDictOptions(flatten_optimizer_state_dict=
True)) into an FSDP1 model (use_orig_params=True) at 2 ranks. One Linear(4, 4) is one flat
parameter of 20 elements: rank 0 holds 10 of the weight's, rank 1 the other 6 and the bias,
so rank 0's Adam holds no state for the bias. Unflattening names each parameter's states
from the local optimizer (``optim.state[param]``): rank 0 loads an empty state for the bias
where rank 1 loads a full one, and FSDP1's load, gathering state by state, runs a collective
rank 0 does not: gloo aborts ("Received data size doesn't match expected size"). The same
state unflattened loads.

    python findings/dsd_fsdp1_flattened_optimizer_empty_shard.py   # abort (torch 2.13.0, gloo)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_state_dict.py).
"""

import datetime
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def run(rank: int, port: int, flatten: bool) -> None:
    warnings.filterwarnings("ignore")  # FSDP1's deprecation and ShardedTensor's warnings
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=10))  # fmt: skip
    torch.manual_seed(0)
    model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"), use_orig_params=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    print(f"rank {rank}: optimizer state for {len(optimizer.state)} of 2 parameters", flush=True)
    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=optimizer_state, options=options)  # fmt: skip
    print(f"rank {rank}: {'flattened' if flatten else 'unflattened'}: loaded", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    for flatten in (False, True):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free_port = s.getsockname()[1]
        try:
            mp.spawn(run, args=(free_port, flatten), nprocs=2)
        except mp.ProcessExitedException as exc:
            print(f"{'flattened' if flatten else 'unflattened'}: {exc}")
