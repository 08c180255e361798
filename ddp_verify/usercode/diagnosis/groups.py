"""A factor that is a process group's size, named with the group.

Code that divides by ``dist.get_world_size(group=g)`` for a group ``g`` it made (a node's, a
shard's) where the world's size is due scales every gradient by ``W / |g|``: the diagnosis
reads a scale, and the ranks' record of the groups they held after training says which group
has the size that explains it.

Example::

    causes = with_groups(causes, scenario, got)
    causes[0].text  # '... 2 is the size of the process group over ranks [0] ...'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ...engine.scenario import Scenario
from ...engine.trace import Trace
from ..findings import Cause

__all__ = ["with_groups"]

# The findings whose factor a group's size may be.
SCALED = ("scale", "loss:scaled")


def with_groups(causes: Sequence[Cause], scenario: Scenario, got: Trace) -> list[Cause]:
    """``causes`` with each scale whose factor is ``W / s``, for the size ``s`` of a group
    the ranks held besides the world (one they made), said to be that group's size.

    Example::

        >>> from ddp_verify.engine.trace import RankTrace
        >>> s = Scenario(world_size=2, schedule=(((1,), (2,)),))
        >>> rank = RankTrace([0.0]); rank.groups = ((0,), (1,))
        >>> row = {"weight": 2.0, "expected": 1.0}
        >>> scaled = Cause("scaled 2x", "gradient", "scale", "", (row,))
        >>> with_groups([scaled], s, Trace("code", [rank, rank]))[0].text.split("; ")[1][:48]
        "the factor is the world's size 2 over 1, the siz"
    """
    groups = {g for rank in got.ranks for g in (rank.groups or ()) if len(g) != scenario.world_size}
    if not groups:
        return list(causes)
    named = []
    for cause in causes:
        factor = _factor(cause)
        if cause.pattern not in SCALED or factor is None or factor <= 0:
            named.append(cause)
            continue
        size = scenario.world_size / factor
        matching = sorted(g for g in groups if abs(len(g) - size) <= 1e-6 * size)
        if not matching:
            named.append(cause)
            continue
        ranks = ", ".join(str(list(g)) for g in matching[:4])
        said = (
            f"; the factor is the world's size {scenario.world_size} over {len(matching[0])}, "
            f"the size of the process group over ranks {ranks} the code made: divided by that "
            "group's size where the world's is due (dist.get_world_size(group=...))"
        )
        named.append(dataclasses.replace(cause, text=cause.text + said))
    return named


def _factor(cause: Cause) -> float | None:
    """The one factor of a scale's fitted weights over their expected ones, if they share it."""
    ratios = {
        round(row["weight"] / row["expected"], 9)
        for row in cause.weights
        if isinstance(row, dict) and row.get("expected")
    }
    return ratios.pop() if len(ratios) == 1 else None
