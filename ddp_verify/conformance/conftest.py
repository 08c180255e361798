"""Fixtures of the conformance suite: the DDP under test and how properties are run."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# Measured facts the tests report, listed at the end of the run (see pytest_terminal_summary).
_FINDINGS = pytest.StashKey[list[str]]()


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
            require(wrapper_factory, ddp_wrapper, kwargs, needs)
        return ddp(wrapper=ddp_wrapper, **kwargs)

    return make


def require(
    factory: Callable[..., Any], label: str | None, kwargs: dict[str, Any], needs: tuple[str, ...]
) -> None:
    """Skip unless ``factory`` takes every keyword in ``kwargs`` and, when it is a class, has
    every attribute in ``needs``."""
    from ddp_verify.methods.ddp import accepts

    ddp_only = {"comm_hook", "hook_state", "zero"}  # the method's, not the wrapper's
    missing = [k for k in kwargs if k not in ddp_only and not accepts(factory, k)]
    if missing:
        pytest.skip(f"the DDP wrapper {label} takes no {', '.join(missing)}")
    if inspect.isclass(factory):
        absent = [n for n in needs if not hasattr(factory, n)]
        if absent:
            pytest.skip(f"the DDP wrapper {label} has no {', '.join(absent)}")


@pytest.fixture
def prove(
    conformance_examples: int, lockstep: Callable[[Any], Any], request: pytest.FixtureRequest
) -> Callable[[st.SearchStrategy[Any], Callable[[Any], None]], None]:
    """``prove(strategy, check)``: ``check`` holds for ``--conformance-examples`` values drawn
    from ``strategy``, or hypothesis shrinks the counterexample and the test fails with it.
    A known torch issue (its mark) is not shrunk: one counterexample shows it, and every
    shrink of a failure that leaves a rank's collectives behind costs a regrouped world (under
    a launcher, the job itself if a rank aborts)."""
    known = request.node.get_closest_marker("known_torch_issue") is not None
    phases = [Phase.explicit, Phase.reuse, Phase.generate] if known else list(Phase)

    def run(strategy: st.SearchStrategy[Any], check: Callable[[Any], None]) -> None:
        @settings(
            max_examples=conformance_examples,
            deadline=None,
            phases=phases,
            # One counterexample, of the kind a known-issue mark expects, not a group of them.
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(strategy)
        def holds(value: Any) -> None:
            check(value)

        # Under torchrun every rank runs this property: in lockstep (a no-op otherwise).
        lockstep(holds)()

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
    from ddp_verify.conformance.known import issue_of, judge

    issue = issue_of(item)
    if issue is not None and report.when == "call":
        import torch

        error = call.excinfo.value if call.excinfo is not None else None
        judge(issue, report, error, torch.__version__)
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found = config.stash.get(_FINDINGS, [])
    if found:
        terminalreporter.section("ddp_verify conformance findings")
        for line in found:
            terminalreporter.write_line(line)
