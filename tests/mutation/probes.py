"""Quick probes of whether a generated mutant changes any numerics: for each module the
mutation tool samples, one job that calls its API as users do, with fixed inputs, on every
rank of a small world, and returns the numbers it produced (or the error it raised). A mutant
whose probe gives exactly the unmutated numbers is set aside as not numerically live. Written
apart from the conformance suite, whose reach the probes must not define."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist


def _flat(tensors: Any) -> list[float]:
    return [float(x) for t in tensors for x in torch.as_tensor(t).reshape(-1)]


def averaging() -> list[float]:
    from torch.distributed.algorithms.model_averaging import averagers, utils
    from torch.distributed.optim import PostLocalSGDOptimizer

    rank, size = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for period, warmup, members in ((2, 1, None), (3, 0, [0]), (1, 2, list(range(size)))):
        group = dist.new_group(members) if members is not None else None
        params = [
            torch.nn.Parameter(torch.arange(3.0, dtype=torch.float64) * (rank + 1) + i)
            for i in range(2)
        ]
        averager = averagers.PeriodicModelAverager(period, warmup, group)
        optimizer = PostLocalSGDOptimizer(torch.optim.SGD(params, lr=0.5), averager)
        for step in range(6):
            for i, p in enumerate(params):
                p.grad = torch.full((3,), float(rank - step + i), dtype=torch.float64)
            if step % 2:
                optimizer.step()
            else:
                averager.average_parameters(iter(params))
            out += _flat(params)
        groups = [{"params": params}]
        utils.average_parameters_or_parameter_groups(groups, group or dist.group.WORLD)
        out += _flat(params)
    return out


def clipping() -> list[float]:
    out: list[float] = []
    for norm_type in (1.0, 2.0, 3.0, math.inf):
        for foreach in (False, True):
            for scale in (0.01, 10.0):
                params = [torch.nn.Parameter(torch.zeros(4, dtype=torch.float64)) for _ in "ab"]
                params = params[: 1 + int(scale > 1)]  # one tensor, and two
                for i, p in enumerate(params):
                    p.grad = torch.linspace(-1, 1 + i, 4, dtype=torch.float64) * scale
                total = torch.nn.utils.clip_grad_norm_(
                    params, 1.0, norm_type=norm_type, foreach=foreach
                )
                out += [float(total), *_flat(p.grad for p in params)]
    for flag in (False, True):
        p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        p.grad = torch.tensor([math.nan, 1.0], dtype=torch.float64)
        try:
            torch.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=flag)
            out.append(0.0)
        except RuntimeError:
            out.append(1.0)
    return out


def differentiable() -> list[float]:
    from torch.distributed.nn import functional

    rank, size = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for kind in ("all_gather", "all_reduce", "broadcast"):
        x = torch.arange(3.0, dtype=torch.float64).add(rank * 10).requires_grad_()
        if kind == "all_gather":
            ys = list(functional.all_gather(x))
        elif kind == "all_reduce":
            ys = [functional.all_reduce(x)]
        else:
            ys = [functional.broadcast(x, size - 1)]
        loss = sum((y * (i + 1 + rank)).sum() for i, y in enumerate(ys))
        loss.backward()
        out += _flat(ys) + _flat([x.grad])
    return out


def sampler() -> list[float]:
    from torch.utils.data import DistributedSampler

    rank, size = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for n in (1, 3, 10, 11):  # fewer items than ranks too: padding longer than the data
        for shuffle in (False, True):
            for drop_last in (False, True):
                s = DistributedSampler(range(n), size, rank, shuffle, seed=3, drop_last=drop_last)
                for epoch in (0, 1):
                    s.set_epoch(epoch)
                    out += [float(i) for i in s] + [float(len(s))]
    return out


def hooks() -> list[float]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    out: list[float] = []
    for hook in (default_hooks.allreduce_hook, default_hooks.fp16_compress_hook):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2).double()
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(2):
            x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) * (rank + 1 + step)
            optimizer.zero_grad()
            ddp(x).pow(2).sum().backward()
            out += _flat(p.grad for p in model.parameters())
            optimizer.step()
        out += _flat(model.parameters())
    return out


def run(name: str, mutant: dict[str, str] | None = None) -> list[float] | str:
    """The probe ``name``'s numbers under ``mutant`` (installed in this rank first; a rank
    process serves one world), or the error it raised (as text)."""
    try:
        if mutant is not None:
            from tests.mutation.generated_patch import install_mutant

            try:
                install_mutant(mutant)
            except ValueError as exc:
                return f"not applicable: {exc}"
        return globals()[name]()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
