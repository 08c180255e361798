"""Which conformance tests call a function of torch: measured once, so that a mutant runs only
the tests that can see it.

A mutant swaps one function's code (:mod:`tests.mutation.generated_patch`). A test that never
calls that function runs exactly what it runs on unmodified torch, and passes: only the tests
that call it can kill the mutant. So the suite runs once on unmodified torch with every
function a mutant may change *marked*: its own code with one statement first that records the
call, and the test running when it was made, in whichever process and thread makes it (a rank,
a comm hook's callback on a backend's thread, the session's own process). The test running is
a counter the session's process writes into a shared page before each test (its setup, call
and teardown) and clears after; the ranks read it. A call made while no test runs (the
collection, the session's start) reaches every test.

That run is also the baseline: the suite must pass on unmodified torch, or no mutant's outcome
would mean anything. Its result is cached per world size under ``.cache/mutation-reach``,
keyed by torch's version and the sources of the suite and of the marked functions.

Imported by every rank and by the session's own process (``--ddp-preload`` and ``-p``) when
``DDP_VERIFY_REACH_MARKS`` names the marks (a JSON list of ``module``, ``qualname``,
``source``); inert without it.
"""

from __future__ import annotations

import ast
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import pytest

MARKS_ENV = "DDP_VERIFY_REACH_MARKS"
# The global a marked function reaches this module by.
GLOBAL = "__ddp_verify_reach__"
OUT_ENV = "DDP_VERIFY_REACH_OUT"
# The counter's value while no test runs.
OUTSIDE = 0
_CLOCK = "clock"
_TESTS = "tests.tsv"

_seen: set[tuple[str, int]] = set()
_page: mmap.mmap | None = None
_log: Any = None
_log_pid = 0
_next_test = 0


def compiling() -> bool:
    """Whether dynamo is tracing: ``torch.compiler.is_compiling`` once marks are installed."""
    return False


def marked(function: ast.FunctionDef, key: str) -> str:
    """The source of ``function`` without its decorators, a call to :func:`hit` with ``key``
    made first (after its docstring), outside code dynamo compiles: what :func:`install` puts
    in place of its code. It reaches this module by :data:`GLOBAL`, which :func:`install`
    puts in the function's globals: dynamo cannot trace ``__import__``, and a call it cannot
    trace breaks the graph (a comm hook under compiled autograd then runs eagerly, and the
    future it returns is never waited on).

    Example::

        >>> tree = ast.parse("def f(x):\\n    '''Doc.'''\\n    return x")
        >>> print(marked(tree.body[0], "m:f"))
        def f(x):
            \"\"\"Doc.\"\"\"
            if not __ddp_verify_reach__.compiling():
                __ddp_verify_reach__.hit('m:f')
            return x
    """
    trial = ast.parse(ast.unparse(function)).body[0]
    assert isinstance(trial, ast.FunctionDef)
    call = ast.parse(f"if not {GLOBAL}.compiling():\n    {GLOBAL}.hit({key!r})").body
    body = trial.body
    docstring = (
        bool(body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    trial.body = body[:1] + call + body[1:] if docstring else call + body
    trial.decorator_list = []
    return ast.unparse(ast.fix_missing_locations(trial))


def hit(key: str) -> None:
    """Record that the function ``key`` ran during the test now running (once per test and
    process: a log line, flushed at once, so that a rank killed later loses nothing)."""
    global _log, _log_pid
    index = _current()
    if (key, index) in _seen:
        return
    _seen.add((key, index))
    if _log is None or _log_pid != os.getpid():  # a forked child writes its own log
        out = os.environ.get(OUT_ENV)
        if not out:
            return
        _log = open(Path(out) / f"calls-{os.getpid()}.tsv", "a", buffering=1)  # noqa: SIM115
        _log_pid = os.getpid()
    _log.write(f"{key}\t{index}\n")


def _current() -> int:
    global _page
    if _page is None:
        out = os.environ.get(OUT_ENV)
        clock = Path(out) / _CLOCK if out else None
        if clock is None or not clock.exists():
            return OUTSIDE
        with open(clock, "r+b") as f:
            _page = mmap.mmap(f.fileno(), 8)
    return int(struct.unpack_from("<q", _page, 0)[0])


def _set(index: int) -> None:
    _current()
    if _page is not None:
        struct.pack_into("<q", _page, 0, index)


def install() -> None:
    """Every mark ``$DDP_VERIFY_REACH_MARKS`` names, in place (nothing without it); a mark
    whose code cannot take the function's place is left out (a mutant of that function could
    not be installed either)."""
    path = os.environ.get(MARKS_ENV)
    if not path:
        return
    import sys

    import torch

    from tests.mutation.generated_patch import compiled

    global compiling
    compiling = torch.compiler.is_compiling  # dynamo folds it to True: no note in a graph
    for mark in json.loads(Path(path).read_text()):
        try:
            target, code = compiled(mark)
        except (ValueError, KeyError, AttributeError, SyntaxError, TypeError, ImportError):
            continue
        if not getattr(target, "_reach_mark", False):
            target.__globals__[GLOBAL] = sys.modules[__name__]
            target.__code__ = code
            target._reach_mark = True


def key_of(item: Any) -> str:
    """A test's name as :func:`reached` and the selection use it: its module and its name
    (parameters included), the same wherever the suite is run from."""
    return f"{item.module.__name__}::{item.name}"


# -- as a pytest plugin in the session's own process ------------------------------------------


def pytest_configure(config: Any) -> None:
    out = os.environ.get(OUT_ENV)
    if out and os.environ.get(MARKS_ENV):
        (Path(out) / _CLOCK).write_bytes(struct.pack("<q", OUTSIDE))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> None:
    global _next_test
    out = os.environ.get(OUT_ENV)
    if not (out and os.environ.get(MARKS_ENV)):
        return
    _next_test += 1
    with open(Path(out) / _TESTS, "a") as f:
        f.write(f"{_next_test}\t{key_of(item)}\n")
    _set(_next_test)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if os.environ.get(OUT_ENV) and os.environ.get(MARKS_ENV):
        _set(OUTSIDE)


def reached(out: Path) -> dict[str, list[str] | None]:
    """What a marked run wrote under ``out``: each function that ran, with the tests that
    called it (None where it ran while no test was running: every test may reach it)."""
    tests = {}
    if (out / _TESTS).exists():
        for line in (out / _TESTS).read_text().splitlines():
            index, name = line.split("\t", 1)
            tests[int(index)] = name
    calls: dict[str, set[str] | None] = {}
    for log in out.glob("calls-*.tsv"):
        for line in log.read_text().splitlines():
            key, _, index = line.rpartition("\t")
            if not key:
                continue
            if int(index) == OUTSIDE or int(index) not in tests:
                calls[key] = None
            elif calls.get(key, set()) is not None:
                calls.setdefault(key, set()).add(tests[int(index)])  # type: ignore[union-attr]
    return {k: None if v is None else sorted(v) for k, v in calls.items()}


install()
