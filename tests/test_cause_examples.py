"""Every cause's example on the reference's causes page runs, as a user would run it from a
clone, and its report names the cause (fixtures/causes.py; docs/reference/causes.md).

Each command is a real run (check's worlds, parity's launched layouts): marked slow, `tox -e
slow` runs them all. CI checks the commands against the parsers and the code they name
(tests/usercode/test_catalogue.py).
"""

from __future__ import annotations

import json
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELD = runpy.run_path(str(ROOT / "fixtures" / "causes.py"))


def _examples():
    for table, examples in HELD["EXAMPLES"].items():
        for pattern, command in examples.items():
            yield pytest.param(pattern, command, id=f"{table}:{pattern}", marks=pytest.mark.slow)


def _named(document: dict) -> list[str]:
    """Every finding a report names: a check's causes (each by its pattern, the page's key,
    and by its reading, which may refine it: ``coupled:scale:1/W``), each parity layout's."""
    if "layouts" in document:
        return [key for row in document["layouts"] for key in row.get("causes") or []]
    causes = document.get("likely_causes") or []
    return [key for cause in causes for key in (cause["pattern"], cause["reading"]) if key]


@pytest.mark.parametrize(("pattern", "command"), list(_examples()))
def test_the_example_names_its_cause(pattern, command):
    words = shlex.split(command)
    assert words[0] == "ddp-verify"
    # From the clone's root, as the page says (a check's reproducer goes to .ddp_verify/,
    # which git ignores); --json where the command takes its options.
    argv = [sys.executable, "-m", "ddp_verify", *words[1:]]
    argv.insert(argv.index("--") if "--" in argv else len(argv), "--json")
    run = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    document = json.loads(run.stdout)
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
    named = _named(document)
    assert pattern in named, f"{command}\nnamed {named}, not {pattern}\n{run.stderr[-2000:]}"
