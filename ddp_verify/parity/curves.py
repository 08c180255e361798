"""Each layout's training curve, read from its recording: per optimizer step the loss it
trained on and the norm of the gradient the optimizer saw (rank 0's). What ``ddp-verify parity
--plot`` draws, and what ``--json`` carries, so a plot can be drawn again from the document.

Example::

    >>> import torch
    >>> norm({"w": torch.tensor([3.0, 4.0]), "frozen": None})
    5.0
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .recording import Recording

__all__ = ["curves", "norm"]


def norm(grads: dict[str, torch.Tensor | None]) -> float:
    """The gradient's norm over every parameter that has one."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values() if g is not None))


def curves(recording: Recording, steps: int) -> dict[str, Any]:
    """``{"loss": [...], "gradient_norm": [...]}`` over the first ``steps`` steps."""
    n = min(steps, recording.steps)
    rank = recording.trace(n).ranks[0]
    return {
        "loss": [float(x) for x in rank.losses[:n]],
        "gradient_norm": [norm(g) for g in (rank.grads or [])[:n]],
    }
