"""Each layout's run: the user's command started by its launcher (see :mod:`.launchers`) in a
session of its own, the recorder installed in every rank, bounded in time, nothing left
running after it.

Example::

    run = launch(Layout(2, 2), ["train.py", "--grad-accum", "2"], directory, steps=3)
    run.returncode, run.seconds
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..world.ports import collided, free_port
from .launchers import DEFAULT_LAUNCHER, Launcher, parse_launcher
from .layouts import Layout, LayoutError, fill
from .loopback import ENV_LOOPBACK
from .recorder import ENV_DIR, ENV_DTYPE, ENV_LAYOUT, ENV_PERTURB, ENV_PIECES, ENV_STEPS

__all__ = ["DEFAULT_LAUNCHER", "Run", "first_failure", "launch", "script_of"]

# Interpreters a command may start with: the script follows.
_PYTHONS = ("python", "python3", os.path.basename(sys.executable))


@dataclasses.dataclass(frozen=True)
class Run:
    """One layout's run: its exit code (None when it outlasted its time), how long it took,
    where its recording and its output went."""

    layout: Layout
    command: tuple[str, ...]
    returncode: int | None
    seconds: float
    directory: Path

    @property
    def output(self) -> str:
        """What the ranks printed, as a failure is read: where the ranks' lines are marked
        (``[rank1]: ...``, as torch prints a rank's uncaught exception), the rank that failed
        first (torchrun's first observed failure, else the one whose error is not another
        rank's going away) with its whole traceback, then each other rank's last line;
        otherwise the last lines before the launcher said a rank failed (torchrun's own
        traceback and summary after it say nothing of the script), or the last lines."""
        path = self.directory / "output.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        told = first_failure(lines)
        if told is not None:
            return told
        failed = next((i for i, line in enumerate(lines) if "failed (exitcode" in line), None)
        if failed is not None:
            return "\n".join(lines[max(0, failed - 40) : failed + 1])
        return "\n".join(lines[-40:])


# A rank's line as torch marks it, and what a rank says when another went away first.
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_FOLLOW_ON = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|timed out|"
    r"Watchdog caught collective operation timeout|ProcessGroup.*(abort|shut)",
    re.IGNORECASE,
)


def first_failure(lines: Sequence[str]) -> str | None:
    """The rank that failed first and its whole traceback, then the others' last lines, from
    the lines a run printed; None where no rank's lines are marked.

    Example::

        >>> print(first_failure(["[rank0]: RuntimeError: Connection closed by peer",
        ...                      "[rank1]: Traceback (most recent call last):",
        ...                      "[rank1]: ValueError: no data"]))
        rank 1 failed first:
        Traceback (most recent call last):
        ValueError: no data
        then, after it:
        rank 0: RuntimeError: Connection closed by peer
    """
    by_rank: dict[int, list[str]] = {}
    for line in lines:
        match = _RANK_LINE.match(line)
        if match:
            by_rank.setdefault(int(match[1]), []).append(match[2])
    if not by_rank:
        return None
    first = _root_cause(lines, by_rank)
    own = by_rank[first]
    starts = [i for i, line in enumerate(own) if line.startswith("Traceback")]
    told = [f"rank {first} failed first:", *own[starts[-1] if starts else 0 :]]
    others = [f"rank {r}: {rows[-1]}" for r, rows in sorted(by_rank.items()) if r != first]
    if others:
        told += ["then, after it:", *others]
    return "\n".join(told)


def _root_cause(lines: Sequence[str], by_rank: dict[int, list[str]]) -> int:
    """The rank torchrun observed failing first (its summary's root cause, or its first
    "failed ... local_rank" line), else the first whose last line is no follow-on error."""
    text = "\n".join(lines)
    cause = re.search(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", text, re.S)
    if cause and int(cause[1]) in by_rank:
        return int(cause[1])
    failed = re.search(r"failed \(exitcode: -?\d+\) local_rank: (\d+)", text)
    if failed and int(failed[1]) in by_rank and len(by_rank) > 1:
        candidate = int(failed[1])
        if not _FOLLOW_ON.search(by_rank[candidate][-1]):
            return candidate
    for rank, rows in sorted(by_rank.items()):
        if not _FOLLOW_ON.search(rows[-1]):
            return rank
    return min(by_rank)


def script_of(command: Sequence[str]) -> list[str]:
    """The script and its arguments from the user's command (``python train.py ...``,
    ``train.py ...`` or ``python -m pkg.train ...``); :class:`LayoutError` otherwise.

    Example::

        >>> script_of(["python", "train.py", "--lr", "0.1"])
        ['train.py', '--lr', '0.1']
    """
    parts = list(command)
    if parts and os.path.basename(parts[0]) in _PYTHONS:
        parts = parts[1:]
    if not parts:
        raise LayoutError("no command after --: give the script, e.g. -- python train.py ...")
    if parts[0] == "-m" and len(parts) >= 2:
        return parts
    if parts[0].startswith("-") or not parts[0].endswith(".py"):
        raise LayoutError(
            f"{shlex.join(command)}: give the training script as it runs on one process, "
            "python SCRIPT.py ARGS or python -m MODULE ARGS (ddp-verify starts the launcher)"
        )
    return parts


def launch(
    layout: Layout,
    command: Sequence[str],
    directory: Path,
    *,
    steps: int,
    global_batch: int | None = None,
    float64: bool = True,
    launcher: str | Launcher = DEFAULT_LAUNCHER,
    timeout: float = 600.0,
    perturb: int | None = None,
    pieces: Sequence[int] = (),
    perturb_dtype: str | None = None,
    nnodes: int = 1,
    ports: Callable[[], int] = free_port,
) -> Run:
    """Run ``command`` at ``layout``, recording ``steps`` optimizer steps into ``directory``;
    at most ``timeout`` seconds, after which the run's whole process group is ended.
    ``perturb``: the rounding-only variant of the run (see :mod:`.recorder`), by a unit
    roundoff of ``perturb_dtype`` where given (the parameters' own otherwise). ``launcher``:
    a :class:`~.launchers.Launcher` or ``--launcher``'s text. ``nnodes``: the nodes a layout
    of more than one rank spans (torchrun, accelerate and fabric then start one agent per node
    on this machine; srun and a template of the user's are given ``{nnodes}`` and
    ``{nproc_per_node}`` and start them). ``pieces``: the context-parallel degrees of the
    layouts this run is held against (the reference's run), whose pieces of each sequence
    the recorder fingerprints too. ``ports``: where each start's port comes from; a
    start whose store found its port taken (another process bound it first) is made again on
    the next, up to three times."""
    script = fill(script_of(command), layout, global_batch=global_batch, nnodes=nnodes)
    if not isinstance(launcher, Launcher):
        launcher = parse_launcher(launcher)
    directory.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        ENV_DIR: str(directory),
        ENV_STEPS: str(steps),
        ENV_DTYPE: "float64" if float64 else "native",
        ENV_LAYOUT: str(layout),
    }
    if pieces:
        env[ENV_PIECES] = ",".join(str(d) for d in sorted(set(pieces)))
    if perturb is not None:
        env[ENV_PERTURB] = f"{perturb}:{perturb_dtype}" if perturb_dtype else str(perturb)
    if launcher.local:
        # One machine: the stores the launcher's agents and the ranks serve on loopback only
        # (see .loopback), gloo's and NCCL's connections too, as the forked worlds' are.
        env[ENV_LOOPBACK] = "1"
        if sys.platform.startswith("linux"):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    started = time.monotonic()
    deadline = started + timeout
    for attempt in range(1, _STARTS + 1):
        starts, added = launcher.commands(
            layout, nnodes, port=ports(), run_id=f"ddp-verify-{os.getpid()}-{layout}-{attempt}"
        )
        argvs = [(*start, *script) for start in starts]
        returncode = _run(argvs, {**env, **added}, directory / "output.log", deadline)
        # A store that found its port taken by another process (see world.ports): the run
        # never began; started again on another port, its recordings (if any) gone.
        if returncode in (0, None) or attempt == _STARTS:
            break
        if not collided((directory / "output.log").read_text(errors="replace")):
            break
        for stale in directory.glob("rank*.pt"):
            stale.unlink()
    return Run(layout, tuple(argvs[0]), returncode, time.monotonic() - started, directory)


# How many times a run whose store found its port taken is started (each on a fresh port).
_STARTS = 3


def _run(
    argvs: Sequence[Sequence[str]], env: dict[str, str], log: Path, deadline: float
) -> int | None:
    """Start ``argvs`` together, their output to ``log``; the first non-zero exit code, 0, or
    None where they outlast ``deadline``. Every process they started is ended after."""
    with open(log, "wb") as output:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            # One agent per node where the nodes are simulated here, each in a session of its
            # own: every one is ended, with all it started, whatever happens.
            for argv in argvs:
                procs.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            codes = [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
            return next((c for c in codes if c), 0)
        except subprocess.TimeoutExpired:
            return None
        finally:
            for proc in procs:
                _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End the run's process group: politely, then by force (a rank that did not leave)."""
    for signum, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            if signum is signal.SIGTERM and not _group_alive(proc.pid):
                return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
