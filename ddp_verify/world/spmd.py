"""SPMD mode: under ``torchrun`` or ``srun`` this process *is* one rank of the world.

Fork mode and SPMD mode share one job protocol and one report; the mode is only how the ranks
come to be. In fork mode a controller ships each job to rank processes it forked and gathers
their outcomes; here every launched process runs the same program, so ``run(fn)`` runs ``fn``
right here and the ranks then *agree* on what happened: each posts its outcome to the job's
store and reads everyone's, so every rank holds every rank's result (or the same
:class:`~ddp_verify.world.errors.RankError`) and takes the same branch next. The store, not the
process group, carries that agreement, so it still works when a collective failed or hung.

What can go wrong, and what every rank then sees:

- a rank raises: it destroys its process group at once (peers waiting on it in a collective
  fail within milliseconds instead of waiting out the time-out), every rank reports that rank's
  traceback, and all re-form the group before the next job;
- a collective hangs (ranks that called different collectives): the group's own time-out,
  the job time-out, makes it raise; every rank reports it, and the world is broken: a process
  group that timed out cannot be trusted, so the session ends;
- a rank is stuck outside collectives (a loop): the others wait until the job's deadline,
  then ask it for its stack (a watchdog thread on every rank answers from the store), report
  it, and the world is broken; the stuck rank's watchdog ends its process once rank 0 has
  reported, so the launcher tears the job down;
- a rank dies: its heartbeat stops, and the others report which rank within seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Generic, TypeVar

from . import protocol, wire
from .agreement import DEAD_AFTER_S, Agreement, Late, OutOfStep
from .backends import DEVICE, check_backend, check_device, placement
from .errors import Category, FailureKind, RankError, RankFailure, WorldError
from .interface import RunsJobs
from .launch import Launched
from .naming import option
from .runtime import Group, flush, run_job, set_up_device
from .watchdog import BEAT_S, Activity, Watchdog, request_stacks

__all__ = ["DEAD_AFTER_S", "LauncherTerminated", "Member", "OutOfStep", "SpmdPool", "SpmdWorld"]

# How often the watchdog beats and looks for requests; how long a silent heart means dead.
# After a job's deadline, how long a waiting rank gives a late one to send its stack.
_STACK_WAIT_S = 3.0
# At the end, how long a rank waits for the others to be done.
_END_WAIT_S = 30.0
# The job's deadline is shared; the others get this much more to post what they did.
_REPORT_GRACE_S = 1.0
# How often a rank waiting at the end looks again.
_POLL_S = 0.05


class LauncherTerminated(KeyboardInterrupt):
    """The launcher sent SIGTERM (it tears the whole job down when one rank exits): raised
    where the rank was, so that what was running is still reported, as for Ctrl-C."""


class Member:
    """This process's membership of a launched world: its device, its store, its process
    group (:class:`~ddp_verify.world.runtime.Group`), the agreements between ranks
    (:class:`~ddp_verify.world.agreement.Agreement`) and the watchdog that answers for this
    rank when it is stuck (:class:`~ddp_verify.world.watchdog.Watchdog`).

    Example::

        member = Member(detect(os.environ), backend="gloo", device="cpu", timeout=60.0)
        member.join()
        everyone = member.agree("hello", member.rank)   # [0, 1, 2, 3] on every rank
    """

    def __init__(
        self,
        launched: Launched,
        *,
        backend: str = "gloo",
        device: str | None = None,
        allow_tf32: bool = False,
        timeout: float = 60.0,
        start_timeout: float = 120.0,
        debug: bool = False,
    ) -> None:
        check_backend(backend)
        self.launched = launched
        self.rank = launched.rank
        self.size = launched.world_size
        self.backend = backend
        self.device = check_device(backend, device)
        self.allow_tf32 = allow_tf32
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.debug = debug
        self.connected = False
        self.joined = False
        # Whether the default group is one the user formed before ddp_verify needed one
        # (used as it is; after a failed job every rank forms ddp_verify's own instead).
        self.adopted = False
        self._store: Any = None
        self._agreement: Agreement | None = None
        self._watchdog: Watchdog | None = None
        self._group: Group | None = None
        self._regroup = False
        self._activity: Activity = None
        self._finished = False
        self.terminated = False
        # Set by the front end when this rank's session failed: then rank 0 must leave first,
        # so that the launcher (which ends the job at the first failing exit) names it.
        self.failed = False

    @property
    def agreement(self) -> Agreement:
        if self._agreement is None:
            raise WorldError("this rank has not connected to the launched job's store yet")
        return self._agreement

    @property
    def broken(self) -> str:
        """Why the world cannot be used any more (empty while it can)."""
        return self._agreement.broken if self._agreement is not None else ""

    @property
    def gone(self) -> set[int]:
        """Ranks known to be dead or stuck."""
        return self._agreement.gone if self._agreement is not None else set()

    # -- joining -----------------------------------------------------------------------------

    def connect(self) -> Member:
        """Choose the device, connect to the job's store and start the watchdog: enough to
        agree with the other ranks (on the collected tests, say), without a process group.

        The group is formed by :meth:`join`, as late as possible: a module imported after it
        exists can keep it alive (``torch._inductor`` does), and a group that cannot be
        destroyed cannot free its peers from a collective when a rank fails.
        """
        if self.connected:
            return self
        import torch.distributed as dist

        try:
            device_id = set_up_device(self.device, self.allow_tf32, self.launched.local_rank)
        except RuntimeError:
            raise WorldError(
                f"rank {self.rank} was asked to train on CUDA but sees no GPU "
                f"(CUDA_VISIBLE_DEVICES?): launch where GPUs are, or pass "
                f"{option('device', 'cpu')}"
            ) from None
        if self.debug:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        if dist.is_initialized():
            # The user's conftest (or script) formed it: use it, and its store.
            self.adopted = True
            base = dist.distributed_c10d._get_default_store()
        else:
            base = self._connect()
        self._store = dist.PrefixStore("ddp_verify", base)
        self._agreement = Agreement(self._store, self.rank, self.size)
        self._group = Group(
            self.backend,
            self._store,
            rank=self.rank,
            size=self.size,
            timeout_s=self.timeout,
            device_id=device_id,
            prefix="group/",
        )
        # The watchdog talks to the store on a connection of its own, so that it never waits
        # behind the main thread's blocking wait (an adopted group's store is shared).
        watch_base = base if self.adopted else self._connect(client=True)
        self._watchdog = Watchdog(
            dist.PrefixStore("ddp_verify", watch_base),
            self.rank,
            activity=lambda: self._activity,
            broken=lambda: self.broken,
        )
        self.connected = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._terminated)
        self._watchdog.start()
        # Stopped and joined before the interpreter finalises (see Watchdog.stop).
        atexit.register(self._watchdog.stop, _END_WAIT_S)
        return self

    def join(self) -> Member:
        """:meth:`connect`, then form (or adopt) the default process group."""
        if self.joined:
            return self
        import torch.distributed as dist

        self.connect()
        if dist.is_initialized():
            self.adopted = True  # formed by the user (a conftest, a fixture) meanwhile
        else:
            # Forming waits for the peers no longer than a job may run: meet first, with the
            # start time-out, so that a rank still importing does not fail the others' init.
            self.agree("forming the process group", None, timeout=self.start_timeout)
            assert self._group is not None
            self._group.form()
        self.joined = True
        return self

    def _terminated(self, signum: int, frame: Any) -> None:
        # The launcher ends the job (a rank exited, often by dying): stop where we are, as
        # Ctrl-C would, so that pytest (or the CLI) still reports what was running.
        waiting = self._agreement.waiting if self._agreement else ""
        doing = (
            f" during {self._activity[0]}"
            if self._activity
            else f" while waiting for the other ranks at {waiting}"
            if waiting
            else ""
        )
        # The others are being ended too: nothing to wait for at the end.
        self.terminated = True
        raise LauncherTerminated(
            f"rank {self.rank} was terminated by {self.launched.launcher}{doing}: another rank "
            "probably ended first (the launcher's report names it and its exit code)"
        )

    def _connect(self, *, client: bool = False) -> Any:
        import torch.distributed as dist

        launched = self.launched
        # torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT; otherwise
        # rank 0 serves it, as torch's env:// rendezvous would.
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        try:
            return dist.TCPStore(
                launched.master_addr,
                launched.master_port,
                self.size,
                is_master=self.rank == 0 and not agent and not client,
                timeout=datetime.timedelta(seconds=self.start_timeout),
                multi_tenant=True,
            )
        except RuntimeError as exc:
            raise WorldError(
                f"rank {self.rank} could not reach the job's store at "
                f"{launched.master_addr}:{launched.master_port} ({launched.launcher}) within "
                f"{self.start_timeout:g} s: {exc}\nCheck MASTER_ADDR/MASTER_PORT (for Slurm, "
                "export MASTER_PORT, or let ddp_verify derive one from SLURM_JOB_ID). If this "
                "process was not launched as one rank of a job (RANK and WORLD_SIZE are left "
                f"over in the environment), run with {option('launch', 'fork')}"
            ) from None

    def regroup_if_needed(self) -> None:
        """Form the default group anew after a failed job (every rank does, at the same
        point of the program, because every rank saw the same failure)."""
        if not self._regroup:
            return
        self._regroup = False
        assert self._group is not None
        self._group.reform()

    def abandon_group(self) -> None:
        """Destroy this rank's process group now: peers waiting on it in a collective fail
        at once rather than at the time-out (see :meth:`Group.abandon`)."""
        if self._group is not None:
            self._group.abandon()

    def need_regroup(self) -> None:
        self._regroup = True

    # -- agreement ---------------------------------------------------------------------------

    def agree(
        self,
        tag: str,
        value: Any,
        *,
        timeout: float | None = None,
        since: float | None = None,
    ) -> list[Any]:
        """Post ``value`` under ``tag`` and return every rank's, in rank order.

        Waits until ``since + timeout`` (default: now plus the job time-out); a rank that is
        late then, or whose heartbeat stopped, raises :class:`RankError` naming it with its
        stack, and the world is broken from then on. Ranks at a different ``tag`` raise
        :class:`OutOfStep`.
        """
        __tracebackhide__ = True
        deadline = (since or time.monotonic()) + (timeout or self.timeout)
        try:
            return self.agreement.agree(tag, value, deadline=deadline)
        except Late as late:
            raise self._gave_up(late) from None

    def _gave_up(self, late: Late) -> RankError:
        """The ranks ``late`` names, each with the stack its watchdog gave (or how it died),
        as the error every waiting rank raises; the world is broken from now on."""
        agreement = self.agreement
        alive = [r for r in late.late if r not in late.dead]
        stacks = request_stacks(self._store, alive, _STACK_WAIT_S)
        unanswered = "(no stack came back: the rank did not answer)"
        failures = []
        for r in late.late:
            if r in late.dead:
                failures.append(
                    RankFailure(
                        r,
                        FailureKind.DIED,
                        f"stopped answering (its heartbeat stopped {DEAD_AFTER_S:g} s ago: the "
                        "process died or was killed)",
                    )
                )
            else:
                failures.append(
                    RankFailure(
                        r,
                        FailureKind.TIMED_OUT,
                        f"did not finish {late.tag} in time (rank {self.rank} waited until the "
                        "deadline)",
                        details=stacks[r][0] if r in stacks else unanswered,
                        full_details=stacks[r][1] if r in stacks else unanswered,
                    )
                )
        agreement.gone.update(late.late)
        error = RankError(
            late.tag,
            self.size,
            self.backend,
            failures,
            world_relaunched=False,
            where=self.label,
            hint=broken_hint(),
            world_state="The process group cannot be trusted any more.",
            finished=[r for r in range(self.size) if r not in late.late],
        )
        agreement.break_(str(error))
        return error

    def declare_broken(self, reason: str) -> None:
        """Every rank saw the same reason to distrust the group: stop using it (no agreement
        needed: each rank reached this verdict from the same agreed outcomes)."""
        self.agreement.declare_broken(reason)

    # -- what the watchdog says --------------------------------------------------------------

    def begin(self, activity: str) -> None:
        """Say what this rank is doing (the watchdog's answer when asked for its stack)."""
        self._activity = (activity, time.monotonic())

    def end(self) -> None:
        self._activity = None

    def finish(self) -> None:
        """End this rank's part: wait for the others at the end (so that no rank exits, and
        has the launcher tear the job down, before rank 0 has printed its report), and let
        rank 0 leave first: a launcher reports the first rank to exit as the root cause."""
        if self._store is None or self._finished:
            return
        self._finished = True
        if threading.current_thread() is threading.main_thread():
            # From here on the launcher may end this process at any time: let it, quietly.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        flush()
        if self.terminated:
            return
        try:
            if not self.broken:
                self.agree("the end of the session", None)
            self._leave()
        except (WorldError, RuntimeError) as exc:
            # The session's results are in; only leaving together failed (a rank that ran
            # other tests, a store already gone): said, not hidden.
            sys.stderr.write(f"ddp_verify: rank {self.rank} could not end with the others: {exc}\n")
        if self.rank != 0 and self._watchdog is not None:
            self._watchdog.stop(_END_WAIT_S)
        if self.joined:
            import torch.distributed as dist

            # Left to the interpreter's exit, a gloo group (ours or the user's) can abort it
            # ("terminate called without an active exception"), the more so after a time-out.
            if dist.is_initialized():
                with contextlib.suppress(RuntimeError, ValueError):
                    dist.destroy_process_group()

    def _leave(self) -> None:
        """Say this rank has ended; rank 0, whose process serves the store (unless a launcher
        agent does), stays until the others are done with it; a failed session's other ranks
        wait for rank 0 to be gone, so that the launcher names rank 0."""
        store, agreement = self._store, self.agreement
        store.set(f"ended/{self.rank}", b"1")
        store.set("ended/any", b"1")
        ended = store.add("ended", 1)
        serving = self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        until = time.monotonic() + _END_WAIT_S
        if serving:
            while ended < self.size - len(agreement.gone) and time.monotonic() < until:
                time.sleep(_POLL_S)
                ended = store.add("ended", 0)
        elif self.rank != 0 and 0 not in agreement.gone and self.failed:
            # Rank 0's watchdog beats until its process is gone.
            last, since = agreement.beat_of(0), time.monotonic()
            while time.monotonic() < until and time.monotonic() - since < 3 * BEAT_S:
                time.sleep(_POLL_S)
                try:
                    beat = agreement.beat_of(0)
                except RuntimeError:
                    return  # the store went with rank 0's process
                if beat != last:
                    last, since = beat, time.monotonic()

    @property
    def label(self) -> str:
        on = f", {self.device}" if DEVICE[self.device].gpus else ""
        return f"the launched world of {self.size} ({self.backend}{on}, {self.launched.launcher})"


def broken_hint() -> str:
    """What a broken launched world means, and what to try."""
    return (
        "A rank that hangs or dies leaves the process group in a state that cannot be trusted "
        "again: this job ends after this test (the launcher then tears it down). Rerun with "
        f"{option('debug', True)} to have torch name mismatched collectives."
    )


class _Done:
    """A job already run and agreed on (SPMD jobs run when submitted)."""

    def __init__(self, results: list[Any] | None, error: BaseException | None) -> None:
        self._results, self._error = results, error

    def result(self) -> list[Any]:
        __tracebackhide__ = True
        if self._error is not None:
            raise self._error
        assert self._results is not None
        return self._results


class SpmdWorld(RunsJobs):
    """The launched job as a :class:`~ddp_verify.world.World`: the same ``run`` / ``submit``
    / ``helper`` interface, run by every rank together.

    ``run(fn)`` runs ``fn`` on this rank and returns every rank's result, in rank order, on
    every rank (or raises the same :class:`RankError` on every rank).

    Example (every rank of ``torchrun --nproc-per-node 4`` runs this)::

        world = SpmdWorld(Member(detect(os.environ)).join())
        assert world.run(lambda: dist.get_rank()) == [0, 1, 2, 3]
    """

    # Every rank runs the same program: hypothesis must draw the same examples on each.
    lockstep = True

    def __init__(self, member: Member) -> None:
        self.member = member
        self.size = member.size
        self.backend = member.backend
        self.device = member.device
        self.allow_tf32 = member.allow_tf32
        self.timeout = member.timeout
        self.start_timeout = member.start_timeout
        self.debug = member.debug
        self.label = member.label
        self.launches = 0
        self.start_method = member.launched.launcher
        self._helper: LocalHelper | None = None
        self._solo: LocalSolo | None = None

    # The World lifecycle: the launcher owns the processes, so there is little to do.
    def start(self) -> SpmdWorld:
        if not self.member.joined:
            self.member.join()
            self.launches = 1
        return self

    def launch(self) -> SpmdWorld:
        return self.start()

    def prestart(self) -> SpmdWorld:
        return self

    def retry_start(self) -> None:
        """Nothing to retry: a launched world that fails to form ends the job."""

    def restart(self) -> bool:
        """A launched job's ranks are the job: they cannot be replaced (False)."""
        return False

    def close(self) -> None:
        if self._solo is not None:
            self._solo.close()
        self.member.finish()

    def __enter__(self) -> SpmdWorld:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.member.rank

    @property
    def pids(self) -> list[int]:
        return [os.getpid()]

    @property
    def placement(self) -> str:
        if not DEVICE[self.device].gpus:
            return self.device
        from .backends import visible_gpus

        return placement(self.size, self.device, visible_gpus())

    @property
    def helper(self) -> LocalHelper:
        """Work beside the ranks' (the reference): each rank does it itself, here."""
        if self._helper is None:
            self._helper = LocalHelper(self)
        return self._helper

    @property
    def solo(self) -> LocalSolo:
        """The one-rank world: forked, in its turn, by a rank of the job (see
        :class:`LocalSolo`)."""
        if self._solo is None:
            self._solo = LocalSolo(self)
        return self._solo

    def connect(self) -> SpmdWorld:
        """Reach the other ranks (through the job's store) without forming the group yet."""
        self.member.connect()
        return self

    def agree(self, tag: str, value: Any) -> list[Any]:
        """Every rank's ``value`` under ``tag``, in rank order (see :meth:`Member.agree`)."""
        self.member.connect()
        return self.member.agree(tag, value)

    def take_output(self) -> list[tuple[str, str]]:
        # Each rank's output is its own process's: pytest captures it there.
        return [("", "")] * self.size

    def __reduce__(self) -> Any:
        raise TypeError("a world cannot be sent to its ranks: inside a job, use torch.distributed")

    def __repr__(self) -> str:
        return f"<SpmdWorld rank={self.rank} size={self.size} backend={self.backend}>"

    # -- jobs (run and run_job: RunsJobs) ---------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        by_value: Sequence[ModuleType] = (),
        name: str | None = None,
    ) -> _Done:
        """Run the job here, now, and agree on its outcome with the other ranks."""
        __tracebackhide__ = True
        del by_value  # every rank has the code already
        import torch.distributed as dist

        member = self.member
        if member.broken:
            return _Done(
                None, WorldError(f"{self.label} cannot run jobs any more: {member.broken}")
            )
        self.start()
        member.regroup_if_needed()
        name = name or protocol.job_name(fn)
        timeout = timeout or self.timeout
        started = time.monotonic()
        member.begin(name)
        try:
            # Through pickle, as a forked rank receives it: the job gets its own copies, and
            # what is shipped by value arrives as it would there.
            outcome = run_job(*protocol.load_job(protocol.dump_job(fn, args, dict(kwargs or {}))))
            if not outcome.ok:
                member.abandon_group()
        finally:
            member.end()
        outcome.process_group_alive = dist.is_initialized()
        elapsed = time.monotonic() - started
        posted = _as_data(outcome, name)
        try:
            outcomes = member.agree(
                name, (posted, elapsed), timeout=timeout + _REPORT_GRACE_S, since=started
            )
        except WorldError as exc:
            return _Done(None, exc)
        failures, results = [], []
        regroup = False
        for r, (theirs, took) in enumerate(outcomes):
            regroup |= not theirs.process_group_alive
            mine = outcome if r == member.rank else None
            try:
                if theirs.ok:
                    results.append(_result(theirs, mine, name, r))
                    continue
                results.append(None)
                failures.append(_failure(r, theirs, order=took, mine=mine))
            except wire.WireError as exc:
                member.declare_broken(str(exc))
                return _Done(None, exc)
        if not failures:
            if regroup:
                # A job destroyed the default group on some rank: re-form it on every rank.
                member.need_regroup()
                member.regroup_if_needed()
            return _Done(results, None)
        from .failures import hint, mark_consequences

        mark_consequences(failures)
        timed_out = [f.rank for f in failures if f.category is Category.COLLECTIVE_TIMEOUT]
        if timed_out:
            # The collective may be half-done on some ranks: the group cannot be trusted.
            which = ", ".join(map(str, timed_out))
            member.declare_broken(
                f"a collective timed out on rank{'s' if len(timed_out) > 1 else ''} {which} "
                f"during {name}"
            )
        # Every rank saw this failure here: all form the group anew together, now, so that
        # whatever runs next (a job, or a test's own collectives) has one.
        if not member.broken:
            member.need_regroup()
            member.regroup_if_needed()
        failed = {f.rank for f in failures}
        return _Done(
            None,
            RankError(
                name,
                self.size,
                self.backend,
                failures,
                world_relaunched=False,
                where=self.label,
                hint=(broken_hint() if member.broken else hint(failures, debug=self.debug)),
                world_state=(
                    "The process group cannot be trusted any more."
                    if member.broken
                    else "Every rank formed the process group anew; the world is still up."
                ),
                finished=[r for r in range(self.size) if r not in failed],
            ),
        )


def _failure(
    rank: int,
    outcome: protocol.Outcome,
    *,
    order: float = 0.0,
    mine: protocol.Outcome | None = None,
) -> RankFailure:
    """How ``rank`` failed, from the outcome it posted (this rank's own exception from
    ``mine``, its local outcome: it never left this process)."""
    if mine is not None:
        exception = protocol.load_exception(mine.exception)
    else:
        exception = wire.loads_exception(outcome.exception, what=f"rank {rank}'s exception")
    return RankFailure(
        rank,
        FailureKind(outcome.error_kind),
        outcome.error_summary,
        details=outcome.error_traceback,
        full_details=outcome.error_traceback_full,
        exception=exception,
        order=order,
    )


def _as_data(outcome: protocol.Outcome, name: str) -> protocol.Outcome:
    """``outcome`` as the other ranks read it from the store: its result and its exception as
    data (:mod:`.wire`), never pickles; a result that is not data fails the job here, with
    the reason, as it would fail on every rank."""
    if outcome.ok:
        try:
            value = protocol.load_result(outcome.result or b"")  # this process's own bytes
            return dataclasses.replace(
                outcome, result=wire.dumps(value, what=f"the result of {name}")
            )
        except wire.WireError as exc:
            return protocol.Outcome(
                outcome.job_id,
                ok=False,
                error_kind=FailureKind.UNPICKLABLE_RESULT.value,
                error_summary=str(exc),
            )
    exception = protocol.load_exception(outcome.exception)
    data = None if exception is None else wire.dumps_exception(exception)
    return dataclasses.replace(outcome, exception=data)


def _result(theirs: protocol.Outcome, mine: protocol.Outcome | None, name: str, rank: int) -> Any:
    """Rank ``rank``'s result: this rank's from its own outcome, another's read as data."""
    if mine is not None and mine.ok:
        return protocol.load_result(mine.result or b"")
    return wire.loads(theirs.result or b"", what=f"rank {rank}'s result of {name}")


class LocalHelper(RunsJobs):
    """The helper of a launched world: work beside the ranks' (the reference, a tolerance's
    measuring runs) done by one rank, in turn, and shared with the others through the store.

    Every rank would get the same result by doing the work itself, but on a machine whose
    ranks share cores that costs the work times the ranks; done once, it costs what the
    fork mode's helper process costs, and every rank compares against the very same result.

    Example::

        reference = world.helper.run(train_reference, scenario)[0]
    """

    size = 1
    process_group = False
    # The store's agreement tag: a job named alike in the helper and the one-rank world
    # reads apart in a stuck-rank report.
    tag = "helper"

    def __init__(self, world: SpmdWorld) -> None:
        self._world = world
        self.device = world.device
        self.allow_tf32 = world.allow_tf32
        self.label = f"the helper work of {world.label}"
        self._jobs = 0

    @property
    def timeout(self) -> float:
        return self._world.timeout

    def run_job(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        **_: Any,
    ) -> list[Any]:
        __tracebackhide__ = True
        world, member = self._world, self._world.member
        name = name or protocol.job_name(fn)
        # The same turn on every rank: every rank asks for the same helper jobs in order.
        runner = self._jobs % world.size
        self._jobs += 1
        started = time.monotonic()
        outcome = None
        mine = None
        if member.rank == runner:
            member.begin(f"{name} (the helper work)")
            try:
                mine = self._execute(fn, args, dict(kwargs or {}), name)
            finally:
                member.end()
        outcome = member.agree(
            f"{self.tag}: {name}",
            None if mine is None else _as_data(mine, name),
            timeout=(timeout or world.timeout) + _REPORT_GRACE_S,
            since=started,
        )[runner]
        try:
            if outcome.ok:
                return [_result(outcome, mine, name, runner)]
            failure = _failure(runner, outcome, mine=mine)
        except wire.WireError as exc:
            member.declare_broken(str(exc))
            raise
        raise RankError(
            name,
            1,
            "none",
            [failure],
            world_relaunched=False,
            where=f"rank {runner}, doing {self.label}",
            world_state="The world is still up.",
        )

    def _execute(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], name: str
    ) -> protocol.Outcome:
        """The job, run on this rank (the runner's turn), as an outcome."""
        return run_job(fn, args, kwargs)

    def retry_start(self) -> None:
        """Nothing to start."""

    def launch(self) -> LocalHelper:
        return self

    def start(self) -> LocalHelper:
        return self

    def close(self) -> None:
        """Nothing to stop."""


class LocalSolo(LocalHelper):
    """The one-rank world of a launched world: a rank's own default process group is the
    job's, so the job's one-rank work (a coupled loss's reference: the code itself on one
    rank holding the whole batch) runs on a world of one rank forked by the rank whose turn
    it is, in a process group of its own, and is shared through the store as the helper's
    work is. Forked on first use, closed with the launched world.

    Example::

        references = world.solo.run_job(train_whole_variants, (method, scenario, 1))[0]
    """

    process_group = True
    tag = "solo"

    def __init__(self, world: SpmdWorld) -> None:
        super().__init__(world)
        self.label = f"the one-rank world beside {world.label}"
        self._forked: Any = None

    def _execute(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], name: str
    ) -> protocol.Outcome:
        return run_job(self._on_one_rank, (fn, args, kwargs, name), {})

    def _on_one_rank(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], name: str
    ) -> Any:
        if self._forked is None:
            from .world import one_rank_world_like

            self._forked = one_rank_world_like(self._world)
            self._forked.label = self.label
        return self._forked.run_job(fn, args, kwargs, name=name)[0]

    def close(self) -> None:
        if self._forked is not None:
            self._forked.close()
            self._forked = None


S = TypeVar("S", bound=SpmdWorld)


class SpmdPool(Generic[S]):
    """:class:`~ddp_verify.world.WorldPool`'s interface over the one launched world: a size
    that is not the launched one cannot be had (callers skip it with the reason).

    Example::

        pool = SpmdPool(world)
        pool.get(world.size) is world
    """

    def __init__(self, world: S) -> None:
        self.world = world

    def get(self, size: int, backend: str | None = None, *, start: bool = True) -> S:
        from .errors import BackendUnavailable

        if size != self.world.size:
            raise BackendUnavailable(
                f"this job was launched with {self.world.size} ranks, so a world of {size} "
                f"cannot run in it (launch {size} processes for that size)"
            )
        if backend is not None and backend != self.world.backend:
            raise BackendUnavailable(f"the launched world uses {self.world.backend}, not {backend}")
        if start:
            self.world.start()
        return self.world

    def worlds(self) -> list[S]:
        return [self.world] if self.world.member.joined else []

    def close(self) -> None:
        self.world.close()
