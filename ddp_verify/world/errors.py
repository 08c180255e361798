"""What can go wrong in a world, and the reports that say so.

Every failure of a job becomes one :class:`RankError` whose message leads with the rank(s) that
failed first (their tracebacks, or how they died), then the ranks that were merely stuck behind
them, each with the output it printed during the job.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from .naming import option, public


def debug_hint() -> str:
    """The advice for failures that mismatched collectives can cause, spelled for the front
    end in use (``--ddp-debug``, ``debug=True``)."""
    return (
        "If the ranks may have called different collectives (or one collective with different "
        f"shapes), rerun with {option('debug', True)}: it sets TORCH_DISTRIBUTED_DEBUG=DETAIL "
        "in the ranks, and torch then names the mismatch."
    )


@public
class WorldError(Exception):
    """Base class of every error the world layer raises.

    Example::

        >>> kinds = (RankError, WorldStartError, BackendUnavailable, JobPicklingError)
        >>> all(issubclass(kind, WorldError) for kind in kinds)
        True
    """


@public
class WorldStartError(WorldError):
    """The rank processes could not be started or could not form a process group. The
    harness's failure, never the code's: ``ddp-verify`` exits 3 for it.

    Example::

        >>> from ddp_verify.usercode.verdict import Status, verdict_for
        >>> verdict_for(WorldStartError("no port")).status is Status.HARNESS_ERROR
        True
    """


@public
class BackendUnavailable(WorldError):
    """The requested backend cannot run a world of this size here (e.g. nccl without GPUs).
    The pytest plugin skips a test with its words; the command line exits 3.

    Example::

        >>> from ddp_verify.usercode.verdict import Status, verdict_for
        >>> verdict_for(BackendUnavailable("nccl needs GPUs")).status.value
        'harness-error'
    """


@public
class DeviceUnavailable(BackendUnavailable):
    """The world asks for GPUs this machine does not show (``device="cuda"`` with none visible,
    or nccl with fewer GPUs than ranks): the request, not the machine, must change, so the
    command line calls it a usage error (exit 2).

    Example::

        >>> from ddp_verify.usercode.verdict import verdict_for
        >>> verdict_for(DeviceUnavailable("device='cuda', and no GPU is visible")).exit_code
        2
    """


@public
class JobPicklingError(WorldError, TypeError):
    """A job or one of its arguments could not be pickled: raised before anything reaches the
    ranks, naming what could not travel (a rank's result that cannot travel back is that
    rank's failure, a :class:`RankError`).

    Example::

        >>> import threading
        >>> from ddp_verify.world import World
        >>> with World(2) as world:
        ...     try:
        ...         world.run(print, threading.Lock())
        ...     except JobPicklingError as exc:
        ...         print("cannot pickle" in str(exc))
        True
    """


class FailureKind(str, enum.Enum):
    """How a rank's job ended: what the rank process did."""

    RAISED = "raised"
    DIED = "died"
    TIMED_OUT = "timed out"
    STUCK = "stuck"
    # Waiting in a collective that cannot complete (told apart without the time-out).
    DEADLOCKED = "deadlocked"
    UNPICKLABLE_RESULT = "unpicklable result"


class Category(str, enum.Enum):
    """What a rank's failure was, for whoever must act on it (:attr:`RankFailure.category`):
    the code's own exception, or trouble in collectives."""

    RAISED = "raised"
    COLLECTIVE_TIMEOUT = "collective time-out"
    COLLECTIVE_MISMATCH = "collective mismatch"
    LOST_PEER = "lost peer"
    DIED = "died"
    HUNG = "hung"
    UNPICKLABLE_RESULT = "unpicklable result"

    @property
    def in_collectives(self) -> bool:
        """Trouble between ranks (a time-out, a mismatch, a lost peer, a death, a hang), as
        opposed to an exception of the code's own or a result that cannot travel."""
        return self not in (Category.RAISED, Category.UNPICKLABLE_RESULT)


# torch's exception types that say what happened, by name (so that nothing here imports
# torch): found anywhere in the exception's class hierarchy.
_TYPES = {"DistNetworkError": Category.LOST_PEER}
# Where torch raises a plain RuntimeError (gloo does for everything) or a rank dies with
# gloo's abort on stderr: its words, lowercased, most specific first.
_WORDS = (
    (
        Category.COLLECTIVE_MISMATCH,
        (
            "detected mismatch between collectives",  # TORCH_DISTRIBUTED_DEBUG=DETAIL
            "collective mismatch",
            "op.preamble.length <= op.nbytes",  # gloo's abort on mismatched sizes
            "gloo::enforcenotmet",
        ),
    ),
    (
        Category.COLLECTIVE_TIMEOUT,
        (
            "timed out waiting",  # gloo: "Timed out waiting 60000ms for recv operation"
            "collective operation timeout",  # NCCL's watchdog
            "operation timed out",
        ),
    ),
    (
        Category.LOST_PEER,
        (
            "connection reset",
            "connection closed",
            "broken pipe",
            "connection refused",
        ),
    ),
)


def categorize(failure: RankFailure) -> Category:
    """The one place failures are classified: by how the rank ended, then by torch's
    exception type, then by torch's and gloo's words."""
    if failure.kind in (FailureKind.TIMED_OUT, FailureKind.STUCK):
        return Category.HUNG
    if failure.kind is FailureKind.DEADLOCKED:
        return Category.COLLECTIVE_MISMATCH
    if failure.kind is FailureKind.UNPICKLABLE_RESULT:
        return Category.UNPICKLABLE_RESULT
    if failure.exception is not None:
        for cls in type(failure.exception).__mro__:
            if cls.__module__.startswith("torch") and cls.__name__ in _TYPES:
                return _TYPES[cls.__name__]
    # A raising rank's own words are its summary; a dying rank's are what it printed.
    text = (failure.summary if failure.kind is FailureKind.RAISED else failure.stderr).lower()
    for category, words in _WORDS:
        if any(w in text for w in words):
            return category
    return Category.DIED if failure.kind is FailureKind.DIED else Category.RAISED


@dataclasses.dataclass
class RankFailure:
    """How one rank failed a job, with everything it left behind."""

    rank: int
    kind: FailureKind
    summary: str
    # Its traceback or stack, cut to the user's frames; ``full_details`` keeps the harness's
    # too (``--full-trace``), where they differ.
    details: str = ""
    full_details: str = ""
    stdout: str = ""
    stderr: str = ""
    exception: BaseException | None = None
    exitcode: int | None = None
    order: float = 0.0
    # Failed only because another rank did (a collective's peer vanished, say).
    consequence: bool = False

    @functools.cached_property
    def category(self) -> Category:
        """What the failure was (see :func:`categorize`)."""
        return categorize(self)

    @property
    def is_primary(self) -> bool:
        """A rank that failed on its own, as opposed to one stuck or broken by another's failure."""
        return self.kind is not FailureKind.STUCK and not self.consequence

    def render(self, *, full_trace: bool = False, ranks: str | None = None) -> str:
        """Its section of the report; ``ranks`` names the ranks it stands for where several
        failed alike (``ranks 0-3``)."""
        who = ranks or f"rank {self.rank}"
        parts = [f"━━ {who} {self.summary}"]
        details = (self.full_details or self.details) if full_trace else self.details
        if details:
            parts.append(textwrap.indent(details.rstrip(), "  "))
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                parts.append(f"  ── {who} {name} ──")
                parts.append(textwrap.indent(_tail(text).rstrip(), "  "))
        return "\n".join(parts)

    def likeness(self, *, full_trace: bool = False) -> tuple[object, ...]:
        """What two ranks' failures must share to be reported once: everything they say,
        thread and object addresses aside (each process has its own)."""
        details = (self.full_details or self.details) if full_trace else self.details
        return (
            self.kind,
            self.consequence,
            self.summary,
            _ADDRESS.sub("0x?", details),
            self.stdout,
            self.stderr,
        )


@public
class RankError(WorldError):
    """One or more ranks failed a job: raised, died, hung or returned something unpicklable.

    ``failures`` lists them most telling first; ``world_relaunched`` says whether the world was
    torn down (it is relaunched on its next use).

    Example::

        >>> import torch.distributed as dist
        >>> from ddp_verify.world import World
        >>> with World(2) as world:
        ...     try:
        ...         world.run(lambda: 1 / (dist.get_rank() - 1))
        ...     except RankError as exc:
        ...         print(exc.ranks, str(exc).splitlines()[0].split(": ", 1)[1])
        [1] rank 1 raised ZeroDivisionError: division by zero
    """

    def __init__(
        self,
        job: str,
        world_size: int,
        backend: str,
        failures: Sequence[RankFailure],
        *,
        world_relaunched: bool,
        hint: str = "",
        finished: Sequence[int] = (),
        where: str = "",
        world_state: str = "",
    ) -> None:
        self.job = job
        # What became of the world, when the default words do not fit (SPMD mode).
        self.world_state = world_state
        # How the failed world is named: "a world of 4 (gloo)" unless it says otherwise.
        self.where = where or f"a world of {world_size} ({backend})"
        self.finished = list(finished)
        self.world_size = world_size
        self.backend = backend
        self.failures = sorted(failures, key=lambda f: (not f.is_primary, f.order, f.rank))
        self.world_relaunched = world_relaunched
        self.hint = hint
        super().__init__(self._message())

    @property
    def ranks(self) -> list[int]:
        """The ranks that failed on their own (not those stuck behind them)."""
        return sorted(f.rank for f in self.failures if f.is_primary)

    @property
    def in_collectives(self) -> bool:
        """Whether any rank's failure was trouble between ranks (see
        :attr:`Category.in_collectives`), not only the code's own exceptions."""
        return any(f.category.in_collectives for f in self.failures)

    def report(self, *, full_trace: bool = False) -> str:
        """The message; ``full_trace`` shows the harness's frames in the ranks' tracebacks and
        stacks too (pytest's ``--full-trace``)."""
        return self._message(full_trace=full_trace)

    @property
    def headline(self) -> str:
        """Which ranks failed first and how, in one line ("rank 1 raised ValueError: ...");
        then those that failed as a consequence, or were stuck."""
        primary = [f for f in self.failures if f.is_primary]
        broken = [f for f in self.failures if f.consequence]
        stuck = [f for f in self.failures if f.kind is FailureKind.STUCK]
        # Ranks that failed alike are said once, as "ranks 0-3" (every rank of a world
        # usually raises the same exception on the same line).
        alike: dict[str, list[RankFailure]] = {}
        for failure in primary:
            alike.setdefault(failure.summary, []).append(failure)
        headline = "; ".join(f"{_ranks(group)} {summary}" for summary, group in alike.items())
        if broken:
            headline += f"; then {_ranks(broken)} failed in a collective as a consequence"
        if stuck:
            headline += f"; {_ranks(stuck)} stuck waiting and killed"
        return headline

    def _message(self, *, full_trace: bool = False) -> str:
        lines = [f"{self.job} failed on {self.where}: {self.headline}"]
        sections: dict[tuple[object, ...], list[RankFailure]] = {}
        for failure in self.failures:
            sections.setdefault(failure.likeness(full_trace=full_trace), []).append(failure)
        lines.extend(
            group[0].render(full_trace=full_trace, ranks=_ranks(group))
            for group in sections.values()
        )
        if self.finished:
            ranks = ", ".join(map(str, self.finished))
            lines.append(
                f"Finished the job normally: rank{'s' if len(self.finished) > 1 else ''} {ranks}."
            )
        after = self.world_state or (
            "The world was torn down and is relaunched on its next use."
            if self.world_relaunched
            else "The world is still up."
        )
        lines.append(after)
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_rank_error,
            (
                self.job,
                self.world_size,
                self.backend,
                self.failures,
                self.world_relaunched,
                self.hint,
                self.finished,
                self.where,
                self.world_state,
            ),
        )


def _rebuild_rank_error(
    job: str,
    world_size: int,
    backend: str,
    failures: list[RankFailure],
    relaunched: bool,
    hint: str,
    finished: list[int],
    where: str,
    world_state: str = "",
) -> RankError:
    return RankError(
        job,
        world_size,
        backend,
        failures,
        world_relaunched=relaunched,
        hint=hint,
        finished=finished,
        where=where,
        world_state=world_state,
    )


def _ranks(failures: Sequence[RankFailure]) -> str:
    """``rank 2``, ``ranks 0-3``, ``ranks 0, 2, 3``: runs of three or more as a span.

    Example::

        >>> _ranks([RankFailure(r, FailureKind.RAISED, "") for r in (3, 0, 1, 2)])
        'ranks 0-3'
        >>> _ranks([RankFailure(r, FailureKind.RAISED, "") for r in (0, 2, 3)])
        'ranks 0, 2, 3'
    """
    ranks = sorted({f.rank for f in failures})
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) >= 3 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


# A thread's or an object's address in a stack dump or a repr.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _tail(text: str, limit: int = 4000) -> str:
    # A rank that loops on print() must not bury the traceback in megabytes of output.
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} earlier characters cut ...]\n" + text[-limit:]


def failure_text(error: BaseException) -> str:
    """Everything a failure says: its message, and for a rank's failure every rank's summary,
    details and output (an abort's message is in the rank's stderr); a group's (hypothesis's
    FlakyFailure) every member's. What known-issue signatures are searched in.

    Example::

        "gloo::EnforceNotMet" in failure_text(rank_error)
    """
    parts = [f"{type(error).__name__}: {error}"]
    for failure in getattr(error, "failures", ()) or ():
        parts += [failure.summary, failure.details, failure.stdout, failure.stderr]
        if failure.exception is not None:
            parts.append(f"{type(failure.exception).__name__}: {failure.exception}")
    for inner in getattr(error, "exceptions", ()) or ():
        parts.append(failure_text(inner))
    return "\n".join(p for p in parts if p)
