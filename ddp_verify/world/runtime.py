"""The rank runtime: what a rank process does, whichever way it came to be (forked by a
controller, :mod:`.rank`; launched by torchrun or srun, :mod:`.spmd`): set up its device and
numerics, form and re-form the default process group, run a job into an
:class:`~ddp_verify.world.protocol.Outcome`. And what a job can ask of it
(:func:`rank_device`).

The controller, and any process that is not a rank, trains on the CPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import frames, protocol
from .backends import BACKEND, DEVICE
from .errors import FailureKind

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


def set_up_device(device: str, allow_tf32: bool, index: int) -> torch.device | None:
    """This rank's numerics and device: TF32 as the world asks (so float32 is float32 unless
    it asked for TF32); on CUDA, GPU ``index % visible GPUs``, made current. Returns that GPU
    for ``init_process_group(device_id=)`` (None on the CPU); a ``RuntimeError`` when the
    world trains on CUDA and this process sees no GPU.

    Example::

        device_id = set_up_device("cuda", allow_tf32=False, index=local_rank)
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    if not DEVICE[device].gpus:
        return None
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError("this world trains on CUDA, but the rank sees no GPU")
    gpu = index % gpus
    torch.cuda.set_device(gpu)
    set_rank_device(f"cuda:{gpu}")
    return torch.device("cuda", gpu)


class Group:
    """A rank's default process group, formed through ``store`` under a prefix per
    generation: every rank re-forms it together (a new generation) after a job destroyed it
    or a rank failed, and abandons it at once when its own job failed, so that peers waiting
    on it in a collective fail within milliseconds instead of at the time-out.

    Example::

        group = Group("gloo", store, rank=0, size=4, timeout_s=60.0)
        group.form()
        group.reform()    # generation 1
    """

    def __init__(
        self,
        backend: str,
        store: Any,
        *,
        rank: int,
        size: int,
        timeout_s: float,
        device_id: torch.device | None = None,
        prefix: str = "",
    ) -> None:
        self.backend, self.store = backend, store
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.device_id = device_id
        self.prefix = prefix
        self.generation = 0

    def form(self) -> None:
        """Form the default group (the current generation's)."""
        import torch.distributed as dist

        row = BACKEND[self.backend]
        row.prepare(os.environ)  # type: ignore[arg-type]
        dist.init_process_group(
            self.backend,
            store=dist.PrefixStore(f"{self.prefix}{self.generation}", self.store),
            rank=self.rank,
            world_size=self.size,
            # A collective stuck longer than a job may run raises instead of hanging.
            timeout=datetime.timedelta(seconds=self.timeout_s),
            # NCCL binds the group to the rank's GPU; gloo reduces CPU and CUDA tensors alike.
            **row.group_options(self.device_id),
        )

    def reform(self, generation: int | None = None) -> None:
        """Destroy the default group (if any) and form the next generation's (or
        ``generation``'s): every rank does, at the same point of the program."""
        self.abandon()
        self.generation = self.generation + 1 if generation is None else generation
        self.form()

    def abandon(self) -> None:
        """Destroy the default group now, if there is one. (Only where nothing else holds
        it: with ``torch._inductor`` imported after it was formed, C++ keeps it alive.)"""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def process_groups() -> tuple[tuple[int, ...], ...]:
    """The global ranks of every process group this rank belongs to besides the default
    one, as ``torch.distributed`` holds them now (the groups code it ran has made), each
    once, sorted; none outside a process group.

    Example (inside a job)::

        dist.new_group([0])
        process_groups()  # ((0,),) on rank 0
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return ()
    # torch keeps its groups' rank maps here; no public call lists them.
    world = getattr(dist.distributed_c10d, "_world", None)
    held = getattr(world, "pg_group_ranks", None) or {}
    found = {
        tuple(sorted(ranks))
        for group, ranks in held.items()
        if group is not dist.group.WORLD and ranks
    }
    return tuple(sorted(found))


def run_job(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> protocol.Outcome:
    """``fn(*args, **kwargs)`` here, as an outcome: its result; or how it failed: raised
    (its traceback cut to the user's frames, and in full), exited (``sys.exit``: the outcome
    says with which code, and a forked rank then ends as a script would), or returned
    something that cannot be pickled back. A ``KeyboardInterrupt`` is not the job's to
    report: it goes on up.
    """
    try:
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return protocol.Outcome(
            0,
            ok=False,
            error_kind=FailureKind.DIED.value,
            error_summary=f"exited with code {code} without a result (sys.exit in the job)",
            error_traceback=frames.format_exception(exc),
            error_traceback_full=frames.format_exception(exc, full=True),
            exit_code=code,
        )
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return protocol.Outcome(
            0,
            ok=False,
            error_kind=FailureKind.RAISED.value,
            error_summary=f"raised {one_line(exc)}",
            error_traceback=frames.format_exception(exc),
            error_traceback_full=frames.format_exception(exc, full=True),
            exception=protocol.dump_exception(exc),
        )
    try:
        return protocol.Outcome(0, ok=True, result=protocol.dump_result(value))
    except Exception as exc:
        # The traceback of a failed result pickle is ours, not the user's: the summary says it.
        return protocol.Outcome(
            0,
            ok=False,
            error_kind=FailureKind.UNPICKLABLE_RESULT.value,
            error_summary=f"returned a {type(value).__name__} that cannot be pickled back "
            f"({one_line(exc)}); return plain data (numbers, tensors, lists, dicts) instead",
            exception=protocol.dump_exception(exc),
        )


def one_line(exc: BaseException) -> str:
    """``ValueError: its message's first line`` (cut at 300 characters), for summaries.

    Example::

        >>> one_line(ValueError("bad\\nsecond line"))
        'ValueError: bad'
    """
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def flush() -> None:
    """Flush stdout and stderr, which may be closed or replaced by now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
