"""ddp_verify: prove that data-parallel training computes what single-process training computes.

Importing the package is cheap: torch is loaded only when a world is started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "check": "ddp_verify.search",
    "EquivalenceError": "ddp_verify.equivalence",
    "VerifyingWorld": "ddp_verify.equivalence",
    "assert_equivalent": "ddp_verify.equivalence",
    "check_equivalent": "ddp_verify.equivalence",
    "Scenario": "ddp_verify.scenario",
    "ModelSpec": "ddp_verify.scenario",
    "OptimizerSpec": "ddp_verify.scenario",
    "World": "ddp_verify.world",
    "WorldPool": "ddp_verify.world",
    "WorldError": "ddp_verify.world",
    "RankError": "ddp_verify.world",
    "WorldStartError": "ddp_verify.world",
    "BackendUnavailable": "ddp_verify.world",
    "JobPicklingError": "ddp_verify.world",
}

__all__ = [
    "BackendUnavailable",
    "EquivalenceError",
    "JobPicklingError",
    "ModelSpec",
    "OptimizerSpec",
    "RankError",
    "Scenario",
    "VerifyingWorld",
    "World",
    "WorldError",
    "WorldPool",
    "WorldStartError",
    "assert_equivalent",
    "check",
    "check_equivalent",
]

if TYPE_CHECKING:
    from .equivalence import (
        EquivalenceError,
        VerifyingWorld,
        assert_equivalent,
        check_equivalent,
    )
    from .scenario import ModelSpec, OptimizerSpec, Scenario
    from .search import check
    from .world import (
        BackendUnavailable,
        JobPicklingError,
        RankError,
        World,
        WorldError,
        WorldPool,
        WorldStartError,
    )


def __getattr__(name: str) -> Any:
    # Submodules (methods, strategies, world, ...) import as usual; these names load lazily.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ddp_verify' has no attribute {name!r}")
