"""Process-group backends a world can use, and whether this machine can run one at a size."""

from __future__ import annotations

from .errors import BackendUnavailable

BACKENDS = ("gloo", "nccl")


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`; a ``ValueError`` that lists them otherwise.

    Example::

        >>> check_backend("gloo")
        'gloo'
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def require_devices(backend: str, size: int) -> None:
    """Raise :class:`BackendUnavailable` when ``backend`` cannot run ``size`` ranks here: nccl
    needs one visible GPU per rank (gloo runs anywhere)."""
    if backend != "nccl":
        return
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < size:
        raise BackendUnavailable(
            f"nccl needs one GPU per rank: a world of {size} needs {size} GPUs, "
            f"{visible} visible here; use --ddp-backend gloo (backend='gloo') on CPU"
        )
