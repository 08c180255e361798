"""What every rank-side method shares: its model, optimizer and slices of each global batch
(:class:`RankRun`), and the data-parallel training loop (:func:`train_data_parallel`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist

from ..engine.models import (
    MicroBatch,
    build_data,
    build_model,
    count_items,
    global_items,
    loss_function,
    micro_batches,
    normaliser,
    nothing_counts_as_zero,
    rank_items,
    training_optimizer,
)
from ..engine.scenario import Scenario
from ..engine.trace import RankTrace, named_gradients, named_parameters
from ..world.backends import DEVICE
from ..world.naming import option
from ..world.runtime import rank_device


class RankRun:
    """One rank's run of a scenario: the model, optimizer, loss, data and the trace so far.

    Example (inside a job on a rank)::

        run = RankRun(scenario)
        for step in range(scenario.steps):
            for inputs, targets in run.micro_batches(step):
                ...
    """

    def __init__(self, scenario: Scenario, model: torch.nn.Module | None = None) -> None:
        self.scenario = scenario
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # The world's device for this rank (cuda:N on GPUs): the model, every batch and every
        # tensor a user's code receives live there.
        self.device = rank_device()
        self.model = model if model is not None else build_model(scenario, device=self.device)
        if scenario.model.batch_norm == "sync" and model is None:
            if not DEVICE[self.device.type].gpus:
                raise ValueError(
                    "SyncBatchNorm runs on GPUs only (torch raises for CPU tensors): check "
                    f"batch_norm='sync' models on a cuda world ({option('device', 'cuda')})"
                )
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        # A rank may hold no sample in a step: its loss there is 0, not torch's 0/0.
        self.loss_fn = nothing_counts_as_zero(scenario, loss_function(scenario))
        self.data = build_data(scenario, device=self.device)
        self.trace = RankTrace()
        self.scheduler: object = None

    def optimizer(
        self,
        params: object = None,
        *,
        ticks: bool = True,
        watch: Callable[..., None] | None = None,
    ) -> torch.optim.Optimizer:
        """The run's optimizer on ``params`` (default: the model's): the scenario's, or the
        user's recipe's with its scheduler (stepped after each optimizer step unless
        ``ticks=False``: then :attr:`scheduler` is the code's to step). ``watch``: a step
        pre-hook run before any clip of the harness's."""
        chosen = self.model.parameters() if params is None else params
        optimizer, self.scheduler = training_optimizer(
            self.scenario, chosen, ticks=ticks, watch=watch
        )
        return optimizer

    def trainable(self) -> list[torch.nn.Parameter]:
        """The model's parameters that take gradients."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def micro_batches(self, step: int) -> list[MicroBatch]:
        """This rank's micro-batches of ``step``, in order."""
        return micro_batches(self.scenario, step, self.rank, self.data[step])

    def local_backward(self, step: int) -> torch.Tensor:
        """Backward of this rank's objective over its micro-batches of ``step``: their mean
        loss (each weighted by its share of the rank's loss items), or under a declared sum
        their summed loss; returns the sum of per-item losses, float64."""
        n = self.local_normaliser(step) or 1  # a rank with nothing: every weight is 0
        local_sum = self.zero()
        for inputs, targets in self.micro_batches(step):
            loss = self.loss_fn(self.model(inputs), targets)
            weight = self.weight(targets)
            (loss * (weight / n)).backward()
            local_sum += loss.detach().double() * weight
        return local_sum

    def items(self, targets: torch.Tensor) -> int:
        """The loss items of a micro-batch: samples, or tokens that count."""
        return count_items(self.scenario, targets)

    def weight(self, targets: torch.Tensor) -> int:
        """What a micro-batch's loss is multiplied by to give its summed loss: its loss
        items, or 1 under a declared sum (whose loss already sums)."""
        return normaliser(self.scenario, self.items(targets))

    def local_normaliser(self, step: int) -> int:
        """What this rank's summed loss at ``step`` is divided by to give its objective: its
        loss items, or 1 under a declared sum."""
        return normaliser(self.scenario, self.local_samples(step))

    def global_normaliser(self, step: int) -> int:
        """What the step's summed loss over every rank is divided by to give the objective:
        its loss items, or 1 under a declared sum."""
        return normaliser(self.scenario, self.global_samples(step))

    def zero(self) -> torch.Tensor:
        """A float64 zero on this rank's device, to sum losses into (nccl reduces CUDA
        tensors only)."""
        return torch.zeros((), dtype=torch.float64, device=self.device)

    def local_samples(self, step: int) -> int:
        """This rank's loss items at ``step``: samples, or tokens that count (the count a
        plug-in is given)."""
        return rank_items(self.scenario, step)[self.rank]

    def local_rows(self, step: int) -> int:
        """This rank's samples at ``step`` (rows of its batches), whatever the loss counts."""
        return self.scenario.samples(step)[self.rank]

    def global_rows(self, step: int) -> int:
        """The samples of ``step``'s global batch."""
        return self.scenario.global_batch(step)

    def global_samples(self, step: int) -> int:
        """The loss items of ``step``'s global batch."""
        return global_items(self.scenario, step)

    def record_gradients(self, model: torch.nn.Module | None = None) -> None:
        self.trace.record("grads", named_gradients(model or self.model))

    def record_step(self, loss: float | torch.Tensor, model: torch.nn.Module | None = None) -> None:
        self.trace.losses.append(float(loss))
        self.trace.record("params", named_parameters(model or self.model))


def fresh_model(run: RankRun) -> torch.nn.Module:
    """The scenario's model built anew, every floating parameter and buffer shifted: only a
    checkpoint's load can make it the trained model again."""
    model = build_model(run.scenario, device=run.device)
    if run.scenario.model.batch_norm == "sync":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(1.0)
    return model


# Checkpoint (wrapped model, optimizer), rebuild both from it, return the rebuilt pair.
Restart = Callable[
    [Callable[..., torch.Tensor], torch.optim.Optimizer],
    tuple[Callable[..., torch.Tensor], torch.optim.Optimizer],
]


def train_data_parallel(
    run: RankRun,
    wrapped: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    no_sync: Callable[[], AbstractContextManager[object]] | None = None,
    set_to_none: bool = True,
    resume: tuple[int, Restart] | None = None,
) -> RankTrace:
    """Train ``run``'s scenario through ``wrapped``, which must average gradients over the
    ranks during backward, as DDP does; each micro-batch's loss is scaled by
    ``world_size * m / N`` (``world_size`` under a declared sum, whose loss sums). DDP, FSDP
    and DDP-like wrappers all train here.

    ``no_sync()`` (default: ``wrapped.no_sync`` if it has one) holds gradient
    synchronisation back for all but each rank's last micro-batch of a step. Without it,
    every backward may synchronise, and ranks holding different numbers of micro-batches would
    call different numbers of collectives: then each rank's weighted micro-batch losses are
    summed into one backward, which gives the same gradient. ``set_to_none=False`` zeroes the
    gradients in place between steps instead of dropping them. ``resume=(k, restart)``
    interrupts training before step ``k``: ``restart(wrapped, optimizer)`` checkpoints them,
    rebuilds both from the checkpoint (a fresh model in ``run.model``) and returns the new
    pair, which trains on as if nothing had happened.

    Example (on a rank)::

        run = RankRun(scenario)
        wrapped = DistributedDataParallel(run.model)
        trace = train_data_parallel(run, wrapped, run.optimizer(wrapped.parameters()))
    """
    given_no_sync = no_sync
    if no_sync is None:
        no_sync = getattr(wrapped, "no_sync", None)
    for step in range(run.scenario.steps):
        if resume is not None and step == resume[0]:
            wrapped, optimizer = resume[1](wrapped, optimizer)
            if given_no_sync is None:
                no_sync = getattr(wrapped, "no_sync", None)
        optimizer.zero_grad(set_to_none=set_to_none)
        scale = run.world_size / run.global_normaliser(step)
        batches = run.micro_batches(step)
        local_sum = run.zero()
        pending: torch.Tensor | None = None
        for j, (inputs, targets) in enumerate(batches):
            last = j == len(batches) - 1
            with contextlib.nullcontext() if last or no_sync is None else no_sync():
                loss = run.loss_fn(wrapped(inputs), targets)
                weight = run.weight(targets)
                scaled = loss * (weight * scale)
                if no_sync is not None:
                    scaled.backward()
                else:
                    pending = scaled if pending is None else pending + scaled
            local_sum += loss.detach().double() * weight
        if pending is not None:
            pending.backward()
        dist.all_reduce(local_sum)
        run.record_gradients()
        optimizer.step()
        run.record_step(local_sum / run.global_normaliser(step))
    return run.trace


def train_local_then_sync(
    run: RankRun, synchronise: Callable[[int, torch.Tensor], float | torch.Tensor]
) -> RankTrace:
    """Train ``run``'s scenario the manual way: each step, the backward of this rank's mean
    loss over its micro-batches (its summed loss under a declared sum), then
    ``synchronise(step, local_sum)`` makes every ``.grad`` the global objective's gradient
    (the global mean's, or the sum's) and returns the loss to report (``local_sum`` is the
    float64 sum
    of this rank's per-sample losses); then the optimizer steps.

    Example (on a rank)::

        def average(step, local_sum):
            ...  # all-reduce the gradients, weighted by samples
            return global_loss

        trace = train_local_then_sync(RankRun(scenario), average)
    """
    optimizer = run.optimizer()
    for step in range(run.scenario.steps):
        optimizer.zero_grad(set_to_none=True)
        reported = synchronise(step, run.local_backward(step))
        run.record_gradients()
        optimizer.step()
        run.record_step(reported)
    return run.trace
