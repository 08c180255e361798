"""Importing what the user names by reference, as every rank imports it: ``MODULE:NAME`` or
``PATH.py:NAME`` (a model factory, a loss, an optimizer or scheduler factory).

A file is loaded once per interpreter under a private module name made from its absolute
path, so a rank, the reference's process and a reproducer find the same callable.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["import_target", "resolve_reference"]


def resolve_reference(reference: str) -> str:
    """``reference`` with a file path made absolute, so that every rank finds the file
    whatever its working directory.

    Example::

        >>> resolve_reference("torch.nn.functional:cross_entropy")
        'torch.nn.functional:cross_entropy'
    """
    target, sep, name = reference.rpartition(":")
    if sep and target.endswith(".py"):
        return f"{os.path.abspath(target)}:{name}"
    return reference


def import_target(target: str, prefix: str) -> ModuleType:
    """The module ``target`` names: imported by name, or loaded from a ``.py`` file under a
    module name of ``prefix`` and the file's path (once per interpreter). Raises what the
    import raises (``ImportError``, ``OSError``, ``SyntaxError``, or what the file's code
    raises); a file that fails to load is not left half-loaded.

    Example::

        >>> import_target("json", "_ddp_verify_x").__name__
        'json'
    """
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = os.path.abspath(target)
    module_name = f"{prefix}_{abs(hash(path))}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python file at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
