"""benchmarks/bench.py survives its yardsticks: a sample that crashes is tried once more on the
same input and otherwise recorded as failed, every other figure kept and the failure printed
under the tables; the diagnosis row's recording of a search's examples leaves the search as
it found it. Run in a fresh interpreter: the benchmark puts the fixtures on ``sys.path`` and
imports them under their file names."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import bench
    from ddp_verify.usercode import search

    calls = []

    def crashes_once(given):
        calls.append(given)
        if len(calls) == 1:
            raise RuntimeError("spawned world died\\nterminate called without an active exception")
        return float(given)

    def always_crashes():
        raise OSError("the bare rank did not get ready\\nSIGABRT")

    failures = {}
    kept = bench.samples("flaky yardstick", crashes_once, 2, failures, 10, 20)
    lost = bench.samples("broken yardstick", always_crashes, 2, failures)

    checked = search.assert_equivalent
    try:
        with bench.examples_recorded() as ran:
            wrapped = search.assert_equivalent is not checked
            raise KeyError("a search that fails midway")
    except KeyError:
        pass
    table = bench.render({"2": {"ddp_check_ms": 12.5, "failures": failures}})
    print(json.dumps({
        "kept": kept, "calls": calls, "lost": lost, "failures": failures, "ran": ran,
        "wrapped": wrapped, "restored": search.assert_equivalent is checked, "table": table,
    }))
    """
)


def _run(script: str) -> Any:
    """``script`` in a fresh interpreter beside the benchmark: the JSON it prints last."""
    result = subprocess.run(
        [sys.executable, "-c", script, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_crashing_sample_is_tried_again_then_recorded_and_nothing_else_is_lost() -> None:
    got = _run(SCRIPT)
    # The crashed sample was tried again on the same input, and both samples count.
    assert got["calls"] == [10, 10, 20]
    assert got["kept"] == [10.0, 20.0]
    assert "flaky yardstick" not in got["failures"]
    # A yardstick that crashes every time gives no figure and a recorded reason.
    assert got["lost"] == []
    assert got["failures"] == {"broken yardstick": "OSError: SIGABRT"}
    table = got["table"]
    assert "ws 2: broken yardstick failed twice, left out: OSError: SIGABRT" in table
    ddp_row = next(line for line in table.splitlines() if line.split()[1:2] == ["ddp"])
    assert "12.5" in ddp_row and ddp_row.split()[3] == "-"  # measured kept, the rest "-"
    # The search's examples were recorded through a wrapper, put back when the search ended.
    assert got["wrapped"] is True and got["restored"] is True and got["ran"] == []


ROUNDS_SCRIPT = textwrap.dedent(
    """
    import argparse, json, sys, types
    sys.path.insert(0, sys.argv[1])
    import bench

    ran = []  # (who ran, scenario), in the order the examples ran

    class Ran:
        def __init__(self, name):
            self.name = name

        def run(self, kind, scenario, *, reference=True):
            ran.append((self.name if reference else self.name + " without reference", scenario))

        def check_equivalent(self, method, scenario):
            ran.append((self.name, scenario))
            return types.SimpleNamespace(equivalent=True)

    bench.timed_rounds(
        Ran("world"), Ran("floor"), Ran("ranks_floor"), "ddp", None, [0, 1, 2],
        argparse.Namespace(rounds=2),
    )
    print(json.dumps(ran))
    """
)


def test_each_side_of_a_round_runs_on_processes_of_its_own_that_wait_alike() -> None:
    # A process that has waited through more examples runs its next one on colder caches:
    # every side's processes must wait as long, or one side's figure carries the others'.
    ran = [tuple(r) for r in _run(ROUNDS_SCRIPT)]
    who = [name for name, _ in ran]
    assert set(who) == {"world", "floor", "ranks_floor without reference"}
    assert len(ran) == 2 * 3 * 3  # 2 rounds, 3 scenarios, 3 sides
    for round_ in (who[:9], who[9:]):
        for name in set(who):
            uses = [i for i, n in enumerate(round_) if n == name]
            gaps = [b - a - 1 for a, b in itertools.pairwise(uses)]
            assert gaps == [2, 2], (name, gaps)  # two other examples between two of its own
    # Every scenario is checked, floored and floored ranks-only in each round.
    assert sorted(ran) == sorted(
        (name, scenario) for name in set(who) for scenario in (0, 1, 2) for _ in range(2)
    )
