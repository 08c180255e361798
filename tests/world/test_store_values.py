"""What a launched job's ranks read from the launcher's store is data, not code: a value
written there by a process outside the job is read as words (the broken flag) or parsed as
data (every agreed value: seeds, outcomes, results, exceptions) and runs nothing."""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import Scenario
from ddp_verify.engine.tolerances import Float64Tolerance
from ddp_verify.world import WorldError, protocol, wire
from ddp_verify.world.agreement import Agreement, read_broken
from ddp_verify.world.errors import FailureKind, RankError, RankFailure

EVIL = textwrap.dedent(
    """
    import os, pickle, sys
    import torch.distributed as dist

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {sys.argv[2]}",))

    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)
    store.set(sys.argv[3], pickle.dumps(Evil()))
    """
)


def _store():
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip


def _outsider_writes(store, marker, key):
    subprocess.run(
        [sys.executable, "-c", EVIL, str(store.port), str(marker), key], check=True, timeout=60
    )


def test_a_broken_flag_written_by_an_outsider_is_read_as_words(tmp_path):
    store = _store()
    marker = tmp_path / "ran"
    _outsider_writes(store, marker, "broken")
    # What pickle.loads would have done: run the outsider's command.
    assert b"os" in store.get("broken") and b"system" in store.get("broken")
    said = read_broken(store)
    assert isinstance(said, str) and not marker.exists()
    # A rank that finds the flag set stops with those words, and runs nothing either.
    agreement = Agreement(store, rank=0, size=2)
    try:
        agreement.agree("a job", None, deadline=0.0)
    except Exception as exc:  # WorldBroken (a WorldError), or Late once the deadline passed
        assert not marker.exists(), exc
    assert not marker.exists()
    # The flag a rank writes is plain text, read back as written.
    store.delete_key("broken")
    Agreement(store, rank=1, size=2).break_("rank 1 hung")
    assert store.get("broken") == b"rank 1 hung" and read_broken(store) == "rank 1 hung"


def test_an_agreed_value_written_by_an_outsider_is_refused_and_runs_nothing(tmp_path):
    # Rank 1's post for the first agreement, forged: rank 0 parses it as data, refuses it with
    # a WorldError naming the key, and breaks the world for every rank.
    store = _store()
    marker = tmp_path / "ran"
    _outsider_writes(store, marker, "agree/1/1")
    agreement = Agreement(store, rank=0, size=2)
    with pytest.raises(WorldError, match=r"rank 1's value for 'the seed' \(key 'agree/1/1'\)"):
        agreement.agree("the seed", 7, deadline=time.monotonic() + 30)
    assert not marker.exists()
    assert "not a value ddp_verify wrote" in read_broken(store)


def test_what_ranks_agree_on_travels_as_data():
    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),))
    trace = train_reference(scenario, "float64")
    skipped = pytest.skip.Exception("no GPU")
    for value in (
        {"seed": 3, "ids": ["a", "b"]},
        (protocol.Outcome(1, ok=True, result=b"x"), 0.5),
        trace,
        Float64Tolerance(),
        torch.arange(3.0),
    ):
        again = wire.loads(wire.dumps(value))
        assert type(again) is type(value)
    again = wire.loads(wire.dumps(trace))
    torch.testing.assert_close(again.ranks[0].params[0], trace.ranks[0].params[0])
    assert type(wire.loads_exception(wire.dumps_exception(skipped))) is type(skipped)
    # A job's failure, as a known torch issue's mark reads it on every rank.
    failure = RankFailure(
        1, FailureKind.RAISED, "raised AssertionError", details="in _orthogonalize"
    )
    error = RankError("a job", 2, "gloo", [failure], world_relaunched=False)
    again = wire.loads_exception(wire.dumps_exception(error))
    assert isinstance(again, RankError) and "in _orthogonalize" in again.failures[0].details
    assert str(wire.loads_exception(wire.dumps_exception(ValueError("bad")))) == "bad"


class _Mine:
    pass


def test_a_value_that_is_not_data_is_refused_where_it_is_written():
    with pytest.raises(wire.WireError, match=r"the result of a job \(_Mine\) cannot travel"):
        wire.dumps(_Mine(), what="the result of a job")
    # A user's exception class travels as its text only (None here), never as a pickle.
    assert wire.dumps_exception(type("Custom", (Exception,), {})("x")) is None


def test_a_module_of_ours_imported_afresh_is_allowed_with_its_new_classes(monkeypatch):
    # pytester restores sys.modules after an inline run: one of our modules may be dropped
    # and imported again while another goes, the count of modules unchanged. The allow-list
    # must follow the modules themselves (a stale one refused the agreement's own _Posted).
    import importlib

    from ddp_verify.world import agreement

    before = wire.loads(wire.dumps(agreement._Posted("t", 1), what="x"), what="x")
    assert before.value == 1
    import ddp_verify.world

    # Both restored after the test: the module in sys.modules and the package's attribute.
    monkeypatch.delitem(sys.modules, "ddp_verify.world.agreement")
    monkeypatch.setattr(ddp_verify.world, "agreement", agreement)
    fresh = importlib.import_module("ddp_verify.world.agreement")
    assert fresh._Posted is not agreement._Posted
    after = wire.loads(wire.dumps(fresh._Posted("t", 2), what="x"), what="x")
    assert isinstance(after, fresh._Posted) and after.value == 2


def test_values_read_on_several_threads_at_once_are_all_allowed():
    # torch's safe_globals swaps a process-wide allow-list in and out: unguarded, one thread
    # leaving it took the list from another still reading (a rank's watchdog and its main
    # thread; CI saw the thread-ranks of test_spmd_parts refuse the agreement's own _Posted).
    import threading

    from ddp_verify.world import agreement

    data = wire.dumps(agreement._Posted("t", [1.5, "x"]), what="x")
    errors: list[BaseException] = []

    def read() -> None:
        for _ in range(300):
            try:
                wire.loads(data, what="x")
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
