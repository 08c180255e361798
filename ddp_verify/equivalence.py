"""Is a method equivalent to single-process full-batch training on a scenario?

``assert_equivalent(world, method, scenario)`` trains the scenario with ``method`` on the
world while the controller trains the reference, compares the traces, and raises
:class:`EquivalenceError` at the first divergence.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from .compare import Float32Tolerance, Float64Tolerance, Mismatch, Tolerance, compare
from .methods import DistributedMethod, Method, Reference
from .methods.base import train_on_rank
from .options import VERIFYING_PRELOAD
from .scenario import Scenario
from .trace import Trace
from .world import World


class EquivalenceError(AssertionError):
    """Training left single-process full-batch training, or the code under test failed to
    run; the message says where and why. ``scenario`` is the (shrunk) scenario, ``outcome``
    the traces when there are any."""

    def __init__(
        self, report: str, *, scenario: Scenario | None = None, outcome: Outcome | None = None
    ) -> None:
        self.outcome = outcome
        self.cause: str | None = None
        self.reproducer: str | None = None
        # For check(): the example (1-based) at which the first counterexample turned up.
        self.found_at: int | None = None
        self.scenario = scenario if scenario is not None else getattr(outcome, "scenario", None)
        self.mismatch = outcome.mismatch if outcome is not None else None
        super().__init__(report)

    @classmethod
    def from_outcome(cls, outcome: Outcome) -> EquivalenceError:
        return cls(outcome.report(), outcome=outcome)


@dataclasses.dataclass
class Outcome:
    """A method's trace next to the reference's, and the first divergence (None if none)."""

    method: str
    scenario: Scenario
    reference: Trace
    got: Trace
    mismatch: Mismatch | None

    @property
    def equivalent(self) -> bool:
        return self.mismatch is None

    def report(self) -> str:
        if self.mismatch is None:
            return f"{self.method} is equivalent to the reference on this scenario."
        m = self.mismatch
        lines = [
            f"{self.method} is not equivalent to single-process full-batch training.",
            m.render(),
        ]
        if m.note == "" and 0 <= m.step < self.reference.steps:
            expected = self.reference.ranks[0].losses[m.step]
            got = ", ".join(f"{r.losses[m.step]:.6g}" for r in self.got.ranks)
            lines.append(f"Losses at step {m.step}: reference {expected:.6g}, ranks {got}")
        lines.append("Scenario: " + self.scenario.describe())
        lines.append(f"Reproduce with: {self.scenario!r}")
        return "\n".join(lines)


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
    reference = Reference("float64").run(scenario)
    if tolerance is None:
        tolerance = (
            Float64Tolerance()
            if scenario.dtype == "float64"
            else Float32Tolerance(reference, Reference("float32").run(scenario))
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


class VerifyingWorld(World):
    """A :class:`~ddp_verify.world.World` that can check methods against the reference.

    Example::

        with VerifyingWorld(2) as world:
            world.assert_equivalent(ddp(), scenario)
    """

    def __init__(self, size: int, *, preload: Sequence[str] = VERIFYING_PRELOAD, **options: Any):
        super().__init__(size, preload=preload, **options)

    def start(self) -> VerifyingWorld:
        if not self._ready and not self._closed:
            # The reference trains here: import what it needs while the fork server does the
            # same for the ranks, on the other core.
            self.prestart()
            for module in self.preload:
                importlib.import_module(module)
        super().start()
        return self

    def check_equivalent(
        self, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
    ) -> Outcome:
        """See :func:`check_equivalent`."""
        return check_equivalent(self, method, scenario, tolerance=tolerance)

    def assert_equivalent(
        self, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
    ) -> None:
        """See :func:`assert_equivalent`."""
        __tracebackhide__ = True
        assert_equivalent(self, method, scenario, tolerance=tolerance)

    def check(self, fn: Any, *, kind: str, **options: Any) -> Any:
        """:func:`ddp_verify.check` on this world: search scenarios for a counterexample.

        Example::

            def test_my_sync(world):
                world.check(my_average_gradients, kind="grad-sync", max_examples=50)
        """
        __tracebackhide__ = True
        from .search import check

        return check(fn, kind=kind, world=self, **options)
