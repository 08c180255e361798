"""Run ground-truth cases through ``check()`` and score each against its truth.

A verdict is right when it is the case's (``equivalent`` or ``not-equivalent``; an error or a
usage error is never right). A cause is right when the first cause's finding is one the
case's mistake is named by (the first cause must always be a cause); ``named`` records
whether any cause was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ddp_verify import check
from ddp_verify.usercode.verdict import CheckFailed, verdict_for
from tests.groundtruth.corpus import Case, check_options


@dataclass(frozen=True)
class Row:
    case: str
    shape: str
    operator: str
    expected: str
    verdict: str
    first: str | None
    patterns: tuple[str, ...]
    truth: tuple[str, ...]
    seconds: float

    @property
    def verdict_right(self) -> bool:
        return self.verdict == self.expected

    @property
    def cause_right(self) -> bool:
        """Right verdict, and for a mistake a first cause that names it."""
        if not self.verdict_right:
            return False
        return self.expected == "equivalent" or self.first in self.truth

    @property
    def named(self) -> bool:
        return self.expected == "equivalent" or bool(set(self.patterns) & set(self.truth))


def run_case(
    case: Case, directory: Path, *, world_size: int = 2, examples: int = 25, seed: int = 0
) -> Row:
    """``case`` checked as a new user would: its shape's options only, no layout pinned."""
    module = case.load(directory)
    fn = getattr(module, case.shape.function)
    started = time.monotonic()
    try:
        verdict = check(
            fn,
            kind=case.shape.kind,
            world_size=world_size,
            max_examples=examples,
            seed=seed,
            **check_options(case, module),
        )
    except CheckFailed as failed:
        verdict = failed.verdict
    except Exception as exc:  # a usage error, the harness's: never a right verdict
        verdict = verdict_for(exc)
    patterns = tuple(c.pattern for c in verdict.causes)
    return Row(
        case=case.name,
        shape=case.shape.name,
        operator=case.operator.name if case.operator else "correct",
        expected=case.expected,
        verdict=verdict.status.value,
        first=patterns[0] if patterns else None,
        patterns=patterns,
        truth=tuple(sorted(case.truth)),
        seconds=time.monotonic() - started,
    )
