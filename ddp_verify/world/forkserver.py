"""A fork server: one interpreter that has imported torch once, from which ranks are forked.

Importing torch costs seconds of CPU per process; a world of four on two cores paid it four
times at every start and every relaunch, and again for torch's first optimizer (which imports
torch._dynamo). The server pays once per controller: it imports torch (and whatever a world
asks it to preload), stays single-threaded, and forks a rank per request. A forked rank is a
fresh process in every way that matters here: its own session, its own output files, the pipes
its controller made, Python's ``random`` reseeded.

The server reaps its children and reports their exit codes, so the controller can still say
"rank 1 died: killed by SIGSEGV". It dies with the controller (parent-death signal and a
``getppid`` check), and its ranks die with it.

Linux only (elsewhere, and with ``DDP_VERIFY_FORK_SERVER=0``, ranks are spawned as before).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import cleanup

# The package root leads sys.path only while ddp_verify itself is imported: for an installed
# package it is site-packages, which must not come before what PYTHONPATH puts first (a
# patched torch under test, a module hidden from the ranks).
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from ddp_verify.world.forkserver import serve; sys.path.remove({root!r}); serve()"
)
_MESSAGE_BYTES = 1 << 16
_PARENT_CHECK_S = 0.5


class ForkServerError(Exception):
    """The fork server could not start or stopped answering; ranks are spawned instead."""


_disabled: str | None = None


def enabled() -> bool:
    """Whether ranks are forked from a fork server in this process."""
    return (
        _disabled is None
        and sys.platform.startswith("linux")
        and os.environ.get("DDP_VERIFY_FORK_SERVER") != "0"
    )


def why_spawned() -> str | None:
    """Why ranks of this process are spawned rather than forked from a fork server, or None
    when they are forked.

    Example::

        why_spawned()   # "DDP_VERIFY_FORK_SERVER=0", or how the fork server failed
    """
    if _disabled is not None:
        return f"the fork server failed: {_disabled.strip().splitlines()[-1]}"
    if not sys.platform.startswith("linux"):
        return f"no fork server on {sys.platform}"
    if os.environ.get("DDP_VERIFY_FORK_SERVER") == "0":
        return "DDP_VERIFY_FORK_SERVER=0"
    return None


def disable(reason: str) -> None:
    """Spawn ranks from now on in this process: the fork server failed (``reason`` says how)."""
    global _disabled
    _disabled = reason


class ForkServer:
    """The controller's handle on one fork server (one per distinct rank environment)."""

    def __init__(self, env: Mapping[str, str], package_root: str) -> None:
        self._lock = threading.RLock()
        self._exits: dict[int, int] = {}
        self._replies: list[tuple[Any, ...]] = []
        self._dead = False
        self._requested: set[str] = set()
        self._pending_preloads = 0
        self._env = dict(env)
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (kept for the server's life)
            prefix=cleanup.owned("ddp_verify-forkserver-"), suffix=".log", delete=False
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        from_main = threading.current_thread() is threading.main_thread()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BOOT.format(root=package_root),
                    str(theirs.fileno()),
                    str(os.getpid()),
                    "1" if from_main else "0",
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                env=dict(env),
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._sock = ours

    # -- requests ------------------------------------------------------------------------------

    def request_preload(self, modules: Sequence[str]) -> None:
        """Have the server import ``modules`` before it forks again; do not wait."""
        wanted = [m for m in modules if m not in self._requested]
        if not wanted:
            return
        with self._lock:
            # Where the controller imports from now (collection may have added the tests'
            # directories): the server looks there too.
            self._send(("preload", wanted, list(sys.path)))
            self._requested.update(wanted)
            self._pending_preloads += 1

    def preload(self, modules: Sequence[str], timeout: float) -> None:
        """Have the server import ``modules`` (once each), and wait until it has."""
        self.request_preload(modules)
        with self._lock:
            while self._pending_preloads:
                reply = self._reply("preloaded", timeout)
                self._pending_preloads -= 1
                if reply[1]:
                    raise ForkServerError(f"the fork server could not preload:\n{reply[1]}")

    def fork(
        self,
        pipes: tuple[int, int],
        paths: tuple[str, str],
        env: Mapping[str, str],
        timeout: float,
    ) -> int:
        """A new rank process; returns its pid. ``pipes`` (the rank's ends of its job and
        result pipes) are handed over; ``paths`` become its stdout and stderr; ``env`` its
        environment."""
        # Only what differs from the server's own start-up environment travels: a whole
        # environment can outgrow one datagram.
        changed = {k: v for k, v in env.items() if self._env.get(k) != v}
        removed = [k for k in self._env if k not in env]
        with self._lock:
            self._send(("fork", list(paths), changed, removed), pipes)
            return self._reply("forked", timeout)[1]

    def exit_code(self, pid: int) -> int | None:
        """The rank's exit code (negative: the signal that killed it); None while it runs."""
        with self._lock:
            self._drain(0.0)
            return self._exit_of(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                code = self._exit_of(pid)
                if code is not None:
                    return code
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                step = 0.05 if remaining is None else min(remaining, 0.05)
                if self._dead:
                    time.sleep(min(step, 0.01))  # no report will come: watch the pid itself
                else:
                    self._drain(step)

    def close(self) -> None:
        """Stop the server; ranks forked from it die with it (their parent-death signal)."""
        self._dead = True
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2.0)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)

    @property
    def alive(self) -> bool:
        return not self._dead and self.process.poll() is None

    # -- internals -----------------------------------------------------------------------------

    def _exit_of(self, pid: int) -> int | None:
        if pid in self._exits:
            return self._exits[pid]
        if self._dead and not cleanup.alive(pid):
            return -signal.SIGKILL  # died with its server, whose report never came
        return None

    def _send(self, message: tuple[Any, ...], fds: Sequence[int] = ()) -> None:
        if self._dead:
            raise ForkServerError(self._why_dead())
        try:
            socket.send_fds(self._sock, [pickle.dumps(message)], list(fds))
        except OSError as exc:
            self._dead = True
            raise ForkServerError(self._why_dead()) from exc

    def _reply(self, tag: str, timeout: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while True:
            for i, reply in enumerate(self._replies):
                if reply[0] == tag:
                    return self._replies.pop(i)
                if reply[0] == "failed":
                    self._dead = True
                    raise ForkServerError(f"the fork server failed:\n{reply[1]}")
            if self._dead:
                raise ForkServerError(self._why_dead())
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ForkServerError(f"the fork server did not answer within {timeout:g} s")
            self._drain(remaining)

    def _drain(self, wait: float) -> None:
        """Read every message that arrives within ``wait`` seconds (at least those waiting)."""
        if self._dead:
            return
        readable, _, _ = select.select([self._sock], [], [], wait)
        while readable:
            try:
                data = self._sock.recv(_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                self._dead = True
                return
            message = pickle.loads(data)
            if message[0] == "exited":
                self._exits[message[1]] = message[2]
            else:
                self._replies.append(message)
            readable, _, _ = select.select([self._sock], [], [], 0)

    def _why_dead(self) -> str:
        code = self.process.poll()
        log = Path(self._log.name).read_text(errors="replace")[-4000:]
        state = "is not answering" if code is None else f"exited with code {code}"
        return f"the fork server {state}" + (f":\n{log}" if log.strip() else "")


# -- the server process ------------------------------------------------------------------------


def serve(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    sock = socket.socket(fileno=int(argv[1]))
    controller = int(argv[2])
    boot_env = dict(os.environ)  # before torch's imports add to it
    if argv[3] == "1" and sys.platform.startswith("linux"):
        _set_parent_death_signal()
    if os.getppid() != controller:
        os._exit(1)
    try:
        import warnings

        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch
        import torch.distributed  # noqa: F401

        from . import rank  # noqa: F401

        _assert_single_threaded()
    except BaseException:
        _send(sock, ("failed", traceback.format_exc()))
        os._exit(1)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        readable, _, _ = _select([sock, wake_read], _PARENT_CHECK_S)
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        _reap(sock)
        if os.getppid() != controller:
            os._exit(0)  # the controller is gone: our ranks follow by their parent-death signal
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)  # the controller closed its end
        message = pickle.loads(data)
        if message[0] == "preload":
            _send(sock, ("preloaded", _preload(message[1], message[2] if len(message) > 2 else [])))
        elif message[0] == "fork":
            env = {**boot_env, **message[2]}
            for key in message[3]:
                env.pop(key, None)
            _fork(sock, (wake_read, wake_write), message[1], env, fds)


def _fork(
    sock: socket.socket,
    wake: tuple[int, int],
    paths: list[str],
    env: dict[str, str],
    fds: list[int],
) -> None:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # The rank's main() reads: job fd, result fd, the parent to die with, and whether
            # its parent-death signal can be armed (it can: we are the server's only thread).
            argv = ["rank", str(fds[0]), str(fds[1]), str(os.getppid()), "1"]
            _become_rank(sock, wake, argv, paths, env)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    _send(sock, ("forked", pid))


def _become_rank(
    sock: socket.socket,
    wake: tuple[int, int],
    argv: list[str],
    paths: list[str],
    env: dict[str, str],
) -> None:
    """In the child: shed the server's state, take the rank's files, run the rank."""
    import random

    from . import rank

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    for fd in wake:
        os.close(fd)
    os.setsid()  # its own process group, as a spawned rank has: killpg() reaches it alone
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for target, path in zip((1, 2), paths, strict=True):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)
    random.seed()  # a spawned process would seed itself from the OS
    rank.main(argv)


def _preload(modules: list[str], paths: Sequence[str] = ()) -> str:
    """Import ``modules`` here, so that every rank forked later has them. One that does not
    import is left to the ranks, which import their preloads themselves and report a failure
    as theirs (a fork server that gave up would spawn every later rank of the session)."""
    import importlib

    sys.path.extend(p for p in paths if p not in sys.path)
    for name in modules:
        # Any failure of the user's module is the ranks' to report (see above).
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    try:
        _assert_single_threaded()
    except RuntimeError as exc:
        return str(exc)
    return ""


def _assert_single_threaded() -> None:
    # fork() copies one thread: a lock another thread held would stay locked in every rank.
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = threading.active_count()
    if tasks != 1:
        raise RuntimeError(f"the fork server has {tasks} threads after its imports; it must have 1")


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _select(fds: list[Any], timeout: float) -> tuple[list[Any], list[Any], list[Any]]:
    try:
        return select.select(fds, [], [], timeout)
    except InterruptedError:
        return [], [], []
    except OSError as exc:
        if exc.errno == errno.EINTR:
            return [], [], []
        raise


def _send(sock: socket.socket, message: tuple[Any, ...]) -> None:
    with contextlib.suppress(OSError):
        sock.send(pickle.dumps(message))


def _set_parent_death_signal() -> None:
    # Where libc cannot be loaded, the server's own check of its parent still ends it.
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# -- one server per interpreter set-up, per controller -----------------------------------------

SetUp = tuple[str, str, tuple[tuple[str, str], ...]]
_servers: dict[SetUp, ForkServer] = {}
_servers_lock = threading.Lock()
# Variables read before a fork can change them: by the interpreter as it starts (PYTHON*),
# the dynamic loader (LD_*), the OpenMP and BLAS runtimes as torch loads them, and torch itself
# as it imports (TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported, TORCH_LOGS
# by torch._logging, ...). Every other variable (PYTEST_CURRENT_TEST, a test's own) is applied
# in the rank after the fork, so it never calls for another server.
_SET_UP_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "CUDA_")
_SET_UP_TORCH_PREFIXES = ("TORCH", "PYTORCH")
# Variables torch sets in its own environment as it imports (torch._dynamo sets the first):
# they change the controller's environment without changing what the ranks need.
_SET_BY_TORCH = frozenset({"TORCHINDUCTOR_CACHE_DIR"})


def set_up(env: Mapping[str, str], package_root: str) -> SetUp:
    """What a fork server's imports depend on: the interpreter, where ddp_verify is imported
    from, and the variables read before a fork (see ``_SET_UP_PREFIXES``).

    Example::

        >>> set_up({"PYTEST_CURRENT_TEST": "t.py::a (call)"}, "/src")[2]
        ()
    """
    prefixes = _SET_UP_PREFIXES + _SET_UP_TORCH_PREFIXES
    read = sorted(
        (k, v) for k, v in env.items() if k.startswith(prefixes) and k not in _SET_BY_TORCH
    )
    return sys.executable, package_root, tuple(read)


def server_for(env: Mapping[str, str], package_root: str) -> ForkServer:
    """The fork server for ranks of this interpreter set-up (see :func:`set_up`), started if
    there is none alive: one for a whole session, however the rest of the environment varies.

    A forked rank gets exactly ``env`` as its environment: what differs from the server's own
    start-up environment travels with each fork request."""
    key = set_up(env, package_root)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive:
            if server is not None:
                server.close()
            server = _servers[key] = ForkServer(env, package_root)
            if len(_servers) == 1:
                import atexit

                atexit.register(close_all)
        return server


def close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
