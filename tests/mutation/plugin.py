"""A pytest plugin for a conformance-suite session that runs every mutant against the test
named to catch it (``-p tests.mutation.plugin``, with ``--ddp-preload
tests.mutation.rank_patches``).

Each catching test is parametrized by its mutants; the ``ddp_mutant`` fixture makes one active
for the test's duration (the ranks and this process read it on every call); every other test is
deselected.
Hypothesis does not shrink here (one counterexample is the proof) and draws the same examples
every run. ``--mutation-results PATH`` writes each run's outcome and exception as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import Phase, settings

from tests.mutation.mutants import BY_NAME, MUTANT_FILE_ENV, MUTANTS, Mutant, install

_results_key = pytest.StashKey[list[dict[str, Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mutation", "torch regressions injected into the session and its ranks")
    group.addoption(
        "--mutants",
        default="all",
        help="comma-separated mutant names, all, or none (the catching tests, nothing injected)",
    )
    group.addoption(
        "--mutants-against",
        default=None,
        metavar="TEST[PARAMS]",
        help="run the chosen mutants against this test instead of the ones named to catch them",
    )
    group.addoption("--mutation-results", default=None, help="write the outcomes here as JSON")


def pytest_configure(config: pytest.Config) -> None:
    settings.register_profile(
        "mutation",
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
    )
    settings.load_profile("mutation")
    handle, path = tempfile.mkstemp(prefix="ddp_verify-mutant-")
    os.close(handle)
    os.environ[MUTANT_FILE_ENV] = path  # before any world starts: the ranks inherit it
    # Here too, where the reference is computed and the single-process properties run.
    install()
    config.stash[_results_key] = []


def _chosen(config: pytest.Config) -> list[str]:
    wanted = config.getoption("mutants")
    if wanted == "none":
        return []
    if wanted == "all":
        return [m.name for m in MUTANTS]
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise pytest.UsageError(f"--mutants: no mutant named {', '.join(unknown)}")
    return names


def _catcher(config: pytest.Config, mutant: Mutant) -> tuple[str, str]:
    """(test function, parameters' id) the mutant runs against."""
    against = config.getoption("mutants_against")
    if against:
        mutant = dataclasses.replace(mutant, caught_by=against)
    return mutant.catcher_function, mutant.catcher_params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ddp_mutant" not in metafunc.fixturenames:
        return
    function = metafunc.function.__name__
    if metafunc.config.getoption("mutants") == "none":
        if any(_catcher(metafunc.config, m)[0] == function for m in MUTANTS):
            metafunc.parametrize("ddp_mutant", [None], indirect=True, ids=["unmutated"])
        return
    config = metafunc.config
    names = [n for n in _chosen(config) if _catcher(config, BY_NAME[n])[0] == function]
    if names:
        metafunc.parametrize("ddp_mutant", names, indirect=True, ids=names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "ddp_mutant" not in callspec.params:
            drop.append(item)
            continue
        name = callspec.params["ddp_mutant"]
        own = name or "unmutated"
        others = "-".join(i for i in callspec.id.split("-") if i != own)
        function = getattr(item, "originalname", item.name)
        catchers = [_catcher(config, m) for m in ([BY_NAME[name]] if name else MUTANTS)]
        (keep if (function, others) in catchers else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(autouse=True)
def ddp_mutant(request: pytest.FixtureRequest) -> Generator[str | None, None, None]:
    """The mutant active in the ranks while this test runs (None outside mutation runs)."""
    name = getattr(request, "param", None)
    path = os.environ[MUTANT_FILE_ENV]
    with open(path, "w") as f:
        f.write(name or "")
    try:
        yield name
    finally:
        with open(path, "w") as f:
            f.write("")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if "ddp_mutant" in params and (report.when == "call" or report.outcome != "passed"):
        name = params["ddp_mutant"]
        error = call.excinfo.value if call.excinfo is not None else None
        item.config.stash[_results_key].append(
            {
                "mutant": name or "",
                "test": item.name,
                "when": report.when,
                "outcome": report.outcome,
                "error": type(error).__name__ if error is not None else None,
                "message": str(error).strip().splitlines()[0][:300] if error is not None else "",
            }
        )
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("mutation_results")
    if path:
        with open(path, "w") as f:
            json.dump(session.config.stash[_results_key], f, indent=1)
    os.unlink(os.environ[MUTANT_FILE_ENV])
