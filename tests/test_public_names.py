"""Every exception a user can meet is importable from ``ddp_verify`` and shown under that name:
what pytest prints, what ``repr`` says and what a pickle holds is ``ddp_verify.<Name>``, never
the module that happens to define it."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest

import ddp_verify

PACKAGE = Path(ddp_verify.__file__).resolve().parent
# Caught inside the package before a user could meet them, each with where.
INTERNAL = {
    "Late": "world.agreement: a wait's deadline, turned into WorldBroken or OutOfStep",
    "ForkServerError": "world.forkserver: said as a WorldStartError",
    "WireError": "world.wire: a store value that is not data, said as a WorldError",
    "NotApplicable": "methods.ddp: a method that does not apply, skipped by the caller",
    "_CodeFailed": "usercode.search: carries a rank failure out of hypothesis",
    "_HarnessFailed": "usercode.search: carries the harness's failure out of hypothesis",
    "_Unshrunk": "conformance.conftest: stops a search",
    "_NotScenarios": "conformance.conftest: a strategy's misuse, said as a test's error",
    "Terminated": "world.cleanup: a signal, said as the verdict 'terminated'",
}


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every class the package defines whose bases name an exception."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "conformance" and path.name.startswith("test_"):
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception", "Failed")))
                or (isinstance(b, ast.Name) and b.id in {"WorldError", "KindError", "Exception"})
                or (isinstance(b, ast.Attribute) and b.attr.endswith("Error"))
                for b in node.bases
            ):
                found.append((module, node.name))
    return found


CLASSES = exception_classes()


def test_the_walk_finds_the_exceptions():
    names = {name for _, name in CLASSES}
    assert {"NotEquivalent", "KindError", "RankError", "LayoutError", "Late"} <= names


@pytest.mark.parametrize(("module", "name"), CLASSES, ids=[n for _, n in CLASSES])
def test_every_exception_a_user_can_meet_is_public(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, BaseException)
    if name in INTERNAL:
        assert name not in ddp_verify.__all__
        return
    assert name in ddp_verify.__all__, f"{module}.{name} is not importable from ddp_verify"
    assert getattr(ddp_verify, name) is cls
    assert cls.__module__ == "ddp_verify", f"{name} is shown as {cls.__module__}.{name}"
    assert pickle.loads(pickle.dumps(cls)) is cls  # found again by its public name


@pytest.mark.parametrize("name", ["EquivalenceError", "KindError", "HarnessError", "LayoutError"])
def test_a_public_exception_crosses_the_wire_between_ranks_as_itself(name):
    # Launched ranks agree on what each raised through the store (world.wire); the exception
    # is found by its public name there too, not read as text (a RankFailed).
    from ddp_verify.world import wire

    cls = getattr(ddp_verify, name)
    again = wire.loads_exception(wire.dumps_exception(cls("what it says")))
    assert type(again) is cls and str(again) == "what it says"
