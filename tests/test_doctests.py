"""The package's docstring examples run (`pytest --doctest-modules` over it), so that what
the docstrings show is what the code does. The conformance suite's test modules are tests,
run by `tox -e conformance-torch213`, not doctests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ddp_verify"


def test_every_docstring_example_of_the_package_holds():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--doctest-modules",
            str(PACKAGE),
            "--ignore-glob=*/conformance/test_*.py",
            f"--ignore={PACKAGE / 'conformance' / 'conftest.py'}",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", done.stdout).group(1))
    assert passed >= 30, done.stdout[-2000:]  # the examples are found, not skipped


def test_every_public_name_has_an_example_that_runs():
    # Each name of ddp_verify.__all__ shows itself at work in a doctest (run above).
    import inspect

    import ddp_verify

    without = [
        name
        for name in ddp_verify.__all__
        if ">>>" not in (inspect.getdoc(getattr(ddp_verify, name)) or "")
    ]
    assert not without, f"public names without a doctested example: {without}"
