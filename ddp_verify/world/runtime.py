"""What a job can ask about the process it runs in: the device this rank trains on.

Set once by the rank (or helper) process as it starts; the controller, and any process that is
not a rank, trains on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_device = "cpu"


def rank_device() -> torch.device:
    """The device this rank trains on: ``cuda:N`` in a world started with ``device="cuda"``
    (its own GPU, or one it shares round-robin), ``cpu`` otherwise, and ``cpu`` outside a
    world.

    Example (inside a job)::

        from ddp_verify.world import rank_device

        def job():
            t = torch.ones(3, device=rank_device())
            dist.all_reduce(t)
            return t.sum().item()
    """
    import torch

    return torch.device(_device)


def set_rank_device(device: str) -> None:
    """Called by the rank process itself once it has chosen its device (``"cuda:1"``)."""
    global _device
    _device = device
