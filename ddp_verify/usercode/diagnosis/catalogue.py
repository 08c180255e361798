"""Every cause the diagnosis can name, as table rows generated from its axes and passes: the
documentation's causes page (docs/reference/causes.md, written by
``python -m ddp_verify.frontends.reference --causes``) shows them, so a row added is a row
documented.

Example::

    >>> causes_table().splitlines()[0]
    '| pattern | found by | cause, as the report words it |'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ...world.naming import option
from .. import findings as f
from . import passes
from .axes import GRADIENT_AXES, LOSS_AXES, Choice, rows
from .coupled import PASSES as COUPLED_PASSES

__all__ = ["Row", "causes_table", "check_causes", "markdown", "named_codes", "words_of"]

# Findings said outside the passes: by the search around the diagnosis, or where nothing
# explains a subject.
ELSEWHERE: dict[str, str] = {
    f.KEEPS_STATE.code: "the replay on a fresh world",
    f.COLLECTIVES_PER_MICRO_BATCH.code: "a failure whose scenario explains it",
    f.TORCH_POWERSGD_UNUSED.code: "a failure with a known torch issue's signature",
    f.MASK_IGNORED.code: "the loss-agg mask probe",
    f.PACKED_DISAGREES.code: "the counterexample re-run unpacked",
    f.NONLINEAR.code: "no hypothesis fits the gradient",
    f.LOSS_UNEXPLAINED.code: "no hypothesis fits the reported loss",
    f.UNEXPLAINED.code: "nothing diverged that a hypothesis covers",
    f.DIAGNOSIS_FAILED.code: "the diagnosis itself failed",
}


# A coupled loss's findings, said by its own probes (diagnosis/coupled.py), with the symbols
# their words take.
COUPLED: dict[str, dict[str, str]] = {
    f.COUPLED_SCALE.code: {"factor": "k", "why": ""},
    f.COUPLED_LOCAL_GRADIENT.code: {
        "towers": "1/W",
        "learned": ", the learned loss parameters all of theirs",
    },
    f.COUPLED_NO_FEATURE_GRADIENT.code: {},
    f.COUPLED_LOCAL_NEGATIVES.code: {},
    f.COUPLED_RANKS_EQUAL.code: {"share": "1/W"},
    f.COUPLED_CONSTANT_FEATURES.code: {},
    f.COUPLED_CONSTANT_TOWER.code: {"tower": "one tower", "other": "the other"},
    f.COUPLED_UNEVEN.code: {"sizes": "the pairs per rank", "what": "what failed, and where"},
    f.COUPLED_WRONG_POSITIVES.code: {"matched": "which pair each was matched with"},
    f.COUPLED_UNEXPLAINED.code: {"why": "what was read"},
}


# Symbols for a finding a pass shares with parity, whose placeholder another row also uses.
SHARED: dict[str, dict[str, str]] = {
    f.OPTIMIZER_SETTINGS.code: {
        "what": "the setting that differs (lr, momentum, a beta, weight decay), its value, "
        "at which step and rank, and the reference's",
    },
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
        if choice.factor is None and choice.name != "k":
            factor = "k"  # a factor the run fills in (a pass's row)
        return f.LOSS_SCALED.says(factor=factor, why=choice.words.format(**fill))
    try:
        finding = f.finding(choice.finding)
    except KeyError:
        return choice.words.format(**fill)
    return finding.says(**fill)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a causes table: the ``pattern`` a report names (``--json``'s ``reading``),
    what finds it, and its words as a report says them (numbers left as symbols)."""

    pattern: str
    found_by: str
    words: str


def words_of(finding: f.Finding, **more: str) -> str:
    """A finding's words with its numbers left as symbols (``more``: symbols for numbers the
    table's defaults do not name).

    Example::

        >>> words_of(f.finding("ranks:sum"))
        'gradients summed across ranks but not divided'
    """
    return finding.says(**_fill(**more))


def check_causes() -> list[Row]:
    """Every cause a check can name: one per wrong choice of every axis, then each pass's
    findings and rows, then what is said elsewhere."""
    made: list[Row] = []
    for axis in (*GRADIENT_AXES, *LOSS_AXES):
        for choice in rows(axis):
            if not choice.right:
                made.append(
                    Row(choice.reading, f"axis `{axis}`, row `{choice.name}`", _words(choice))
                )
    said = {row.pattern for row in made}
    for each in passes.registered():
        for choice in each.adds:
            if choice.reading not in said:
                said.add(choice.reading)
                made.append(Row(choice.reading, f"pass `{each.name}`", _words(choice)))
        for code in each.says:
            if code not in said:
                said.add(code)
                words = words_of(f.finding(code), **SHARED.get(code, {}))
                made.append(Row(code, f"pass `{each.name}`", words))
    for code, where in ELSEWHERE.items():
        if code not in said:
            made.append(Row(code, where, words_of(f.finding(code))))
    for probing in COUPLED_PASSES:
        for code in probing.says:
            said.add(code)
            found_by = f"coupled-loss pass `{probing.name}`"
            made.append(Row(code, found_by, words_of(f.finding(code), **COUPLED[code])))
    for code, symbols in COUPLED.items():
        if code not in said:
            made.append(Row(code, "the coupled-loss probes", words_of(f.finding(code), **symbols)))
    return made


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(table: list[Row], examples: Mapping[str, str] | None = None) -> str:
    """``table`` in Markdown; with ``examples`` (a cell per pattern), a column for them.

    Example::

        >>> print(markdown([Row("ranks:sum", "axis `ranks`", "summed")], {"ranks:sum": "x"}))
        | pattern | found by | cause, as the report words it | example |
        | --- | --- | --- | --- |
        | `ranks:sum` | axis `ranks` | summed | x |
    """
    head = ["pattern", "found by", "cause, as the report words it"]
    if examples is not None:
        head.append("example")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for row in table:
        cells = [f"`{row.pattern}`", row.found_by, _cell(row.words)]
        if examples is not None:
            cells.append(_cell(examples.get(row.pattern, "")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def causes_table() -> str:
    """The check's causes table, in Markdown, without examples."""
    return markdown(check_causes())


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
    "label": "c",
    "empty": "r",
    "nonfinite": "the ranks",
    "whole": "which value: the loss, its sum over the step's items, or over the ranks",
    "replaced": "each parameter a of its value before the step plus 1 - a of the reference's "
    "after it (a running average left in the model), or the update undone",
    "step": "s",
    "stale": "'name' on rank r",
    "tied": "'name' (also 'other') has a gradient k x the reference's",
    "held": "the counts",
    "same_counts": option("same_micro_batch_counts", True),
    "read": "are the correct weighting",
    "reason": "why",
    "measured": "",
    "ranks": "each rank's norm and what it kept",
    "computed": "O",
    "declared": "D",
    "zeroed": "what the code trains with those losses set to 0",
}


def named_codes() -> set[str]:
    """Every pattern the check's table names."""
    return {row.pattern for row in check_causes()}
