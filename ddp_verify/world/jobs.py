"""A job in flight on every rank, and the wait for its results: each rank's outcome, its death,
or its silence until the deadline."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import Any

from . import failures as fail
from . import protocol
from .deadlock import DeadlockWatch, all_in_collectives
from .errors import RankFailure
from .processes import RankProcess, collect_stack_dumps

# After one rank fails, how long the others get to report before they count as stuck.
FAILURE_GRACE_S = 1.0
# How often the unfinished ranks' CPU time is read, where a deadlock is watched for.
WATCH_POLL_S = 0.5


@dataclasses.dataclass
class Collected:
    """What came back from a job: results in rank order (None where none came), failures as
    they arrived, the ranks still running at the deadline, and whether any rank's job
    destroyed the default process group (every rank then forms it anew)."""

    results: list[Any]
    failures: list[RankFailure]
    unfinished: list[RankProcess]
    regroup: bool


class PendingJob:
    """A job sent to every rank; :meth:`result` waits for it (see ``World.submit``).

    ``failures`` starts with the ranks the job could not even be sent to; ``finish`` turns
    what :func:`collect` gathered into the results or a ``RankError``.
    """

    def __init__(
        self,
        ranks: Sequence[RankProcess],
        name: str,
        sent_at: float,
        timeout: float,
        marks: list[tuple[int, int]],
        failures: list[RankFailure],
        finish: Callable[[PendingJob, Collected], list[Any]],
        *,
        watch_deadlock: bool = False,
    ) -> None:
        self.ranks, self.name = list(ranks), name
        self.sent_at, self.timeout = sent_at, timeout
        self.marks = marks
        self.failures = failures
        self._finish = finish
        # Ranks on CPUs: a collective mismatch is told by its shape (see .deadlock).
        self.watch_deadlock = watch_deadlock
        self._results: list[Any] | None = None

    def result(self) -> list[Any]:
        """The ranks' results in rank order; raises ``RankError`` as ``World.run`` does."""
        __tracebackhide__ = True
        if self._results is None:
            self._results = self._finish(self, collect(self))
        return self._results


def collect(job: PendingJob) -> Collected:
    """Wait for every rank's outcome until the job's deadline, or until the others have had
    ``FAILURE_GRACE_S`` to report after the first failure, or until the ranks still running
    are seen deadlocked in collectives (where ``job.watch_deadlock``)."""
    failures = list(job.failures)
    failed = {f.rank for f in failures}
    results: list[Any] = [None] * len(job.ranks)
    pending = {r.results: r for r in job.ranks if r.rank not in failed}
    deadline = job.sent_at + job.timeout
    grace_deadline = time.monotonic() + FAILURE_GRACE_S if failures else None
    regroup = False
    watch = DeadlockWatch(enabled=job.watch_deadlock)
    while pending:
        until = deadline if grace_deadline is None else min(deadline, grace_deadline)
        remaining = until - time.monotonic()
        if remaining <= 0:
            break
        if watch.enabled and not failures:
            remaining = min(remaining, WATCH_POLL_S)
        answered = ready(pending, remaining)
        for conn in answered:
            r = pending.pop(conn)
            now = time.monotonic()
            try:
                outcome: protocol.Outcome = protocol.decode(conn.recv_bytes())
            except (EOFError, OSError):
                failures.append(fail.death(r, now, job.marks[r.rank]))
            else:
                regroup |= not outcome.process_group_alive
                if outcome.ok:
                    try:
                        results[r.rank] = protocol.load_result(outcome.result or b"")
                    except Exception as exc:
                        failures.append(fail.unloadable_result(r.rank, exc, now))
                else:
                    failures.append(fail.raised(r, outcome, now, job.marks[r.rank]))
            if failures and grace_deadline is None:
                grace_deadline = time.monotonic() + FAILURE_GRACE_S
        waiting = list(pending.values())
        # Looked at only when a poll went by with no answer: a rank that just answered says
        # the job is moving (and reading every rank's /proc costs the controller per example).
        if waiting and not failures and not answered and watch.idle(waiting):
            dumps = collect_stack_dumps(waiting)
            if all_in_collectives(dumps, waiting):
                finished = [r for r in range(len(job.ranks)) if r not in {w.rank for w in waiting}]
                failures += fail.deadlocked(waiting, dumps, watch.idle_s, finished, job.marks)
                pending.clear()
                break
            watch.not_a_deadlock()
    return Collected(results, failures, list(pending.values()), regroup)


def ready(pipes: Iterable[Connection], timeout: float) -> list[Connection]:
    """Those of ``pipes`` that have something to read (or were closed) within ``timeout``."""
    return [
        c for c in mp_connection.wait(list(pipes), timeout=timeout) if isinstance(c, Connection)
    ]
