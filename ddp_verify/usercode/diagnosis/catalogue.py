"""Every cause the diagnosis can name, as a table generated from its rows and passes: the
documentation's causes page (docs/reference/causes.md) shows this module's output, so a row
added is a row documented.

Run ``python -m ddp_verify.usercode.diagnosis.catalogue`` to print it, or with
``--write docs/reference/causes.md`` to replace the table between
that page's markers.

Example::

    >>> causes_table().splitlines()[0]
    '| pattern | found by | cause, as the report words it |'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...world.naming import option
from .. import findings as f
from . import passes
from .axes import GRADIENT_AXES, LOSS_AXES, Choice, rows

__all__ = ["BEGIN", "END", "causes_table", "named_codes", "written"]

BEGIN = (
    "<!-- causes table: python -m ddp_verify.usercode.diagnosis.catalogue"
    " --write docs/reference/causes.md -->"
)
END = "<!-- end of the causes table -->"

# Findings said outside the passes: by the search around the diagnosis, or where nothing
# explains a subject.
ELSEWHERE: dict[str, str] = {
    f.KEEPS_STATE.code: "the replay on a fresh world",
    f.COLLECTIVES_PER_MICRO_BATCH.code: "a failure whose scenario explains it",
    f.TORCH_POWERSGD_UNUSED.code: "a failure with a known torch issue's signature",
    f.NONLINEAR.code: "no hypothesis fits the gradient",
    f.LOSS_UNEXPLAINED.code: "no hypothesis fits the reported loss",
    f.UNEXPLAINED.code: "nothing diverged that a hypothesis covers",
    f.DIAGNOSIS_FAILED.code: "the diagnosis itself failed",
}


class _Symbol(str):
    """A number's place in the words, shown as its symbol whatever its format (``{k:.4g}``)."""

    def __format__(self, spec: str) -> str:
        return str(self)


def _fill(**more: str) -> dict[str, _Symbol]:
    return {k: _Symbol(v) for k, v in {**_FILL, **more}.items()}


def _words(choice: Choice) -> str:
    """A row's words as a report says them, with the numbers left as symbols."""
    fill = _fill()
    if choice.axis == "scale":
        return f.SCALE.says(why=choice.words.format(**fill), unit="sample", factor=_Symbol("k "))
    if choice.axis == "report-scale":
        factor = "k at every step" if choice.name == "k" else choice.name
        return f.LOSS_SCALED.says(factor=factor, why=choice.words.format(**fill))
    try:
        finding = f.finding(choice.finding)
    except KeyError:
        return choice.words.format(**fill)
    return finding.says(**fill)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def causes_table() -> str:
    """The causes table, in Markdown: one line per wrong choice of every axis, then each
    pass's findings, then what is said elsewhere."""
    lines = ["| pattern | found by | cause, as the report words it |", "| --- | --- | --- |"]
    for axis in (*GRADIENT_AXES, *LOSS_AXES):
        for choice in rows(axis):
            if choice.right:
                continue
            how = f"axis `{axis}`, row `{choice.name}`"
            lines.append(f"| `{choice.reading}` | {how} | {_cell(_words(choice))} |")
    said = {c.reading for a in (*GRADIENT_AXES, *LOSS_AXES) for c in rows(a) if not c.right}
    for each in passes.registered():
        for code in each.says:
            if code in said:
                continue
            said.add(code)
            words = f.finding(code).says(**_fill())
            lines.append(f"| `{code}` | pass `{each.name}` | {_cell(words)} |")
    for code, where in ELSEWHERE.items():
        if code not in said:
            lines.append(f"| `{code}` | {where} | {_cell(f.finding(code).says(**_fill()))} |")
    return "\n".join(lines)


# What a finding's words are filled with in the table: symbols, not one run's numbers (and
# options as check() spells them).
_FILL = {
    "unit": "sample",
    "n": "N",
    "world": "W",
    "m": "M",
    "total": "N",
    "source": "S",
    "where": "every rank",
    "value": "k",
    "factor": "k ",
    "names": "the names",
    "fmt": "the format",
    "bound": "c",
    "lossy": option("lossy", "fp16|bf16|lowrank"),
    "what": "the matrix, its rank and the full-batch gradient's",
    "result_on": option("result_on", "rank0"),
    "exclude": option("excluded_features", "unused"),
    "how": "what the replay showed",
    "step": "s",
    "held": "the counts",
    "same_counts": option("same_micro_batch_counts", True),
    "read": "are the correct weighting",
    "reason": "why",
    "measured": "",
    "ranks": "each rank's norm and what it kept",
}


def named_codes() -> set[str]:
    """Every finding code the table names."""
    return {
        line.split("`")[1].split(":")[0] if False else line.split("`")[1]
        for line in causes_table().splitlines()[2:]
    }


def written(page: str) -> str:
    """``page`` with the text between :data:`BEGIN` and :data:`END` replaced by the table."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + causes_table() + "\n" + page[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The diagnosis's causes table, in Markdown.")
    parser.add_argument("--write", metavar="PAGE", help="replace the table in this file")
    args = parser.parse_args(argv)
    if args.write is None:
        print(causes_table())
        return 0
    path = Path(args.write)
    path.write_text(written(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
