"""Whether a loss aggregation applies its mask: the code re-run on the counterexample with the
per-token losses the mask excludes set to zero.

The harness hands ``loss_mat`` a loss at every position (a policy loss has one wherever there
is a token), so code that never multiplies by ``loss_mask`` counts positions it must not. No
weighting of the micro-batches' gradients predicts that (the excluded positions' gradients
are no column of the diagnosis), so it is not guessed from the numbers: the run is repeated
with those losses zeroed, and a result that changes is code that reads them. What the code
does besides is diagnosed on the zeroed run, where the mask no longer matters.

Example::

    cause, outcome, method = mask_probe(world, method, outcome, bounds)
    cause.pattern if cause else None  # 'mask:ignored'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...engine.compare import compare
from ...engine.outcome import Outcome
from ...engine.tolerances import Float64Tolerance
from ...methods.base import Method
from ...methods.equivalence import check_equivalent
from ...world.interface import Ranked
from .. import findings as f
from ..adapters import LossAggregator
from ..findings import Cause
from .probes import isolating_scenarios


def mask_probe(
    world: Ranked, method: Method, outcome: Outcome, bounds: Mapping[str, Any] | None = None
) -> tuple[Cause | None, Outcome, Method]:
    """``(cause, outcome, method)``: the mask finding where zeroing the losses the mask
    excludes changes what the code trains, on the counterexample or else on the first
    scenario isolating an axis (a shrunk counterexample may have no position under the mask),
    with the counterexample's outcome and the method to diagnose the rest with (the zeroed
    ones: what the code does besides); ``(None, outcome, method)`` as given where the code
    applies its mask or is no loss aggregation."""
    if not isinstance(method, LossAggregator) or method.zero_under_mask:
        return None, outcome, method
    probe = method.under_zeroed_mask()
    tried = [outcome.scenario, *(s for _, s in isolating_scenarios(outcome.scenario, bounds))]
    for scenario in tried:
        original = outcome if scenario is outcome.scenario else None
        if original is None:
            original = check_equivalent(world, method, scenario)
        zeroed = check_equivalent(world, probe, scenario, tolerance=original.tolerance)
        # Bit for bit where the code never reads them: float64's bound says "the same run".
        if compare(original.got, zeroed.got, scenario, Float64Tolerance()) is None:
            continue
        zeroed_words = (
            "with those losses set to 0, the same scenario trains what the reference trains"
            if zeroed.equivalent
            else "with those losses set to 0 it still differs, as said below"
        )
        cause = f.MASK_IGNORED.cause(zeroed=zeroed_words)
        if scenario is not outcome.scenario:
            cause = dataclasses.replace(cause, scenario=repr(scenario))
            zeroed = check_equivalent(world, probe, outcome.scenario, tolerance=outcome.tolerance)
        return cause, zeroed, probe
    return None, outcome, method
