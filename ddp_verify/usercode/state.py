"""Whether the code keeps state between calls: the counterexample replayed on a fresh world
(new rank processes, the user's module imported afresh) and again on warm ranks, and how many
calls of it a fresh process needs before it fails.

A module global, a cache or an attribute that outlives a call makes the result depend on what
ran before: the search's counterexample is one call among many on warm ranks, and a script that
replays it once in a fresh process may pass. So the replay is done before the report is
written; a difference is reported with both results, and the reproducer repeats the call as
often as the fresh world needed.
"""

from __future__ import annotations

import dataclasses

from ..engine.compare import Mismatch, compare
from ..engine.outcome import Outcome
from ..engine.trace import Trace
from ..methods.base import Method
from ..methods.equivalence import HarnessError
from ..world import RankError, WorldError
from ..world.interface import Ranked
from . import findings
from .findings import Cause

__all__ = ["State", "most_calls", "replayed"]

# At most this many calls of the counterexample on a fresh world: each is one training run of
# a shrunk scenario (milliseconds to a second), and state that needs more calls than the
# search made to show is not what the search saw.
MOST_CALLS = 200


@dataclasses.dataclass(frozen=True)
class State:
    """What the replays found: the cause to report and how many calls of the scenario the
    reproducer makes in its fresh process (as many as the fresh world needed to fail).

    Example::

        state = replayed(world, method, outcome, calls=most_calls(examples))
        if state is not None:
            print(state.cause.text, state.calls)
    """

    cause: Cause
    calls: int


# Where the ranks could not be replaced, how many calls the reproducer makes: code whose
# result changes with every call shows it from its second.
SAME_RANKS_CALLS = 3


def most_calls(examples: int) -> int:
    """How many calls of the counterexample the fresh replay may make: one more than the
    search made (its examples), within :data:`MOST_CALLS`.

    Example::

        >>> most_calls(10)
        11
    """
    return max(2, min(examples + 1, MOST_CALLS))


def replayed(world: Ranked, method: Method, outcome: Outcome, *, calls: int) -> State | None:
    """Replay ``outcome``'s scenario on a fresh world (``world.restart()``; a launched world's
    ranks cannot be replaced, so there on the same ranks) and return the :class:`State` when
    the code's result depends on the calls before it; None when it does not, or when the
    replay could not run (the counterexample stands either way).

    On a fresh world: the first call's result is held against the search's (warm) result;
    where they differ, the scenario is called again on those ranks until it fails, at most
    ``calls`` times. Where they agree, or on the same ranks, a second call's result is held
    against the first's.

    Example::

        state = replayed(world, method, error.outcome, calls=11)
    """
    scenario, tolerance = outcome.scenario, outcome.tolerance
    reference = outcome.reference

    def mismatch(trace: Trace) -> Mismatch | None:
        return compare(reference, trace, scenario, tolerance)

    try:
        fresh = world.restart()
        first = method.run(scenario, world)
        if fresh and _differs(outcome.got, first, outcome):
            failed = mismatch(first) is not None
            made = 1
            while not failed and made < calls:
                made += 1
                failed = mismatch(method.run(scenario, world)) is not None
            return State(
                findings.KEEPS_STATE.cause(
                    how=_fresh_words(outcome, first, mismatch(first), made, failed),
                    evidence=_evidence(
                        outcome.got, first, outcome, "the search's call", "a fresh call"
                    ),
                ),
                made,
            )
        second = method.run(scenario, world)
        if not _differs(first, second, outcome):
            return None
    except (RankError, WorldError, HarnessError):
        return None
    where = "a fresh world" if fresh else "the same ranks (a launched job's ranks are the job)"
    how = (
        f"the same scenario, called again on {where}, gave "
        f"{_result(second, mismatch(second))} where the call before gave "
        f"{_result(first, mismatch(first))}"
    )
    return State(
        findings.KEEPS_STATE.cause(
            how=how, evidence=_evidence(first, second, outcome, "one call", "the next")
        ),
        # On a fresh world the first call failed as the search's did.
        1 if fresh else SAME_RANKS_CALLS,
    )


def _differs(before: Trace, after: Trace, outcome: Outcome) -> bool:
    """Whether any rank's result moved beyond what the check allows."""
    return _parting(before, after, outcome) is not None


def _parting(before: Trace, after: Trace, outcome: Outcome) -> tuple[int, Mismatch] | None:
    """The first rank whose result moved beyond what the check allows, and where (rank by
    rank: ranks that never synchronise differ from each other, not from themselves)."""
    for r, (b, a) in enumerate(zip(before.ranks, after.ranks, strict=True)):
        moved = compare(
            Trace("before", [b]), Trace("after", [a]), outcome.scenario, outcome.tolerance
        )
        if moved is not None:
            return r, moved
    return None


def _fresh_words(
    outcome: Outcome, first: Trace, first_mismatch: Mismatch | None, made: int, failed: bool
) -> str:
    said = (
        f"replayed on a fresh world (new ranks, its module imported afresh), the first call "
        f"gave {_result(first, first_mismatch)} where the search's call, after earlier calls "
        f"on the same ranks, gave {_result(outcome.got, outcome.mismatch)}"
    )
    if not failed:
        return (
            f"{said}; {made} calls of this scenario on the fresh world never failed: its failure "
            "depends on calls of other scenarios before it, which the reproducer cannot replay"
        )
    if made == 1:
        return said
    return f"{said}; it fails from call {made} of this scenario on"


def _result(trace: Trace, mismatch: Mismatch | None) -> str:
    """One call's result in words: its loss at step 0 on rank 0 and whether it passed."""
    rank = trace.ranks[0]
    loss = f"loss {rank.losses[0]:.6g} at step 0" if rank.losses else "its result"
    verdict = "equivalent"
    if mismatch is not None:
        verdict = f"{mismatch.quantity} off at step {mismatch.step}"
    return f"{loss} ({verdict})"


def _evidence(before: Trace, after: Trace, outcome: Outcome, first: str, second: str) -> str:
    """Where two calls' results part: the rank, step and quantity, with both values."""
    parting = _parting(before, after, outcome)
    if parting is None:
        return ""
    rank, moved = parting
    where = int((moved.got.double() - moved.expected.double()).abs().reshape(-1).argmax())
    was, now = moved.expected.reshape(-1)[where], moved.got.reshape(-1)[where]
    return (
        f"rank {rank}, step {moved.step}, {moved.quantity} {moved.name!r}: {first} gave "
        f"{float(was):.6g}, {second} {float(now):.6g}"
    )
