"""The documentation's causes tables are generated from the diagnosis's rows and passes and
parity's findings, every finding a report can make is in them, and every cause has a real
example or says why it has none (ddp_verify/usercode/diagnosis/catalogue.py,
ddp_verify/parity/catalogue.py, ddp_verify/frontends/reference.py, fixtures/causes.py)."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from ddp_verify.frontends import cli, parity_command, reference
from ddp_verify.parity.catalogue import script_causes
from ddp_verify.usercode import findings as f
from ddp_verify.usercode.diagnosis import axes, catalogue

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "causes.md"
EXAMPLES = ROOT / "fixtures" / "causes.py"
CELLS = reference.example_cells(EXAMPLES)


def test_the_causes_page_shows_the_tables_the_rows_make():
    page = PAGE.read_text()
    assert reference.causes_page(page, CELLS) == page, (
        "docs/reference/causes.md's tables are stale: python -m ddp_verify.frontends.reference "
        "--causes docs/reference/causes.md --examples fixtures/causes.py"
    )


def test_every_finding_is_in_a_table():
    named = catalogue.named_codes() | {row.pattern for row in script_causes()}
    missing = [
        finding.code
        for finding in f.every_finding()
        if not any(code == finding.code or code.startswith(finding.code + ":") for code in named)
    ]
    assert not missing, missing


def test_parity_says_its_own_findings_and_the_check_the_rest():
    own = {row.pattern for row in script_causes()}
    assert {x.code for x in f.SCRIPT_FINDINGS} <= own
    shared = {x.code for x in f.SHARED_FINDINGS}
    assert not (own & {x.code for x in f.SCRIPT_FINDINGS} & catalogue.named_codes()) - shared
    # What both say, both tables list.
    assert shared <= own & catalogue.named_codes()


def test_a_row_added_is_a_line_of_the_table():
    row = axes.Choice("micro", "first", "micro:first-only", weight=lambda c, g: 1.0, words="x")
    assert "micro:first-only" not in catalogue.named_codes()
    with axes.added(row):
        assert "| `micro:first-only` | axis `micro`, row `first` | x |" in catalogue.causes_table()


TABLES = {"check": catalogue.check_causes(), "parity": script_causes()}


@pytest.mark.parametrize("table", TABLES)
def test_every_cause_has_an_example_or_says_why_not(table):
    cells = CELLS[table]
    bare = [row.pattern for row in TABLES[table] if not cells.get(row.pattern)]
    assert not bare, f"no example for {bare}: add one to fixtures/causes.py"
    # No example for a pattern the table does not have (a renamed finding).
    stale = set(cells) - {row.pattern for row in TABLES[table]}
    assert not stale - set(_held()["NO_EXAMPLE"]), stale


def _held() -> dict:
    import runpy

    return runpy.run_path(str(EXAMPLES))


def _commands():
    for table, examples in _held()["EXAMPLES"].items():
        for pattern, command in examples.items():
            yield pytest.param(table, pattern, command, id=f"{table}:{pattern}")


def _defined(target: str) -> bool:
    path, _, name = target.rpartition(":")
    tree = ast.parse((ROOT / path).read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    imported = {
        a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
    }
    return name in top | imported


@pytest.mark.parametrize(("table", "pattern", "command"), list(_commands()))
def test_every_example_is_a_command_the_parsers_take_on_code_that_exists(table, pattern, command):
    words = shlex.split(command)
    assert words[:2] == ["ddp-verify", table], command
    if table == "check":
        args = cli._parser().parse_args(words[1:])
        assert _defined(args.target), f"{args.target} names no function"
        for option in ("model", "hook_state"):
            value = getattr(args, option)
            if value:
                assert _defined(value), f"{value} names no function"
    else:
        split = words.index("--")
        parity_command.parser().parse_args(words[2:split])
        script = next(w for w in words[split:] if w.endswith(".py"))
        assert (ROOT / script).is_file(), script
