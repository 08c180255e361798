"""``ddp-verify`` run inside the test's own process: for tests whose subject is a verdict, an
option or a report, not the process boundary (exit, imports at start, signals, the terminal).

A command run as a subprocess pays an interpreter, its imports and a fork server that imports
torch: about 4 s of CPU before its first example on this project's 2-core CI machine, which
three dozen such tests paid each. Run here, the command's ranks are forked from this process's
fork server, started once: they are still real rank processes on a real process group; what
is shared is the controller, whose state this module saves and restores around each run.
The tests of the boundary itself (``tests/frontends/test_cli.py``'s start-up, exit, numpy,
terminal and one-JSON-document tests, ``tests/world/test_signals.py``) keep the subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from ddp_verify.world import cleanup

_PACKAGE = str(Path(__file__).resolve().parents[2] / "ddp_verify")


@contextlib.contextmanager
def _restored(cwd: Path | None, env: Mapping[str, str] | None) -> Iterator[None]:
    """The working directory, environment, import path, user modules and signal handlers a
    command may change, as they were."""
    handlers = {s: signal.getsignal(s) for s in (*cleanup.TERMINATING, signal.SIGINT)}
    saved_env = dict(os.environ)
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        os.environ.update(env or {})
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        # The user's files the command imported (by path, or as their neighbours): another
        # test may write a file of the same name with other contents.
        for name in set(sys.modules) - saved_modules:
            module = sys.modules[name]
            origin = getattr(module, "__file__", None) or ""
            if name.startswith("ddp_verify_user_") or not _installed(origin):
                del sys.modules[name]
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _installed(origin: str) -> bool:
    """Whether a module file belongs to an installed package or this project's package (kept
    imported: torch's lazily imported submodules must stay the ones torch holds)."""
    if not origin:
        return True  # built-in and namespace modules
    return origin.startswith((sys.prefix, sys.base_prefix, _PACKAGE))


def ddp_verify_here(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """What ``ddp-verify ARGS`` prints and exits with, run by ``cli.main`` in this process:
    the same result a subprocess would give (``returncode``, ``stdout``, ``stderr``)."""
    from ddp_verify.frontends import cli

    out, err = io.StringIO(), io.StringIO()
    with _restored(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's --help and --version
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(
        ["ddp-verify", *args], code, stdout=out.getvalue(), stderr=err.getvalue()
    )
