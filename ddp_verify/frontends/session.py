"""The pytest session running in this process, if any, as ``check()`` sees it: a test that
calls ``ddp_verify.check(fn, kind=...)`` checks on the session's world, at the session's world
size and on its backend and device, unless the call asks for another. The plugin sets it at
configure and clears it at unconfigure; nothing here imports torch.

Example::

    >>> shared = SessionWorld(get=lambda: "the world", size=2, said="--world-size 2")
    >>> shared.get(), shared.size
    ('the world', 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["SessionWorld", "current", "set_current"]


@dataclasses.dataclass(frozen=True)
class SessionWorld:
    """The session's world: ``get()`` returns it (started on first use, shared with the
    ``world`` fixture); ``size`` its ranks; ``said`` how its options were given, for the
    report (``--world-size 2``)."""

    get: Callable[[], Any]
    size: int
    said: str


_current: SessionWorld | None = None


def current() -> SessionWorld | None:
    """The running session's world, or None outside a pytest session."""
    return _current


def set_current(session: SessionWorld | None) -> None:
    """Set (the plugin, at configure) or clear (at unconfigure) the session's world."""
    global _current
    _current = session
