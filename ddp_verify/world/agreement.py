"""The ranks of a launched job agreeing through its store, not its process group (so that it
still works when a collective failed or hung): each posts a value under a tag, and every rank
reads everyone's; ranks at different tags are out of step; a rank that does not post by the
deadline, or whose heartbeat (:mod:`.watchdog`) stopped, is late.

Example (every rank runs this)::

    agreement = Agreement(store, rank, size)
    everyone = agreement.agree("hello", rank, deadline=time.monotonic() + 30)
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

from . import wire
from .errors import WorldError
from .naming import public

# A silent heart for this long means the rank is dead.
DEAD_AFTER_S = 10.0
# A blocking wait on the store lasts at most this long before the waiter looks around.
WAIT_SLICE_S = 0.25


@public
class OutOfStep(WorldError):
    """The ranks reached different points of the program (a rank skipped a job, or ran a test
    the others did not): nothing they do together can be trusted any more.

    Example::

        >>> import ddp_verify
        >>> issubclass(ddp_verify.OutOfStep, ddp_verify.WorldError)
        True
    """


@public
class WorldBroken(WorldError):
    """Some rank found the world broken (a hung or dead rank); every rank stops using it.

    Example::

        >>> import ddp_verify
        >>> issubclass(ddp_verify.WorldBroken, ddp_verify.WorldError)
        True
    """


@dataclasses.dataclass
class Late(Exception):
    """Ranks that had not posted ``tag`` by the deadline: ``dead`` ones stopped beating."""

    tag: str
    late: list[int]
    dead: list[int]


@dataclasses.dataclass
class _Posted:
    """What one rank posts for one agreement: where it is, and what it has to say (data:
    :mod:`.wire` writes it and reads it back, never a pickle)."""

    tag: str
    value: Any = None


# The longest reason a rank's broken flag may carry: text, never code.
BROKEN_LIMIT = 20_000


def read_broken(store: Any) -> str:
    """Why some rank found the world broken, as it wrote it in the store: plain text (UTF-8,
    bounded), never unpickled, so a value written there by anyone else is only words."""
    raw = store.get("broken")
    return bytes(raw[:BROKEN_LIMIT]).decode("utf-8", errors="replace")


def beat_key(rank: int) -> str:
    """Where ``rank``'s heartbeat counter lives in the store."""
    return f"beat/{rank}"


class Agreement:
    """This rank's side of the agreements of a launched job (see the module text).

    ``gone`` are ranks known to be dead or stuck: later agreements do not wait for them.
    ``broken`` says why the world cannot be used any more (empty while it can).
    """

    def __init__(self, store: Any, rank: int, size: int) -> None:
        self.store, self.rank, self.size = store, rank, size
        self.gone: set[int] = set()
        self.broken = ""
        # The tag this rank waits at, while it does (said when the launcher ends it there).
        self.waiting = ""
        self._sequence = 0

    def agree(self, tag: str, value: Any, *, deadline: float) -> list[Any]:
        """Post ``value`` under ``tag`` and return every rank's, in rank order (None for a
        gone rank); :class:`Late` when some had not posted by ``deadline``,
        :class:`OutOfStep` when some posted another tag, :class:`WorldBroken` when some rank
        found the world broken."""
        __tracebackhide__ = True
        if self.broken:
            raise WorldBroken(self.broken)
        self._sequence += 1
        key = f"agree/{self._sequence}"
        mine = wire.dumps(_Posted(tag, value), what=f"the value for {tag!r}")
        self.store.set(f"{key}/{self.rank}", mine)
        if self._sequence > 2:
            # A rank posts n after reading everyone's n-1, and each of them posted n-1 after
            # reading everyone's n-2: agreement n-2 has been read by all, and can go.
            self.store.delete_key(f"agree/{self._sequence - 2}/{self.rank}")
        self.waiting = tag
        try:
            posted = self._gather(key, tag, deadline)
        finally:
            self.waiting = ""
        steps = {r: p.tag for r, p in posted.items() if p is not None and p.tag != tag}
        if steps:
            where = "; ".join(f"rank {r} at {t!r}" for r, t in sorted(steps.items()))
            self.break_(
                f"the ranks are out of step: rank {self.rank} is at {tag!r}, {where}. Every "
                "rank must run the same tests and jobs in the same order (same files, options "
                "and seeds; no rank-dependent branches around jobs)"
            )
            raise OutOfStep(self.broken)
        return [p.value if (p := posted.get(r)) is not None else None for r in range(self.size)]

    def _gather(self, key: str, tag: str, deadline: float) -> dict[int, _Posted | None]:
        waiting = [r for r in range(self.size) if r not in self.gone]
        posted: dict[int, _Posted | None] = {r: None for r in self.gone}
        beats = {r: (self.beat_of(r), time.monotonic()) for r in waiting}
        while waiting:
            # Blocks until every key is there (the store answers at once), in slices so that
            # a broken world, a dead rank or the deadline is noticed meanwhile.
            try:
                self.store.wait(
                    [f"{key}/{r}" for r in waiting], datetime.timedelta(seconds=WAIT_SLICE_S)
                )
            except RuntimeError as exc:
                if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                    raise  # the store itself failed: not a slice that ran out
            still = []
            for r in waiting:
                if self.store.check([f"{key}/{r}"]):
                    posted[r] = self._read(f"{key}/{r}", r, tag)
                else:
                    still.append(r)
            waiting = still
            if not waiting:
                break
            if self.store.check(["broken"]):
                self.broken = read_broken(self.store)
                raise WorldBroken(self.broken)
            now = time.monotonic()
            dead = []
            for r in waiting:
                beat = self.beat_of(r)
                if beat != beats[r][0]:
                    beats[r] = (beat, now)
                elif now - beats[r][1] > DEAD_AFTER_S:
                    dead.append(r)
            if dead or now > deadline:
                raise Late(tag, waiting, dead)
        return posted

    def _read(self, key: str, rank: int, tag: str) -> _Posted:
        """Rank ``rank``'s post under ``key``, read as data; a :class:`~.wire.WireError` (and
        the world broken for every rank) for anything else."""
        what = f"rank {rank}'s value for {tag!r} (key {key!r})"
        try:
            posted = wire.loads(self.store.get(key), what=what)
            if not isinstance(posted, _Posted) or not isinstance(posted.tag, str):
                raise wire.WireError(f"{what} in the job's store is not an agreement's post")
        except wire.WireError as exc:
            self.break_(str(exc))
            raise
        return posted

    def beat_of(self, rank: int) -> int:
        """``rank``'s heartbeat count (its watchdog adds one every beat)."""
        return int(self.store.add(beat_key(rank), 0))

    def break_(self, reason: str) -> None:
        """The world is broken, for ``reason``: say so to every rank (their watchdogs end a
        stuck one; a rank that has yet to arrive at an agreement stops there)."""
        self.broken = self.broken or reason
        self.store.set("broken", self.broken.encode("utf-8")[:BROKEN_LIMIT])

    def declare_broken(self, reason: str) -> None:
        """Every rank saw the same reason to distrust the group: stop using it (no store
        write needed: each rank reached this verdict from the same agreed outcomes)."""
        self.broken = self.broken or reason
