"""The operating-system side of rank processes: start them, read what they print, end them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path

from .forkserver import ForkServer

# The rank imports the package from wherever the controller imported it, installed or not:
# the folder that holds ddp_verify/world/processes.py's package.
# As the fork server's (see forkserver._BOOT): the package root leads sys.path only for the import.
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from ddp_verify.world.rank import main; sys.path.remove({root!r}); main()"
)
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class RankProcess:
    """One rank's process, its two pipes, and the files its output and stack dumps go to.

    Forked from ``server`` when one is given (see :mod:`ddp_verify.world.forkserver`), else
    spawned as a fresh interpreter.
    """

    def __init__(
        self,
        rank: int,
        workdir: Path,
        env: Mapping[str, str],
        *,
        server: ForkServer | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.rank = rank
        self.stdout_path = workdir / f"rank{rank}.stdout"
        self.stderr_path = workdir / f"rank{rank}.stderr"
        self.stack_path = workdir / f"rank{rank}.stacks"
        job_read, job_write = os.pipe()
        result_read, result_write = os.pipe()
        self.jobs = Connection(job_write, readable=False)
        self.results = Connection(result_read, writable=False)
        self._read_from = {"stdout": 0, "stderr": 0, "stacks": 0}
        if server is not None:
            try:
                paths = (str(self.stdout_path), str(self.stderr_path))
                pid = server.fork((job_read, result_write), paths, env, timeout)
            except BaseException:
                self.close_pipes()
                raise
            finally:
                os.close(job_read)
                os.close(result_write)
            self.process: subprocess.Popen[bytes] | ForkedProcess = ForkedProcess(server, pid)
            return
        from_main = threading.current_thread() is threading.main_thread()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            try:
                self.process = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _BOOT.format(root=PACKAGE_ROOT),
                        str(job_read),
                        str(result_write),
                        str(os.getpid()),
                        "1" if from_main else "0",
                    ],
                    pass_fds=(job_read, result_write),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=dict(env),
                    # Its own process group: terminal signals meant for the controller do not
                    # reach it, and killpg() also ends whatever the rank itself started.
                    start_new_session=True,
                )
            finally:
                os.close(job_read)
                os.close(result_write)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    # Output. Files, not pipes: a rank that prints a lot can never block on a full pipe.
    def output_marks(self) -> tuple[int, int]:
        return _size(self.stdout_path), _size(self.stderr_path)

    def output_since(self, marks: tuple[int, int]) -> tuple[str, str]:
        return (
            _text(_read_bytes(self.stdout_path, marks[0])),
            _text(_read_bytes(self.stderr_path, marks[1])),
        )

    def take_new(self, stream: str) -> str:
        """What the rank wrote to ``stdout``, ``stderr`` or ``stacks`` since the last take."""
        path = {"stdout": self.stdout_path, "stderr": self.stderr_path, "stacks": self.stack_path}
        data = _read_bytes(path[stream], self._read_from[stream])
        self._read_from[stream] += len(data)
        return _text(data)

    def request_stack_dump(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)

    def exit_description(self, wait_s: float) -> str:
        """'killed by SIGSEGV', 'exited with code 3', or 'closed its result pipe' if running."""
        try:
            code = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return "closed its result pipe while still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exited with code {code}"

    def close_pipes(self) -> None:
        for conn in (self.jobs, self.results):
            with contextlib.suppress(OSError):
                conn.close()


class ForkedProcess:
    """A rank forked by a fork server, with the bits of ``subprocess.Popen`` this module uses:
    its exit code comes from the server, which is its parent."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid

    @property
    def returncode(self) -> int | None:
        return self.server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
        return code


def collect_stack_dumps(ranks: Iterable[RankProcess], settle_s: float = 1.0) -> dict[int, str]:
    """Signal each rank to dump every thread's stack, then read the dumps once they settle."""
    ranks = list(ranks)
    before = {r.rank: _size(r.stack_path) for r in ranks}
    for r in ranks:
        r.request_stack_dump()
    deadline = time.monotonic() + settle_s
    sizes = dict(before)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {r.rank: _size(r.stack_path) for r in ranks}
        grown = all(now[k] > before[k] for k in now)
        if grown and now == sizes:
            break
        sizes = now
    return {r.rank: r.take_new("stacks") for r in ranks}


def terminate(ranks: Iterable[RankProcess], grace_s: float = 1.0) -> None:
    """SIGTERM each rank's process group, then SIGKILL whatever is left after ``grace_s``."""
    ranks = list(ranks)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for r in ranks:
            if r.process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.pid, sig)
        deadline = time.monotonic() + grace_s
        for r in ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        if all(r.process.returncode is not None for r in ranks):
            break
    for r in ranks:
        r.close_pipes()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_bytes(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
