"""What a session leaves behind, and how it still goes when the session is ended: temporary
files named for the process that owns them, removed at exit, on SIGTERM and SIGHUP as on
SIGINT, and by the next session when their owner was killed outright.

Example::

    ends_cleanly()                 # a front end's main process: SIGTERM/SIGHUP exit cleanly
    stop_if_asked()                # before new work: a signal whose exception was lost
    path = tempfile.mkdtemp(prefix=owned("ddp_verify-world4-"))
    remove_abandoned()             # what a SIGKILLed session left
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import NoReturn

# What this package writes to the temporary directory: ddp_verify-world4-<pid>-<random> (a
# world's directory) and ddp_verify-forkserver-<pid>-<random>.log (a fork server's log).
PREFIX = "ddp_verify-"
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def owned(prefix: str) -> str:
    """``prefix`` with this process's pid: the mark :func:`remove_abandoned` reads.

    Example::

        >>> owned("ddp_verify-world4-").startswith("ddp_verify-world4-")
        True
    """
    return f"{prefix}{os.getpid()}-"


def _owner(name: str) -> int | None:
    parts = name[len(PREFIX) :].split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts: not ours to judge).

    Example::

        >>> alive(os.getpid())
        True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_abandoned(directory: str | None = None) -> list[str]:
    """Remove what sessions whose process is gone left in the temporary directory (a
    SIGKILLed controller runs no clean-up); return the names removed. Only names this package
    writes, only of this user, only where the owner pid is dead.

    Example::

        remove_abandoned()  # ['ddp_verify-world4-81234-k2j3.../', ...]
    """
    root = Path(directory or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if not entry.name.startswith(PREFIX):
                continue
            owner = _owner(entry.name)
            if owner is None or alive(owner):
                continue
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid != os.getuid():
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()
                removed.append(entry.name)
    return removed


class Terminated(KeyboardInterrupt):
    """The session was asked to end (SIGTERM, SIGHUP): it stops as on Ctrl-C, through its
    clean-up (pytest ends the session, the command line reports a verdict); ``signum`` says
    which signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


# The terminating signal (SIGTERM, SIGHUP) a front end was asked to end by, once one came. Its
# exception can still be lost after it was raised: code that goes on after ``except
# BaseException`` (in a library, or in the user's code under test), a ``__del__`` or a weakref
# callback (reported as ignored). New work is then refused (stop_if_asked), so that a session
# never runs on to its end. Not SIGINT: a KeyboardInterrupt that code catches is Python's own
# semantics, which a test of the user's Ctrl-C handling relies on.
_asked: int | None = None


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    global _asked
    if signum in TERMINATING:
        _asked = signum
    if _in_gc_callback(frame):
        _later(signum)
        return
    raise _interruption(signum)


# How deep in the interrupted frame's callers a garbage collector's callback is looked for.
_GC_DEPTH = 4
# After how long a signal that arrived inside one is delivered again.
_AGAIN_S = 0.05


def _interruption(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def stop_if_asked() -> None:
    """Raise the terminating signal's exception (SIGTERM, SIGHUP) again if one came and the
    session went on: where new work starts (a job sent to the ranks, a test set up). A no-op
    where no such signal came, after SIGINT (a caught KeyboardInterrupt is the catcher's to
    handle, as in Python), or where :func:`ends_cleanly` was never called (a library's user
    keeps their own handlers).

    Example::

        stop_if_asked()        # before a job is sent: raises Terminated(15) after a SIGTERM
    """
    if _asked is not None:
        raise _interruption(_asked)


def _in_gc_callback(frame: FrameType | None) -> bool:
    """Whether the signal interrupted a garbage collector's callback (hypothesis installs one):
    an exception raised there is reported as "ignored" and lost, and the session would go on
    as if no signal had come."""
    codes = set()
    for callback in gc.callbacks:
        code = getattr(callback, "__code__", None) or getattr(
            getattr(callback, "__func__", None), "__code__", None
        )
        if code is not None:
            codes.add(code)
    depth = 0
    while frame is not None and depth < _GC_DEPTH and codes:
        if frame.f_code in codes:
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def _later(signum: int) -> None:
    """Deliver ``signum`` to this process again shortly, out of the callback."""
    timer = threading.Timer(_AGAIN_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def ends_cleanly() -> None:
    """Make SIGTERM and SIGHUP end this process as SIGINT does, through ``finally`` blocks and
    ``atexit`` (worlds closed, temporary files removed), where nobody else handles them; and
    make none of them, SIGINT included, be lost when it arrives inside a garbage collector's
    callback (where an exception is only reported as ignored). A front end's main process
    calls it; a library never does.

    Example::

        ends_cleanly()
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in TERMINATING:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _exit_cleanly)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_cleanly)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` as the interpreter's own exit would, less its teardown
    of every module: other threads joined, ``atexit`` handlers run (worlds closed, temporary
    files removed, logs flushed), the standard streams flushed, then ``os._exit``. Once torch
    is imported that teardown is about a second of CPU (two once ``torch._dynamo`` is), spent
    on a process whose work is done; objects still alive then are not finalized one by one. A
    front end's command ends with it; a library never does.

    Example::

        exit_now(main())       # where a command would end with sys.exit(main())
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe (``ddp-verify ... | head``) loses the output, not the exit code.
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
