"""How the user sees what the package names: an option, as the front end in use spells it;
an exception, under the package's own name.

Layers below the front ends name parameters (``device``, ``debug``); whichever front end runs
(the pytest plugin, the command line) says how its users spell them, so that advice reads
``--ddp-device cpu`` under pytest, ``--device cpu`` on the command line and ``device='cpu'``
from Python (the spelling when no front end has said otherwise).

Example::

    raise WorldError(f"... or pass {option('device', 'cpu')}")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

# A spelling: a flag (``--ddp-device``; a value follows it, ``True`` is the flag alone) or
# a function of the value.
Spelling = str | Callable[[Any], str]

_spellings: Mapping[str, Spelling] = {}

E = TypeVar("E", bound=type[BaseException])


def public(cls: E) -> E:
    """Show the exception ``cls`` as ``ddp_verify.<Name>``, the name it is imported by (each
    is one of :data:`ddp_verify.__all__`), rather than the module that defines it: tracebacks,
    pytest's summary lines and ``repr`` name it so, and pickles find it there.

    Example::

        >>> @public
        ... class SomethingWrong(Exception): ...
        >>> SomethingWrong.__module__
        'ddp_verify'
    """
    cls.__module__ = "ddp_verify"
    return cls


_UNSET = object()


def option(name: str, value: Any = _UNSET) -> str:
    """How the user sets parameter ``name`` (to ``value``) in the front end in use.

    Example::

        >>> with spelled_as({}):
        ...     option("device", "cpu")
        "device='cpu'"
        >>> with spelled_as({"device": "--device"}):
        ...     option("device", "cpu")
        '--device cpu'
    """
    spelling = _spellings.get(name)
    if spelling is None:
        return name if value is _UNSET else f"{name}={value!r}"
    if callable(spelling):
        return spelling(value)
    if value is _UNSET or value is True:
        return spelling
    return f"{spelling} {value}"


@contextlib.contextmanager
def spelled_as(spellings: Mapping[str, Spelling]) -> Iterator[None]:
    """Within the block, messages spell options as ``spellings`` say (a front end's flags);
    parameters it does not name keep Python's spelling."""
    global _spellings
    before = _spellings
    _spellings = spellings
    try:
        yield
    finally:
        _spellings = before


def current() -> Mapping[str, Spelling]:
    """The spellings in use (what a world sends its ranks, so that messages made there read
    as the controller's front end spells them)."""
    return _spellings


def speak_as(spellings: Mapping[str, Spelling]) -> Callable[[], None]:
    """:func:`spelled_as` for a front end whose session has no block to run in (the pytest
    plugin between ``pytest_configure`` and ``pytest_unconfigure``); returns the undo."""
    global _spellings
    before = _spellings
    _spellings = spellings

    def undo() -> None:
        global _spellings
        _spellings = before

    return undo
