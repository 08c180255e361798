"""benchmarks/bench.py survives its yardsticks: a sample that crashes is tried once more on the
same input and otherwise recorded as failed, every other figure kept and the failure printed
under the tables; the diagnosis row's recording of a search's examples leaves the search as
it found it. Run in a fresh interpreter: the benchmark puts the fixtures on ``sys.path`` and
imports them under their file names."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_a_crashing_sample_is_tried_again_then_recorded_and_nothing_else_is_lost() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
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
