"""Every use of pytest's, pytest-xdist's and hypothesis's private internals, in one place.

Where a documented way exists it is used (hypothesis's ``settings(...)(test)`` and
``seed(...)(test)`` to change a test, ``.hypothesis.inner_test`` to wrap its body); what has
none is reached here only, each access checked first, so that a release that moved it fails
at once with what is missing and which version, instead of ranks silently drawing different
examples or a report landing in the wrong place. Nothing here imports pytest or xdist: they are
handed in (a config, an item, an exception), so the engine stays usable without them.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from typing import Any

from ..world.naming import public


@public
class IncompatibleRelease(RuntimeError):
    """A dependency's release no longer has an internal ddp_verify relies on: the harness's
    failure (exit 3), never the code's.

    Example::

        >>> import ddp_verify
        >>> issubclass(ddp_verify.IncompatibleRelease, RuntimeError)
        True
    """


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - always installed
        return "unknown"


def release(package: str) -> tuple[int, ...]:
    """An installed package's release as numbers: ``(6, 131, 1)``."""
    return tuple(int(p) for p in re.findall(r"\d+", _version(package))[:3])


def _missing(package: str, what: str, why: str) -> IncompatibleRelease:
    return IncompatibleRelease(
        f"{package} {_version(package)} has no {what}, which ddp_verify uses to {why}; "
        f"install the {package} release pyproject.toml's range allows that has it, or a "
        "ddp_verify that supports this one (and report it)"
    )


def _require(obj: Any, attribute: str, package: str, what: str, why: str) -> Any:
    if not hasattr(obj, attribute):
        raise _missing(package, what, why)
    return getattr(obj, attribute)


# -- pytest --------------------------------------------------------------------------------


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` on every Python the package supports: ``add_note`` is 3.11's,
    and pytest and hypothesis read ``__notes__`` on 3.10 too.

    Example::

        >>> error = ValueError("bad"); add_note(error, "seen on rank 1"); error.__notes__
        ['seen on rank 1']
    """
    setattr(exc, "__notes__", [*getattr(exc, "__notes__", []), note])  # noqa: B010


def fixture_argnames(item: Any) -> tuple[str, ...]:
    """The fixture names a test function takes itself (not autouse ones, not defaults)."""
    info = _require(
        item, "_fixtureinfo", "pytest", "Function._fixtureinfo", "read a test's own arguments"
    )
    return tuple(_require(info, "argnames", "pytest", "FuncFixtureInfo.argnames", "the same"))


def at_test_location(skip: BaseException) -> BaseException:
    """A ``pytest.skip`` exception raised elsewhere (on a rank, in a helper), made to report
    the test's location rather than the line that raised it."""
    _require(
        skip,
        "_use_item_location",
        "pytest",
        "Skipped._use_item_location",
        "report a skip at the test's location",
    )
    skip._use_item_location = True  # type: ignore[attr-defined]
    return skip


def without_xdist(config: Any) -> bool:
    """Turn pytest-xdist off for this session (each launched rank already is one worker);
    whether it was on."""
    option = config.option
    if not getattr(option, "numprocesses", None):
        return False
    for name in ("dist", "tx"):
        _require(option, name, "pytest-xdist", f"the option {name!r}", "turn xdist off")
    option.numprocesses = None
    option.dist = "no"
    option.tx = []
    return True


def without_junit_xml(config: Any) -> None:
    """No JUnit XML from this process (under a launcher, rank 0 writes the one report)."""
    _require(config.option, "xmlpath", "pytest", "the option 'xmlpath'", "write one report")
    config.option.xmlpath = None


# -- hypothesis ----------------------------------------------------------------------------


def settings_of(test: Callable[..., Any]) -> Any:
    """The settings a ``@given`` test runs with (its own, or the loaded profile's)."""
    return _require(
        test,
        "_hypothesis_internal_use_settings",
        "hypothesis",
        "a @given test's settings attribute",
        "run a test in lockstep",
    )


def set_settings(test: Callable[..., Any], chosen: Any) -> None:
    """Replace a ``@given`` test's settings (``settings(...)(test)`` refuses a test that
    already has some)."""
    settings_of(test)  # checked
    test._hypothesis_internal_use_settings = chosen  # type: ignore[attr-defined]


def seed_of(test: Callable[..., Any]) -> Any:
    """The seed a ``@given`` test was given with ``@seed`` (None if none)."""
    return getattr(test, "_hypothesis_internal_use_seed", None)


def forced_seed() -> int | None:
    """The seed ``--hypothesis-seed`` forces on every test of the session, if any."""
    from hypothesis import core

    return _require(
        core, "global_force_seed", "hypothesis", "core.global_force_seed", "agree on a seed"
    )


def force_seed(seed: int) -> None:
    """Force ``seed`` on every test of the session, as ``--hypothesis-seed`` does."""
    from hypothesis import core

    forced_seed()  # checked
    setattr(core, "global_force_seed", seed)  # noqa: B010 (typed None in hypothesis)


# hypothesis draws constants from the process's local modules from this release on.
LOCAL_CONSTANTS_SINCE = (6, 131, 1)


def without_local_constants() -> None:
    """Stop hypothesis drawing constants from this process's local modules: ranks that
    imported different local modules would draw different examples. Releases before
    :data:`LOCAL_CONSTANTS_SINCE` draw none; a later one without the hook fails loudly."""
    if release("hypothesis") < LOCAL_CONSTANTS_SINCE:
        return
    why = "keep ranks that imported different local modules drawing the same examples"
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        raise _missing("hypothesis", "internal.conjecture.providers", why) from None
    constants = _require(providers, "Constants", "hypothesis", "providers.Constants", why)
    _require(providers, "_get_local_constants", "hypothesis", "its local constants hook", why)
    nothing = constants()
    providers._get_local_constants = lambda: nothing
    # What was drawn from before: the pools it cached per kind of choice.
    cached = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if isinstance(cached, dict):
        cached.clear()
