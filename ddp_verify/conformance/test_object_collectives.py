"""Every object collective torch has, with objects of different sizes on every rank:
``all_gather_object`` and ``gather_object`` must give each rank (or the destination) every
rank's object, in rank order, intact; ``broadcast_object_list`` every rank the source's list;
``scatter_object_list`` each rank the object the source meant for it; over the default group
and over any group c10d makes, the root named by its global or its group rank."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from ddp_verify.conformance import collective_jobs, groupings, jobs

# Objects whose pickles differ in length from rank to rank (and from example to example). The
# text has a fixed alphabet (multi-byte characters included): hypothesis builds its unicode
# tables on first use, and under a launcher every rank must draw the very same examples.
TEXT = st.text("ab\u00e9\u20ac\U0001f600", max_size=8)
OBJECTS = st.recursive(
    st.none() | st.integers() | TEXT | st.binary(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(TEXT, inner),
    max_leaves=40,
)


def test_object_collectives_deliver_every_ranks_object(world, prove):
    # torch serialises objects through numpy on the ranks.
    pytest.importorskip("numpy", reason="torch's *_object collectives need numpy")

    def check(case):
        objects, dst = case
        results = world.run(jobs.objects_gathered, objects, dst)
        expected = list(objects)
        for rank, (gathered, to_dst) in enumerate(results):
            assert gathered == expected, (
                f"all_gather_object on rank {rank} gave {gathered!r}, the ranks sent {expected!r}"
            )
            want = expected if rank == dst else None
            assert to_dst == want, (
                f"gather_object to rank {dst}: rank {rank} holds {to_dst!r}, expected {want!r}"
            )

    prove(
        st.tuples(st.tuples(*[OBJECTS] * world.size), st.integers(0, world.size - 1)),
        check,
    )


def test_object_collectives_from_one_source_deliver_what_it_sent(world, prove):
    pytest.importorskip("numpy", reason="torch's *_object collectives need numpy")

    def check(case):
        objects, src = case
        results = world.run(jobs.objects_sent, objects, src)
        for rank, (broadcast, scattered) in enumerate(results):
            assert broadcast == list(objects), (
                f"broadcast_object_list from rank {src}: rank {rank} holds {broadcast!r}, "
                f"the source sent {list(objects)!r}"
            )
            assert scattered == objects[rank], (
                f"scatter_object_list from rank {src}: rank {rank} received {scattered!r}, "
                f"the source sent it {objects[rank]!r}"
            )

    # Objects of several sizes in one list: an offset that does not advance hands every rank
    # the first one.
    prove(
        st.tuples(st.tuples(*[OBJECTS] * world.size), st.integers(0, world.size - 1)),
        check,
        examples=[(tuple(range(world.size)), 0), (("a", *["bb" * 40] * (world.size - 1)), 0)],
    )


def test_object_collectives_over_any_group_reach_its_members_by_either_rank(world, prove):
    # Over a subgroup a root named by its group rank must be the rank named by its global
    # one; the objects go to the group's members in group-rank order.
    pytest.importorskip("numpy", reason="torch's *_object collectives need numpy")
    world_size = world.size

    def check(case):
        objects, grouping, root, by_group_rank = case
        results = world.run(
            collective_jobs.objects_in_a_group, objects, grouping, root, by_group_rank
        )
        for rank, got in enumerate(results):
            members = groupings.members(grouping, rank, world_size)
            said = (f"over {grouping}, root group rank {root % len(members or [0])} named by "
                    f"{'group' if by_group_rank else 'global'} rank")  # fmt: skip
            if members is None:
                assert got is None, f"{said}: rank {rank} is in no group, yet ran: {got}"
                continue
            n, me, at = len(members), members.index(rank), root % len(members)
            want = {
                "all_gather_object": [objects[r] for r in members],
                "gather_object": [objects[r] for r in members] if me == at else None,
                "broadcast_object_list": list(objects[:n]),
                "scatter_object_list": objects[me],
            }
            for name, value in want.items():
                assert got is not None and got[name] == value, (
                    f"{name} {said}: rank {rank} holds "
                    f"{None if got is None else got[name]!r}, expected {value!r}"
                )

    prove(
        st.tuples(
            st.tuples(*[OBJECTS] * world_size),
            groupings.groupings(world_size),
            st.integers(0, world_size - 1),
            st.booleans(),
        ),
        check,
        examples=[
            (
                tuple(range(world_size)),
                ("new_group", tuple(reversed(range(world_size))), not groupings.SORT_RANKS),
                world_size - 1,
                True,
            ),
        ],
    )
