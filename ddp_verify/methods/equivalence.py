"""Is a method equivalent to single-process full-batch training on a scenario?

``assert_equivalent(world, method, scenario)`` trains the scenario with ``method`` on the
world while the reference trains here, compares the traces, and raises
:class:`~ddp_verify.engine.outcome.EquivalenceError` at the first divergence.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engine.compare import compare
from ..engine.outcome import EquivalenceError, Outcome
from ..engine.reference import train_reference
from ..engine.scenario import Scenario
from ..engine.tolerances import Float32Tolerance, Float64Tolerance, Tolerance
from ..engine.trace import Trace
from ..world import World
from .base import DistributedMethod, Method, train_on_rank

__all__ = ["EquivalenceError", "Outcome", "assert_equivalent", "check_equivalent"]


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
    # The reference trains here while the ranks train there.
    reference = train_reference(scenario, "float64")
    if tolerance is None:
        tolerance = (
            Float64Tolerance()
            if scenario.dtype == "float64"
            else Float32Tolerance(reference, train_reference(scenario, "float32"))
        )
    got = finish()
    return Outcome(
        method.name, scenario, reference, got, compare(reference, got, scenario, tolerance)
    )


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
