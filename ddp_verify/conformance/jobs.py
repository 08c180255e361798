"""Jobs the conformance suite runs on every rank (importable there by name)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..engine.scenario import Scenario
from ..methods.ddp import DDP
from ..methods.loop import RankRun
from ..world.runtime import rank_device


def buffers_after_forward(method: DDP, scenario: Scenario) -> tuple[float, ...]:
    """Each rank shifts its buffer by its rank, runs one forward through the wrapped model and
    returns the buffer it then holds."""
    run = RankRun(scenario)
    with torch.no_grad():
        run.model.scale.add_(run.rank)
    wrapped = method.wrap(run.model, scenario)
    inputs, _ = run.micro_batches(0)[0]
    wrapped(inputs)
    return tuple(float(v) for v in run.model.scale)


def gradients_inside_and_after_no_sync(method: DDP, scenario: Scenario) -> tuple[bool, bool]:
    """(whether ranks' gradients differ after a backward inside ``no_sync()``, whether they
    agree after the next backward outside it), from one all-gather each."""
    run = RankRun(scenario)
    wrapped = method.wrap(run.model, scenario)
    inputs = torch.cat([x for x, _ in run.micro_batches(0)])
    targets = torch.cat([y for _, y in run.micro_batches(0)])
    with wrapped.no_sync():
        run.loss_fn(wrapped(inputs[:1]), targets[:1]).backward()
    differ = not _same_on_every_rank(run.model)
    run.loss_fn(wrapped(inputs[1:]), targets[1:]).backward()
    return differ, _same_on_every_rank(run.model)


def _same_on_every_rank(model: torch.nn.Module) -> bool:
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    flat = torch.cat(grads) if grads else torch.zeros(0, device=rank_device())
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def powersgd_state(rank: int, module: torch.nn.Module, **options: object) -> object:
    """A PowerSGD hook state, built on each rank (it holds the process group)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    return PowerSGDState(process_group=None, matrix_approximation_rank=rank, **options)


def batched_powersgd_full_rank_state(module: torch.nn.Module, **options: object) -> object:
    """A state for ``batched_powerSGD_hook`` whose rank is the side of the square matrix the
    hook folds a bucket into (every trainable parameter fits the first bucket of these tiny
    models): a full-rank approximation, hence exact. A larger rank fails an assertion."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return powersgd_state(math.ceil(math.sqrt(trainable)), module, **options)
