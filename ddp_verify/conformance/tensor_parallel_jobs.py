"""Rank jobs of the tensor-parallel properties (``test_tensor_parallel.py``): a small MLP block
(a LayerNorm, a linear map up, tanh, a linear map down) parallelised by ``parallelize_module``
with one of the plans training code writes, run forward and backward on each rank; and the
same block on one process (the oracle: plain autograd, nothing of DTensor).

Example::

    world.run(tensor_parallel_jobs.parallelised, case)  # per rank: output piece, gradients
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PLANS", "block", "one_process", "parallelised"]

# The plans drawn, by name: which parallel style each submodule gets (see _plan).
PLANS = ("megatron", "colwise_gathered", "sequence_parallel", "prepared_input")
WIDTH, SEQUENCE = 4, 2  # per rank: the sequence is SEQUENCE x the world size long


class Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH, dtype=torch.float64)
        self.up = torch.nn.Linear(WIDTH, hidden, dtype=torch.float64)
        self.down = torch.nn.Linear(hidden, WIDTH, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(self.norm(x))))


def block(case: dict[str, Any], rank: int = 0) -> Block:
    """The block, the same on every rank and in the oracle; where the case draws a source
    rank for ``parallelize_module`` (``src_data_rank``), the linear maps the plan shards
    differ from rank to rank (rank ``rank``'s here): the source's are the ones distributed."""
    torch.manual_seed(case["seed"])
    made = Block(case["hidden"])
    with torch.no_grad():
        # A norm that is not the identity: its gradient shows where its input came from.
        made.norm.weight.uniform_(0.5, 1.5)
        made.norm.bias.uniform_(-0.5, 0.5)
        if case.get("src_data_rank") is not None:
            generator = torch.Generator().manual_seed(case["seed"] * 31 + rank)
            for name in _sharded(case["plan"]):
                for p in getattr(made, name).parameters():
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return made


def _sharded(plan: str) -> tuple[str, ...]:
    """The linear maps ``plan`` shards (column- or row-wise), which it distributes from the
    source rank."""
    return ("up",) if plan == "colwise_gathered" else ("up", "down")


def inputs(case: dict[str, Any], world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole input ``[batch, sequence, width]`` and the weights of the loss on the output."""
    generator = torch.Generator().manual_seed(case["seed"] + 1)
    shape = (case["batch"], SEQUENCE * world_size, WIDTH)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    weights = torch.randn(shape, generator=generator, dtype=torch.float64)
    return x, weights


def one_process(case: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The oracle: the block on the whole input (the source rank's, where one is drawn), the
    loss ``sum(output * weights)``."""
    model = block(case, case.get("src_data_rank") or 0)
    x, weights = inputs(case, world_size)
    out = model(x)
    (out * weights).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {"output": out.detach(), "grads": grads}


def _plan(name: str) -> tuple[dict[str, Any], bool]:
    """The plan, and whether the block's input and output are each rank's piece of the
    sequence (sequence parallel) rather than the whole."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if name == "megatron":
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}, False
    if name == "colwise_gathered":
        # The up projection's output gathered whole; the down projection left plain.
        return {"up": ColwiseParallel(output_layouts=Replicate())}, False
    if name == "sequence_parallel":
        return {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        }, True
    # The block handed the sequence in pieces and gathering it itself first.
    return {
        "norm": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        ),
        "up": ColwiseParallel(),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    }, True


def parallelised(case: dict[str, Any]) -> dict[str, Any]:
    """On each rank: the block under the case's plan on a mesh of every rank, forward on its
    input (the whole, or its piece of the sequence) and backward of its part of the loss;
    its output piece, and every parameter's gradient made whole."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    model = block(case, rank)
    plan, pieces = _plan(case["plan"])
    source = case.get("src_data_rank")
    if source is None:
        parallelize_module(model, mesh, plan)
    else:
        parallelize_module(model, mesh, plan, src_data_rank=source)
    x, weights = inputs(case, world)
    if pieces:
        x, weights = x.chunk(world, dim=1)[rank], weights.chunk(world, dim=1)[rank]
    out = model(x)
    # The loss of a whole output on every rank alike; of a piece, each rank its own part.
    (out * weights).sum().backward()
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is not None and callable(getattr(grad, "full_tensor", None)):
            grad = grad.full_tensor()
        grads[name] = grad
    return {"output": out.detach(), "pieces": pieces, "grads": grads}
