"""The ground-truth table: every call shape times every mistake operator that fits it
(tests/groundtruth/corpus.py), checked as a new user would, scored against the case's own
truth (never the diagnosis's word): verdict and cause accuracy by shape and by operator, and
the misses.

    python benchmarks/diagnosis_table.py [--world-size 2] [--examples 25] [--cases GLOB ...]
                                         [--out table.json]

Prints one line per case, then the tables; writes every row as JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.groundtruth.corpus import cases  # noqa: E402
from tests.groundtruth.table import Row, run_case  # noqa: E402


def _table(rows: list[Row], key: str) -> list[str]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[getattr(row, key)].append(row)
    width = max(len(k) for k in groups) + 2
    lines = [f"{key:<{width}} cases  verdicts  causes  named"]
    for name, group in sorted(groups.items()):
        verdicts = sum(r.verdict_right for r in group)
        causes = sum(r.cause_right for r in group)
        named = sum(r.named for r in group)
        lines.append(f"{name:<{width}} {len(group):>5}  {verdicts:>8}  {causes:>6}  {named:>5}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--cases", nargs="*", default=["*"], help="case name globs")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    chosen = [c for c in cases() if any(fnmatch.fnmatch(c.name, g) for g in args.cases)]
    rows: list[Row] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        for case in chosen:
            row = run_case(
                case, Path(directory), world_size=args.world_size, examples=args.examples
            )
            rows.append(row)
            mark = "ok " if row.cause_right else ("v  " if row.verdict_right else "XX ")
            print(
                f"{mark}{row.case:<48} {row.verdict:<15} first={row.first} "
                f"truth={'|'.join(row.truth) or '-'} ({row.seconds:.1f} s)",
                flush=True,
            )
    print()
    for key in ("shape", "operator"):
        print("\n".join(_table(rows, key)))
        print()
    total = len(rows)
    verdicts = sum(r.verdict_right for r in rows)
    causes = sum(r.cause_right for r in rows)
    buggy = [r for r in rows if r.expected != "equivalent"]
    false_alarms = sum(r.expected == "equivalent" and not r.verdict_right for r in rows)
    print(
        f"{total} cases, world size {args.world_size}, {args.examples} examples each, "
        f"{time.monotonic() - started:.0f} s: verdicts right {verdicts}/{total}, "
        f"false alarms {false_alarms}, causes right {causes}/{total} "
        f"({sum(r.cause_right for r in buggy)}/{len(buggy)} of the mistakes)"
    )
    misses = [r for r in rows if not r.cause_right]
    if misses:
        print("misses:")
        for r in misses:
            print(f"  {r.case}: {r.verdict}, causes {list(r.patterns)}, truth {list(r.truth)}")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
