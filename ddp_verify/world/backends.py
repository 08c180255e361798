"""Process-group backends and training devices a world can use, and whether this machine can
run a world of them at a size."""

from __future__ import annotations

import dataclasses

from .errors import DeviceUnavailable
from .naming import option


@dataclasses.dataclass(frozen=True)
class Backend:
    """A process-group backend, as data: what it reduces, where a world of it trains unless
    told otherwise, how many GPUs its ranks need, and how a group of it forms and ends. Code
    reads these rows; nothing branches on a backend's name.

    Example::

        >>> BACKEND["nccl"].devices, BACKEND["gloo"].gpu_per_rank
        (('cuda',), False)
    """

    name: str
    # The devices whose tensors it reduces.
    devices: tuple[str, ...]
    default_device: str
    # Each rank needs a GPU of its own (nccl); else ranks may share one.
    gpu_per_rank: bool
    # The group is bound to the rank's GPU (init_process_group(device_id=)).
    binds_device: bool
    # Set in a rank before its group forms: how a failed collective ends (its teardown).
    environment: tuple[tuple[str, str], ...] = ()

    def group_options(self, device_id: object) -> dict[str, object]:
        """``init_process_group``'s keyword arguments beside the rendezvous: the rank's GPU
        where the group binds one.

        Example::

            >>> BACKEND["gloo"].group_options("cuda:0")
            {}
        """
        return {"device_id": device_id} if self.binds_device else {}

    def prepare(self, environ: dict[str, str]) -> None:
        """Set in ``environ`` (a rank's ``os.environ``) what this backend's group needs
        before it forms; what is already set is kept."""
        for key, value in self.environment:
            environ.setdefault(key, value)


@dataclasses.dataclass(frozen=True)
class Device:
    """A training device, as data.

    Example::

        >>> DEVICE["cuda"].start_method, DEVICE["cpu"].watch_deadlock
        ('spawn', True)
    """

    name: str
    # Ranks train on GPUs: one must be visible, and each rank is placed on one.
    gpus: bool
    # A job stuck in collectives is told from a slow one by the ranks' stacks (on the CPU,
    # where a rank's Python stack shows the wait).
    watch_deadlock: bool
    # How a standalone script's ranks start: forked where nothing forbids it; CUDA cannot
    # be forked into once initialised.
    start_method: str
    # float32 matmuls may round to TF32 where allowed.
    tf32: bool
    # How messages name its tensors.
    said: str


BACKEND = {
    backend.name: backend
    for backend in (
        Backend("gloo", ("cpu", "cuda"), "cpu", gpu_per_rank=False, binds_device=False),
        Backend(
            "nccl",
            ("cuda",),
            "cuda",
            gpu_per_rank=True,
            binds_device=True,
            # A failed or timed-out collective aborts the communicator and ends the process,
            # so that no rank is left holding the GPU.
            environment=(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),),
        ),
    )
}
DEVICE = {
    device.name: device
    for device in (
        Device("cpu", False, watch_deadlock=True, start_method="fork", tf32=False, said="CPU"),
        Device("cuda", True, watch_deadlock=False, start_method="spawn", tf32=True, said="CUDA"),
    )
}
BACKENDS = tuple(BACKEND)
DEVICES = tuple(DEVICE)


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`; a ``ValueError`` that lists them otherwise.

    Example::

        >>> check_backend("gloo")
        'gloo'
    """
    if backend not in BACKEND:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def default_device(backend: str) -> str:
    """The device a backend trains on unless told otherwise: ``cuda`` for nccl, ``cpu`` for
    gloo.

    Example::

        >>> default_device("nccl")
        'cuda'
    """
    return BACKEND[check_backend(backend)].default_device


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
    if device not in DEVICE:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    row = BACKEND[check_backend(backend)]
    if device not in row.devices:
        others = [b.name for b in BACKEND.values() if device in b.devices]
        raise ValueError(
            f"{backend} reduces {' and '.join(DEVICE[d].said for d in row.devices)} tensors "
            f"only: use device {' or '.join(repr(d) for d in row.devices)} with {backend}, or "
            f"backend {' or '.join(repr(b) for b in others)} for {DEVICE[device].said} tensors"
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
    if not DEVICE[device].gpus:
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
    if not DEVICE[device].gpus:
        return 0
    gpus = visible_gpus()
    if BACKEND[backend].gpu_per_rank and gpus < size:
        instead = (
            f"{option('backend', 'gloo')} on CPU"
            if gpus == 0
            else f"{option('world_size', gpus)} or fewer, or {option('backend', 'gloo')} "
            f"{option('device', 'cuda')} to share the GPUs between ranks"
        )
        raise DeviceUnavailable(
            f"{backend} needs one GPU per rank: a world of {size} needs {size} GPUs, {gpus} "
            f"visible here; use {instead}"
        )
    if gpus == 0:
        raise DeviceUnavailable(
            f"device {device!r} asked for, but no GPU is visible here (torch "
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
