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
        runtime.flush()
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

        self.dist = dist
        for module in launch.preload:
            importlib.import_module(module)
        torch.set_num_threads(launch.threads)
        device_id = runtime.set_up_device(launch.device, launch.allow_tf32, launch.rank)
        self.group: runtime.Group | None = None
        if launch.process_group:
            # -1: no count of users, so the file is never deleted under a rank that joins
            # late; it goes with the world's directory.
            store = dist.FileStore(launch.store_path, -1)
            store.set_timeout(datetime.timedelta(seconds=launch.collective_timeout_s))
            self.group = runtime.Group(
                launch.backend,
                store,
                rank=launch.rank,
                size=launch.world_size,
                timeout_s=launch.collective_timeout_s,
                device_id=device_id,
                prefix=f"{launch.store_prefix}/",
            )
            self.group.form()

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
            if self.group is not None and generation != self.group.generation:
                # A job destroyed the default group on some rank: every rank re-forms it.
                self.group.reform(generation)
            outcome = runtime.run_job(*protocol.load_job(payload))
            outcome.job_id = job_id
            if outcome.exit_code is not None:
                # sys.exit() in a job ends the rank, as it would end a script; the controller
                # reports the exit and its code.
                sys.stderr.write(outcome.error_traceback)
                runtime.flush()
                os._exit(outcome.exit_code)
            # A helper has no group to lose; a rank's job may have destroyed its.
            outcome.process_group_alive = self.dist.is_initialized() if self.group else True
            runtime.flush()
            results.send_bytes(protocol.encode(outcome))
        runtime.flush()
        # Skip interpreter teardown: the controller only waits for the exit.
        os._exit(0)


def _die_with_controller(controller_pid: int, *, parent_death_signal: bool) -> None:
    """End this rank as soon as the controller is gone, however it went.

    Linux sends the parent-death signal when the controller *thread* that started us exits, so
    it is armed only when that was the controller's main thread; the watchdog covers the rest
    (other platforms, other threads, reparenting to a subreaper).
    """
    if parent_death_signal and sys.platform.startswith("linux"):
        # Where libc cannot be loaded, the watchdog below still ends the rank.
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
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
