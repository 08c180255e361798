"""Mutation operators over torch's Python source: each finds, in one function's syntax tree,
the places it can change, and makes the changed function's source for one of them. Nothing is
chosen by hand: a mutant is (module, function, operator, place), sampled by
:mod:`tests.mutation.generated`.

Operators (the regressions that get out of data-parallel code): a comparison's boundary, a sum
for a mean (and back), a keyword that passes an argument on dropped, a dictionary key swapped
for another of the function's keys, a divisor taken from the world instead of the group, an
iteration reversed, an argument ignored for its default, an arithmetic operator swapped, an
integer constant off by one.

Example::

    >>> import ast
    >>> tree = ast.parse("def f(a, n=2):\\n    return a.sum() / n if a > 0 else a")
    >>> [site.operator for site in sites(tree.body[0])][:3]
    ['comparison', 'sum-mean', 'ignored-argument']
"""

from __future__ import annotations

import ast
import dataclasses
import pickle
from collections.abc import Callable, Iterator

__all__ = ["OPERATORS", "Site", "mutated", "sites"]

_BOUNDARY: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
}  # fmt: skip
_ARITHMETIC: dict[type, type] = {ast.Div: ast.Mult, ast.Mult: ast.Div, ast.Add: ast.Sub,
                                 ast.Sub: ast.Add}  # fmt: skip
_REDUCTIONS = {"sum": "mean", "mean": "sum"}
_GROUP_SIZES = {"get_world_size", "size"}


@dataclasses.dataclass(frozen=True)
class Site:
    """One place an operator can change: its operator, the index of the node among the
    function's nodes (``ast.walk`` order), the line, and what the change is, in words."""

    operator: str
    index: int
    line: int
    change: str


def _params_with_defaults(function: ast.FunctionDef) -> dict[str, ast.expr]:
    args = function.args
    positional = args.posonlyargs + args.args
    found = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults) :]],
                     args.defaults, strict=True))  # fmt: skip
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if default is not None:
            found[arg.arg] = default
    return found


def _keys(function: ast.FunctionDef) -> list[str]:
    return sorted(
        {
            node.slice.value
            for node in ast.walk(function)
            if isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        }
    )


def _describe(node: ast.AST) -> str:
    try:
        return ast.unparse(node)[:80]
    except Exception:
        return type(node).__name__


# Each operator: (name, does it apply to this node in this function, change the node in place
# and say how). The node is a copy inside a copied function.
Apply = Callable[[ast.AST, ast.FunctionDef], str | None]


def _comparison(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _BOUNDARY:
        before = _describe(node)
        node.ops[0] = _BOUNDARY[type(node.ops[0])]()
        return f"{before} -> {_describe(node)}"
    return None


def _sum_mean(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _REDUCTIONS
    ):
        before = _describe(node)
        node.func.attr = _REDUCTIONS[node.func.attr]
        return f"{before} -> {_describe(node)}"
    return None


def _dropped_keyword(node: ast.AST, function: ast.FunctionDef) -> str | None:
    # A keyword that passes an argument of the same name on: f(..., group=group).
    if isinstance(node, ast.Call):
        for i, keyword in enumerate(node.keywords):
            value = keyword.value
            if keyword.arg and isinstance(value, ast.Name) and value.id == keyword.arg:
                before = _describe(node)
                del node.keywords[i]
                return f"{before} -> {_describe(node)}"
    return None


def _dictionary_key(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        others = [k for k in _keys(function) if k != node.slice.value]
        if others:
            before = _describe(node)
            node.slice = ast.Constant(others[0])
            return f"{before} -> {_describe(node)}"
    return None


def _world_divisor(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _GROUP_SIZES
        and (node.args or node.keywords)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("dist", "torch", "c10d")
    ):
        before = _describe(node)
        node.args, node.keywords = [], []
        return f"{before} -> {_describe(node)}"
    return None


def _reversed(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if isinstance(node, ast.For):
        before = _describe(node.iter)
        node.iter = ast.Call(
            ast.Name("reversed", ast.Load()),
            [ast.Call(ast.Name("list", ast.Load()), [node.iter], [])],
            [],
        )
        return f"for ... in {before} -> reversed(list(...))"
    return None


def _ignored_argument(node: ast.AST, function: ast.FunctionDef) -> str | None:
    defaults = _params_with_defaults(function)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in defaults:
        default = defaults[node.id]
        if isinstance(default, ast.Constant) and default.value is not None:
            _replace(function, node, ast.Constant(default.value))
            return f"argument {node.id} ignored for its default {default.value!r}"
    return None


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put ``new`` where ``old`` is in ``tree``."""
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return


def _arithmetic(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITHMETIC:
        before = _describe(node)
        node.op = _ARITHMETIC[type(node.op)]()
        return f"{before} -> {_describe(node)}"
    return None


def _off_by_one(node: ast.AST, function: ast.FunctionDef) -> str | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        before = node.value
        node.value = before + 1
        return f"{before} -> {before + 1}"
    return None


OPERATORS: dict[str, Apply] = {
    "comparison": _comparison,
    "sum-mean": _sum_mean,
    "dropped-keyword": _dropped_keyword,
    "dictionary-key": _dictionary_key,
    "world-divisor": _world_divisor,
    "reversed-iteration": _reversed,
    "ignored-argument": _ignored_argument,
    "arithmetic": _arithmetic,
    "off-by-one": _off_by_one,
}


def _copy(function: ast.FunctionDef) -> ast.FunctionDef:
    # A pickle round trip copies a syntax tree in half the time copy.deepcopy takes (one copy
    # per place an operator may change: most of the time spent finding a module's mutants).
    copied: ast.FunctionDef = pickle.loads(pickle.dumps(function, pickle.HIGHEST_PROTOCOL))
    return copied


def _nodes(function: ast.FunctionDef) -> Iterator[tuple[int, ast.AST]]:
    # The body only: decorators, defaults and annotations are not the function's arithmetic.
    body = ast.Module(body=function.body, type_ignores=[])
    yield from enumerate(ast.walk(body))


# What each operator may change, checked before a copy is made to try it (a cheap filter).
_MAY: dict[str, Callable[[ast.AST, ast.FunctionDef], bool]] = {
    "comparison": lambda n, f: isinstance(n, ast.Compare),
    "sum-mean": lambda n, f: isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute),
    "dropped-keyword": lambda n, f: isinstance(n, ast.Call) and bool(n.keywords),
    "dictionary-key": lambda n, f: isinstance(n, ast.Subscript),
    "world-divisor": lambda n, f: isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute),
    "reversed-iteration": lambda n, f: isinstance(n, ast.For),
    "ignored-argument": lambda n, f: isinstance(n, ast.Name) and n.id in _params_with_defaults(f),
    "arithmetic": lambda n, f: isinstance(n, (ast.BinOp, ast.AugAssign)),
    "off-by-one": lambda n, f: isinstance(n, ast.Constant) and type(n.value) is int,
}


def sites(function: ast.FunctionDef) -> list[Site]:
    """Every place an operator can change in ``function`` (a parsed ``def``), in order."""
    found = []
    for name, apply in OPERATORS.items():
        for index, original in _nodes(function):
            if not _MAY[name](original, function):
                continue
            trial = _copy(function)
            node = dict(_nodes(trial))[index]
            change = apply(node, trial)
            if change is not None:
                found.append(Site(name, index, getattr(node, "lineno", function.lineno), change))
    return found


def mutated(function: ast.FunctionDef, site: Site) -> str:
    """The source of ``function`` with ``site``'s change made, without its decorators (the
    mutated code takes the place of the decorated function's own code)."""
    trial = _copy(function)
    node = dict(_nodes(trial))[site.index]
    if OPERATORS[site.operator](node, trial) is None:
        raise ValueError(f"{site} does not apply to {function.name}")
    trial.decorator_list = []
    return ast.unparse(ast.fix_missing_locations(trial))
