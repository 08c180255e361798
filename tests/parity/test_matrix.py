"""The framework matrix's scoring (benchmarks/framework_matrix.py): an answer is right only
where it is the configuration's truth, and the page keeps one section per release set."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from ddp_verify.parity.layouts import Layout

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def matrix():
    spec = importlib.util.spec_from_file_location(
        "framework_matrix", ROOT / "benchmarks" / "framework_matrix.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["framework_matrix"] = module
    spec.loader.exec_module(module)
    return module


def test_every_configuration_names_a_fixture_that_is_there(matrix):
    names = [c.name for c in matrix.configs()]
    assert len(names) == len(set(names))
    for config in matrix.configs():
        assert (matrix.SCRIPTS / config.script).is_file(), config


def test_an_answer_is_right_only_where_it_is_the_truth(matrix):
    pytest.importorskip("accelerate", reason="the frameworks extra: pip install -e '.[frameworks]'")
    (config,) = [c for c in matrix.configs() if c.name == "accelerate/plain-backward"]
    row = matrix.run(config, (Layout(1, 2),), steps=1)
    assert row["cells"]["1x2"] == {**row["cells"]["1x2"], "got": "scale:A", "right": True}
    assert "fixtures/scripts/accelerate_loop.py" in matrix.reproducer(row, 1)
    # The same answer held to another truth is wrong.
    other = dataclasses.replace(config, truth=matrix.where_accumulating("scale:W"))
    assert matrix.run(other, (Layout(1, 2),), steps=1)["cells"]["1x2"]["right"] is False


def test_the_page_keeps_a_section_per_release_set(matrix, tmp_path):
    page = tmp_path / "frameworks.md"
    matrix.write_section(page, "current", ["## current", "a"])
    matrix.write_section(page, "older", ["## older", "b"])
    matrix.write_section(page, "current", ["## current", "c"])
    text = page.read_text()
    assert text.startswith("# Parity on the frameworks users train with")
    assert "\na\n" not in text and "\nc\n" in text and "\nb\n" in text
    assert text.index("## current") < text.index("## older")
