"""Single-process training of a scenario: the loop the reference and every simulation share.

A simulation holds one model and optimizer per *replica* (a replica stands for a rank where
the simulation needs one; its optimizer is the engine's own, :mod:`.optimizers`) and says
only how a step's gradients come to be: ``backward(step)``
fills every replica's ``.grad`` from the step's global batch and returns the loss each replica
reports. The loop builds the replicas from the scenario, zeroes gradients, records gradients,
steps every optimizer (unless ``backward`` already did), and records losses and parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .models import (
    MicroBatch,
    build_data,
    build_model,
    count_items,
    global_items,
    loss_function,
    micro_batches,
    normaliser,
    one_thread,
    rank_items,
    training_optimizer,
    window_factor,
)
from .optimizers import ReferenceOptimizer
from .scenario import Scenario
from .trace import RankTrace, Trace, named_gradients, named_parameters


@dataclasses.dataclass
class Step:
    """One step of single-process training: its global batch and every replica."""

    scenario: Scenario
    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    models: list[torch.nn.Module]
    optimizers: list[Any]  # ReferenceOptimizer, or the user's recipe's torch optimizer
    loss_fn: torch.nn.Module
    stepped: bool = False
    # How many times the step's objective counts: its share of its window's, where the
    # declared objective normalises by the window (models.window_factor); 1 otherwise.
    factor: float = 1.0

    @property
    def model(self) -> torch.nn.Module:
        """The replica of a one-replica run."""
        return self.models[0]

    def loss(self, model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
        """``model``'s mean loss on ``batch``."""
        inputs, targets = batch
        return self.loss_fn(model(inputs), targets)

    def rank_batch(self, rank: int) -> MicroBatch:
        """Every sample ``rank`` holds at this step."""
        start = self.scenario.offset(self.index, rank)
        n = self.scenario.samples(self.index)[rank]
        return self.inputs[start : start + n], self.targets[start : start + n]

    def micro_batches(self, rank: int) -> list[MicroBatch]:
        """``rank``'s micro-batches at this step, in order."""
        return micro_batches(self.scenario, self.index, rank, (self.inputs, self.targets))

    def items(self, batch: MicroBatch) -> int:
        """The loss items of ``batch``: samples, or tokens that count."""
        return count_items(self.scenario, batch[1])

    def rank_items(self) -> list[int]:
        """The loss items each rank holds at this step."""
        return rank_items(self.scenario, self.index)

    def global_items(self) -> int:
        """The loss items of this step's global batch."""
        return global_items(self.scenario, self.index)

    def share(self, batch: MicroBatch) -> float:
        """The weight of ``batch``'s own loss in the step's: its share of the step's loss
        items, or 1 under a declared sum, whose pieces add unweighted; times the step's
        :attr:`factor` where the objective normalises by its window."""
        return self.weight(batch) / self.normaliser() * self.factor

    def weight(self, batch: MicroBatch) -> int:
        """What ``batch``'s own loss is multiplied by to give its part of the summed loss:
        its loss items under a mean, 1 under a declared sum (its loss already sums)."""
        return normaliser(self.scenario, self.items(batch))

    def normaliser(self, rank: int | None = None) -> int:
        """What the step's summed loss (or ``rank``'s) is divided by to give its objective:
        the loss items under a mean, 1 under a declared sum."""
        items = self.global_items() if rank is None else self.rank_items()[rank]
        return normaliser(self.scenario, items)

    def step_optimizers(self) -> None:
        """Step every replica's optimizer now (a simulation that steps per micro-batch); the
        loop then does not step them again at the end of the step."""
        for optimizer in self.optimizers:
            optimizer.step()
        self.stepped = True


Backward = Callable[[Step], Sequence[float]]


def train(
    scenario: Scenario,
    backward: Backward,
    *,
    dtype: str | None = None,
    device: torch.device | str | None = None,
    replicas: int = 1,
    name: str = "simulation",
) -> Trace:
    """Train ``scenario`` on this process (on ``device``, default the CPU); ``backward`` says
    how each step's gradients form.

    Example (the reference: the mean loss over the whole global batch)::

        def full_batch(step):
            loss = step.loss(step.model, (step.inputs, step.targets))
            loss.backward()
            return [loss.item()]

        trace = train(scenario, full_batch, name="reference")
    """
    with one_thread():
        models = [build_model(scenario, dtype, device) for _ in range(replicas)]
        # The engine's own optimizers, never torch.optim: the oracle shares no code with the
        # optimizers and clipping the conformance suite gates. A user's recipe trains with
        # the user's optimizer and scheduler: what their code trains with is the question.
        optimizers: list[Any] = [
            training_optimizer(scenario, m.parameters())[0]
            if scenario.recipe.optimizer or scenario.recipe.scheduler
            else ReferenceOptimizer(scenario.optimizer, m.parameters())
            for m in models
        ]
        loss_fn = loss_function(scenario)
        records = [RankTrace() for _ in models]
        for index, (inputs, targets) in enumerate(build_data(scenario, dtype, device)):
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            step = Step(
                scenario,
                index,
                inputs,
                targets,
                models,
                optimizers,
                loss_fn,
                factor=window_factor(scenario, index),
            )
            losses = backward(step)
            for model, record in zip(models, records, strict=True):
                record.record("grads", named_gradients(model))
            if not step.stepped:
                for optimizer in optimizers:
                    optimizer.step()
            for model, record, loss in zip(models, records, losses, strict=True):
                record.losses.append(float(loss))
                record.record("params", named_parameters(model))
        return Trace(name, records)
