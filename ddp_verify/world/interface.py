"""What every world offers its callers, declared: the typed protocol that forked worlds
(:class:`~ddp_verify.world.World`), the launched world (:class:`~ddp_verify.world.spmd.SpmdWorld`),
their helpers and the pools implement, and that the layers above are written against.

mypy checks the implementations against it (``tox -e lint``); tests/world/test_interface.py
checks them at run time too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Pending(Protocol):
    """A job sent to every rank; :meth:`result` waits for it."""

    def result(self) -> list[Any]:
        """The ranks' results in rank order, or the ``RankError`` of the job."""
        ...


@runtime_checkable
class Ranks(Protocol):
    """Processes that run jobs: a world's ranks, or its helper (one process, no group).

    Example::

        def total(ranks: Ranks) -> float:
            return sum(ranks.run(lambda: 1.0))
    """

    @property
    def size(self) -> int:
        """How many processes."""
        ...

    @property
    def device(self) -> str:
        """Where they train: ``cpu`` or ``cuda``."""
        ...

    @property
    def timeout(self) -> float:
        """How long a job may run, in seconds."""
        ...

    @property
    def label(self) -> str:
        """How reports name these processes (``a world of 4 (gloo)``)."""
        ...

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""
        ...

    def run_job(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> list[Any]:
        """:meth:`run` with a job's options (``timeout``, ``by_value``, ``name``)."""
        ...

    def start(self) -> Ranks:
        """Start the processes (if they are not running) and wait until they are ready."""
        ...

    def retry_start(self) -> None:
        """Let the next start try again after one that failed."""
        ...

    def close(self) -> None:
        """Stop the processes."""
        ...


@runtime_checkable
class Ranked(Ranks, Protocol):
    """A world: ranks in one process group, the helper beside them (where the reference
    trains), and whether hypothesis must run in lockstep on every rank (a launched world,
    where every rank runs the same program).

    Example::

        def check(world: Ranked, scenario: Scenario) -> None:
            pending = world.submit(train, (scenario,))
            reference = world.helper.run(train_reference, scenario)[0]
            assert pending.result() == [reference] * world.size
    """

    @property
    def backend(self) -> str:
        """The process group's backend: ``gloo`` or ``nccl``."""
        ...

    @property
    def allow_tf32(self) -> bool:
        """Whether CUDA float32 may use TF32 on the ranks."""
        ...

    @property
    def debug(self) -> bool:
        """Whether the ranks run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``."""
        ...

    @property
    def lockstep(self) -> bool:
        """Whether hypothesis must run in lockstep on every rank (a launched world)."""
        ...

    @property
    def helper(self) -> Ranks:
        """Work beside the ranks' (the reference, a tolerance's measuring runs)."""
        ...

    @property
    def solo(self) -> Ranks:
        """A world of one rank beside the ranks, in a process group of its own (the
        reference of code that is its own reference on one rank: a coupled loss)."""
        ...

    def submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        by_value: Sequence[ModuleType] = (),
        name: str | None = None,
    ) -> Pending:
        """Send a job to every rank and return at once."""
        ...

    def take_output(self) -> list[tuple[str, str]]:
        """What each rank printed since the last call, as (stdout, stderr)."""
        ...

    def restart(self) -> bool:
        """Replace the ranks with new processes (nothing of earlier jobs in them: modules
        imported afresh) and wait until they are ready; False where the ranks cannot be
        replaced (a launched job's ranks are the job), which then stay as they were."""
        ...


@runtime_checkable
class Agreeing(Protocol):
    """A lockstep world's ranks agreeing on values: each posts one, all get everyone's."""

    @property
    def rank(self) -> int:
        """This process's rank."""
        ...

    def agree(self, tag: str, value: Any) -> list[Any]:
        """Every rank's ``value`` under ``tag``, in rank order, on every rank."""
        ...


@runtime_checkable
class Pool(Protocol):
    """Worlds by size, each started once and kept."""

    def get(self, size: int, backend: str | None = None, *, start: bool = True) -> Ranked:
        """The world of ``size`` ranks (started unless ``start=False``)."""
        ...

    def worlds(self) -> Sequence[Ranked]:
        """Every world created so far."""
        ...

    def close(self) -> None:
        """Stop every world."""
        ...


class RunsJobs:
    """:meth:`run`, and :meth:`run_job` where the world has :meth:`submit`, written once for
    every kind of world.

    Example::

        class MyWorld(RunsJobs):
            def submit(self, fn, args=(), kwargs=None, **options): ...
    """

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        The default process group is initialised on every rank; ``fn`` may be a closure or a
        lambda. Raises ``RankError`` when any rank raises, dies or outlasts the timeout.
        """
        __tracebackhide__ = True
        return self.run_job(fn, args, kwargs)

    def run_job(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> list[Any]:
        """:meth:`run` with the options of ``submit``: its own ``timeout``, modules to ship
        ``by_value``, a ``name`` for reports.

        Example::

            world.run_job(step, (model,), timeout=5.0, name="training step")
        """
        __tracebackhide__ = True
        return self.submit(fn, args, kwargs, **options).result()  # type: ignore[attr-defined]
