"""What every plug-in adapter shares: the user's callable as a method of the world, the
values any rank can bind a parameter to, and the loss it returns checked as one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..methods.base import DistributedMethod
from ..world.protocol import modules_ranks_cannot_import
from .kinds import Call, KindError

__all__ = ["UserMethod", "anywhere_values", "as_loss"]


class UserMethod(DistributedMethod):
    """A user's callable as a method: trained on every rank, shipped by value where the
    ranks cannot import its module."""

    # How the harness calls the code (set by adapt()).
    call: Call | None = None

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.by_value = tuple(modules_ranks_cannot_import(fn))


def anywhere_values() -> dict[str, Any]:
    """What a bound parameter may get on any rank, whatever the kind: the world's size, this
    rank's index and device, the world's group."""
    from ..world.runtime import rank_device

    return {
        "world_size": dist.get_world_size(),
        "rank": dist.get_rank(),
        "device": rank_device(),
        "group": dist.group.WORLD,
    }


def as_loss(value: Any, who: str = "a loss-fn plug-in", into: str = "the logits") -> torch.Tensor:
    """``value`` as the 0-d loss to backpropagate; a :class:`KindError` that says what ``who``
    must return otherwise (a one-element tensor that backpropagates ``into``)."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        got = (
            f"a tensor of shape {tuple(value.shape)}"
            + ("" if value.requires_grad else " that does not require grad")
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise KindError(
            f"{who} must return the loss as a one-element tensor that backpropagates to "
            f"{into}, got {got}"
        )
    return value.reshape(())
