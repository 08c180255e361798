"""Hypothesis strategies for scenarios, at the import path users know
(``from ddp_verify.strategies import scenarios``); they live in
:mod:`ddp_verify.engine.strategies`."""

from .engine.strategies import (
    accumulation_schedules,
    batch_splits,
    coupled_scenarios,
    models,
    optimizers,
    scenarios,
)

__all__ = [
    "accumulation_schedules",
    "batch_splits",
    "coupled_scenarios",
    "models",
    "optimizers",
    "scenarios",
]
