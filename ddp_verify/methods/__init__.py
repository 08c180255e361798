"""Methods: ways to train a scenario, each returning a trace to compare with the reference.

``reference()`` runs in the controller; ``ddp(**kwargs)`` and ``manual_allreduce(weighting=...)``
run on a world.
"""

from .base import DistributedMethod, Method
from .ddp import DDP, ddp
from .manual import ManualAllReduce, manual_allreduce
from .reference import Reference, reference

__all__ = [
    "DDP",
    "DistributedMethod",
    "ManualAllReduce",
    "Method",
    "Reference",
    "ddp",
    "manual_allreduce",
    "reference",
]
