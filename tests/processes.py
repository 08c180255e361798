"""Helpers to look at real processes from tests (Linux /proc, no extra dependency)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable


def default_sigint() -> None:
    """A ``preexec_fn`` that gives the child SIGINT's default disposition: a shell's
    background job inherits SIGINT ignored, and a Python started so never raises
    KeyboardInterrupt, which tests of Ctrl-C rely on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its parent's wait counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """Wait until every pid has exited; return those still alive after ``timeout``."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def descendants(pid: int) -> list[int]:
    """Every living process whose ancestry leads to ``pid``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found
