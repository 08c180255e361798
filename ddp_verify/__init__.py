"""ddp_verify: prove that data-parallel training computes what single-process training computes.

Every exception a user can meet is importable from here and shown under this name
(``ddp_verify.NotEquivalent``), wherever it is defined.

Importing the package is cheap: torch is loaded only when a world is started. The layers,
each a folder that imports only those before it: ``world`` (rank processes and their process
group), ``engine`` (scenarios, the reference, traces, comparison, strategies), ``methods``
(ways to train data-parallel), ``usercode`` (plug-in kinds, the search, the diagnosis), then
``parity`` (whole training scripts at several data-parallel layouts), then the front ends
(``frontends``: the pytest plugin, the command line, ``check()``, ``assert_parity()``) and the
packaged ``conformance`` suite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "check": "ddp_verify.frontends.api",
    "assert_parity": "ddp_verify.frontends.api",
    "ParityFailed": "ddp_verify.frontends.api",
    "CodeFailed": "ddp_verify.usercode.verdict",
    "NotEquivalent": "ddp_verify.usercode.verdict",
    "Verdict": "ddp_verify.usercode.verdict",
    "VerifyingWorld": "ddp_verify.frontends.verifying",
    "EquivalenceError": "ddp_verify.engine.outcome",
    "HarnessError": "ddp_verify.methods.equivalence",
    "assert_equivalent": "ddp_verify.methods.equivalence",
    "check_equivalent": "ddp_verify.methods.equivalence",
    "Scenario": "ddp_verify.engine.scenario",
    "ModelSpec": "ddp_verify.engine.scenario",
    "OptimizerSpec": "ddp_verify.engine.scenario",
    "Recipe": "ddp_verify.engine.scenario",
    "World": "ddp_verify.world",
    "WorldPool": "ddp_verify.world",
    "WorldError": "ddp_verify.world",
    "RankError": "ddp_verify.world",
    "WorldStartError": "ddp_verify.world",
    "BackendUnavailable": "ddp_verify.world",
    "DeviceUnavailable": "ddp_verify.world",
    "JobPicklingError": "ddp_verify.world",
    "CheckFailed": "ddp_verify.usercode.verdict",
    "KindError": "ddp_verify.usercode.kinds",
    "LayoutPinError": "ddp_verify.usercode.layouts",
    "PlotUnavailable": "ddp_verify.usercode.plot",
    "UsageError": "ddp_verify.frontends.usage",
    "OutOfStep": "ddp_verify.world.agreement",
    "WorldBroken": "ddp_verify.world.agreement",
    "LaunchError": "ddp_verify.world.launch",
    "UserModelError": "ddp_verify.engine.user_models",
    "RecipeError": "ddp_verify.engine.recipes",
    "IncompatibleRelease": "ddp_verify.engine.compat",
    "RankFailed": "ddp_verify.engine.lockstep",
    "LayoutError": "ddp_verify.parity.layouts",
    "RecordingError": "ddp_verify.parity.recording",
}

__all__ = [
    "BackendUnavailable",
    "CheckFailed",
    "CodeFailed",
    "DeviceUnavailable",
    "EquivalenceError",
    "HarnessError",
    "IncompatibleRelease",
    "JobPicklingError",
    "KindError",
    "LaunchError",
    "LayoutError",
    "LayoutPinError",
    "ModelSpec",
    "NotEquivalent",
    "OptimizerSpec",
    "OutOfStep",
    "ParityFailed",
    "PlotUnavailable",
    "RankError",
    "RankFailed",
    "Recipe",
    "RecipeError",
    "RecordingError",
    "Scenario",
    "UsageError",
    "UserModelError",
    "Verdict",
    "VerifyingWorld",
    "World",
    "WorldBroken",
    "WorldError",
    "WorldPool",
    "WorldStartError",
    "assert_equivalent",
    "assert_parity",
    "check",
    "check_equivalent",
]

if TYPE_CHECKING:
    from .engine.compat import IncompatibleRelease
    from .engine.lockstep import RankFailed
    from .engine.outcome import EquivalenceError
    from .engine.recipes import RecipeError
    from .engine.scenario import ModelSpec, OptimizerSpec, Recipe, Scenario
    from .engine.user_models import UserModelError
    from .frontends.api import ParityFailed, assert_parity, check
    from .frontends.usage import UsageError
    from .frontends.verifying import VerifyingWorld
    from .methods.equivalence import HarnessError, assert_equivalent, check_equivalent
    from .parity.layouts import LayoutError
    from .parity.recording import RecordingError
    from .usercode.kinds import KindError
    from .usercode.layouts import LayoutPinError
    from .usercode.plot import PlotUnavailable
    from .usercode.verdict import CheckFailed, CodeFailed, NotEquivalent, Verdict
    from .world import (
        BackendUnavailable,
        DeviceUnavailable,
        JobPicklingError,
        RankError,
        World,
        WorldError,
        WorldPool,
        WorldStartError,
    )
    from .world.agreement import OutOfStep, WorldBroken
    from .world.launch import LaunchError


def __getattr__(name: str) -> Any:
    # Submodules (methods, strategies, world, ...) import as usual; these names load lazily.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ddp_verify' has no attribute {name!r}")
