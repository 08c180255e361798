"""At world size 1, ``fully_shard`` hands a tensor subclass's ``fsdp_post_all_gather`` only the
first of the inputs its ``fsdp_pre_all_gather`` returned: the one-rank path of
``FSDPParamGroup.wait_for_unshard`` copies ``all_gather_inputs[0]`` alone, so an extension
sending two inputs (quantised data and its scales, here a float64 tensor's float32 rounding and
its rest) fails unpacking them ("not enough values to unpack (expected 2, got 1)") on the first
forward. At two or more ranks the same subclass trains.

    python findings/fsdp_one_rank_all_gather_extension.py   # torch 2.13.0, gloo, 1 rank

Found by ``pytest --pyargs ddp_verify.conformance --world-size 1`` (test_fsdp.py).
"""

import socket

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils._pytree import tree_map_only


class Split(torch.Tensor):
    """Float64 values whose all-gather sends two inputs: the float32 rounding and the rest."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=data.device
        )

    def __init__(self, data):
        self.data_ = data

    def __tensor_flatten__(self):
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(inner, *_):
        return Split(inner["data_"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(
            *tree_map_only(cls, lambda t: t.data_, args),
            **tree_map_only(cls, lambda t: t.data_, kwargs or {}),
        )
        return tree_map_only(torch.Tensor, cls, out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        high = self.data_.to(torch.float32)
        return (high, self.data_ - high.double()), None

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        high, rest = outputs  # at one rank: only `high` arrives
        if out is not None:
            with torch.no_grad():
                out.copy_(high.double() + rest)
            return None
        return high.double() + rest, (high, rest)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    model = torch.nn.Linear(2, 1, bias=False).double()
    model.weight = torch.nn.Parameter(Split(torch.tensor([[1.0, 2.0]], dtype=torch.float64)))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    try:
        print("output", model(torch.ones(1, 2, dtype=torch.float64)))
    except ValueError as exc:
        print(f"ValueError: {exc}")
    dist.destroy_process_group()
