"""set_model_state_dict into a DDP-wrapped model one of whose modules is shared under two
names (``left.0`` and ``right.1`` below, as weight-shared layers are): get_model_state_dict
gives both names, unprefixed, as the plain model's state_dict does; loading that state back
renames only the keys of the modules it walks, and it walks a shared module once, under its
first name. The second name's keys keep no ``module.`` prefix, and the strict load refuses
them: "Missing key(s) module.right.1.weight ... Unexpected key(s) right.1.weight". Under FSDP2
with full_state_dict=True, the second name's whole tensor is likewise never distributed into
a DTensor: "aten.copy_.default got mixed torch.Tensor and DTensor". The same state loads into
the unwrapped model, and a sharded one into FSDP2.

    python findings/dsd_shared_module_wrapped_load.py   # plain, fsdp2 sharded: loaded;
                                                        # ddp, fsdp2 full: RuntimeError

Found by ``pytest --pyargs ddp_verify.conformance`` (test_state_dict.py).
"""

import socket

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import fully_shard


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = torch.nn.Linear(2, 2)
        self.left = torch.nn.Sequential(shared)
        self.right = torch.nn.Sequential(torch.nn.Tanh(), shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


def model() -> torch.nn.Module:
    return Blocks()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    wrappers = [
        ("plain", lambda m: m, False),
        ("ddp", torch.nn.parallel.DistributedDataParallel, False),
        ("fsdp2 sharded", fully_shard, False),
        ("fsdp2 full", fully_shard, True),
    ]
    for name, wrap, full in wrappers:  # fmt: skip
        options = StateDictOptions(full_state_dict=full)
        saved = get_model_state_dict(wrap(model()), options=options)
        print(f"{name}: saved {sorted(saved)}")
        try:
            set_model_state_dict(wrap(model()), saved, options=options)
            print(f"{name}: loaded")
        except RuntimeError as exc:
            print(f"{name}: {' '.join(str(exc).split())}")
    dist.destroy_process_group()
