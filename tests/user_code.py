"""The aggregation code of ``fixtures/`` (what users write), loaded as modules by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load(stem: str) -> ModuleType:
    """``fixtures/<stem>.py`` as a module (registered, so its functions pickle by reference
    where the ranks can import them and by value where they cannot)."""
    name = "fixtures_" + stem.replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
