"""The worlds the pytest plugin and ``check()`` hand out: worlds (forked, or the launched job
itself) that check methods and user code against the reference."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..world import World
from ..world.spmd import Member, SpmdWorld
from .preloads import RANK_PRELOAD

if TYPE_CHECKING:
    from ..engine.outcome import Outcome
    from ..engine.scenario import Scenario
    from ..engine.tolerances import Tolerance
    from ..methods import Method
    from ..usercode.kinds import Kind
    from ..world.interface import Ranked


class Verifying:
    """What both kinds of world add: checking methods and user code against the reference."""

    def check_equivalent(
        self,
        method: Method,
        scenario: Scenario,
        *,
        tolerance: Tolerance | None = None,
        measure_all: bool = False,
    ) -> Outcome:
        """See :func:`ddp_verify.methods.equivalence.check_equivalent`."""
        from ..methods.equivalence import check_equivalent

        return check_equivalent(
            self._world(), method, scenario, tolerance=tolerance, measure_all=measure_all
        )

    def assert_equivalent(
        self, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
    ) -> None:
        """See :func:`ddp_verify.methods.equivalence.assert_equivalent`."""
        __tracebackhide__ = True
        from ..methods.equivalence import assert_equivalent

        assert_equivalent(self._world(), method, scenario, tolerance=tolerance)

    def check(self, fn: Any, *, kind: Kind | str, **options: Any) -> Any:
        """:func:`ddp_verify.check` on this world: search scenarios for a counterexample.

        Example::

            def test_my_sync(world):
                world.check(my_average_gradients, kind="grad-sync", max_examples=50)
        """
        __tracebackhide__ = True
        from ..usercode.search import search

        return search(fn, kind=kind, world=self._world(), **options)

    def _world(self) -> Ranked:
        # A mixin: the classes below are worlds (World, SpmdWorld).
        return cast("Ranked", self)


class VerifyingWorld(Verifying, World):
    """A :class:`~ddp_verify.world.World` that can check methods against the reference, which
    its helper process trains (see :attr:`World.helper`).

    Example::

        >>> from ddp_verify import Scenario
        >>> from ddp_verify.methods import ddp
        >>> with VerifyingWorld(2) as world:
        ...     world.assert_equivalent(ddp(), Scenario(world_size=2, schedule=(((1,), (2,)),)))
        ...     world.helper is not None
        True
    """

    def __init__(self, size: int, *, preload: Sequence[str] = (), **options: Any):
        # What every verifying rank needs first, then the caller's own modules.
        modules = tuple(dict.fromkeys((*RANK_PRELOAD, *preload)))
        super().__init__(size, preload=modules, **options)

    def start(self) -> VerifyingWorld:
        if not self._ready and not self._closed:
            # The ranks and the helper process that trains the reference start side by side.
            self.launch()
            self.helper.launch()
        super().start()
        self.helper.start()
        return self


class VerifyingSpmdWorld(Verifying, SpmdWorld):
    """The launched world (SPMD mode) with the same checks: the reference and the other
    helper work are done by one rank at a time and shared through the job's store (see
    :class:`~ddp_verify.world.spmd.LocalHelper`), and the ranks agree on every verdict.

    Example (under ``torchrun --nproc-per-node 4``)::

        world = VerifyingSpmdWorld(Member(detect(os.environ)))
        world.check(my_average_gradients, kind="grad-sync")
    """

    def __init__(self, member: Member, *, preload: Sequence[str] = ()) -> None:
        super().__init__(member)
        self.preload = tuple(dict.fromkeys((*RANK_PRELOAD, *preload)))

    def start(self) -> VerifyingSpmdWorld:
        if not self.member.joined:
            # What a forked rank has from its fork server before its first job: paid at
            # start-up, not by the first example, and before the group exists (see
            # Member.connect: torch._dynamo's imports would otherwise keep it alive).
            for module in self.preload:
                importlib.import_module(module)
            SpmdWorld.start(self)
        return self


# Either kind of world the plugin and check() hand out.
AnyVerifyingWorld = VerifyingWorld | VerifyingSpmdWorld
