"""The pytest session of one rank of a launched job (SPMD mode): registered by the plugin when
pytest runs under ``torchrun`` or ``srun``, as pytest-xdist registers its worker session.

Every rank runs the whole session; this makes the ranks one session: the collected tests are
checked to be the same on every rank, every hypothesis test runs in lockstep, every test
phase's outcome is agreed (a failure on any rank fails the test on every rank, with that rank's
report), rank 0 prints and writes the reports while the others stay quiet, and a world that
broke (a hung or dead rank) stops the session on every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ..engine import compat
from ..engine.lockstep import in_lockstep
from ..world import WorldError
from ..world.spmd import SpmdWorld


def quiet(rank: int, log_dir: str | None) -> None:
    """Send this (non-zero) rank's terminal output to its log, or nowhere: rank 0 reports.

    Done with file descriptors before pytest starts capturing, so pytest's own restoring of
    stdout puts it back here, not on the terminal. Without a log directory stderr stays, so
    a rank that crashes still says why.
    """
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        target = os.open(Path(log_dir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    else:
        target = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(Exception):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
    os.dup2(target, 1)
    if log_dir:
        os.dup2(target, 2)
    os.close(target)


class SpmdSession:
    """The hooks that make the launched ranks one pytest session (see the module text)."""

    def __init__(self, config: pytest.Config, world: SpmdWorld) -> None:
        self.config = config
        self.world = world
        self.member = world.member
        if self.member.rank != 0:
            # One report: rank 0's. (The others' failures reach it through the agreement.)
            compat.without_junit_xml(config)
        # Every @given in the session, even one built inside a test and not wrapped with the
        # lockstep fixture, draws from one agreed seed (as --hypothesis-seed would make it).
        if compat.forced_seed() is None:
            mine = random.SystemRandom().getrandbits(32)
            compat.force_seed(self.world.agree("the hypothesis seed", mine)[0])
        self.seed = compat.forced_seed()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        ids = [item.nodeid for item in session.items]
        digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]
        everyone = self.world.agree("the collected tests", (digest, ids))
        if len({d for d, _ in everyone}) == 1:
            return
        mine = set(ids)
        lines = []
        for r, (d, theirs) in enumerate(everyone):
            extra = sorted(set(theirs) - mine)[:3]
            missing = sorted(mine - set(theirs))[:3]
            lines.append(
                f"  rank {r}: {len(theirs)} tests (hash {d})"
                + (f"; only there: {', '.join(extra)}" if extra else "")
                + (f"; not there: {', '.join(missing)}" if missing else "")
            )
        raise pytest.UsageError(
            "the ranks of this launched job collected different tests, so they cannot run them "
            "together:\n" + "\n".join(lines) + "\nEvery rank must see the same files and "
            "options (-k, -m, --lf), with no rank-dependent parametrization or skips at "
            "collection."
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Every test may use the group (plain tests call torch.distributed themselves).
        self.world.start()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if function is not None:
            in_lockstep(function, self.world, name=item.nodeid)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[Any]
    ) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        rank, size = self.member.rank, self.member.size
        if self.member.broken:
            # Already reported by the phase that broke it: finish this test as it is, stop.
            item.session.shouldfail = _stop_reason(WorldError(self.member.broken))
            return report
        mine = (
            report.outcome,
            report.longreprtext if report.failed else "",
            [s for s in report.sections if report.failed],
            _crash(report),
        )
        try:
            everyone = self.world.agree(f"the {call.when} of {item.nodeid}", mine)
        except WorldError as exc:
            report.outcome = "failed"
            report.longrepr = f"{report.longreprtext}\n{exc}".strip()
            item.session.shouldfail = _stop_reason(exc)
            return report
        failing = [(r, said) for r, said in enumerate(everyone) if said[0] == "failed"]
        shown = _crash(report)
        if failing and not report.failed:
            first, (_, text, _, shown) = failing[0]
            report.outcome = "failed"
            report.longrepr = (
                f"[ddp_verify] failed on rank {first} of {size} (rank {rank} passed):\n{text}"
            )
            with contextlib.suppress(AttributeError):
                del report.wasxfail
        for r, (_, text, sections, crash) in failing:
            if r == rank:
                continue
            if crash != shown:
                # A failure of its own (agreed failures are the same on every rank).
                report.sections.append((f"rank {r} of {size} failed too", text))
            for title, body in sections:
                report.sections.append((f"{title} (rank {r})", body))
        if self.member.broken:
            item.session.shouldfail = _stop_reason(WorldError(self.member.broken))
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.member.failed = exitstatus != 0

    def pytest_report_header(self, config: pytest.Config) -> str:
        launched = self.member.launched
        nodes = f" on {launched.nodes} nodes" if launched.nodes > 1 else ""
        logs = config.getoption("ddp_log_dir")
        return (
            f"ddp_verify: SPMD under {launched.launcher}: this is rank {launched.rank} of "
            f"{launched.world_size}{nodes} (local rank {launched.local_rank}), rendezvous "
            f"{launched.master_addr}:{launched.master_port}; rank 0 reports"
            + (f", the others log to {logs}" if logs else "")
            + f"; hypothesis seed {self.seed} on every rank (--hypothesis-seed {self.seed} "
            "replays it)"
        )


def _crash(report: pytest.TestReport) -> str:
    """The one line that says how a phase failed (the same on every rank for an agreed
    failure)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else ""
    return report.longreprtext.strip().splitlines()[0] if report.longreprtext.strip() else ""


def _stop_reason(exc: BaseException) -> str:
    # The failure itself is in the test's report; the stop line only says why the rest is off.
    del exc
    return (
        "ddp_verify: the launched world can no longer be trusted after this failure; the job ends"
    )
