"""Methods: ways to train a scenario, each returning a trace to compare with the reference.

``reference()`` runs in the controller; ``ddp(**kwargs)``, ``manual_allreduce(weighting=...)`` and
``fully_shard()`` run on a world.
"""

from .base import DistributedMethod, Method
from .ddp import DDP, ddp
from .fsdp import FullyShard, fully_shard
from .manual import ManualAllReduce, manual_allreduce
from .reference import Reference, reference

__all__ = [
    "DDP",
    "DistributedMethod",
    "FullyShard",
    "ManualAllReduce",
    "Method",
    "Reference",
    "ddp",
    "fully_shard",
    "manual_allreduce",
    "reference",
]
