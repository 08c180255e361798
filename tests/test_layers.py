"""The layers of DESIGN.md are folders, and imports only go down them: world <- engine <-
methods <- usercode <- parity <- front ends, with the conformance suite free to use them all. Every
import counts, those inside functions and under TYPE_CHECKING too; and no module imports
itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ddp_verify"
LAYERS = ["world", "engine", "methods", "usercode", "parity", "frontends", "conformance"]
# The package's own modules at its top: the lazy front door, ``python -m`` and the
# documented ``ddp_verify.strategies`` path are front ends.
TOP_LEVEL = "frontends"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[-1] in LAYERS else TOP_LEVEL


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from package import module`` imports the module; ``from module import name``
            # the module that holds the name.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] == "ddp_verify" and t in MODULES)
    found.discard(module)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_every_layer_is_a_folder_with_modules():
    for name in LAYERS:
        assert (PACKAGE / name / "__init__.py").is_file(), name
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "strategies.py"], top


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_only_to_the_same_layer_or_below(module):
    mine = LAYERS.index(layer(module))
    upward = sorted(m for m in GRAPH[module] if LAYERS.index(layer(m)) > mine)
    assert not upward, f"{module} ({layer(module)}) imports from a layer above it: {upward}"


def test_the_world_layer_imports_nothing_else_of_ours():
    for module in MODULES:
        if layer(module) == "world":
            others = sorted(m for m in GRAPH[module] if layer(m) != "world")
            assert not others, f"{module} imports {others}"


def test_there_are_no_import_cycles():
    # Tarjan's strongly connected components: any component of more than one module is a
    # cycle (self-imports were dropped above).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_analysis_sees_imports_of_every_kind():
    # The checks above are only as good as the import finder: relative, absolute, lazy and
    # package-relative imports must all be seen.
    assert "ddp_verify.world.failures" in GRAPH["ddp_verify.world.world"]  # from . import x
    assert "ddp_verify.engine.trace" in GRAPH["ddp_verify.methods.base"]  # from ..engine.trace
    assert "ddp_verify.engine.strategies" in GRAPH["ddp_verify.strategies"]  # from .engine...
    assert "ddp_verify.methods.equivalence" in GRAPH["ddp_verify.frontends.verifying"]  # lazy
