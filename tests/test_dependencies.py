"""The versions the project says it works with are the versions it is tested with: every floor
in pyproject.toml is pinned in requirements/oldest.txt, which `tox -e oldest` installs on the
lowest Python the project declares; in that environment, what is installed is those pins."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLDEST = ROOT / "requirements" / "oldest.txt"


def pins() -> dict[str, str]:
    """requirements/oldest.txt as ``{name: version}``."""
    found = {}
    for line in OLDEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{OLDEST.name}: {line!r} is not pinned with =="
            found[name.strip().lower()] = version.strip()
    return found


def floors() -> tuple[dict[str, str], str]:
    """pyproject.toml's ``>=`` floors of the project's dependencies and its ``test`` extra,
    and the floor of ``requires-python``."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement.strip())
        assert match, f"pyproject.toml: {requirement!r} has no plain >= floor to test"
        found[match[1].lower()] = match[2]
    python = re.fullmatch(r">=\s*([0-9.]+)", project["requires-python"])
    assert python, project["requires-python"]
    return found, python[1]


def _padded(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def test_every_declared_floor_is_pinned_for_the_oldest_environment():
    declared, python = floors()
    pinned = pins()
    assert sorted(pinned) == sorted(declared)
    for name, floor in declared.items():
        assert _padded(pinned[name]) == _padded(floor), (
            f"pyproject.toml says {name}>={floor}, requirements/oldest.txt pins "
            f"{name}=={pinned[name]}: raise both together"
        )
    assert _tox()["testenv:oldest"]["base_python"] == f"python{python}"


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


@pytest.mark.skipif(
    "DDP_VERIFY_OLDEST" not in os.environ, reason="only in the oldest environment (tox -e oldest)"
)
def test_the_oldest_environment_runs_the_pins():
    for name, version in pins().items():
        installed = importlib.metadata.version(name).split("+")[0]
        assert _padded(installed) == _padded(version), f"{name} {installed}, pinned {version}"
    assert (
        f"python{sys.version_info[0]}.{sys.version_info[1]}"
        == _tox()["testenv:oldest"]["base_python"]
    )


def test_the_plugins_the_checkouts_pytest_options_load_are_the_packages_own_dependencies():
    # `pip install -e .` then `pytest` once exited 4 ("unrecognized arguments: -n --dist"):
    # pytest-xdist came only with the test extra, and the checkout's addopts need it.
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
    needs = {"-n": "pytest-xdist", "--dist": "pytest-xdist"}
    core = {
        re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower()
        for r in pyproject["project"]["dependencies"]
    }
    missing = sorted({needs[o] for o in addopts if o in needs} - core)
    assert not missing, f"addopts {addopts} need {missing}, which `pip install -e .` leaves out"


def test_ci_runs_the_readmes_two_commands_as_written():
    def marked(page: str) -> list[str]:
        text = (ROOT / page).read_text()
        block = text.split("<!-- ci -->", 1)[1].split("<!-- /ci -->", 1)[0]
        lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
        return [line for line in lines if line and not line.startswith("```")]

    setup, tests = marked("README.md")
    # The first sets everything up and runs the main job on the bundled example; the second
    # is the project's tests, with nothing but the checkout's own options.
    assert setup.startswith("pip install ") and setup.endswith("&& ddp-verify parity"), setup
    assert tests == "pytest", tests
    assert marked("CONTRIBUTING.md")[0] == "python -m build --outdir dist"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "marked README.md" in ci and "marked CONTRIBUTING.md" in ci
    assert ci.index('"${readme[@]}"') < ci.index('"${contributing[@]}"')  # README's first
