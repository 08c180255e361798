"""Is a method equivalent to single-process full-batch training on a scenario?

``assert_equivalent(world, method, scenario)`` trains the scenario with ``method`` on the
world's ranks while the world's helper process trains the reference (and derives the float32
tolerance), compares the traces here, and raises
:class:`~ddp_verify.engine.outcome.EquivalenceError` at the first divergence. The controller
builds no model and no optimizer, so it never imports what torch's optimizers pull in
(``torch._dynamo``, FSDP, sympy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..engine.compare import compare
from ..engine.outcome import EquivalenceError, Outcome
from ..engine.reference import train_reference
from ..engine.scenario import Scenario
from ..engine.tolerances import Float32Tolerance, Float64Tolerance, Tolerance
from ..engine.trace import Trace
from ..world import RankError, World
from .base import DistributedMethod, Method, train_on_rank

__all__ = [
    "EquivalenceError",
    "HarnessError",
    "Outcome",
    "assert_equivalent",
    "check_equivalent",
]


class HarnessError(RuntimeError):
    """The harness itself failed (the reference's process, say), not the code under test."""


def check_equivalent(
    world: World | None, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
) -> Outcome:
    """Train ``scenario`` with ``method`` and with the reference; compare them.

    Example::

        outcome = check_equivalent(world, ddp(), scenario)
        assert outcome.equivalent, outcome.report()
    """
    if world is not None and world.size != scenario.world_size:
        raise ValueError(
            f"the scenario is for {scenario.world_size} ranks, the world has {world.size}: draw "
            f"scenarios with scenarios(world_size=world.size)"
        )
    finish = _start(world, method, scenario)
    try:
        # The reference trains beside the ranks, on the world's helper process.
        reference, derived = _truth(world, scenario, tolerance is None)
    except RankError as exc:
        with contextlib.suppress(RankError):
            finish()  # the ranks' job is collected either way: the world stays usable
        raise HarnessError(f"the reference could not be trained:\n{exc}") from exc
    got = finish()
    tolerance = tolerance or derived
    assert tolerance is not None
    mismatch = compare(reference, got, scenario, tolerance)
    return Outcome(method.name, scenario, reference, got, mismatch, tolerance)


def reference_and_tolerance(
    scenario: Scenario, derive_tolerance: bool = True
) -> tuple[Trace, Tolerance | None]:
    """The float64 reference trace of ``scenario`` and, if asked, the tolerance its dtype
    calls for (float32's is measured by training float32 runs: see
    :mod:`ddp_verify.engine.tolerances`).

    Example::

        reference, tolerance = reference_and_tolerance(scenario)
    """
    reference = train_reference(scenario, "float64")
    if not derive_tolerance:
        return reference, None
    if scenario.dtype == "float64":
        return reference, Float64Tolerance()
    return reference, Float32Tolerance.derive(scenario, reference)


def _truth(
    world: World | None, scenario: Scenario, derive_tolerance: bool
) -> tuple[Trace, Tolerance | None]:
    if world is None:
        return reference_and_tolerance(scenario, derive_tolerance)
    return world.helper.run_job(
        reference_and_tolerance, (scenario, derive_tolerance), name="the reference"
    )[0]


def assert_equivalent(
    world: World | None, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
) -> None:
    """Raise :class:`EquivalenceError` unless ``method`` matches the reference on ``scenario``.

    Example::

        from hypothesis import given
        from ddp_verify import assert_equivalent, methods, strategies

        @given(strategies.scenarios(world_size=2))
        def test_ddp(world, scenario):
            assert_equivalent(world, methods.ddp(), scenario)
    """
    __tracebackhide__ = True
    outcome = check_equivalent(world, method, scenario, tolerance=tolerance)
    if not outcome.equivalent:
        raise EquivalenceError.from_outcome(outcome)


def _start(world: World | None, method: Method, scenario: Scenario) -> Callable[[], Trace]:
    if isinstance(method, DistributedMethod):
        if world is None:
            raise TypeError(f"{method.name} trains on a world: pass a World")
        pending = world.submit(train_on_rank, (method.shipped(), scenario), name=method.name)
        return lambda: method.collect(pending.result())
    return lambda: method.run(scenario, world)
