"""Imported by every rank and by the session's own process (``--ddp-preload`` and ``-p``) when
``DDP_VERIFY_GENERATED_MUTANT`` names a generated mutant (a JSON file: ``module``,
``qualname``, ``source``): torch's function runs its mutated source, compiled in its own
module (see :func:`tests.mutation.mutants.compile_like`). Inert without the variable."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.mutation.mutants import compile_like

ENV = "DDP_VERIFY_GENERATED_MUTANT"
# Test modules to run first (comma-separated names): the mutated module's own properties, so
# that a killed mutant is found killed sooner. The whole suite still runs for a survivor.
FIRST_ENV = "DDP_VERIFY_GENERATED_FIRST"
# The tests to run (a JSON list of names as tests.mutation.reach.key_of gives them): those that
# call the mutated function. Every test without it.
ONLY_ENV = "DDP_VERIFY_GENERATED_ONLY"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    only = os.environ.get(ONLY_ENV)
    if only:
        from tests.mutation.reach import key_of

        keep = set(json.loads(Path(only).read_text()))
        config.hook.pytest_deselected(items=[i for i in items if key_of(i) not in keep])
        items[:] = [i for i in items if key_of(i) in keep]
    first = [name for name in os.environ.get(FIRST_ENV, "").split(",") if name]
    if first:
        rank = {name: i for i, name in enumerate(first)}
        items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))


def install() -> None:
    """The mutant ``$DDP_VERIFY_GENERATED_MUTANT`` names, in place (nothing without it)."""
    path = os.environ.get(ENV)
    if path:
        with open(path) as f:
            install_mutant(json.load(f))


def install_mutant(mutant: dict[str, str]) -> None:
    """``mutant`` (``module``, ``qualname``, ``source``: the function's ``def`` without its
    decorators) in place of torch's function: the function's code object is swapped, so that
    every reference to it (a re-export as ``torch.nn.utils.clip_grad_norm_``, a decorator's
    wrapper, a bound method) runs the mutated code. A ``ValueError`` where the mutated code
    cannot take the original's place (it closes over other names)."""
    target, code = compiled(mutant)
    if not getattr(target, "_generated_mutant", False):
        target.__code__ = code
        target._generated_mutant = True


def compiled(mutant: dict[str, str]) -> tuple[Any, Any]:
    """(torch's function, the mutated code that can take its code's place); a
    ``ValueError`` where it cannot (the mutated code closes over other names)."""
    import importlib
    import inspect

    owner: Any = importlib.import_module(mutant["module"])
    *parents, attribute = mutant["qualname"].split(".")
    for part in parents:
        owner = getattr(owner, part)
    found = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
    target = inspect.unwrap(getattr(found, "__func__", found))
    made = compile_like(target, mutant["source"])
    code = getattr(made, "__func__", made).__code__
    if code.co_freevars != target.__code__.co_freevars:
        raise ValueError(
            f"the mutated {mutant['qualname']} closes over {code.co_freevars}, the original "
            f"over {target.__code__.co_freevars}"
        )
    return target, code


install()
