"""The rank process: join the world, then run the controller's jobs until told to stop.

Started by :class:`ddp_verify.world.World` as
``python -c ... JOB_FD RESULT_FD CONTROLLER_PID FROM_MAIN_THREAD``.
It never outlives the controller: a parent-death signal and a watchdog thread both end it.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

from . import frames, naming, protocol, runtime
from .errors import FailureKind

_WATCHDOG_PERIOD_S = 0.2


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    job_fd, result_fd, controller_pid = int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_controller(controller_pid, parent_death_signal=argv[4] == "1")
    jobs = Connection(job_fd, writable=False)
    results = Connection(result_fd, readable=False)
    try:
        launch: protocol.Launch = protocol.decode(jobs.recv_bytes())
    except EOFError:
        os._exit(0)
    try:
        member = _Member(launch)
    except BaseException as exc:
        # The harness failed, not a job: its frames are the story.
        start_failed = (protocol.START_FAILED, frames.format_exception(exc, full=True))
        results.send_bytes(protocol.encode(start_failed))
        _flush()
        os._exit(1)
    results.send_bytes(protocol.encode((protocol.READY, os.getpid())))
    member.serve(jobs, results)


class _Member:
    """This process's membership of the world: its process group and its job loop."""

    def __init__(self, launch: protocol.Launch) -> None:
        self.launch = launch
        # The handler writes from C, so it works while the main thread waits inside a collective.
        self._stack_file = open(launch.stack_file, "w")  # noqa: SIM115 (kept open for life)
        faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True)
        sys.path[:] = launch.sys_path
        os.chdir(launch.cwd)
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        for module in launch.preload:
            importlib.import_module(module)
        torch.set_num_threads(launch.threads)
        self.gpu = self._choose_device()
        self.generation = 0
        if launch.process_group:
            self.store = dist.TCPStore(
                launch.store_host,
                launch.store_port,
                is_master=False,
                timeout=datetime.timedelta(seconds=launch.collective_timeout_s),
            )
            self._init_process_group()

    def _choose_device(self) -> int | None:
        """This process's GPU (``rank % visible GPUs``) when the world trains on CUDA, made
        current; TF32 as the world asks, so float32 is float32 unless TF32 was asked for."""
        launch, torch = self.launch, self.torch
        torch.backends.cuda.matmul.allow_tf32 = launch.allow_tf32
        torch.backends.cudnn.allow_tf32 = launch.allow_tf32
        if launch.device != "cuda":
            return None
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise RuntimeError("this world trains on CUDA, but the rank sees no GPU")
        gpu = launch.rank % gpus
        torch.cuda.set_device(gpu)
        runtime.set_rank_device(f"cuda:{gpu}")
        return gpu

    def _init_process_group(self) -> None:
        launch, torch, dist = self.launch, self.torch, self.dist
        device_id = None
        if launch.backend == "nccl":
            assert self.gpu is not None
            device_id = torch.device("cuda", self.gpu)
            # A failed or timed-out collective aborts the communicator and ends the process,
            # so no rank is left holding the GPU (the controller's own deadline comes first).
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        dist.init_process_group(
            launch.backend,
            store=dist.PrefixStore(f"{launch.store_prefix}/{self.generation}", self.store),
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=datetime.timedelta(seconds=launch.collective_timeout_s),
            device_id=device_id,
        )

    def _rejoin(self, generation: int) -> None:
        # A job destroyed the default group on some rank: every rank re-forms it together.
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
        self.generation = generation
        self._init_process_group()

    def serve(self, jobs: Connection, results: Connection) -> None:
        while True:
            try:
                message = protocol.decode(jobs.recv_bytes())
            except EOFError:
                break
            if message[0] == protocol.EXIT:
                break
            _, job_id, generation, payload, sys_path, cwd, spellings = message
            if sys_path is not None:
                sys.path[:] = sys_path
            if cwd is not None:
                os.chdir(cwd)
            if spellings is not None:
                naming.speak_as(spellings)
            if generation != self.generation:
                self._rejoin(generation)
            outcome = _run_job(job_id, payload)
            # A helper has no group to lose; a rank's job may have destroyed its.
            outcome.process_group_alive = (
                self.dist.is_initialized() if self.launch.process_group else True
            )
            _flush()
            results.send_bytes(protocol.encode(outcome))
        _flush()
        # Skip interpreter teardown: the controller only waits for the exit.
        os._exit(0)


def _run_job(job_id: int, payload: bytes) -> protocol.Outcome:
    try:
        fn, args, kwargs = protocol.load_job(payload)
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        # sys.exit() in a job ends the rank, as it would in a script; the controller reports it.
        sys.stderr.write(frames.format_exception(exc))
        _flush()
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        os._exit(code)
    except BaseException as exc:
        return _failed(job_id, FailureKind.RAISED, exc, f"raised {_one_line(exc)}")
    try:
        return protocol.Outcome(job_id, ok=True, result=protocol.dump_result(value))
    except Exception as exc:
        return _failed(
            job_id,
            FailureKind.UNPICKLABLE_RESULT,
            exc,
            f"returned a {type(value).__name__} that cannot be pickled back to the controller "
            f"({_one_line(exc)}); return plain data (numbers, tensors, lists, dicts) instead",
        )


def _failed(job_id: int, kind: FailureKind, exc: BaseException, summary: str) -> protocol.Outcome:
    # The traceback of a failed result pickle is ours, not the user's: the summary says it all.
    user_code = kind is FailureKind.RAISED
    return protocol.Outcome(
        job_id,
        ok=False,
        error_kind=kind.value,
        error_summary=summary,
        error_traceback=frames.format_exception(exc) if user_code else "",
        error_traceback_full=frames.format_exception(exc, full=True) if user_code else "",
        exception=protocol.dump_exception(exc),
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _die_with_controller(controller_pid: int, *, parent_death_signal: bool) -> None:
    """End this rank as soon as the controller is gone, however it went.

    Linux sends the parent-death signal when the controller *thread* that started us exits, so
    it is armed only when that was the controller's main thread; the watchdog covers the rest
    (other platforms, other threads, reparenting to a subreaper).
    """
    if parent_death_signal and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        except Exception:
            pass
    if os.getppid() != controller_pid:
        os._exit(1)  # The controller died before we could arm the signal.

    def watch() -> Any:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if os.getppid() != controller_pid:
                os._exit(1)

    threading.Thread(target=watch, name="ddp_verify-watchdog", daemon=True).start()


if __name__ == "__main__":
    main()
