"""Process-group backends and training devices a world can use, and whether this machine can
run a world of them at a size."""

from __future__ import annotations

from .errors import DeviceUnavailable
from .naming import option

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`; a ``ValueError`` that lists them otherwise.

    Example::

        >>> check_backend("gloo")
        'gloo'
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def default_device(backend: str) -> str:
    """The device a backend trains on unless told otherwise: ``cuda`` for nccl, ``cpu`` for
    gloo.

    Example::

        >>> default_device("nccl")
        'cuda'
    """
    return "cuda" if backend == "nccl" else "cpu"


def check_device(backend: str, device: str | None) -> str:
    """The device a world of ``backend`` trains on: ``device``, or the backend's default; a
    ``ValueError`` for a device that is not one of :data:`DEVICES` or that the backend cannot
    reduce (nccl reduces CUDA tensors only).

    Example::

        >>> check_device("gloo", None), check_device("gloo", "cuda")
        ('cpu', 'cuda')
    """
    if device is None:
        return default_device(backend)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if backend == "nccl" and device != "cuda":
        raise ValueError(
            "nccl reduces CUDA tensors only: use device 'cuda' with nccl, or backend 'gloo' "
            "for CPU tensors"
        )
    return device


def visible_gpus() -> int:
    """How many CUDA devices this process can see (0 without CUDA). The controller asks; ranks
    are forked from the fork server, which never touches CUDA, so they may use it."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_of(rank: int, gpus: int) -> int:
    """The GPU a rank trains on: its own (``cuda:rank``) when there are enough, shared
    round-robin when gloo runs more ranks than there are GPUs.

    Example::

        >>> [gpu_of(r, 2) for r in range(4)]
        [0, 1, 0, 1]
    """
    return rank % gpus


def placement(size: int, device: str, gpus: int) -> str:
    """How ranks sit on devices, in the words a report header uses.

    Example::

        >>> placement(4, "cuda", 1)
        'cuda, 4 ranks share 1 GPU'
    """
    if device != "cuda":
        return device
    if size <= gpus:
        return f"cuda, one GPU per rank ({size} of {gpus})"
    if gpus == 1:
        return f"cuda, {size} ranks share 1 GPU"
    return f"cuda, {size} ranks share {gpus} GPUs round-robin"


def require_devices(backend: str, size: int, device: str) -> int:
    """The GPUs visible here, once they can hold a world of ``size`` ranks of ``backend`` on
    ``device``; :class:`DeviceUnavailable` (saying what to change) when they cannot. nccl needs
    one GPU per rank; gloo on CUDA needs at least one (ranks share them); CPU needs none."""
    if device != "cuda":
        return 0
    gpus = visible_gpus()
    if backend == "nccl" and gpus < size:
        instead = (
            f"{option('backend', 'gloo')} on CPU"
            if gpus == 0
            else f"{option('world_size', gpus)} or fewer, or {option('backend', 'gloo')} "
            f"{option('device', 'cuda')} to share the GPUs between ranks"
        )
        raise DeviceUnavailable(
            f"nccl needs one GPU per rank: a world of {size} needs {size} GPUs, {gpus} "
            f"visible here; use {instead}"
        )
    if gpus == 0:
        raise DeviceUnavailable(
            f"device 'cuda' asked for, but no GPU is visible here (torch "
            f"{_torch_version()}, CUDA {_cuda_version()}); use {option('device', 'cpu')} "
            "with the gloo backend"
        )
    return gpus


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _cuda_version() -> str:
    import torch

    return str(torch.version.cuda or "none in this build")
