"""Ports for a store that a launcher started here will listen on, chosen where no other
process's outgoing connection can take them first.

A port found free by binding port 0 comes from the kernel's ephemeral range, the range every
outgoing connection's own port is drawn from too: between its choice and the launched
store's bind (an interpreter's start and torch's import, seconds), any connection on the
machine (a gloo pair of another world, a test's client) may take it, and the store fails with
``EADDRINUSE``. A port below that range is only ever taken by a process that binds it by
number, so a free one stays free unless another chooser draws the same (drawn at random from
thousands: rare, and what :func:`collided` lets a launcher retry).

Example::

    port = free_port()   # then MASTER_PORT=port, --rdzv-endpoint 127.0.0.1:{port}, ...
"""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

__all__ = ["collided", "ephemeral_range", "free_port"]

# The lowest port drawn from: above the registered services most machines run.
_LOWEST = 10000
# Linux's default ephemeral range (macOS's starts at 49152), where the kernel does not say.
_DEFAULT_RANGE = (32768, 60999)
# Independent of the `random` module's state, which tests and hypothesis seed: two processes
# seeded alike must not draw the same ports.
_DRAW = random.SystemRandom()
# What torch's TCPStore (and this project's loopback store) print when the port is taken.
_COLLISION = re.compile(r"EADDRINUSE|Address already in use", re.IGNORECASE)


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default where unsaid).

    Example::

        >>> low, high = ephemeral_range()
        >>> 1024 <= low <= high <= 65535
        True
    """
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_RANGE
    return low, high


def free_port(*, tries: int = 64) -> int:
    """A port no socket holds now, below the ephemeral range (as the module says why); a port
    the kernel picks (bound to port 0) where the range leaves too little room below it.

    Example::

        >>> 1024 <= free_port() <= 65535
        True
    """
    low, _ = ephemeral_range()
    if low - _LOWEST >= 1000:
        for _ in range(tries):
            port = _DRAW.randrange(_LOWEST, low)
            if _bindable(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def collided(output: str) -> bool:
    """Whether a launched run's output says a store found its port taken.

    Example::

        >>> collided("RuntimeError: ... port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE")
        True
        >>> collided("ValueError: no data")
        False
    """
    return _COLLISION.search(output) is not None


def _bindable(port: int) -> bool:
    # Bound as the store will be (SO_REUSEADDR, as torch's TCPStore sets it) and on every
    # interface: a listener on any address of this port is a conflict for torch's own bind.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            sock.listen(1)
        except OSError:
            return False
    return True
