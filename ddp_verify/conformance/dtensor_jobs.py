"""Jobs of ``test_dtensor``, run on every rank: DTensors laid out on a device mesh
(sharded unevenly, replicated, or partial sums), redistributed and put through the
operations training runs, forward and backward, returned whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# Operations on a (rows, columns) tensor ``a`` and a (columns, k) tensor ``b``, as training
# meets them: elementwise, reductions, a matrix product, layout changes.
OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + a * 2,
    "neg": lambda a, b: -a,
    "relu": lambda a, b: torch.relu(a - 1),
    "exp": lambda a, b: torch.exp(a / 8),
    "where": lambda a, b: torch.where(a > 0, a, -a),
    "sum": lambda a, b: a.sum(),
    "sum_rows": lambda a, b: a.sum(0),
    "sum_columns": lambda a, b: a.sum(1),
    "mean": lambda a, b: a.mean(),
    "mean_rows": lambda a, b: a.mean(0),
    "amax_rows": lambda a, b: a.amax(0),
    "norm": lambda a, b: a.norm(),
    "softmax": lambda a, b: torch.softmax(a / 4, -1),
    "matmul": lambda a, b: a @ b,
    "transpose": lambda a, b: a.t(),
    "cat": lambda a, b: torch.cat([a, a], 0),
    "flatten": lambda a, b: a.reshape(-1),
    "slice_columns": lambda a, b: a[:, 1:] * 2,
    "select_row": lambda a, b: a[0] * 2,
}
# Operations autograd goes through in training (the rest are taken forward only).
DIFFERENTIABLE = ("add", "neg", "relu", "exp", "sum", "sum_rows", "sum_columns", "mean",
                  "mean_rows", "norm", "softmax", "matmul", "transpose", "cat", "slice_columns",
                  "select_row")  # fmt: skip


def full_value(seed: int, which: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Tensor ``which`` of a case, whole: small integers in float64 (sums exact)."""
    generator = torch.Generator().manual_seed(seed * 31 + which)
    return torch.randint(-4, 5, shape, generator=generator).to(torch.float64)


def _placement(name: str) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate(),
            "partial": Partial()}[name]  # fmt: skip


def laid_out(full: torch.Tensor, mesh: Any, placements: tuple[str, ...]) -> Any:
    """``full`` as a DTensor with ``placements`` (one a mesh dimension): sharded through
    ``distribute_tensor``; a partial sum by the first rank along that mesh dimension holding
    the value and the others zeros, through ``DTensor.from_local``."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    plain = [_placement("replicate" if p == "partial" else p) for p in placements]
    local = distribute_tensor(full, mesh, plain).to_local()
    if "partial" not in placements:
        return distribute_tensor(full, mesh, plain)
    for dim, p in enumerate(placements):
        if p == "partial" and mesh.get_local_rank(dim) != 0:
            local = torch.zeros_like(local)
    return DTensor.from_local(local, mesh, [_placement(p) for p in placements],
                              shape=full.shape, stride=full.stride())  # fmt: skip


def operations(case: dict[str, Any]) -> dict[str, Any]:
    """Lay the case's two tensors out on a mesh of its shape, redistribute the first to the
    case's target placements, run each operation of the case on them and, for the
    differentiable ones, backward through the sum of the result (weighted by a fixed
    tensor); everything returned whole, or the error an operation raised."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    a_full = full_value(case["seed"], 0, tuple(case["a_shape"]))
    b_full = full_value(case["seed"], 1, tuple(case["b_shape"]))
    out: dict[str, Any] = {}
    a = laid_out(a_full, mesh, tuple(case["a_placements"]))
    b = laid_out(b_full, mesh, tuple(case["b_placements"]))
    out["laid out"] = a.full_tensor()
    target = [_placement(p) for p in case["target"]]
    out["redistributed"] = a.redistribute(mesh, target).full_tensor()
    if "partial" not in case["a_placements"]:
        # A user's redistribution to a partial sum: refused, or (where the release documents
        # Shard -> Partial("sum")) the whole tensor it stands for.
        try:
            summed = a.redistribute(mesh, [_placement("partial")] * mesh.ndim)
            out["to partial"] = summed.full_tensor()
        except RuntimeError as exc:
            out["to partial"] = str(exc)
    for name in case["operations"]:
        try:
            out[name] = OPERATIONS[name](a, b).full_tensor()
        except (RuntimeError, NotImplementedError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if name in DIFFERENTIABLE and "partial" not in case["a_placements"]:
            leaf = laid_out(a_full, mesh, tuple(case["a_placements"])).detach()
            leaf.requires_grad_()
            result = OPERATIONS[name](leaf, b)
            weights = full_value(case["seed"], 2, tuple(result.shape))
            (result * laid_out(weights, mesh, _replicated(result))).sum().backward()
            out[f"{name} gradient"] = leaf.grad.full_tensor()
    dist.barrier()
    return out


def _replicated(result: Any) -> tuple[str, ...]:
    return ("replicate",) * result.device_mesh.ndim
