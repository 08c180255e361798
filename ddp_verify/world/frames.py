"""Which frames of a rank's traceback or stack dump are the user's, and how they read.

pytest cuts a failing test's traceback to the test's own frames; a rank's traceback and a stuck
rank's stack are cut the same way. Hidden, unless the report is asked for in full
(``--full-trace``):

- frames of this layer (``ddp_verify/world/``: the rank's job loop, the fork server, the SPMD
  runner) and the ``python -c`` line that starts a rank: they only deliver the job;
- frames of functions that set ``__tracebackhide__`` (pytest's convention, for users' helpers
  too);
- the frames that lead to the user's code: the harness's (the plugin's test runner, the
  check's training loop and adapters), pytest's, pluggy's and hypothesis's, up to the next
  frame of anything else (the user's code, or torch calling it back). The conformance suite
  is tests, so its frames are the user's.

Harness frames that the user's code called and that failed stay, as does a traceback with no
frame of the user's at all: the failure is then the harness's, and they are the evidence.

Frames read as Python prints them, source line included: a stack dump comes from
``faulthandler`` (file, line and function only) and gets its source lines here.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
import traceback
import types
from collections.abc import Iterable, Sequence
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
# The layers that run the user's code; ``conformance`` (tests) is not among them.
_HARNESS_DIRS = tuple(f"{_PACKAGE / name}/" for name in ("engine", "methods", "usercode"))
_HARNESS_DIRS += (f"{_PACKAGE / 'frontends'}/", f"{_PACKAGE / '__init__.py'}")
_DISPATCH_DIR = f"{_PACKAGE / 'world'}/"
# What runs a test before it reaches the user's code (under a launcher, or in a
# pytest-xdist worker), and what starts a thread before its target runs.
_RUNNERS = (
    "/_pytest/",
    "/pluggy/",
    "/hypothesis/",
    "/xdist/",
    "/execnet/",
    "/pytest/__main__",
    "<frozen runpy>",
    "/runpy.py",
    "/threading.py",
)
# Where console scripts (``pytest``, ``ddp-verify``) live: their one frame starts the runner.
_SCRIPT_DIRS = ("bin", "Scripts")
# A rank process's first line: ``python -c "from ddp_verify.world.rank import main; main()"``.
_BOOTSTRAP = "<string>"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame: where it is, and whether it asked to be hidden (``__tracebackhide__``)."""

    filename: str
    lineno: int
    name: str
    hides_itself: bool = False

    @property
    def delivers_job(self) -> bool:
        bootstrap = self.filename == _BOOTSTRAP and self.name == "<module>"
        return self.filename.startswith(_DISPATCH_DIR) or bootstrap

    @property
    def is_harness(self) -> bool:
        """A frame of the layers that run the user's code (the check's loop, the plugin)."""
        return self.filename.startswith(_HARNESS_DIRS)

    @property
    def leads_to_user(self) -> bool:
        """A frame of the harness or of a runner (pytest, its console script, a thread's
        start), which calls the user's code."""
        return (
            self.is_harness
            or any(part in self.filename for part in _RUNNERS)
            or (self.name == "<module>" and Path(self.filename).parent.name in _SCRIPT_DIRS)
        )

    def render(self) -> str:
        line = f'  File "{self.filename}", line {self.lineno}, in {self.name}\n'
        source = linecache.getline(self.filename, self.lineno).strip()
        return line + (f"    {source}\n" if source else "")


def user_frames(frames: Sequence[Frame]) -> list[Frame]:
    """``frames`` (oldest first) without the ones the module docstring hides: each run of
    harness and runner frames that leads to a frame of other code goes. A run that leads
    nowhere (the user's code called the harness, which failed; or no user frame at all) stays
    from its first harness frame: the failure is the harness's, and those are the evidence.
    A run of runners alone (a thread's start beside the rank's watchdog) has nothing to show."""
    kept: list[Frame] = []
    run: list[Frame] = []
    for frame in frames:
        if frame.delivers_job or frame.hides_itself:
            continue
        if frame.leads_to_user:
            run.append(frame)
        else:
            kept.append(frame)
            run = []
    first_harness = next((i for i, f in enumerate(run) if f.is_harness), len(run))
    return kept + run[first_harness:]


def of_traceback(tb: types.TracebackType | None) -> list[Frame]:
    """The frames of a traceback, oldest first."""
    return [_frame(frame, lineno) for frame, lineno in traceback.walk_tb(tb)]


def of_stack(frame: types.FrameType | None) -> list[Frame]:
    """The frames of a live stack (another thread's, say), from its outermost frame to
    ``frame``."""
    return [_frame(f, lineno) for f, lineno in reversed(list(traceback.walk_stack(frame)))]


def _frame(frame: types.FrameType, lineno: int | None) -> Frame:
    # A function that assigns __tracebackhide__ hides itself; the value is not read. Reading
    # ``f_locals`` would copy the locals of a frame still running (the one that caught the
    # exception) into a dict that holds the exception: a cycle that keeps the traceback, and
    # the process group its frames hold, alive past destroy_process_group(). For another
    # thread's running frames it would not be safe at all.
    code = frame.f_code
    hides = "__tracebackhide__" in code.co_varnames
    return Frame(code.co_filename, lineno or 0, code.co_name, hides)


def render(frames: Iterable[Frame]) -> str:
    """Frames as a traceback shows them (oldest first), each with its source line."""
    return "".join(f.render() for f in frames)


def format_exception(exc: BaseException, *, full: bool = False) -> str:
    """The traceback as Python prints it, cut to the user's frames unless ``full``; the
    exception's chain is left out (the rank's own handling is not the user's business)."""
    frames = of_traceback(exc.__traceback__)
    if not full:
        frames = user_frames(frames)
    head = "Traceback (most recent call last):\n" + render(frames) if frames else ""
    return head + "".join(traceback.format_exception_only(type(exc), exc))


# faulthandler's lines: a thread's header, then one line per frame, most recent first.
_THREAD = re.compile(r"^(?:(Current thread|Thread) (0x[0-9a-f]+)[^:]*|Stack[^:]*):\s*$")
_DUMPED_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')


def format_dump(dump: str, *, full: bool = False) -> str:
    """A ``faulthandler`` dump of every thread, rewritten as tracebacks read (oldest frame
    first, source lines included) and cut to the user's frames unless ``full``. A thread
    left with no frame (the rank's own watchdog) is left out; with several threads left, each
    is headed by faulthandler's name for it."""
    threads: list[tuple[str, list[Frame], list[str]]] = []
    for line in dump.splitlines():
        header = _THREAD.match(line)
        dumped = _DUMPED_FRAME.match(line)
        if header or not threads:
            label = f"{header.group(1)} {header.group(2)}" if header and header.group(1) else ""
            threads.append((label, [], []))
        if dumped:
            threads[-1][1].insert(
                0, Frame(dumped["file"], int(dumped["line"]), dumped["name"].strip())
            )
        elif not header and line.strip():
            threads[-1][2].append(line.strip())  # "<no Python frame>", "...": kept as said
    kept = [(label, f if full else user_frames(f), notes) for label, f, notes in threads]
    kept = [(label, f, notes) for label, f, notes in kept if f or (full and notes)]
    blocks = []
    for label, frames, notes in kept:
        head = f"{label}:\n" if label and len(kept) > 1 else ""
        blocks.append(head + render(frames) + "".join(f"  {n}\n" for n in notes))
    return "\n".join(blocks)
