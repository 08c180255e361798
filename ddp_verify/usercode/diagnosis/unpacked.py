"""Whether code that fails packed is right padded: the code re-run on the counterexample with
its sequences a row each, as padded batches lay them out.

A packed counterexample trains the same tokens, with the same losses, as the same scenario
unpacked: the reference is one. Where the code trains the reference's run unpacked, what
differs is how it reads the packed rows (their boundaries, a row taken for a sequence), and
the report says so beside whatever the numbers name.

Example::

    cause = packing_probe(world, method, outcome)
    cause.pattern if cause else None  # 'packed:disagrees'
"""

from __future__ import annotations

import dataclasses

from ...engine.outcome import Outcome
from ...methods.base import Method
from ...methods.equivalence import check_equivalent
from ...world.interface import Ranked
from .. import findings as f
from ..findings import Cause

__all__ = ["packing_probe"]


def packing_probe(world: Ranked, method: Method, outcome: Outcome) -> Cause | None:
    """The finding that the code is right on the counterexample unpacked and wrong packed;
    None where it was not packed, or differs unpacked too."""
    scenario = outcome.scenario
    if not scenario.packing:
        return None
    unpacked = dataclasses.replace(scenario, packing="", boundary="dropped")
    if not check_equivalent(world, method, unpacked, tolerance=outcome.tolerance).equivalent:
        return None
    # The boundary label is said where it changed (a loss that shifts its labels).
    dropped = ", its first labels dropped" if scenario.boundary != "dropped" else ""
    return f.PACKED_DISAGREES.cause(
        unpacked=f"padded{dropped}",
        packing=scenario.packing,
        evidence=f"the code re-run on {unpacked!r} trains what the reference trains",
    )
