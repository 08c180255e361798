"""Telling a collective mismatch from a slow job, without waiting out the time-out.

Ranks that called different collectives, or different numbers of them (a ``no_sync()`` that
does not hold, a collective only some ranks reach), wait for each other for ever: gloo notices
nothing until its own time-out. On CPU worlds such a wait has a shape no working job has:
every rank still running sits in torch's collective code (``torch.distributed``, DDP's
reducer under autograd's backward) and uses no CPU at all, while any rank that could still
come to its aid has finished the job. A rank that computes, sleeps in its own code or waits on
anything else is never taken for it.

:class:`DeadlockWatch` samples the unfinished ranks' CPU time (``/proc/PID/stat``, the
process's threads together); once none of them has used any for :data:`IDLE_S`, it asks for
their stacks and reads where each main thread waits.

Example::

    watch = DeadlockWatch(enabled=True)
    ...  # now and then, while ranks are unfinished:
    if watch.idle(unfinished) and all_in_collectives(collect_stack_dumps(unfinished), unfinished):
        ...  # a collective mismatch: report it now
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence

from .processes import RankProcess

# How long every unfinished rank must have used no CPU before its stack is read.
IDLE_S = 3.0
# At most this many clock ticks (1/100 s on Linux) of CPU in that time count as none: a
# blocked rank's threads still wake now and then.
IDLE_TICKS = 2
# After stacks that showed no mismatch, how long before they are read again.
RECHECK_S = 10.0

# Where a rank's innermost frame is when it waits on other ranks: torch's collectives and
# process groups, DDP and its comm hooks, and autograd's backward (DDP's reducer all-reduces
# from autograd's hooks and waits for them at the end of the backward).
_COLLECTIVE_CODE = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/")
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line \d+ in (?P<name>.*)$')
# The rank's job loop: the thread whose stack holds it runs the job.
_JOB_LOOP = f"{os.sep}ddp_verify{os.sep}world{os.sep}"


_HAS_PROC = os.path.exists("/proc/self/stat")


def cpu_ticks(pid: int) -> int | None:
    """User and system clock ticks the process (all its threads) has used; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields follow the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def waits_in_collective(dump: str) -> bool:
    """Whether the job's thread of a ``faulthandler`` dump (most recent call first) waits
    in torch's collective code."""
    threads: list[list[str]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (frame := _FRAME.match(line)):
            threads[-1].append(frame["file"])
    jobs = [files for files in threads if any(_JOB_LOOP in f for f in files)]
    if not jobs:
        return False
    innermost = jobs[-1][0] if jobs[-1] else ""
    return any(part in innermost for part in _COLLECTIVE_CODE)


class DeadlockWatch:
    """Watches the unfinished ranks of one job (see the module text). ``enabled`` is False
    where no such reading is sound: no ``/proc``, or ranks on GPUs (a rank waiting for its
    kernels uses no CPU either)."""

    def __init__(self, *, enabled: bool, idle_s: float = IDLE_S) -> None:
        self.enabled = enabled and _HAS_PROC
        self.idle_s = idle_s
        self._last: dict[int, int] = {}
        self._idle_since: float | None = None
        self._not_before = 0.0

    def idle(self, ranks: Sequence[RankProcess]) -> bool:
        """Call now and then while ``ranks`` are unfinished: True once none of them has used
        any CPU for ``idle_s`` (and the last look at their stacks is long enough ago)."""
        if not self.enabled or not ranks:
            return False
        now = time.monotonic()
        ticks = {r.rank: cpu_ticks(r.pid) for r in ranks}
        if any(t is None for t in ticks.values()):
            self._reset(now)  # a rank ended: its death is reported as such
            return False
        moved = any(
            r not in self._last or ticks[r] - self._last[r] > IDLE_TICKS  # type: ignore[operator]
            for r in ticks
        )
        if moved or self._idle_since is None:
            self._last = dict(ticks)  # type: ignore[arg-type]
            self._idle_since = now
            return False
        return now - self._idle_since >= self.idle_s and now >= self._not_before

    def not_a_deadlock(self) -> None:
        """The stacks showed some rank outside collectives: look again later, not at once."""
        self._reset(time.monotonic())
        self._not_before = time.monotonic() + RECHECK_S

    def _reset(self, now: float) -> None:
        self._last, self._idle_since = {}, None


def all_in_collectives(dumps: Mapping[int, str], ranks: Sequence[RankProcess]) -> bool:
    """Whether every one of ``ranks`` waits in torch's collective code, by its stack dump."""
    return all(waits_in_collective(dumps.get(r.rank, "")) for r in ranks)
