"""The groups c10d makes, as data the conformance suite draws: which grouping, and the
members it gives each rank (the oracle's side of
:func:`ddp_verify.conformance.collective_jobs.group_of`, which makes them on the ranks)."""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist
from hypothesis import strategies as st

# new_group's sort_ranks (torch 2.13): False keeps the ranks in the order given.
SORT_RANKS = "sort_ranks" in inspect.signature(dist.new_group).parameters
# new_subgroups' group (torch 2.5): subgroups of a group's ranks, in its rank order.
SUBGROUPS_OF = "group" in inspect.signature(dist.new_subgroups).parameters


def groupings(world_size: int) -> st.SearchStrategy[tuple[Any, ...]]:
    """The groupings of :func:`ddp_verify.conformance.collective_jobs.group_of`: the default
    group, any nonempty subset by ``new_group`` (in any order, ``sort_ranks`` both ways where
    torch has it), blocks by ``new_subgroups``, blocks of another group's rank order by
    ``new_subgroups(group=...)`` (the world's ranks in any order, by ``new_group`` with
    ``sort_ranks=False``: a non-member cannot call it), and a partition of some ranks (others
    left in no subgroup) by ``new_subgroups_by_enumeration``.
    """
    ranks = list(range(world_size))
    subset = st.lists(st.sampled_from(ranks), min_size=1, unique=True)
    sizes = [d for d in [*ranks[1:], world_size] if world_size % d == 0]

    @st.composite
    def enumeration(draw: st.DrawFn) -> tuple[Any, ...]:
        chosen = draw(st.permutations(ranks))[: draw(st.integers(1, world_size))]
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(chosen) - 1)), max_size=2)))
        parts, start = [], 0
        for cut in [*cuts, len(chosen)]:
            if cut > start:
                parts.append(tuple(sorted(chosen[start:cut])))
                start = cut
        return ("by_enumeration", tuple(parts))

    @st.composite
    def new_group(draw: st.DrawFn) -> tuple[Any, ...]:
        ranks = tuple(draw(st.permutations(draw(subset))))
        return ("new_group", ranks, not SORT_RANKS or draw(st.booleans()))

    forms = [
        st.just(("default",)),
        new_group(),
        st.sampled_from(sizes).map(lambda d: ("new_subgroups", d)),
        enumeration(),
    ]
    if SUBGROUPS_OF and SORT_RANKS:
        forms.append(
            st.tuples(st.permutations(ranks), st.sampled_from(sizes)).map(
                lambda drawn: ("subgroups_of", tuple(drawn[0]), drawn[1])
            )
        )
    return st.one_of(*forms)


def members(grouping: tuple[Any, ...], rank: int, world_size: int) -> list[int] | None:
    """The global ranks of ``rank``'s group, in group-rank order; None outside any.

    Example::

        >>> members(("new_subgroups", 2), 3, 4)
        [2, 3]
        >>> members(("new_group", (1, 0), False), 0, 2)
        [1, 0]
        >>> members(("by_enumeration", ((1,),)), 0, 2) is None
        True
        >>> members(("subgroups_of", (3, 0, 2, 1), 2), 1, 4)
        [1, 2]
    """
    kind = grouping[0]
    if kind == "default":
        return list(range(world_size))
    if kind == "new_group":  # by global rank unless told to keep the order given
        ordered = sorted(grouping[1]) if grouping[2] else list(grouping[1])
        return ordered if rank in ordered else None
    if kind == "new_subgroups":
        start = rank // grouping[1] * grouping[1]
        return list(range(start, start + grouping[1]))
    if kind == "subgroups_of":  # blocks of the parent's rank order, each made by global rank
        order, size = grouping[1], grouping[2]
        at = order.index(rank) // size * size
        return sorted(order[at : at + size])
    return next((list(p) for p in grouping[1] if rank in p), None)
