"""What a failed job left behind, turned into :class:`RankFailure` reports: which rank raised,
died or hung, which only failed because another did, and what to try next."""

from __future__ import annotations

from collections.abc import Sequence

from . import frames, protocol
from .errors import Category, FailureKind, RankFailure, debug_hint
from .processes import RankProcess, collect_stack_dumps

# How long a rank that closed its pipe gets to finish exiting, so its exit code can be read.
EXIT_WAIT_S = 2.0
# Failures that mismatched collectives can cause, which debug mode would name.
_DEBUGGABLE = (
    Category.COLLECTIVE_TIMEOUT,
    Category.COLLECTIVE_MISMATCH,
    Category.LOST_PEER,
    Category.HUNG,
)


def raised(
    r: RankProcess, outcome: protocol.Outcome, at: float, marks: tuple[int, int]
) -> RankFailure:
    """The rank's job raised: its traceback, output and the exception itself."""
    stdout, stderr = r.output_since(marks)
    return RankFailure(
        rank=r.rank,
        kind=FailureKind(outcome.error_kind),
        summary=outcome.error_summary,
        details=outcome.error_traceback,
        full_details=outcome.error_traceback_full,
        stdout=stdout,
        stderr=stderr,
        exception=protocol.load_exception(outcome.exception),
        order=at,
    )


def death(r: RankProcess, at: float, marks: tuple[int, int]) -> RankFailure:
    """The rank's process ended without a result: how it ended, and what it printed."""
    how = r.exit_description(EXIT_WAIT_S)
    stdout, stderr = r.output_since(marks)
    summary = f"died: {how}" if how.startswith("killed") else f"{how} without a result"
    return RankFailure(
        rank=r.rank,
        kind=FailureKind.DIED,
        summary=summary,
        stdout=stdout,
        stderr=stderr,
        exitcode=r.process.returncode,
        order=at,
    )


def hung(
    ranks: Sequence[RankProcess],
    timeout: float,
    after_failure: bool,
    marks: Sequence[tuple[int, int]],
) -> list[RankFailure]:
    """Ranks still running at the deadline (or after another rank failed), with the stack each
    waits in."""
    if not ranks:
        return []
    if after_failure:
        kind, summary = FailureKind.STUCK, "was still running after another rank failed; killed"
    else:
        kind, summary = (
            FailureKind.TIMED_OUT,
            f"did not finish within the {timeout:g} s timeout; killed",
        )
    return _waiting(ranks, collect_stack_dumps(ranks), kind, summary, marks)


def deadlocked(
    ranks: Sequence[RankProcess],
    dumps: dict[int, str],
    idle_s: float,
    finished: Sequence[int],
    marks: Sequence[tuple[int, int]],
) -> list[RankFailure]:
    """Ranks that wait in collectives that can never complete (see :mod:`.deadlock`), with the
    stack each waits in (``dumps``, already taken)."""
    others = (
        f"rank(s) {', '.join(map(str, finished))} had finished the job"
        if finished
        else "every rank waited so"
    )
    summary = (
        f"waited in a collective, using no CPU for {idle_s:g} s, that can never complete "
        f"({others}): the ranks called different collectives, or different numbers of them; "
        "killed"
    )
    return _waiting(ranks, dumps, FailureKind.DEADLOCKED, summary, marks)


def _waiting(
    ranks: Sequence[RankProcess],
    dumps: dict[int, str],
    kind: FailureKind,
    summary: str,
    marks: Sequence[tuple[int, int]],
) -> list[RankFailure]:
    """One failure per rank still running, with where its stack dump says it waits."""
    failures = []
    for r in ranks:
        stdout, stderr = r.output_since(marks[r.rank])
        dump = dumps.get(r.rank, "")
        failures.append(
            RankFailure(
                rank=r.rank,
                kind=kind,
                summary=summary,
                details=_where_it_waits(frames.format_dump(dump)),
                full_details=_where_it_waits(frames.format_dump(dump, full=True)),
                stdout=stdout,
                stderr=stderr,
                order=float("inf"),
            )
        )
    return failures


def unloadable_result(rank: int, exc: Exception, at: float) -> RankFailure:
    """The rank's result arrived but the controller could not unpickle it."""
    return RankFailure(
        rank=rank,
        kind=FailureKind.UNPICKLABLE_RESULT,
        summary=f"returned a result the controller cannot unpickle ({type(exc).__name__}: {exc})",
        order=at,
    )


def mark_consequences(failures: list[RankFailure]) -> None:
    """A rank whose collective lost its peer failed because another rank failed first, if
    another failed for a reason of its own: judged once all reports are in, since the broken
    peer's report can arrive before the death that broke it."""
    lost = [f for f in failures if f.category is Category.LOST_PEER]
    if len(lost) < len(failures):
        for failure in lost:
            failure.consequence = True


def hint(failures: Sequence[RankFailure], *, debug: bool) -> str:
    """Advice for failures that look like mismatched collectives (unless already debugging)."""
    if debug:
        return ""
    for f in failures:
        if f.category in _DEBUGGABLE:
            return debug_hint()
        if f.category is Category.DIED and (f.exitcode or 0) < 0:
            return debug_hint()
    return ""


def _where_it_waits(stack: str) -> str:
    if not stack.strip():
        return "(no stack dump came back)"
    return "where it waits (most recent call last):\n" + stack.rstrip()
