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

Where float64's rounding ends is measured on the probe too: a gradient that is small because
large terms cancel carries their rounding, so float64 code can differ from the reference by
1e-12 of such a gradient (verl's token mean did, on a tiny transformer). The line sits
between float64's rounding amplified as float32's measured deviation on the probe is, and
float32's unamplified (:func:`float64_line`).
And code that trains the reference's gradients times a factor near one, to float64's rounding
(an epsilon in a denominator, ``count + 1e-8``, as verl, OpenRLHF and NeMo-RL guard theirs),
computes in float64: the probe measures the factor, and the report says which bound covers it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, settings

from ..engine.compare import compare
from ..engine.outcome import Outcome
from ..engine.reference import train_reference
from ..engine.scenario import Scenario
from ..engine.strategies import scenarios
from ..engine.tolerances import (
    FLOAT32_SAFETY,
    FLOAT64_RTOL,
    MeasuredTolerance,
    common_scale,
    relative_deviation,
    unit_roundoff_of,
)
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


def float64_line(float32s: float) -> float:
    """The largest deviation read as float64's rounding on a scenario where float32's
    measured deviation is ``float32s``: cancellation amplifies every format's rounding by
    about ``float32s / u32``, so float64 code lands near that times ``u64``; code that rounds
    only some sums in float32 (an all-reduce) may escape the amplification and land near
    ``u32``. The line is their geometric mean, never below FLOAT64_LIMIT.

    Example::

        >>> f"{float64_line(3e-3):.1e}", float64_line(1e-8) == FLOAT64_LIMIT
        ('5.8e-10', True)
    """
    return max(FLOAT64_LIMIT, (unit_roundoff_of("float64") * float32s) ** 0.5)


@dataclasses.dataclass(frozen=True)
class Precision:
    """What the probe measured: ``format``, the format the code computes in where it is lower
    than float64 (its examples are held to that format's measured bound), else None; and
    ``scale``, where the code trains the reference's gradients times a factor near one (an
    epsilon in a denominator), that factor.

    Example::

        >>> print(Precision(scale=1 - 2e-9).words())  # doctest: +NORMALIZE_WHITESPACE
        computes in float64, its gradients (1 - 2e-09) × the reference's on the probe (an
        epsilon in a denominator, say): held to float64's bound (rtol 1e-07), 50 times that
    """

    format: str | None = None
    scale: float | None = None
    # Where the lower format shows, where the even probe did not show it (counts or weights
    # held in float32 are exact on an even split): the scenario's numbers that are not.
    where: str | None = None

    def words(self) -> str | None:
        """The report's Precision line, None where there is nothing to say (float64)."""
        if self.format is not None and self.where is not None:
            return (
                f"computes in float64 on an even split but to {self.format}'s rounding where "
                f"{self.where}: counts or weights held in {self.format} (torch.tensor(float(n)) "
                f"is {torch.get_default_dtype()}, torch's default): held to {self.format}'s "
                "measured bound"
            )
        if self.format is not None:
            return f"computes in {self.format}: held to {self.format}'s measured bound"
        if self.scale is None:
            return None
        off = self.scale - 1.0
        return (
            f"computes in float64, its gradients (1 {'+' if off > 0 else '-'} {abs(off):.2g}) × "
            "the reference's on the probe (an epsilon in a denominator, say): held to "
            f"float64's bound (rtol {FLOAT64_RTOL:g}), {FLOAT64_RTOL / abs(off):.2g} times that"
        )


def probe_scenario(
    world_size: int, bounds: dict[str, Any], *, dtype: str = "float64"
) -> Scenario | None:
    """The simplest scenario of ``bounds`` that is even, one micro-batch per rank, one step,
    in ``dtype``; None if the bounds allow none (``dtype`` excluded, say).

    Example::

        probe_scenario(2, {})  # Scenario(world_size=2, schedule=(((1,), (1,)),), ...)
    """
    if dtype not in tuple(bounds.get("dtypes", ("float64",))):
        return None
    probe_bounds = {
        **bounds,
        "even": True,
        "max_micro_batches": 1,
        "max_steps": 1,
        "dtypes": (dtype,),
    }
    probe_bounds.pop("same_micro_batch_counts", None)
    try:
        strategy = scenarios(world_size=world_size, **probe_bounds)
        # Hypothesis draws the simplest example first: a shrink phase finds it again (half
        # a second of every check's start-up) and is left out.
        return hypothesis.find(
            strategy,
            lambda scenario: True,
            settings=settings(
                database=None,
                derandomize=True,
                max_examples=10,
                phases=[Phase.generate],
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
    return measured(world, method, scenario).format


def measured(world: Ranked, method: Method, scenario: Scenario | None) -> Precision:
    """What the probe ``scenario`` measures of the code: the :class:`Precision` it computes
    in (a lower format, or float64 times a factor near one), or plain float64 when it computes
    in float64, the difference is no format's rounding (a mistake the search will find) or
    the probe failed.

    Example::

        measured(world, adapt(token_mean_with_an_epsilon, "loss-agg"), probe).scale  # 0.999...
    """
    if scenario is None:
        return Precision()
    try:
        return judged(world, scenario, check_equivalent(world, method, scenario))
    except (RankError, WorldError, HarnessError):
        return Precision()  # the code fails: the search says how, on a scenario of its own


def diverged_precision(world: Ranked, scenario: Scenario, outcome: Outcome) -> Precision:
    """What a scenario whose run diverged beyond float64's bound measures of the code, where
    the even probe measured float64: a lower format whose measured bound covers the run
    (counts or weights held in float32 round only where they are not exact in it, as an
    uneven split's shares are), with the scenario's shares that are not; else plain float64
    (a mistake, or rounding no format accounts for: the search goes on).

    Example::

        diverged_precision(world, scenario, outcome).words()  # "computes in float64 on ..."
    """
    found = judged(world, scenario, outcome)
    if found.format is None:
        return Precision()
    return dataclasses.replace(found, where=inexact_shares(scenario, found.format))


def inexact_shares(scenario: Scenario, dtype: str) -> str:
    """Where ``scenario``'s shares of the global batch (each rank's, each micro-batch's) are
    not exact in ``dtype``, in words.

    Example::

        >>> s = Scenario(world_size=2, schedule=(((1,), (2,)),))
        >>> inexact_shares(s, "float32")
        "step 0's shares 1/3, 2/3 are not exact in float32"
    """
    fmt = getattr(torch, dtype)
    said = []
    for step, ranks in enumerate(scenario.schedule):
        total = sum(sum(sizes) for sizes in ranks)
        counts = sorted({n for sizes in ranks for n in (sum(sizes), *sizes)})
        inexact = [n for n in counts if torch.tensor(n / total, dtype=fmt).item() != n / total]
        if inexact:
            shares = ", ".join(f"{n}/{total}" for n in inexact)
            said.append(f"step {step}'s shares {shares}")
    if not said:
        return f"this scenario's numbers round in {dtype}"
    return "; ".join(said) + f" are not exact in {dtype}"


def judged(world: Ranked, scenario: Scenario, outcome: Outcome) -> Precision:
    """What ``outcome`` (the code's run of ``scenario`` against its reference) says of the
    precision the code computes in: see :func:`measured`."""
    try:
        deviation = relative_deviation(outcome.reference, outcome.got)
        if deviation <= FLOAT64_LIMIT:
            return Precision()
        float32s = world.helper.run_job(
            float32_deviation, (scenario,), {"device": world.device}, name="float32's rounding"
        )[0]
        rounding = float64_line(float32s)
        scale, rest = common_scale(outcome.reference, outcome.got)
        if rest <= rounding and FLOAT64_LIMIT < abs(scale - 1.0) <= FLOAT64_RTOL / FLOAT32_SAFETY:
            # Float64 times a factor near one, which float64's bound covers with the margin a
            # measured bound keeps (a larger factor is a weighting: the search names it).
            # Looked for first: a factor shows on every tensor alike, so it can hide under
            # the rounding of the one whose terms cancel most.
            return Precision(scale=scale)
        if deviation <= rounding:
            return Precision()
        for dtype in LOWER:
            tolerance = held_to(world, scenario, dtype)
            if compare(outcome.reference, outcome.got, scenario, tolerance) is None:
                return Precision(format=dtype)
    except (RankError, WorldError, HarnessError):
        pass  # the helper fails: the search says how, on a scenario of its own
    return Precision()


def float32_deviation(scenario: Scenario, *, device: str = "cpu") -> float:
    """How far the float64 ``scenario`` trained in float32 lands from its float64 reference,
    as :func:`~ddp_verify.engine.tolerances.relative_deviation` measures it: float32's
    rounding of this scenario, cancellation included.

    Example::

        float32_deviation(probe)  # 3e-07
    """
    reference = train_reference(scenario, "float64")
    lowered = dataclasses.replace(scenario, dtype="float32")
    return relative_deviation(reference, train_reference(lowered, "float32", device))
