"""What the ranks of a launched job exchange through its store, as data: written with
``torch.save``, read with ``torch.load(weights_only=True)`` and an allow-list of ddp_verify's
own data types, so that a value someone else wrote there is parsed, never executed.

A launcher's store listens on the master node's network (torchrun's TCPStore binds every
interface): whoever reaches it could write a rank's key. A pickle read from there would run
what it names; a weights-only read builds tensors, numbers, strings, containers and the data
classes listed here, and refuses anything else with a :class:`WireError` naming the key.

Example::

    store.set(key, dumps(outcome))
    outcome = loads(store.get(key), what=f"rank 1's outcome of {name}")
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import io
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .errors import WorldError

__all__ = ["WireError", "dumps", "dumps_exception", "loads", "loads_exception", "reducer"]

F = TypeVar("F", bound=Callable[..., Any])

# Functions a data class of ours pickles itself through (its __reduce__), allowed by name.
_REDUCERS: list[Callable[..., Any]] = []


class WireError(WorldError):
    """A value in the job's store is not one a rank of this job wrote (or cannot be one)."""


def reducer(fn: F) -> F:
    """Allow ``fn``, a function a data class of ours reduces itself to (it only builds the
    object from plain values), on the wire.

    Example::

        @reducer
        def _unpack_rank_trace(losses, grads, params): ...
    """
    _REDUCERS.append(fn)
    return fn


def dumps(value: Any, *, what: str = "a value") -> bytes:
    """``value`` as bytes another rank can :func:`loads`; :class:`WireError` naming its type
    when it holds something that is not data (a user class, a function).

    Example::

        >>> loads(dumps({"loss": 1.5}))
        {'loss': 1.5}
    """
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        data = buffer.getvalue()
        _load(data)  # what the other ranks will do: refused here, where it is clear why
    except Exception as exc:
        raise WireError(
            f"{what} ({type(value).__name__}) cannot travel between the ranks of a launched "
            f"job: they exchange data only (tensors, numbers, strings, lists, tuples, dicts and "
            f"ddp_verify's own results), never pickled objects ({_reason(exc)})"
        ) from None
    return data


def loads(data: bytes, *, what: str = "a value") -> Any:
    """The value :func:`dumps` wrote; :class:`WireError` for anything else (never run).

    Example::

        loads(store.get("agree/3/1"), what="rank 1's value for 'the seed'")
    """
    try:
        return _load(bytes(data))
    except Exception as exc:
        raise WireError(
            f"{what} in the job's store is not a value ddp_verify wrote ({_reason(exc)}): "
            "someone outside the job may have written to the launcher's store (it listens on "
            "the master node's network; see docs/security.md), or the ranks run "
            "different ddp_verify versions. Nothing was run; the session stops"
        ) from None


@dataclasses.dataclass(frozen=True)
class _PytestOutcome:
    """pytest's skip, xfail and fail exceptions, as data: their class says it lives in
    ``builtins``, so they cannot be written by reference, and are rebuilt by name."""

    name: str
    msg: str | None


def dumps_exception(exc: BaseException) -> bytes | None:
    """``exc`` as bytes, where it is data (its type one of Python's, pytest's outcomes,
    hypothesis's or ddp_verify's, its arguments plain); None otherwise (its traceback text
    travels beside it).

    Example::

        >>> type(loads_exception(dumps_exception(ValueError("no"))))
        <class 'ValueError'>
    """
    outcomes = sys.modules.get("_pytest.outcomes")
    for name in ("Skipped", "XFailed", "Failed"):
        if outcomes is not None and type(exc) is getattr(outcomes, name, None):
            return dumps(_PytestOutcome(name, getattr(exc, "msg", None)))
    try:
        return dumps(exc)
    except WireError:
        return None


def loads_exception(data: bytes | None, *, what: str = "an exception") -> BaseException | None:
    """The exception :func:`dumps_exception` wrote (None for None); :class:`WireError` for
    anything else."""
    if data is None:
        return None
    value = loads(data, what=what)
    if isinstance(value, _PytestOutcome):
        from _pytest import outcomes

        kind = getattr(outcomes, value.name)
        return (
            kind(value.msg, allow_module_level=True) if value.name == "Skipped" else kind(value.msg)
        )
    if not isinstance(value, BaseException):
        raise WireError(f"{what} in the job's store is a {type(value).__name__}, not an exception")
    return value


# torch.serialization.safe_globals swaps a process-wide list in and back out: two threads
# reading at once (a rank's watchdog and its main thread; the tests' thread ranks) would each
# restore the list the other had not added yet, and refuse our own classes.
_LOADING = threading.Lock()


def _load(data: bytes) -> Any:
    with (
        _LOADING,
        torch.serialization.safe_globals(_allowed(_our_modules(), len(_REDUCERS))),
        warnings.catch_warnings(),
    ):
        # torch warns of pickle protocols it does not write: a forged value's, refused anyway.
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(io.BytesIO(data), weights_only=True)


def _reason(exc: BaseException) -> str:
    # torch's message is long and advises loading untrusted files: keep what names the type.
    text = str(exc)
    for line in text.splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line:
            return line.strip().split(" was not an allowed global")[0]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


def _our_modules() -> tuple[tuple[str, int], ...]:
    """Which of our modules are loaded, each by identity: the allow-list is made again when
    one is imported (a diagnosis imports its own) or imported afresh (pytester restores
    ``sys.modules`` after a run; a module imported again holds new classes). A count of
    ``sys.modules`` is not enough: one module in and another out leaves it unchanged."""
    return tuple(
        (name, id(module))
        for name, module in list(sys.modules.items())
        if name.startswith("ddp_verify.") or name == "hypothesis.errors"
    )


@functools.lru_cache(maxsize=1)
def _allowed(modules: tuple[tuple[str, int], ...], reducers: int) -> list[Any]:
    """Python's exceptions (under both names pickle gives them) and ddp_verify's data: its
    data classes, enums, exceptions and tolerances, defined in its modules loaded now. Never
    a class that unpickles what it holds (a shipped job): that would bring pickle back."""
    from .errors import _rebuild_rank_error  # how a RankError travels (errors is below us)

    allowed: list[Any] = [*_REDUCERS, _rebuild_rank_error]
    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            allowed += [value, (value, f"exceptions.{value.__name__}")]
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if name == "hypothesis.errors":
            # Its control flow (an assumption not met) is how every rank leaves an example.
            allowed += [
                v
                for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, BaseException)
            ]
            continue
        if not name.startswith("ddp_verify."):
            continue
        for value in vars(module).values():
            # Defined here, or a public exception (shown as ddp_verify.<Name>, naming.public),
            # wherever it is met: listed twice is harmless.
            if not isinstance(value, type) or value.__module__ not in (name, "ddp_verify"):
                continue
            if getattr(value, "__wire__", None) is False:
                continue
            tolerance = any(c.__module__ == _TOLERANCES for c in value.__mro__)
            if (
                tolerance
                or dataclasses.is_dataclass(value)
                or issubclass(value, (enum.Enum, BaseException))
            ):
                allowed.append(value)
    return allowed


# Where the tolerances live (named, not imported: this layer is below the engine's).
_TOLERANCES = "ddp_verify.engine.tolerances"
