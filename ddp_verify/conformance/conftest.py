"""Fixtures of the conformance suite: the DDP under test and how properties are run."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ddp_verify.engine import compat

# Measured facts the tests report, listed at the end of the run (see pytest_terminal_summary).
_FINDINGS = pytest.StashKey[list[str]]()
# Per test function (any parameters), the first of its tests whose job reached the job
# time-out: the rest of that function's tests wait a shorter while (_seen_hang_timeout), not
# the whole time-out again at the same place.
_HUNG = pytest.StashKey[dict[str, tuple[str, float]]]()
# The shorter while: a quarter of the time-out, and never under this (a sound job of the suite
# takes a few seconds at most on a loaded 2-core machine).
_SEEN_HANG_FLOOR_S = 5.0


@pytest.fixture(scope="session")
def wrapper_factory(ddp_wrapper: str | None) -> Callable[..., Any] | None:
    """The ``--ddp-wrapper`` callable, imported here so a bad name fails once, clearly."""
    if ddp_wrapper is None:
        return None
    from ddp_verify.methods.ddp import load_wrapper

    try:
        return load_wrapper(ddp_wrapper)
    except ValueError as exc:
        raise pytest.UsageError(f"--ddp-wrapper: {exc}") from None


@pytest.fixture
def data_parallel(
    ddp_wrapper: str | None, wrapper_factory: Callable[..., Any] | None
) -> Callable[..., Any]:
    """``data_parallel(**ddp_kwargs)``: the DDP method under test, torch's DDP or the
    ``--ddp-wrapper``. A wrapper that cannot take a keyword, or lacks a feature a test needs
    (``register_comm_hook`` whenever a ``comm_hook`` is given), skips that test and says
    which."""
    from ddp_verify.methods import ddp

    def make(*, needs: tuple[str, ...] = (), **kwargs: Any) -> Any:
        if wrapper_factory is not None:
            if "comm_hook" in kwargs:
                needs = (*needs, "register_comm_hook")
            require(wrapper_factory, f"the DDP wrapper {ddp_wrapper}", kwargs, needs)
        else:
            # An option of a later release than the installed one is not this torch's to hold.
            import torch
            from torch.nn.parallel import DistributedDataParallel

            require(DistributedDataParallel, f"torch {torch.__version__}'s DDP", kwargs, ())
        return ddp(wrapper=ddp_wrapper, **kwargs)

    return make


def require(
    factory: Callable[..., Any], label: str, kwargs: dict[str, Any], needs: tuple[str, ...]
) -> None:
    """Skip unless ``factory`` takes every keyword in ``kwargs`` and, when it is a class, has
    every attribute in ``needs``."""
    from ddp_verify.methods.ddp import METHOD_OPTIONS, accepts

    missing = [k for k in kwargs if k not in METHOD_OPTIONS and not accepts(factory, k)]
    if missing:
        pytest.skip(f"{label} takes no {', '.join(missing)}")
    if inspect.isclass(factory):
        absent = [n for n in needs if not hasattr(factory, n)]
        if absent:
            pytest.skip(f"{label} has no {', '.join(absent)}")


class _Unshrunk(BaseException):
    """A failure carried out of hypothesis as it is (hypothesis shrinks every ``Exception``):
    a hang, whose every replay would wait out the time-out again, or a known torch issue,
    which one counterexample shows."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)  # in args, so that it pickles (SPMD ranks agree on outcomes)

    @property
    def error(self) -> BaseException:
        return self.args[0]


def _not_applicable(error: BaseException) -> str | None:
    """The reason to skip when the wrapper leaves the test nothing to check: its own comm
    hook leaves no room for the test's, or its options meet a limitation DDP documents."""
    from ddp_verify.methods.ddp import NotApplicable

    raised = [f.exception for f in getattr(error, "failures", ()) or ()]
    if raised and all(isinstance(e, NotApplicable) for e in raised):
        return str(raised[0])
    return None


def _timed_out(error: BaseException) -> bool:
    from ddp_verify.world.errors import FailureKind

    kinds = {f.kind for f in getattr(error, "failures", ()) or ()}
    return bool(kinds & {FailureKind.TIMED_OUT, FailureKind.DEADLOCKED})


def _reached_time_out(error: BaseException) -> bool:
    """A job that waited the whole job time-out (not a deadlock told in seconds)."""
    from ddp_verify.world.errors import FailureKind

    return any(f.kind is FailureKind.TIMED_OUT for f in getattr(error, "failures", ()) or ())


def _seen_hang_timeout(timeout: float) -> float:
    return min(timeout, max(_SEEN_HANG_FLOOR_S, timeout / 4))


def _uneven_counts(scenario: Any) -> bool:
    return any(len({len(sizes) for sizes in step}) > 1 for step in scenario.schedule)


def _accumulates(scenario: Any) -> bool:
    return any(len(sizes) > 1 for step in scenario.schedule for sizes in step)


def _broke_down(error: BaseException) -> bool:
    """The ranks' collectives broke down: a rank died (gloo aborts on a size mismatch) or lost
    its peers. (A hang or a deadlock never gets here: ``holds`` already ends the test on it.)"""
    from ddp_verify.world.errors import Category, FailureKind

    return any(
        f.kind is FailureKind.DIED
        or f.category in (Category.COLLECTIVE_MISMATCH, Category.LOST_PEER)
        for f in getattr(error, "failures", ()) or ()
    )


def _first_run(holds: Callable[[Any], None], values: Sequence[Any]) -> Exception | None:
    """Check ``values`` before hypothesis runs. A hang, a known issue (``_Unshrunk``), a skip,
    and ranks whose collectives broke down (where accumulation that syncs anyway pairs the
    ranks' collectives wrongly: every replay of a shrink would restart the world) end the test
    here; another failure is returned, for hypothesis to meet and shrink."""
    for value in values:
        try:
            holds(value)
        except Exception as exc:
            if type(exc).__module__.startswith("hypothesis"):
                continue  # hypothesis's own control flow (assume(), notes) outside a test
            if _broke_down(exc):
                compat.add_note(
                    exc,
                    "Found by the accumulating scenario the property checks first (not shrunk: "
                    "the ranks' collectives broke down, and every replay would restart them).",
                )
                raise _Unshrunk(exc) from exc
            return exc
    return None


class _NotScenarios(Exception):
    """The strategy draws something other than scenarios: nothing to look for."""


def _accumulating_first(strategy: st.SearchStrategy[Any]) -> list[Any]:
    """A scenario ``strategy`` draws in which the ranks of a step run different numbers of
    micro-batches, or else one in which some rank accumulates; none for a strategy of anything
    else. Checked first, in place of one drawn example (as large as a drawn one, so the run
    takes no longer), so that a regression of accumulation (``no_sync()`` that syncs anyway, a
    dropped micro-batch) fails its test at the first job, not after draws that happen not to
    accumulate. Deterministic, so that every rank of a launched job finds the same one."""
    from hypothesis import Phase, find
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    from ddp_verify.engine.scenario import Scenario

    def scenario(wanted: Callable[[Any], bool]) -> Callable[[Any], bool]:
        def holds(value: Any) -> bool:
            if not isinstance(value, Scenario):
                raise _NotScenarios
            return wanted(value)

        return holds

    searching = settings(
        database=None,
        derandomize=True,
        max_examples=40,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    for wanted in (_uneven_counts, _accumulates):
        try:
            return [find(strategy, scenario(wanted), settings=searching)]
        except _NotScenarios:
            return []
        except (NoSuchExample, Unsatisfiable):
            continue
    return []


@pytest.fixture
def prove(
    conformance_examples: int, lockstep: Callable[[Any], Any], request: pytest.FixtureRequest
) -> Callable[..., None]:
    """``prove(strategy, check, examples=())``: ``check`` holds for ``examples`` (the cases a
    property must never leave to chance, checked first) and for ``--conformance-examples``
    values drawn from ``strategy``, or hypothesis shrinks the counterexample and the test
    fails with it. For a strategy of scenarios, one that accumulates unevenly is checked
    before any drawn one, in place of one of them (see ``_accumulating_first``): where the
    ranks' collectives break down on it, the test ends there.
    The phases are the loaded hypothesis profile's. A failure that matches a known torch
    issue the test is marked with is not shrunk: one counterexample shows it, and every shrink
    of a failure that leaves a rank's collectives behind costs a regrouped world (under a
    launcher, the job itself if a rank aborts). A hang is not shrunk or retried either: the
    first job that outlives ``--ddp-timeout``, or whose ranks are seen deadlocked in
    collectives, fails the test with where each rank waited. Once a test's job has waited out
    the whole job time-out, the other tests of the same function (its other parameters) give
    each job a quarter of it (5 s at least), and say so when they time out too."""
    import torch

    from ddp_verify.conformance.known import issues_of

    world = request.getfixturevalue("world") if "world" in request.fixturenames else None
    backend = getattr(world, "backend", None)
    size = getattr(world, "size", None)
    known = [i for i in issues_of(request.node) if i.applies_to(torch.__version__, backend, size)]
    kind = getattr(request.node, "originalname", request.node.name)
    hung = request.config.stash.setdefault(_HUNG, {})

    def run(
        strategy: st.SearchStrategy[Any],
        check: Callable[[Any], None],
        *,
        examples: Sequence[Any] = (),
    ) -> None:
        def holds(value: Any) -> None:
            try:
                check(value)
            except Exception as exc:
                reason = _not_applicable(exc)
                if reason is not None:
                    # At the test's location, not this line.
                    raise compat.at_test_location(pytest.skip.Exception(reason)) from None
                if _timed_out(exc) or any(i.matches(exc) for i in known):
                    raise _Unshrunk(exc) from exc
                raise

        test = given(strategy)(holds)
        for value in examples:
            test = example(value)(test)
        accumulating = _accumulating_first(strategy)
        test = settings(
            # The accumulating scenario, run first below, stands for one drawn example.
            max_examples=max(1, conformance_examples - len(accumulating)),
            deadline=None,
            phases=settings().phases,
            # One counterexample, of the kind a known-issue mark expects, not a group of them.
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )(test)
        full: float | None = getattr(world, "timeout", None)
        earlier = hung.get(kind)
        short = _seen_hang_timeout(full) if full is not None else None
        shortened = earlier is not None and full is not None and short is not None and short < full
        if shortened:
            world.timeout = short  # type: ignore[union-attr]
        try:
            # A hang or a known issue there ends the test at once; any other failure is left
            # to hypothesis, which meets it again and shrinks it (an explicit example is never
            # shrunk), and is raised as it is only if hypothesis's own draws never do.
            unshrunk = _first_run(holds, accumulating)
            # Under torchrun every rank runs this property: in lockstep (a no-op otherwise).
            lockstep(test)()
            if unshrunk is not None:
                compat.add_note(
                    unshrunk,
                    "Found by the accumulating scenario the property checks first; none of "
                    "the drawn ones failed, so it is not shrunk.",
                )
                raise unshrunk
        except _Unshrunk as failure:
            error = failure.error
            if _reached_time_out(error):
                if earlier is None and full is not None:
                    hung[kind] = (request.node.nodeid, full)
                elif shortened and earlier is not None:
                    compat.add_note(
                        error,
                        f"Not waited out again: {earlier[0]} (the same test, other parameters) "
                        f"already reached the {earlier[1]:g} s job time-out, so this test's "
                        f"jobs had {short:g} s each.",
                    )
            raise error from None
        finally:
            if shortened:
                world.timeout = full  # type: ignore[union-attr]

    return run


@pytest.fixture
def finding(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``finding(text)``: a measured fact the run reports (a tolerance used, an error seen)
    in the terminal summary and in the test's JUnit properties."""

    def record(text: str) -> None:
        request.node.user_properties.append(("finding", text))
        request.config.stash.setdefault(_FINDINGS, []).append(f"{request.node.nodeid}: {text}")

    return record


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "known_torch_issue(issue): the installed torch is known to break this property; a "
        "failure matching the issue's signature reads as xfail, another is a failure (see "
        "ddp_verify.conformance.known)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    from ddp_verify.conformance.known import issues_of, judge

    issues = issues_of(item)
    if issues and report.when == "call":
        import torch

        from ddp_verify.frontends.options import DEFAULT_CONFORMANCE_EXAMPLES

        error = call.excinfo.value if call.excinfo is not None else None
        funcargs = getattr(item, "funcargs", {})
        judge(
            issues,
            report,
            error,
            torch.__version__,
            searched=funcargs.get("conformance_examples"),
            enough=DEFAULT_CONFORMANCE_EXAMPLES,
            backend=getattr(funcargs.get("world"), "backend", None),
            world_size=getattr(funcargs.get("world"), "size", None),
        )
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found = config.stash.get(_FINDINGS, [])
    if found:
        terminalreporter.section("ddp_verify conformance findings")
        for line in found:
            terminalreporter.write_line(line)


@pytest.fixture
def peers(world: Any) -> None:
    """Skips a property about what differs between ranks on a world of one rank, saying so."""
    if world.size < 2:
        pytest.skip(
            "a property of what differs between ranks: needs a world of 2 or more "
            "(--world-size); a world of 1 has nothing to differ"
        )
