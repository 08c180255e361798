"""A world: ``size`` rank processes in one ``torch.distributed`` process group, kept warm.

The controller owns a :class:`World`. Starting it spawns the ranks, which rendezvous through a
``FileStore`` in the world's private directory (nothing listens on a network for it; gloo's own
connections are on loopback); every :meth:`World.run` then ships a callable to all ranks by
value and returns their results in rank order, in milliseconds rather than the seconds a fresh
spawn costs. Any failure (a rank raises, dies or hangs) is reported as a
:class:`~ddp_verify.world.errors.RankError`, the ranks are torn down, and a new set is started
in the background for the next job.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from . import cleanup, forkserver, frames, naming, protocol
from . import failures as fail
from .backends import (
    DEVICE,
    check_backend,
    check_device,
    placement,
    require_devices,
    visible_gpus,
)
from .errors import FailureKind, RankError, RankFailure, WorldError, WorldStartError
from .interface import RunsJobs
from .jobs import Collected, PendingJob, ready
from .processes import PACKAGE_ROOT, RankProcess, collect_stack_dumps, terminate


class World(RunsJobs):
    """``size`` rank processes joined in one process group, reused for every job.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> def total(x):
        ...     t = torch.tensor([x * (dist.get_rank() + 1)])
        ...     dist.all_reduce(t)
        ...     return t.item()
        >>> with World(4) as world:
        ...     world.run(total, 1.0)
        [10.0, 10.0, 10.0, 10.0]

    ``backend`` is ``"gloo"`` or ``"nccl"``; ``device`` is where the ranks train, ``"cpu"`` or
    ``"cuda"`` (default: ``"cuda"`` for nccl, ``"cpu"`` for gloo). On CUDA each rank uses
    ``cuda:rank``, shared round-robin when gloo runs more ranks than there are GPUs (nccl needs
    one per rank); jobs ask :func:`~ddp_verify.world.rank_device` which. Asking for GPUs that
    are not there raises :class:`DeviceUnavailable` at once. ``allow_tf32`` lets CUDA float32
    matmuls and convolutions use TF32 (off by default, so float32 means float32).
    ``timeout`` bounds every job, in seconds; ``start_timeout`` the wait for the ranks to join
    (a start that fails is reported with where each rank was, and not retried until
    :meth:`retry_start`).
    ``debug`` sets ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in the ranks, so torch checks that every
    rank calls the same collectives. ``env`` adds variables to the ranks' environment.
    ``preload`` names modules every rank imports before its first job (once for all ranks,
    in the fork server, where ranks are forked from one; see ``start_method``).
    ``process_group=False`` starts the processes without one: see :attr:`helper`.
    """

    # Forked ranks run the controller's jobs: hypothesis runs here only, never in lockstep.
    lockstep = False

    def __init__(
        self,
        size: int,
        *,
        backend: str = "gloo",
        device: str | None = None,
        allow_tf32: bool = False,
        timeout: float = 60.0,
        start_timeout: float = 120.0,
        threads_per_rank: int = 1,
        debug: bool = False,
        env: Mapping[str, str] | None = None,
        preload: Sequence[str] = (),
        process_group: bool = True,
    ) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"world size must be a positive integer, got {size!r}")
        check_backend(backend)
        device = check_device(backend, device)
        if not timeout > 0 or not start_timeout > 0:
            raise ValueError(f"timeouts must be positive, got {timeout!r} and {start_timeout!r}")
        if threads_per_rank < 1:
            raise ValueError(f"threads_per_rank must be at least 1, got {threads_per_rank!r}")
        self.size = size
        self.backend = backend
        self.device = device
        self.allow_tf32 = allow_tf32
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.threads_per_rank = threads_per_rank
        self.debug = debug
        self._extra_env = dict(env or {})
        self.preload = tuple(preload)
        self.process_group = process_group
        # How reports name this world.
        on = f", {device}" if DEVICE[device].gpus else ""
        self.label = (
            f"a world of {size} ({backend}{on})"
            if process_group
            else f"{size} helper process(es){' on ' + device if on else ''}"
        )
        # Why the last start failed: start() raises it again, without waiting out another
        # start time-out, until retry_start() (the pytest plugin calls it before each test).
        self._start_failure: WorldStartError | None = None
        self._helper: World | None = None
        self._solo: World | None = None
        # "fork server" or "spawn": how the current ranks were started.
        self.start_method = ""
        self._ranks: list[RankProcess] = []
        self._ready = False
        self._closed = False
        self._store: str | None = None
        self._workdir: Path | None = None
        self._generation = 0
        self._job_ids = itertools.count(1)
        self._sent_sys_path: list[str] = []
        self._sent_cwd = ""
        self._sent_spellings: dict[str, Any] = {}
        self._untaken_output: list[tuple[str, str]] = []
        self._pending: PendingJob | None = None
        self.launches = 0
        # Ranks are killed even if the world is never closed or the controller exits early.
        self._finalizer = weakref.finalize(self, _kill_and_remove, self._ranks, None)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> World:
        """Start the ranks and wait until they have formed the process group."""
        self.launch()
        if not self._ready:
            self._await_ready()
        return self

    def retry_start(self) -> None:
        """Let the next :meth:`start` try again after a start that failed (by default it
        re-raises that failure at once: a search that keeps asking must not wait out the start
        time-out for every example)."""
        self._start_failure = None
        if self._helper is not None:
            self._helper.retry_start()
        if self._solo is not None:
            self._solo.retry_start()

    def restart(self) -> bool:
        """Replace the ranks with new ones forked afresh (nothing of earlier jobs in them:
        the modules jobs imported are imported again) and wait until they are ready.

        Example::

            world.restart()  # True: a fresh world, same size and options
        """
        if self._closed:
            raise WorldError("this world was closed; create a new World")
        self._shutdown()
        self.start()
        return True

    def launch(self) -> World:
        """Start the ranks without waiting for them to join (:meth:`start` then waits), so
        that several worlds, or a world and its helper, start side by side.

        Example::

            world.launch(); world.helper.launch()
            world.start(); world.helper.start()
        """
        if self._closed:
            raise WorldError("this world was closed; create a new World")
        if self._start_failure is not None:
            raise self._start_failure
        if not self._ready and not self._ranks:
            self._spawn()
        return self

    def close(self) -> None:
        """Stop every rank (politely, then by force), the helper too, and remove the world's
        files."""
        self._closed = True
        self._shutdown()
        if self._helper is not None:
            self._helper.close()
        if self._solo is not None:
            self._solo.close()

    @property
    def helper(self) -> World:
        """One process forked as the ranks are, with the same preloads, outside their process
        group: for work beside theirs that should not burden the controller (training the
        reference while the ranks train). Started on first use, closed with this world; its
        jobs run and fail as the ranks' do.

        Example::

            pending = world.submit(train, (scenario,))
            reference = world.helper.run(train_reference, scenario)[0]
        """
        if self._closed:
            raise WorldError("this world was closed, and its helper with it")
        if self._helper is None:
            self._helper = self._beside(process_group=False)
            self._helper.label = f"the helper process of {self.label}"
        self._helper.timeout = self.timeout
        return self._helper

    @property
    def solo(self) -> World:
        """A world of one rank beside this one, forked as the ranks are, in a process group
        of its own (its collectives are identities): for code whose reference is the code
        itself on one rank holding the whole batch (a coupled loss). Started on first use,
        closed with this world.

        Example::

            references = world.solo.run_job(train_whole_variants, (method, scenario, 1))[0]
        """
        if self._closed:
            raise WorldError("this world was closed, and its one-rank world with it")
        if self._solo is None:
            self._solo = self._beside(process_group=True)
            self._solo.label = f"the one-rank world beside {self.label}"
        self._solo.timeout = self.timeout
        return self._solo

    def _beside(self, *, process_group: bool) -> World:
        """One process forked as the ranks are, with their settings: its own one-rank
        process group, or none."""
        return one_rank_world_like(self, process_group=process_group)

    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The rank processes' ids, in rank order (empty while no ranks are running)."""
        return [r.pid for r in self._ranks]

    def __reduce__(self) -> Any:
        raise TypeError(
            "a World cannot be sent to its ranks (or pickled at all): inside a job, use "
            "torch.distributed directly; the job already runs on every rank"
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._ready else "not started"
        if not self.process_group:
            return f"<World size={self.size} without a process group {state}>"
        return f"<World size={self.size} backend={self.backend} device={self.device} {state}>"

    @property
    def placement(self) -> str:
        """Where the ranks train, in words: ``cpu``, or ``cuda, 4 ranks share 1 GPU``."""
        gpus = visible_gpus() if DEVICE[self.device].gpus else 0
        return placement(self.size, self.device, gpus)

    # -- jobs --------------------------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        by_value: Sequence[ModuleType] = (),
        name: str | None = None,
    ) -> PendingJob:
        """Send a job to every rank and return at once; ``.result()`` waits for it.

        The controller is free while the ranks work (one job at a time per world).

        Example::

            pending = world.submit(train, (scenario,))
            expected = train_locally(scenario)      # runs while the ranks train
            assert pending.result() == [expected] * world.size
        """
        cleanup.stop_if_asked()
        if self._pending is not None:
            raise WorldError("a job is still running on this world: call .result() on it first")
        payload = protocol.dump_job(fn, args, kwargs or {}, by_value=by_value)
        self.start()
        job_id = next(self._job_ids)
        message = protocol.encode(
            (protocol.RUN, job_id, self._generation, payload, *self._environment_changes())
        )
        marks = [r.output_marks() for r in self._ranks]
        sent_at = time.monotonic()
        unreachable: list[RankFailure] = []
        for r in self._ranks:
            try:
                r.jobs.send_bytes(message)
            except OSError:
                unreachable.append(fail.death(r, sent_at, marks[r.rank]))
        self._pending = PendingJob(
            self._ranks,
            name or protocol.job_name(fn),
            sent_at,
            timeout or self.timeout,
            marks,
            unreachable,
            self._finish,
            watch_deadlock=DEVICE[self.device].watch_deadlock,
        )
        return self._pending

    def take_output(self) -> list[tuple[str, str]]:
        """Each rank's ``(stdout, stderr)`` printed since the last call, in rank order.

        Output of ranks that were since torn down is included, so nothing printed is lost.
        """
        taken = self._untaken_output or [("", "")] * self.size
        self._untaken_output = []
        current = [(r.take_new("stdout"), r.take_new("stderr")) for r in self._ranks]
        return [
            (out + new_out, err + new_err)
            for (out, err), (new_out, new_err) in itertools.zip_longest(
                taken, current, fillvalue=("", "")
            )
        ]

    # -- internals ---------------------------------------------------------------------------

    def _environment_changes(self) -> tuple[Any, ...]:
        # Ranks follow the controller's sys.path and working directory, so by-reference
        # pickles resolve and relative paths mean the same thing on both sides; and its front
        # end's spelling of options, so that advice made there reads as the user's flags.
        sys_path = None
        if sys.path != self._sent_sys_path:
            sys_path = self._sent_sys_path = list(sys.path)
        cwd = None
        if os.getcwd() != self._sent_cwd:
            cwd = self._sent_cwd = os.getcwd()
        spellings = None
        if naming.current() != self._sent_spellings:
            spellings = self._sent_spellings = dict(naming.current())
        return sys_path, cwd, spellings

    def prestart(self) -> World:
        """Start what the ranks are forked from (and its preloads) without waiting for it, so
        that it imports torch while the caller does other work; :meth:`start` then waits.

        Example::

            world = World(4).prestart()
            import torch                  # the fork server imports torch meanwhile
            world.start()
        """
        if forkserver.enabled():
            with contextlib.suppress(forkserver.ForkServerError):
                server = forkserver.server_for(self._rank_env(), PACKAGE_ROOT)
                server.request_preload(self.preload)
        return self

    def _spawn(self) -> None:
        require_devices(self.backend if self.process_group else "gloo", self.size, self.device)
        self.prestart()  # the server imports torch while this process does
        cleanup.remove_abandoned()
        self._workdir = Path(
            tempfile.mkdtemp(prefix=cleanup.owned(f"ddp_verify-world{self.size}-"))
        )
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_and_remove, self._ranks, self._workdir)
        # The ranks meet through a file in the world's private directory: a TCPStore binds
        # every interface whatever host it is given, which would let any host that reaches
        # this machine write the world's rendezvous keys while it runs.
        self._store = str(self._workdir / "rendezvous") if self.process_group else None
        self._generation = 0
        self._sent_sys_path = list(sys.path)
        self._sent_cwd = os.getcwd()
        self._sent_spellings = {}  # a new rank speaks Python's spelling until told
        try:
            self._spawn_ranks()
        except BaseException:
            self._shutdown(polite=False)
            raise
        self.launches += 1

    def _spawn_ranks(self) -> None:
        env = self._rank_env()
        server = self._fork_server(env)
        try:
            self._start_ranks(env, server)
        except forkserver.ForkServerError as exc:
            # Ranks are spawned as fresh interpreters instead, now and from now on.
            forkserver.disable(str(exc))
            terminate(self._ranks)
            self._ranks.clear()
            self._start_ranks(env, None)

    def _fork_server(self, env: Mapping[str, str]) -> forkserver.ForkServer | None:
        if not forkserver.enabled():
            return None
        try:
            server = forkserver.server_for(env, PACKAGE_ROOT)
            server.preload(self.preload, self.start_timeout)
        except forkserver.ForkServerError as exc:
            forkserver.disable(str(exc))
            return None
        return server

    def _start_ranks(self, env: Mapping[str, str], server: forkserver.ForkServer | None) -> None:
        assert self._workdir is not None
        prefix = uuid.uuid4().hex
        self.start_method = "spawn" if server is None else "fork server"
        for rank in range(self.size):
            proc = RankProcess(rank, self._workdir, env, server=server, timeout=self.start_timeout)
            self._ranks.append(proc)
            launch = protocol.Launch(
                rank=rank,
                world_size=self.size,
                backend=self.backend,
                store_path=self._store or "",
                store_prefix=prefix,
                # Collectives time out well after the controller's own deadline, so the
                # controller's report (with stack dumps) always comes first.
                collective_timeout_s=max(self.timeout, self.start_timeout) + 60.0,
                threads=self.threads_per_rank,
                stack_file=str(proc.stack_path),
                sys_path=tuple(self._sent_sys_path),
                cwd=self._sent_cwd,
                preload=self.preload,
                process_group=self.process_group,
                device=self.device,
                allow_tf32=self.allow_tf32,
            )
            proc.jobs.send_bytes(protocol.encode(launch))

    def _rank_env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.threads_per_rank)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
        if sys.platform.startswith("linux"):
            # One machine: gloo's and NCCL's listeners (NCCL's bootstrap and proxy sockets)
            # on loopback, unless the user chose an interface. NCCL's peers on one node talk
            # through shared memory or NVLink, never this socket.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        if self.debug:
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        env.update(self._extra_env)
        return env

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = {r.results: r for r in self._ranks}
        problems: list[str] = []
        while waiting and not problems:
            remaining = deadline - time.monotonic()
            answered = ready(waiting, max(0.0, remaining))
            if not answered:
                problems += [
                    f"rank {r.rank} did not join within {self.start_timeout:g} s"
                    for r in waiting.values()
                ]
                break
            for conn in answered:
                r = waiting.pop(conn)
                try:
                    message = protocol.decode(conn.recv_bytes())
                except (EOFError, OSError):
                    how = r.exit_description(fail.EXIT_WAIT_S)
                    problems.append(f"rank {r.rank} {how} at start")
                    continue
                if message[0] == protocol.START_FAILED:
                    problems.append(f"rank {r.rank} could not join:\n{message[1]}")
        if problems:
            # Where the ranks that never joined are waiting (an NCCL init, an import, a
            # rendezvous) says why; the rest say how they failed on stderr.
            stuck = [r for r in waiting.values() if r.alive()]
            stacks = collect_stack_dumps(stuck) if stuck else {}
            report = "".join(
                f"── rank {r.rank} stderr ──\n{r.take_new('stderr')}"
                + (
                    f"── rank {r.rank} stack (still starting) ──\n"
                    + frames.format_dump(stacks[r.rank], full=True)
                    if stacks.get(r.rank)
                    else ""
                )
                for r in self._ranks
            )
            self._shutdown(polite=False)
            self._start_failure = WorldStartError(
                f"could not start {self.label}:\n" + "\n".join(problems) + "\n" + report
            )
            raise self._start_failure
        self._ready = True

    def _finish(self, job: PendingJob, collected: Collected) -> list[Any]:
        """The job's results, or (after relaunching the world if a rank may be broken) the
        :class:`RankError` that reports every rank's failure."""
        __tracebackhide__ = True
        self._pending = None
        if collected.regroup:
            self._generation += 1
        failures = collected.failures
        if not failures and not collected.unfinished:
            return collected.results
        fail.mark_consequences(failures)
        failures += fail.hung(collected.unfinished, job.timeout, bool(failures), job.marks)
        # Every rank finished its job and only a result failed to travel: the group is intact.
        relaunch = bool(collected.unfinished) or any(
            f.kind is not FailureKind.UNPICKLABLE_RESULT for f in failures
        )
        if relaunch:
            self._relaunch()
        failed = {f.rank for f in failures}
        raise RankError(
            job.name,
            self.size,
            self.backend,
            failures,
            where=self.label,
            world_relaunched=relaunch,
            hint=fail.hint(failures, debug=self.debug),
            finished=[r for r in range(self.size) if r not in failed],
        )

    def _relaunch(self) -> None:
        # Ranks that saw a failure may be inside a collective: no polite exit for them.
        self._shutdown(polite=False)
        # Start the next set of ranks now: they import torch while the caller reports. If that
        # fails, the next start() tries again and reports why.
        with contextlib.suppress(WorldError, forkserver.ForkServerError, OSError):
            self._spawn()

    def _shutdown(self, *, polite: bool = True) -> None:
        ranks = list(self._ranks)
        self._ready = False
        if polite:
            for r in ranks:
                if r.alive():
                    with contextlib.suppress(OSError):
                        r.jobs.send_bytes(protocol.encode((protocol.EXIT,)))
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and any(r.alive() for r in ranks):
                time.sleep(0.01)
        terminate(ranks)
        if ranks:
            self._untaken_output = self.take_output()
        self._ranks.clear()
        self._store = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


def _kill_and_remove(ranks: list[RankProcess], workdir: Path | None) -> None:
    terminate(ranks, grace_s=0.5)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def one_rank_world_like(source: Any, *, process_group: bool = True) -> World:
    """A world of one rank with ``source``'s settings (a :class:`World`, or a launched world,
    whose ranks' threads, environment and preloads are the launcher's and so stay the
    defaults here): the one-rank worlds beside a world and beside a launched job are one kind.

    Example::

        solo = one_rank_world_like(world)  # one rank, its own process group
    """
    return World(
        1,
        # The ranks' device and TF32 setting: float32's tolerance runs there measure the
        # rounding of the ranks' kind of device (the float64 truth stays on CPU).
        device=source.device,
        allow_tf32=source.allow_tf32,
        timeout=source.timeout,
        start_timeout=source.start_timeout,
        threads_per_rank=getattr(source, "threads_per_rank", 1),
        # The ranks' own environment, so both are forked from the same server.
        debug=source.debug,
        env=getattr(source, "_extra_env", None),
        preload=getattr(source, "preload", ()),
        process_group=process_group,
    )
