"""The documentation's page of the gate's surface is the table the entries make."""

from __future__ import annotations

from pathlib import Path

from ddp_verify.conformance import surface

PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance-surface.md"


def test_the_docs_show_the_table_the_entries_make():
    assert PAGE.read_text() == surface.page(), (
        "docs/conformance-surface.md is stale: python -m ddp_verify.conformance.surface "
        "--write docs/conformance-surface.md"
    )
