"""What a diagnosis pattern means in numbers, checked against a cause's fitted weights
independently of its words: a cause is right when the weights say so."""

from __future__ import annotations

import math
from collections import defaultdict


def weights_show(
    pattern: str, weights: list[dict], world_size: int, dtype: str = "float64"
) -> bool:
    """Whether the fitted ``weights`` (one row per rank and micro-batch: items, weight per
    item, expected per item) have the shape ``pattern`` names, up to ``dtype``'s rounding."""
    tolerance = 3e-2 if dtype == "bfloat16" else 2e-3

    def _close(a: float, b: float, tol: float = tolerance) -> bool:
        # Zero is judged against the size of a rank's share, not against itself.
        return math.isclose(a, b, rel_tol=tol, abs_tol=tolerance / world_size)

    totals: dict[int, float] = defaultdict(float)
    items: dict[int, int] = defaultdict(int)
    rows: dict[int, list[dict]] = defaultdict(list)
    for row in weights:
        totals[row["rank"]] += row["weight"] * row["items"]
        items[row["rank"]] += row["items"]
        rows[row["rank"]].append(row)
    n = sum(items.values())
    if pattern == "scale":
        ratios = [row["weight"] / row["expected"] for row in weights]
        return not _close(ratios[0], 1.0) and all(_close(r, ratios[0]) for r in ratios)
    if pattern == "ranks:world":
        return all(_close(t, 1 / world_size) for t in totals.values()) and any(
            not _close(items[r] / n, 1 / world_size) for r in totals
        )
    if pattern == "ranks:sum":
        return all(_close(t, 1.0) for t in totals.values())
    if pattern == "ranks:means-over-count":
        return all(_close(t, 1 / n) for t in totals.values())
    if pattern in ("ranks:one", "ranks:own"):
        return sum(not _close(t, 0.0) for t in totals.values()) == 1
    if pattern == "micro:equal":
        return any(
            len(mine) > 1
            and all(
                _close(row["weight"] * row["items"], mine[0]["weight"] * mine[0]["items"])
                for row in mine
            )
            and len({row["items"] for row in mine}) > 1
            for mine in rows.values()
        )
    if pattern == "micro:last-only":
        return any(
            len(mine) > 1
            and all(_close(row["weight"] * row["items"], 0.0) for row in mine[:-1])
            and not _close(mine[-1]["weight"] * mine[-1]["items"], 0.0)
            for mine in rows.values()
        )
    raise ValueError(f"no numeric meaning for {pattern!r}")


NUMERIC = (
    "scale",
    "ranks:world",
    "ranks:sum",
    "ranks:means-over-count",
    "ranks:one",
    "ranks:own",
    "micro:equal",
    "micro:last-only",
)
