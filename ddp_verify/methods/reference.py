"""The ground truth: one process, the whole global batch per step, mean loss, one step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models import build_data, build_model, build_optimizer, loss_function, one_thread
from ..scenario import DTYPES, Scenario
from ..trace import RankTrace, Trace, gradients, parameters
from .base import Method

if TYPE_CHECKING:
    from ..world import World


class Reference(Method):
    """Single-process full-batch training in the controller (in the scenario's dtype unless
    ``dtype`` says otherwise)."""

    def __init__(self, dtype: str | None = None) -> None:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.dtype = dtype
        self.name = "reference" if dtype is None else f"reference({dtype})"

    def run(self, scenario: Scenario, world: World | None = None) -> Trace:
        with one_thread():
            return self._train(scenario)

    def _train(self, scenario: Scenario) -> Trace:
        model = build_model(scenario, self.dtype)
        optimizer = build_optimizer(scenario.optimizer, model.parameters())
        loss_fn = loss_function(scenario)
        record = RankTrace()
        for inputs, targets in build_data(scenario, self.dtype):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            record.grads.append(gradients(model))  # type: ignore[union-attr]
            optimizer.step()
            record.losses.append(loss.item())
            record.params.append(parameters(model))
        return Trace(self.name, [record])


def reference(dtype: str | None = None) -> Reference:
    """Single-process full-batch training: the ground truth every method is compared with.

    Example::

        trace = reference().run(scenario)
    """
    return Reference(dtype)
