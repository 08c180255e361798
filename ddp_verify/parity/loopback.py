"""Loopback-only stores for the layouts ``ddp-verify parity`` starts on this machine.

torch's ``TCPStore`` server listens on every interface whatever host it is given, and both
torchrun's agent (the rendezvous store) and a one-process script (``init_process_group``'s
``env://`` store) start one. Where the environment says so (``DDP_VERIFY_LOOPBACK=1``, which
:mod:`.launch` sets for its own single-machine launches only: a real multi-node job needs its
store reachable), every server a process starts listens on a socket bound to 127.0.0.1,
handed to torch as ``master_listen_fd`` (the public argument for a socket bound already).
gloo's own listeners are kept on loopback by ``GLOO_SOCKET_IFNAME=lo``.

Example (what :mod:`.autorecord` does in each rank and agent)::

    if os.environ.get(ENV_LOOPBACK) == "1":
        install()
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import socket
from typing import Any

import torch.distributed as dist

__all__ = ["ENV_LOOPBACK", "install"]

ENV_LOOPBACK = "DDP_VERIFY_LOOPBACK"
# The modules that bound TCPStore by name at import; the rest look it up on torch.distributed.
_HOLDERS = (
    "torch.distributed",
    "torch.distributed.rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


def install() -> None:
    """Make every ``TCPStore`` server started in this process listen on 127.0.0.1 only."""
    base = dist.TCPStore
    if getattr(base, "_loopback", False):
        return

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        """A ``TCPStore`` whose server, if this process hosts it, listens on loopback."""

        _loopback = True

        def __init__(
            self,
            host_name: str,
            port: int,
            world_size: int | None = None,
            is_master: bool = False,
            timeout: datetime.timedelta = datetime.timedelta(seconds=300),
            wait_for_workers: bool = True,
            multi_tenant: bool = False,
            master_listen_fd: int | None = None,
            use_libuv: bool = True,
        ) -> None:
            if is_master and master_listen_fd is None:
                master_listen_fd = _listening(port)
            super().__init__(
                host_name,
                port,
                world_size,
                is_master,
                timeout,
                wait_for_workers,
                multi_tenant,
                master_listen_fd,
                use_libuv,
            )

    for name in _HOLDERS:
        with contextlib.suppress(ImportError, AttributeError):
            module: Any = importlib.import_module(name)
            if module.TCPStore is base:
                module.TCPStore = LoopbackTCPStore


def _listening(port: int) -> int:
    """A socket bound to 127.0.0.1:``port`` (0: a free one) and listening, its descriptor
    given up to torch, which owns it from then on. A port in use is torch's own error (a
    ``RuntimeError``: the rendezvous then joins as a client, as it does with its own)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(4096)
    except OSError as exc:
        sock.close()
        raise RuntimeError(
            f"the TCPStore server could not listen on 127.0.0.1:{port}: {exc}"
        ) from exc
    return sock.detach()
