"""Hypothesis in lockstep: every rank of a launched (SPMD) world draws the same examples,
shrinks the same way and stops at the same time.

Each rank runs the same ``@given`` test, so the ranks agree on everything hypothesis decides
with: the seed (rank 0's, sent to all), the example database (read and written by rank 0; the
others receive what it read), and the outcome of every example (a failure on any rank fails the
example on every rank, with the same exception raised from the same place, so hypothesis's
notion of "the same bug" agrees too). What hypothesis decides by the clock (deadlines, the
too-slow health check) is switched off: clocks differ between ranks.

Hypothesis also mixes in constants it finds in the local modules a process has imported, and
the ranks need not have imported the same ones (rank 0 reports; an editable install is local
code): in lockstep those constants are left out, or the ranks would draw different examples.

In fork mode nothing here applies: :func:`in_lockstep` returns the test as it is.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

import hypothesis
from hypothesis import HealthCheck, settings
from hypothesis.database import ExampleDatabase

from ..world import frames, wire
from ..world.interface import Agreeing, Ranked
from ..world.naming import public
from . import compat


def is_lockstep(world: Ranked) -> TypeGuard[Agreeing]:
    """Whether ``world`` is a launched world whose ranks must run hypothesis in lockstep."""
    return world.lockstep and isinstance(world, Agreeing)


def in_lockstep(test: Callable[..., Any], world: Ranked, *, name: str = "") -> Callable[..., Any]:
    """Make a ``@given`` test run in lockstep on every rank of ``world`` (in place; returns it).

    Example::

        @given(scenarios(world_size=world.size))
        def search(scenario): ...

        in_lockstep(search, world)()
    """
    if not is_lockstep(world) or not getattr(test, "is_hypothesis_test", False):
        return test
    if getattr(test.hypothesis.inner_test, "_ddp_verify_agreed", False):  # type: ignore[attr-defined]
        return test  # already in lockstep (a parametrized test's next case, say)
    compat.without_local_constants()
    name = name or getattr(test, "__qualname__", "test")
    current = compat.settings_of(test)
    database = current.database
    # Every example waits on the slowest rank: what is slow is the world, not the data.
    suppressed = dict.fromkeys([*current.suppress_health_check, HealthCheck.too_slow])
    compat.set_settings(
        test,
        settings(
            current,
            deadline=None,
            suppress_health_check=list(suppressed),
            database=LockstepDatabase(database, world, name) if database is not None else None,
        ),
    )
    if compat.seed_of(test) is None and not current.derandomize:
        mine = compat.forced_seed()
        if mine is None:
            mine = random.SystemRandom().getrandbits(64)
        hypothesis.seed(world.agree(f"seed of {name}", mine)[0])(test)
    inner = test.hypothesis.inner_test  # type: ignore[attr-defined]
    test.hypothesis.inner_test = agreed(inner, world, name)  # type: ignore[attr-defined]
    return test


def agreed(inner: Callable[..., Any], world: Agreeing, name: str) -> Callable[..., Any]:
    """``inner`` with its outcome agreed: whatever any rank raised, every rank raises."""

    @functools.wraps(inner)
    def run_agreed(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        mine: BaseException | None = None
        try:
            value = inner(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            mine, value = exc, None
        everyone = world.agree(f"example of {name}", _describe(mine, world.rank))
        failed = [(r, said) for r, said in enumerate(everyone) if said is not None]
        if not failed:
            return value
        rank, (kind, payload, text) = failed[0]
        # Where every rank raised the same kind of error (one the ranks had already agreed on,
        # a RankError say), the rank it came from adds nothing.
        everywhere = len(failed) == len(everyone) and all(s[0] == kind for _, s in failed)
        if (
            mine is not None
            and type(mine).__module__.startswith("hypothesis")
            and (f"{type(mine).__module__}.{type(mine).__qualname__}" == kind)
        ):
            # hypothesis's own control flow (assume(), a data stop): its own object.
            raise mine
        raise _rebuilt(payload, kind, text, rank, len(everyone), note=not everywhere)

    run_agreed._ddp_verify_agreed = True  # type: ignore[attr-defined]
    return run_agreed


def _describe(exc: BaseException | None, rank: int) -> tuple[str, bytes | None, str] | None:
    if exc is None:
        return None
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return kind, wire.dumps_exception(exc), frames.format_exception(exc)


@public
class RankFailed(AssertionError):
    """What a rank raised, when its exception could not travel to the other ranks: every rank
    raises it alike, with the rank's traceback as text.

    Example::

        >>> import ddp_verify
        >>> issubclass(ddp_verify.RankFailed, AssertionError)  # pytest shows it as a failure
        True
    """


def _rebuilt(
    payload: bytes | None, kind: str, text: str, rank: int, size: int, *, note: bool = True
) -> BaseException:
    # Every rank (the failing one too) raises a fresh copy from here, so the failure looks the
    # same to hypothesis on every rank.
    # Read as data (the store is the network's): an exception that is not data travels as
    # its text only, and every rank raises RankFailed alike.
    exc = wire.loads_exception(payload, what=f"rank {rank}'s exception")
    if exc is None:
        return RankFailed(f"rank {rank} of {size} raised {kind}:\n{text}")
    exc.__traceback__ = None
    if note:
        said = f"[ddp_verify] raised on rank {rank} of {size}; there:\n{text.rstrip()}"
        compat.add_note(exc, said)
    return exc


class LockstepDatabase(ExampleDatabase):
    """Rank 0's example database, shared with the other ranks of a launched world: rank 0
    reads and writes it; every fetch is agreed, so all ranks replay the same examples.

    Example::

        settings(database=LockstepDatabase(DirectoryBasedExampleDatabase(".hypothesis"), world))
    """

    def __init__(self, database: ExampleDatabase, world: Agreeing, name: str = "") -> None:
        super().__init__()
        self._database = database
        self._world = world
        self._name = name

    def fetch(self, key: bytes) -> Iterable[bytes]:
        mine = list(self._database.fetch(key)) if self._world.rank == 0 else None
        yield from self._world.agree(f"database of {self._name}", mine)[0] or []

    def save(self, key: bytes, value: bytes) -> None:
        if self._world.rank == 0:
            self._database.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        if self._world.rank == 0:
            self._database.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if self._world.rank == 0:
            self._database.move(src, dest, value)

    def __repr__(self) -> str:
        return f"LockstepDatabase({self._database!r})"
