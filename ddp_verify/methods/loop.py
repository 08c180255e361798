"""What every rank-side method shares: its model, optimizer and slices of each global batch."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..models import build_data, build_model, build_optimizer, loss_function
from ..scenario import Scenario
from ..trace import RankTrace, gradients, parameters

MicroBatch = tuple[torch.Tensor, torch.Tensor]


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
        self.model = model if model is not None else build_model(scenario)
        self.loss_fn = loss_function(scenario)
        self.data = build_data(scenario)
        self.trace = RankTrace()

    def optimizer(self, params: object = None) -> torch.optim.Optimizer:
        chosen = self.model.parameters() if params is None else params
        return build_optimizer(self.scenario.optimizer, chosen)

    def micro_batches(self, step: int) -> list[MicroBatch]:
        """This rank's micro-batches of ``step``, in order."""
        inputs, targets = self.data[step]
        start = self.scenario.offset(step, self.rank)
        batches = []
        for size in self.scenario.schedule[step][self.rank]:
            batches.append((inputs[start : start + size], targets[start : start + size]))
            start += size
        return batches

    def local_backward(self, step: int) -> torch.Tensor:
        """Backward of this rank's mean loss over its micro-batches of ``step`` (each weighted
        by its share of the rank's samples); returns the sum of per-sample losses, float64."""
        n = self.local_samples(step)
        local_sum = torch.zeros((), dtype=torch.float64)
        for inputs, targets in self.micro_batches(step):
            loss = self.loss_fn(self.model(inputs), targets)
            (loss * (len(inputs) / n)).backward()
            local_sum += loss.detach().double() * len(inputs)
        return local_sum

    def local_samples(self, step: int) -> int:
        return self.scenario.samples(step)[self.rank]

    def global_samples(self, step: int) -> int:
        return self.scenario.global_batch(step)

    def record_gradients(self, model: torch.nn.Module | None = None) -> None:
        assert self.trace.grads is not None
        self.trace.grads.append(gradients(model or self.model))

    def record_step(self, loss: float | torch.Tensor, model: torch.nn.Module | None = None) -> None:
        self.trace.losses.append(float(loss))
        self.trace.params.append(parameters(model or self.model))
