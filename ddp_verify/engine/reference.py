"""The ground truth: single-process training on each step's whole global batch, with a mean
loss and one optimizer step, float64 unless asked otherwise."""

from __future__ import annotations

import torch

from .models import loss_function
from .scenario import DTYPES, Scenario
from .term_values import term_values, weighted
from .trace import Trace
from .training import Step, train


def train_reference(
    scenario: Scenario, dtype: str | None = None, device: torch.device | str | None = None
) -> Trace:
    """The reference trace of ``scenario`` in ``dtype`` (default: the scenario's), on
    ``device`` (default: the CPU, where the float64 truth is trained).

    Example::

        truth = train_reference(scenario, "float64")
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    name = "reference" if dtype is None else f"reference({dtype})"
    if scenario.recipe:
        # Said in reports (which reference judged): the engine's loop with the user's pieces.
        precision = f", {dtype}" if dtype else ""
        name = (
            f"reference (one process, the whole batch{precision}, with your "
            f"{scenario.recipe.describe()})"
        )
    return train(scenario, _full_batch, dtype=dtype, device=device, name=name)


def _full_batch(step: Step) -> list[float]:
    if step.scenario.terms:
        loss = objective_of_terms(step, step.model, step.inputs, step.targets)
        loss.backward()
        return [loss.item()]
    loss = step.loss(step.model, (step.inputs, step.targets)) * step.factor
    loss.backward()
    return [loss.item()]


def objective_of_terms(
    step: Step, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The declared objective of several terms (:mod:`.terms`) on ``step``'s global batch
    (``inputs`` and ``targets``, in its order): each term's value times its weight, summed.

    Example::

        loss = objective_of_terms(step, step.model, step.inputs, step.targets)
    """
    values = term_values(
        step.scenario, step.index, model(inputs), targets, loss_function(step.scenario, "none")
    )
    return weighted(step.scenario, values)


def train_per_batch_statistics(scenario: Scenario) -> Trace:
    """What data-parallel training computes for a model with BatchNorm, float64: every
    micro-batch of every rank forwarded on its own (so normalised by its own statistics), its
    mean loss weighted by its share of the global batch, one optimizer step. DDP's documented
    divergence from full-batch training is exactly the difference from
    :func:`train_reference`; SyncBatchNorm removes it where each rank forwards once per step.

    Example::

        expected = train_per_batch_statistics(scenario)  # what DDP must match with BatchNorm
    """

    def per_micro_batch(step: Step) -> list[float]:
        reported = 0.0
        for rank in range(scenario.world_size):
            for batch in step.micro_batches(rank):
                loss = step.loss(step.model, batch)
                share = step.share(batch)
                (loss * share).backward()
                reported += loss.item() * share
        return [reported]

    return train(scenario, per_micro_batch, dtype="float64", name="per-batch statistics")
