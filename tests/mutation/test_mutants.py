"""Every conformance test is proven able to fail: each regression of :mod:`tests.mutation.mutants`
is injected into a real conformance session (its ranks and its own process, where the reference
is computed) and must be caught by the test named for it, with the property's own failure (an
equivalence failure or the property's assertion), not a crash or a time-out; with no mutant
active, the same tests pass."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.mutation.mutants import MUTANTS, PatchDoesNotApply, _resolve, _source_patch

ROOT = Path(__file__).resolve().parents[2]
# What a property says when it does not hold: the harness's verdict, or the check's assertion.
PROPERTY_FAILURES = {"EquivalenceError", "AssertionError"}
CONFORMANCE = (
    "test_comm_hooks",
    "test_data",
    "test_ddp_options",
    "test_differentiable_collectives",
    "test_fused_optimizer",
    "test_model_averaging",
    "test_fsdp",
    "test_join",
    "test_object_collectives",
    "test_optimizers",
    "test_zero",
)
AREAS = {
    "comm hooks",
    "PowerSGD",
    "DDP",
    "Join",
    "ZeRO",
    "DistributedSampler",
    "fully_shard",
    "object collectives",
    "optimizer",
    "checkpointing",
    "differentiable collectives",
    "model averaging",
}


def run_mutants(pytester: pytest.Pytester, *args: str, timeout: float = 600) -> list[dict]:
    """A conformance session at world size 2 with the mutants' dispatchers in every rank;
    returns each mutant's (or unmutated) run of its catching test."""
    results = pytester.path / "mutation.json"
    pytester.runpytest_subprocess(
        "--pyargs",
        "ddp_verify.conformance",
        "-p",
        "tests.mutation.plugin",
        "--ddp-preload",
        "tests.mutation.rank_patches",
        "--world-size",
        "2",
        "--ddp-timeout",
        "30",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
        "--mutation-results",
        str(results),
        *args,
        timeout=timeout,
    )
    return json.loads(results.read_text())


@pytest.fixture
def mutation_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The ranks import tests.mutation from the checkout.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_the_catalogue_covers_every_area_and_names_real_tests() -> None:
    assert len(MUTANTS) >= 20
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.area for m in MUTANTS} == AREAS
    # Read, not imported: the suite's modules are collected by pytest, not this session.
    package = ROOT / "ddp_verify" / "conformance"
    tests = {
        node.name
        for module in CONFORMANCE
        for node in ast.parse((package / f"{module}.py").read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    unknown = [m.caught_by for m in MUTANTS if m.catcher_function not in tests]
    assert not unknown, f"mutants name tests the suite does not have: {unknown}"


def test_every_mutant_is_torchs_own_source_with_its_lines_changed() -> None:
    # The honesty rule: what runs under a mutant is the function it names, recompiled from
    # torch's file with the regression's lines edited, never a stand-in of ours.
    for mutant in MUTANTS:
        owner, attribute = _resolve(mutant.target)
        original = inspect.unwrap(
            owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        )
        assert getattr(mutant.make, "changes", None), f"{mutant.name} is not a _source_patch"
        made = mutant.make(original)
        patched = inspect.unwrap(made)
        assert patched.__code__.co_filename == original.__code__.co_filename, mutant.name
        assert patched.__code__.co_name == original.__code__.co_name, mutant.name
        # Compared as syntax trees: a change that only re-spaces a line is no regression.
        before = ast.dump(ast.parse(textwrap.dedent(inspect.getsource(original))))
        after = ast.dump(ast.parse(made.__patched_source__))
        assert before != after, f"{mutant.name}: its patch leaves {original.__qualname__} as it was"


def test_a_source_patch_refuses_a_line_the_function_lacks_and_keeps_super_working() -> None:
    class Base:
        def greet(self) -> str:
            return "base"

    class Child(Base):
        def greet(self) -> str:
            word = super().greet()
            return word + "!"

    with pytest.raises(PatchDoesNotApply, match="0 times, not once"):
        _source_patch("return word + '?'", "return word")(Child.greet)
    # Child.greet closes over __class__ (zero-argument super()): the patch must too.
    patched = _source_patch('return word + "!"', 'return word + "?"')(Child.greet)
    assert patched(Child()) == "base?"


def test_the_conformance_page_lists_every_mutant_with_its_catching_test() -> None:
    page = (ROOT / "docs" / "conformance.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| [^|]+ \| [^|]+ \| `([^`]+)` \|$", page, re.M))
    assert rows == {m.name: m.caught_by for m in MUTANTS}


def test_every_mutant_is_caught_by_its_named_test_as_a_property_failure(
    pytester: pytest.Pytester, mutation_env: None
) -> None:
    results = run_mutants(pytester, "--mutants", "all")
    seen = Counter(r["mutant"] for r in results)
    assert seen == Counter(m.name for m in MUTANTS), "each mutant runs exactly once"
    escaped = [
        f"{r['mutant']} ({r['test']}): {r['when']} {r['outcome']} {r['error']}: {r['message']}"
        for r in results
        if r["when"] != "call" or r["outcome"] != "failed" or r["error"] not in PROPERTY_FAILURES
    ]
    assert not escaped, "mutants not caught as a property's failure:\n" + "\n".join(escaped)


def test_the_catching_tests_pass_with_the_dispatchers_in_place_and_no_mutant(
    pytester: pytest.Pytester, mutation_env: None
) -> None:
    # Otherwise a dispatcher that broke torch would make every mutant look caught. (Three
    # scenarios each: the dispatchers' transparency, not the properties; tox runs those.)
    results = run_mutants(pytester, "--mutants", "none", "--conformance-examples", "3")
    catchers = {m.caught_by for m in MUTANTS}
    assert len(results) == len(catchers)
    failed = [
        f"{r['test']}: {r['error']}: {r['message']}" for r in results if r["outcome"] != "passed"
    ]
    assert not failed, "\n".join(failed)


def test_a_no_sync_regression_elsewhere_in_the_suite_ends_as_that_tests_failure(
    pytester: pytest.Pytester, mutation_env: None
) -> None:
    # no_sync() as a no-op under accumulation: the ranks all-reduce different numbers of
    # times. The test must end, failed and named, within the job time-out: not shrunk, not
    # retried, not an outer time-out (the subprocess's own limit is far above one job's).
    results = run_mutants(
        pytester,
        "--mutants",
        "no_sync_does_nothing",
        "--mutants-against",
        "test_ddp_option_keeps_training_equivalent[defaults]",
        timeout=300,
    )
    (result,) = results
    assert (
        result["test"] == "test_ddp_option_keeps_training_equivalent[no_sync_does_nothing-defaults]"
    )
    assert (result["when"], result["outcome"]) == ("call", "failed")
    assert result["error"] in {"RankError", "EquivalenceError"}, result
