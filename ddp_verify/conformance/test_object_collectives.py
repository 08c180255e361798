"""Every object collective torch has, with objects of different sizes on every rank:
``all_gather_object`` and ``gather_object`` must give each rank (or the destination) every
rank's object, in rank order, intact; ``broadcast_object_list`` every rank the source's list;
``scatter_object_list`` each rank the object the source meant for it."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from ddp_verify.conformance import jobs

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
