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
    out += _hierarchical(rank, size)
    return out


def _hierarchical(rank: int, size: int) -> list[float]:
    from collections import OrderedDict

    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager,
    )

    out: list[float] = []
    for levels, warmup in (([(1, 1), (2, size)], 1), ([(2, 1), (3, size)], 0)):
        param = torch.nn.Parameter(torch.tensor([rank * 3.0, -rank], dtype=torch.float64))
        averager = HierarchicalModelAverager(OrderedDict(levels), warmup_steps=warmup)
        for step in range(7):
            param.grad = torch.zeros_like(param)
            with torch.no_grad():
                param.add_(float(rank + step))
            averager.average_parameters(iter([param]))
            out += _flat([param])
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
    groups: list[tuple[Any, int]] = [(dist.group.WORLD, 0)]
    if size > 1:  # the subgroup holding global rank 0 (the others meet known torch issues)
        groups.append((dist.new_group([0]), 0))
    kinds = ("all_gather", "all_reduce", "broadcast", "reduce_scatter", "all_to_all_single",
             "gather", "scatter", "reduce")  # fmt: skip
    for group, first in groups:
        if rank >= first + dist.get_world_size(group):
            continue
        n = dist.get_world_size(group)
        for kind in kinds:
            x = torch.arange(2.0 * n, dtype=torch.float64).add(rank * 10).requires_grad_()
            if kind == "all_gather":
                ys = list(functional.all_gather(x, group=group))
            elif kind == "all_reduce":
                ys = [functional.all_reduce(x, group=group)]
            elif kind == "broadcast":
                ys = [functional.broadcast(x, first + n - 1, group=group)]
            elif kind == "reduce_scatter":
                ys = [functional.reduce_scatter(torch.empty(2, dtype=torch.float64),
                                                list(x.chunk(n)), group=group)]  # fmt: skip
            elif kind == "all_to_all_single":
                ys = [functional.all_to_all_single(torch.empty(2 * n, dtype=torch.float64), x,
                                                   group=group)]  # fmt: skip
            elif kind == "gather":
                ys = list(functional.gather(x, first, group=group))
            elif kind == "scatter":
                ys = [functional.scatter(list(x.reshape(n, 2).unbind()), first, group=group)]
            else:
                ys = [functional.reduce(x, first, group=group)]
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


def post_local() -> list[float]:
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel

    rank, size = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for start, allreduce, group_size in ((1, True, 1), (2, False, 1), (0, True, size)):
        subgroup, _ = dist.new_subgroups(group_size=group_size)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2).double()
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(PostLocalSGDState(None, subgroup, start, allreduce),
                               post_localSGD_hook)  # fmt: skip
        for step in range(4):
            x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) * (rank + 1 + step)
            model.zero_grad()
            ddp(x).pow(2).sum().backward()
            out += _flat(p.grad for p in model.parameters())
    return out


def powersgd() -> list[float]:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    out: list[float] = []
    # One bucket: with a bucket per parameter, PowerSGD on gloo waited forever here (seen, not
    # pursued); batched_powerSGD_hook is left to the suite (it failed its own shape assertion
    # on the small models tried here).
    for hook, rank_k, start, feedback, warm in (
        (power.powerSGD_hook, 1, 2, True, True),
        (power.powerSGD_hook, 2, 1, False, False),
        (power.powerSGD_hook, 3, 3, True, False),
    ):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 4))
        ddp = DistributedDataParallel(model)
        state = power.PowerSGDState(None, matrix_approximation_rank=rank_k,
                                    start_powerSGD_iter=start, min_compression_rate=0.5,
                                    use_error_feedback=feedback, warm_start=warm)  # fmt: skip
        ddp.register_comm_hook(state, hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(4):
            x = torch.linspace(-1, 1, 12).reshape(2, 6) * (rank + 1 + step)
            optimizer.zero_grad()
            ddp(x).pow(2).sum().backward()
            out += _flat(p.grad for p in model.parameters())
            optimizer.step()
    return out


def zero() -> list[float]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    rank = dist.get_rank()
    out: list[float] = []
    for cls, bucket_view, kwargs in ((torch.optim.SGD, False, {"lr": 0.1, "momentum": 0.9}),
                                     (torch.optim.Adam, True, {"lr": 0.01}),
                                     (torch.optim.AdamW, False, {"lr": 0.01})):  # fmt: skip
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), cls, parameters_as_bucket_view=bucket_view, **kwargs
        )
        for step in range(3):
            x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) * (rank + 1 + step)
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
            for p in model.parameters():  # the data-parallel mean, as DDP would give
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            optimizer.step()
            out += _flat(model.parameters())
        optimizer.consolidate_state_dict(0)
        if rank == 0:
            state = optimizer.state_dict()["state"]
            out += _flat(v for k in sorted(state) for v in state[k].values()
                         if torch.is_tensor(v) and v.dim() > 0)  # fmt: skip
    return out


def ddp() -> list[float]:
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    out: list[float] = []
    options = ({}, {"static_graph": True}, {"find_unused_parameters": True},
               {"gradient_as_bucket_view": True, "bucket_cap_mb": 1e-6},
               {"broadcast_buffers": False})  # fmt: skip
    for kwargs in options:
        torch.manual_seed(rank)  # different on every rank: the broadcast from rank 0 is seen
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                    torch.nn.Linear(4, 2)).double()  # fmt: skip
        ddp = DistributedDataParallel(model, **kwargs)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            # static_graph with no_sync() is a known torch issue (pytorch#143580): one micro-batch
            for micro in range(1 if kwargs.get("static_graph") else 2):
                x = torch.arange(9.0, dtype=torch.float64).reshape(3, 3) * (rank + 1 + step + micro)
                if micro == 0 and not kwargs.get("static_graph"):
                    with ddp.no_sync():
                        ddp(x).pow(2).sum().backward()
                else:
                    ddp(x).pow(2).sum().backward()
            optimizer.step()
            out += _flat([*model.parameters(), *model.buffers()])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    ddp = DistributedDataParallel(model)
    with Join([ddp], divide_by_initial_world_size=False):
        for step in range(2 + rank):  # uneven inputs
            ddp(torch.ones(2, 3, dtype=torch.float64) * (step + 1)).sum().backward()
    out += _flat(p.grad for p in model.parameters())
    return out


def fsdp() -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, size = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    cases = ((None, None, False, True), (torch.bfloat16, 2.0, True, False),
             (torch.float16, None, False, True), (None, 3.0, True, True))  # fmt: skip
    for param_dtype, factor, force_sum, reshard in cases:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        mesh = init_device_mesh("cpu", (size,))
        reduce_dtype = torch.float32 if param_dtype else None
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        if factor is not None:
            model.set_gradient_divide_factor(factor)
        model.set_force_sum_reduction_for_comms(force_sum)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for step in range(2):
            for micro in range(2):
                model.set_requires_gradient_sync(micro == 1)
                x = torch.linspace(-1, 1, 6).reshape(2, 3) * (rank + 1 + step + micro)
                model(x).pow(2).sum().backward()
            out += [float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))]
            out += _flat(p.grad.full_tensor() for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad()
        out += _flat(p.full_tensor() for p in model.parameters())
    return out


def checkpoint() -> list[float]:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    rank = dist.get_rank()
    out: list[float] = []
    for full in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
        groups = [{"params": model[0].parameters(), "lr": 0.1, "weight_decay": 0.01},
                  {"params": model[1].parameters(), "lr": 0.02}]  # fmt: skip
        optimizer = torch.optim.AdamW(groups)
        x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) * (rank + 1)
        model(x).pow(2).sum().backward()
        optimizer.step()
        options = StateDictOptions(full_state_dict=full)
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        torch.manual_seed(1)
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
        fresh_groups = [{"params": fresh[0].parameters(), "lr": 0.5},
                        {"params": fresh[1].parameters(), "lr": 0.5}]  # fmt: skip
        fresh_optimizer = torch.optim.AdamW(fresh_groups)
        set_state_dict(fresh, fresh_optimizer, model_state_dict=model_state,
                       optim_state_dict=optimizer_state, options=options)  # fmt: skip
        out += [g["lr"] for g in fresh_optimizer.param_groups]
        out += [g["weight_decay"] for g in fresh_optimizer.param_groups]
        fresh(x).pow(2).sum().backward()
        fresh_optimizer.step()
        out += _flat(fresh.parameters())
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
