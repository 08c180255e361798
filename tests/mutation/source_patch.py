"""A mutant installed as its module's own source, before anything imports the module: for a
function that runs only while its module is imported (an op registered, a decorator applied,
a singleton built), where swapping its code afterwards (:mod:`tests.mutation.generated_patch`)
would change nothing that runs.

``DDP_VERIFY_GENERATED_SOURCE`` names a JSON file (``module``, ``source``: the module's whole
source with the one function mutated); this module, imported by a ``sitecustomize`` at the
start of every process of the run (the session, the fork server, each rank), puts a finder
first on ``sys.meta_path`` that imports that module from that source. It imports nothing of
torch's, so that it is in place before torch is. Inert without the variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Sequence
from types import CodeType

ENV = "DDP_VERIFY_GENERATED_SOURCE"
SITECUSTOMIZE = "import tests.mutation.source_patch\n"


class _Loader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, text: str) -> None:
        super().__init__(fullname, path)
        self._text = text

    def get_code(self, fullname: str) -> CodeType:
        # Compiled from the mutated text, never from (or into) the bytecode cache.
        return compile(self._text, self.path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, text: str) -> None:
        self.module, self.text = module, text

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        spec.loader = _Loader(fullname, spec.origin, self.text)
        return spec


def install() -> None:
    """The finder for the mutant ``$DDP_VERIFY_GENERATED_SOURCE`` names (nothing without it);
    a ``RuntimeError`` where its module was imported before (the mutant would not run)."""
    path = os.environ.get(ENV)
    if not path or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    with open(path) as f:
        data = json.load(f)
    if data["module"] in sys.modules:
        raise RuntimeError(f"{data['module']} was imported before its mutant's finder")
    sys.meta_path.insert(0, _Finder(data["module"], data["source"]))


install()
