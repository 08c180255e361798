"""The reference as a method: single-process full-batch training, run where it is called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.reference import train_reference
from ..engine.scenario import DTYPES, Scenario
from ..engine.trace import Trace
from .base import Method

if TYPE_CHECKING:
    from ..world.interface import Ranks


class Reference(Method):
    """Single-process full-batch training (in the scenario's dtype unless ``dtype`` says
    otherwise); see :func:`ddp_verify.engine.reference.train_reference`."""

    def __init__(self, dtype: str | None = None) -> None:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.dtype = dtype
        self.name = "reference" if dtype is None else f"reference({dtype})"

    def run(self, scenario: Scenario, world: Ranks | None = None) -> Trace:
        return train_reference(scenario, self.dtype)


def reference(dtype: str | None = None) -> Reference:
    """Single-process full-batch training: the ground truth every method is compared with.

    Example::

        trace = reference().run(scenario)
    """
    return Reference(dtype)
