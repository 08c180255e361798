"""The world layer: real multi-rank ``torch.distributed`` worlds, started once and reused.

Usable without pytest::

    from ddp_verify.world import World

    with World(2) as world:
        print(world.run(lambda: __import__("torch.distributed").distributed.get_rank()))
"""

from .errors import (
    BackendUnavailable,
    Category,
    DeviceUnavailable,
    FailureKind,
    JobPicklingError,
    RankError,
    RankFailure,
    WorldError,
    WorldStartError,
)
from .pool import WorldPool
from .runtime import rank_device
from .world import World

__all__ = [
    "BackendUnavailable",
    "Category",
    "DeviceUnavailable",
    "FailureKind",
    "JobPicklingError",
    "RankError",
    "RankFailure",
    "World",
    "WorldError",
    "WorldPool",
    "WorldStartError",
    "rank_device",
]
