"""How precisely the user's code computes, measured before the search: code that upcasts to
float32 inside (``logits.float()``, as Hugging Face's and torchtitan's losses do; an
``fp32_allreduce``) is correct and must not be held to float64's bound.

The measurement is a probe: the simplest scenario the search could draw that is even (every
rank as many samples, one micro-batch each, one step), where correct code and the usual
weighting mistakes give the same result. The code's difference from the float64 reference
there is its rounding: within float64's bound, it computes in float64; within float32's
measured bound, it computes in float32, and every example is then held to float32's bound,
measured per scenario as a float32 scenario's is (a 16-bit format inside is compression,
declared with ``--lossy``, never inferred). A difference
beyond every bound is not rounding: the probe says nothing, and the search finds what it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, settings

from ..engine.compare import compare
from ..engine.reference import train_reference
from ..engine.scenario import Scenario
from ..engine.strategies import scenarios
from ..engine.tolerances import MeasuredTolerance, relative_deviation, unit_roundoff_of
from ..methods.base import Method
from ..methods.equivalence import HarnessError, check_equivalent
from ..world import RankError, WorldError
from ..world.interface import Ranked

# The formats a probe tries. float32 only: code that rounds to a 16-bit format inside (a
# comm hook that compresses to float16) is lossy, and says so with --lossy, never by
# inference: bfloat16's bound is loose enough to hide small mistakes.
LOWER = ("float32",)
# A relative deviation above this is not float64's rounding (about 1e-16 per operation) but
# a coarser format's (float32's is about 6e-8): the geometric mean of their unit roundoffs.
FLOAT64_LIMIT = (unit_roundoff_of("float64") * unit_roundoff_of("float32")) ** 0.5


def probe_scenario(world_size: int, bounds: dict[str, Any]) -> Scenario | None:
    """The simplest scenario of ``bounds`` that is even, one micro-batch per rank, one step,
    in float64; None if the bounds allow none (float64 excluded, say).

    Example::

        probe_scenario(2, {})  # Scenario(world_size=2, schedule=(((1,), (1,)),), ...)
    """
    if "float64" not in tuple(bounds.get("dtypes", ("float64",))):
        return None
    probe_bounds = {
        **bounds,
        "even": True,
        "max_micro_batches": 1,
        "max_steps": 1,
        "dtypes": ("float64",),
    }
    probe_bounds.pop("same_micro_batch_counts", None)
    try:
        strategy = scenarios(world_size=world_size, **probe_bounds)
        return hypothesis.find(
            strategy,
            lambda scenario: True,
            settings=settings(
                database=None,
                derandomize=True,
                max_examples=10,
                phases=[Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            ),
        )
    except Exception:  # bounds the search itself will report on
        return None


def lowered_tolerance(scenario: Scenario, dtype: str, *, device: str = "cpu") -> MeasuredTolerance:
    """``dtype``'s measured bound for a float64 ``scenario`` whose code computes in ``dtype``:
    the deviations of runs of the scenario in that format from the float64 reference.

    Example::

        tolerance = lowered_tolerance(scenario, "float32")
    """
    reference = train_reference(scenario, "float64")
    lowered = dataclasses.replace(scenario, dtype=dtype)  # type: ignore[arg-type]
    tolerance = MeasuredTolerance.derive(lowered, reference, device=device)
    tolerance.because = f"the code computes in {dtype}: held to {dtype}'s measured bound"
    return tolerance


def held_to(world: Ranked, scenario: Scenario, dtype: str) -> MeasuredTolerance:
    """:func:`lowered_tolerance`, measured on the world's helper (beside the ranks, on their
    kind of device, as the reference is).

    Example::

        tolerance = held_to(world, scenario, "float32")
    """
    return world.helper.run_job(
        lowered_tolerance, (scenario, dtype), {"device": world.device}, name=f"{dtype}'s bound"
    )[0]


def measured_precision(world: Ranked, method: Method, scenario: Scenario | None) -> str | None:
    """The format the code computes in, if lower than float64 (``"float32"``), measured on
    the probe ``scenario``; None for float64, or when the
    difference is no format's rounding (a mistake the search will find) or the probe failed.

    Example::

        measured_precision(world, adapt(for_masked_lm_loss, "loss-fn"), probe)  # "float32"
    """
    if scenario is None:
        return None
    try:
        outcome = check_equivalent(world, method, scenario)
        if relative_deviation(outcome.reference, outcome.got) <= FLOAT64_LIMIT:
            return None
        for dtype in LOWER:
            tolerance = held_to(world, scenario, dtype)
            if compare(outcome.reference, outcome.got, scenario, tolerance) is None:
                return dtype
    except (RankError, WorldError, HarnessError):
        return None  # the code fails: the search says how, on a scenario of its own
    return None
