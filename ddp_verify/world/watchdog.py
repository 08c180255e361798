"""A launched rank's watchdog: a thread that answers for the rank when its main thread cannot.

It beats (the others tell a dead rank by a heart that stopped), gives the main thread's stack
when another rank asks (a rank stuck outside collectives cannot say where it is), and ends the
process when the others gave up on the world while this rank is still busy (so that a stuck
rank never keeps the launched job alive). It talks to the store on a connection of its own,
so it never waits behind the main thread's blocking waits.

Example::

    watchdog = Watchdog(store, rank, activity=lambda: member.activity, broken=...)
    watchdog.start()
    stacks = request_stacks(store, [2], wait_s=3.0)   # on another rank
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import frames
from .agreement import beat_key, read_broken

BEAT_S = 0.5
# A stuck rank waits this long for the others to finish their report before it exits.
STUCK_EXIT_WAIT_S = 60.0
# How often a rank waiting for stacks looks for them.
_POLL_S = 0.05

# What the main thread is doing and since when (None between jobs).
Activity = tuple[str, float] | None


class Watchdog:
    """The thread of the module text, for ``rank``. ``activity`` says what the main thread
    is doing; ``broken`` whether this rank itself already knows the world is broken (then it
    is not stuck, only on its way out); ``on_stuck(reason, lost_store)`` ends the process (by
    default: says why on stdout and stderr, then exits with 1)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        *,
        activity: Callable[[], Activity],
        broken: Callable[[], str],
        main_thread: int | None = None,
        on_stuck: Callable[[str, bool], None] | None = None,
        beat_s: float = BEAT_S,
        stuck_exit_wait_s: float = STUCK_EXIT_WAIT_S,
    ) -> None:
        self.store, self.rank = store, rank
        self._activity, self._broken = activity, broken
        self._main_thread = main_thread or threading.main_thread().ident or 0
        self._on_stuck = on_stuck or self._exit_stuck
        self._beat_s, self._stuck_exit_wait_s = beat_s, stuck_exit_wait_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="ddp_verify-spmd", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and join the thread (before the interpreter finalises: a daemon thread still
        inside a store call then would be unwound through C++ and abort the process)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def _watch(self) -> None:
        stuck_since: float | None = None
        while not self._stop.wait(self._beat_s):
            try:
                self.store.add(beat_key(self.rank), 1)
                if self.store.check([f"stack-request/{self.rank}"]):
                    self.store.delete_key(f"stack-request/{self.rank}")
                    self.store.set(f"stack/{self.rank}", self.stack().encode())
                    self.store.set(f"stack-full/{self.rank}", self.stack(full=True).encode())
                if not self._broken() and self.store.check(["broken"]):
                    # The others gave up; a main thread that has not noticed is stuck.
                    stuck_since = stuck_since or time.monotonic()
                    waited = time.monotonic() - stuck_since
                    reported = self.store.check(["ended/0" if self.rank else "ended/any"])
                    if (reported and waited > 2 * self._beat_s) or waited > self._stuck_exit_wait_s:
                        self._on_stuck(read_broken(self.store), False)
                        return
            except RuntimeError:
                # The store is gone (torch raises its store errors as RuntimeErrors): the job
                # is ending. A main thread still busy a while later is stuck, and must not
                # keep the job alive.
                if self._stop.wait(self._stuck_exit_wait_s / 2):
                    return
                self._on_stuck("the job's store went away (the other ranks ended)", True)
                return

    def stack(self, *, full: bool = False) -> str:
        """What the main thread is doing and where, cut to the user's frames unless
        ``full``."""
        frame = sys._current_frames().get(self._main_thread)
        activity = self._activity()
        doing = activity[0] if activity else "nothing (between jobs)"
        since = f" for {time.monotonic() - activity[1]:.1f} s" if activity else ""
        stack = frames.of_stack(frame) if frame is not None else []
        shown = stack if full else frames.user_frames(stack)
        return (
            f"busy with {doing}{since}; its main thread (most recent call last):\n"
            + frames.render(shown)
        )

    def _exit_stuck(self, reason: str, lost_store: bool) -> None:
        import os

        activity = self._activity()
        doing = activity[0] if activity else "its test"
        if self.rank == 0:
            # Rank 0 reports, and its main thread cannot: say here what the others found.
            sys.stdout.write(f"\nddp_verify: the other ranks gave up on rank 0:\n{reason}\n")
        sys.stderr.write(
            f"ddp_verify: rank {self.rank} was still busy with {doing} when the others gave "
            f"up on it; ending this process.\n{self.stack()}\n"
        )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(1)


def request_stacks(store: Any, ranks: Sequence[int], wait_s: float) -> dict[int, tuple[str, str]]:
    """Ask ``ranks``' watchdogs for their main threads' stacks and wait up to ``wait_s`` for
    the answers: each rank's, cut to the user's frames and in full (a rank that does not
    answer in time is left out)."""
    for r in ranks:
        store.set(f"stack-request/{r}", b"1")
    stacks: dict[int, tuple[str, str]] = {}
    until = time.monotonic() + wait_s
    while len(stacks) < len(ranks) and time.monotonic() < until:
        for r in ranks:
            keys = [f"stack/{r}", f"stack-full/{r}"]
            if r not in stacks and store.check(keys):
                cut, full = (store.get(k).decode(errors="replace") for k in keys)
                stacks[r] = (cut, full)
        time.sleep(_POLL_S)
    return stacks
