"""The documentation's causes table is generated from the diagnosis's rows and passes, and every
finding a check can make is in it (ddp_verify/usercode/diagnosis/catalogue.py)."""

from __future__ import annotations

from pathlib import Path

from ddp_verify.usercode import findings as f
from ddp_verify.usercode.diagnosis import axes, catalogue

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "causes.md"

# What only ddp-verify parity says (its own comparison of whole scripts).
PARITY = {
    f.DATA_SAME,
    f.DATA_DUPLICATED,
    f.DATA_MISSING,
    f.DATA_ORDER,
    f.SYNC_LEFT_OUT,
    f.MICRO_CLEARED,
    f.MICRO_OWN_MEAN,
    f.MICRO_WEIGHTS,
    f.GRAD_DIFFERS,
    f.LOG_DIFFERS,
    f.PRECISION_LOWER,
    f.SCRIPT_STEPS,
    f.OPTIMIZER_SETTINGS,
}


def test_the_causes_page_shows_the_table_the_rows_make():
    page = PAGE.read_text()
    assert catalogue.written(page) == page, (
        "docs/reference/causes.md's table is stale: python -m "
        "ddp_verify.usercode.diagnosis.catalogue --write docs/reference/causes.md"
    )


def test_every_finding_of_a_check_is_in_the_table():
    named = catalogue.named_codes()
    missing = [
        finding.code
        for finding in f.every_finding()
        if finding not in PARITY
        and not any(code == finding.code or code.startswith(finding.code + ":") for code in named)
    ]
    assert not missing, missing


def test_a_row_added_is_a_line_of_the_table():
    row = axes.Choice("micro", "first", "micro:first-only", weight=lambda c, g: 1.0, words="x")
    assert "micro:first-only" not in catalogue.named_codes()
    with axes.added(row):
        assert "| `micro:first-only` | axis `micro`, row `first` | x |" in catalogue.causes_table()
