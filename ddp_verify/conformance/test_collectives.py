"""c10d's tensor collectives against what each is documented to leave on every rank,
computed here from every rank's inputs: ``all_reduce`` and ``reduce`` (every ``ReduceOp``
the backend takes, on the dtypes it takes them), ``broadcast``, ``all_gather`` and
``all_gather_into_tensor`` (``all_gather_single``), ``gather``, ``scatter``,
``reduce_scatter_tensor`` (``reduce_scatter_single``) and ``all_to_all_single`` (even, and
split unevenly with empty chunks), synchronous and with ``async_op=True``; over the default
group and over the groups ``new_group`` (its ranks in any order, ``sort_ranks`` both ways),
``new_subgroups`` and ``new_subgroups_by_enumeration`` make, subgroups that are not the
world included, their roots named by global rank or by group rank (``group_src`` /
``group_dst``). A rank outside a group gets ``None`` back and keeps its tensors as they
were; a group reports its members, sizes and rank mappings as documented. Point-to-point
sends (blocking, asynchronous, batched, objects) pass round a ring of any group; the
functional collectives take a group in every form their docstrings list; groups keep the
documented time-out and local synchronisation; every documented refusal is made.

Data-parallel code reaches all of these (DDP and ZeRO over a subgroup, FSDP2's
reduce-scatters, hierarchical averaging); a collective that delivers the wrong rank's chunk,
reduces by the wrong op or over the wrong members trains every rank alike, wrongly."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import collective_jobs, groupings, refusal_jobs
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.world import RankError

# The ops gloo reduces, and the dtypes each applies to (the bitwise ones to integers).
OPS = {"SUM": ("float64", "int64"), "PRODUCT": ("float64", "int64"), "MIN": ("float64", "int64"),
       "MAX": ("float64", "int64"), "AVG": ("float64",), "BAND": ("int64",), "BOR": ("int64",),
       "BXOR": ("int64",)}  # fmt: skip


def _reduced(op: str, values: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(values)
    if op == "SUM":
        return stacked.sum(0)
    if op == "PRODUCT":
        return stacked.prod(0)
    if op == "MIN":
        return stacked.min(0).values
    if op == "MAX":
        return stacked.max(0).values
    if op == "AVG":
        return stacked.sum(0) / len(values)
    out = values[0].clone()
    for v in values[1:]:
        out = {"BAND": out & v, "BOR": out | v, "BXOR": out ^ v}[op]
    return out


def _expected(case: tuple[Any, ...], rank: int, world_size: int) -> dict[str, Any]:
    seed, grouping, op, dtype, root = case[:5]
    members = groupings.members(grouping, rank, world_size)

    def inputs(r: int, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        return collective_jobs.collective_inputs(seed + offset, r, shape, dtype)

    if members is None:  # every call returns None and leaves the rank's tensors alone
        return {
            "rank": -1, "size": 0, "ranks": None,
            "all_reduce": inputs(rank, (3,)).tolist(),
            "broadcast": inputs(rank, (3,), 1).tolist(),
            "reduce": inputs(rank, (3,), 2).tolist(),
            "all_gather": [[0, 0]], "gather": None, "scatter": [0, 0],
            "all_to_all_single": [0, 0], "all_to_all_single_uneven": [],
            **{name: [0, 0] for name in collective_jobs.GATHERS_INTO_A_TENSOR},
            **{name: [0, 0] for name in collective_jobs.REDUCE_SCATTERS_OF_A_TENSOR},
        }  # fmt: skip
    n, me = len(members), members.index(rank)
    root = root % n

    def inputs_of(sender: int, seed_of: int) -> list[Any]:
        return collective_jobs.collective_inputs(seed_of, sender, (2,), dtype).tolist()

    chunks = lambda r, offset: inputs(r, (2 * n,), offset).view(n, 2)  # noqa: E731
    want: dict[str, Any] = {
        "rank": me, "size": n, "ranks": members,
        "global_of_root": members[root], "group_rank_of_self": me,
        "all_reduce": _reduced(op, [inputs(r, (3,)) for r in members]).tolist(),
        "broadcast": inputs(members[root], (3,), 1).tolist(),
        "all_gather": [inputs(r, (2,), 3).tolist() for r in members],
        "gather": [inputs(r, (2,), 3).tolist() for r in members] if me == root else None,
        "scatter": inputs_of(members[root], seed + 10 + me),
        "all_to_all_single": torch.cat([chunks(r, 5)[me] for r in members]).tolist(),
    }  # fmt: skip
    uneven = []
    for sender in range(n):  # what each group rank sent this one, after what it sent before
        sizes = [collective_jobs.uneven_split(seed, sender, j) for j in range(n)]
        sent = inputs(members[sender], (sum(sizes),), 6)
        uneven += sent[sum(sizes[:me]) : sum(sizes[: me + 1])].tolist()
    want["all_to_all_single_uneven"] = uneven
    for name in collective_jobs.GATHERS_INTO_A_TENSOR:
        want[name] = torch.cat([inputs(r, (2,), 3) for r in members]).tolist()
    for name in collective_jobs.REDUCE_SCATTERS_OF_A_TENSOR:
        want[name] = _reduced(op, [chunks(r, 4)[me] for r in members]).tolist()
    if me == root:  # only the destination's tensor is documented after a reduce
        want["reduce"] = _reduced(op, [inputs(r, (3,), 2) for r in members]).tolist()
    return want


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
    return bool(got == want)


def test_tensor_collectives_leave_what_is_documented_on_every_rank(world, prove):
    world_size = world.size

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[Any, ...]:
        op = draw(st.sampled_from(sorted(OPS)))
        return (
            draw(st.integers(0, 2**16)),
            draw(groupings.groupings(world_size)),
            op,
            draw(st.sampled_from(OPS[op])),
            draw(st.integers(0, world_size - 1)),  # the root's group rank (mod its size)
            draw(st.booleans()),
            draw(st.booleans()),
        )

    # Subgroups of a group ranked evens first: at 4 ranks {0, 2} and {1, 3}, not the world's
    # blocks.
    interleaved = (*range(0, world_size, 2), *range(1, world_size, 2))
    halves = 2 if world_size % 4 == 0 else world_size
    subgroups_of = (
        [(5, ("subgroups_of", interleaved, halves), "SUM", "float64", 0, True, False)]
        if groupings.SUBGROUPS_OF and groupings.SORT_RANKS
        else []
    )

    def check(case: tuple[Any, ...]) -> None:
        seed, grouping, op, dtype, root, by_group_rank, async_op = case
        # The root as a group rank of the group each rank is in (the job takes it as given).
        results = world.run(collective_jobs.tensor_collectives, seed, grouping, op, dtype,
                            root, by_group_rank, async_op)  # fmt: skip
        for rank, got in enumerate(results):
            want = _expected(case, rank, world_size)
            assert got is not None
            for name, value in want.items():
                assert _close(got.get(name), value), (
                    f"{name} over {grouping} ({op}, {dtype}, root {root}, "
                    f"{'group_src/group_dst' if by_group_rank else 'src/dst'}, "
                    f"async_op={async_op}): rank {rank} holds {got.get(name)!r}, documented "
                    f"{value!r}"
                )
            inside = want["ranks"] is not None
            for name, none in got["returned_none"].items():
                assert none != (inside and async_op), (
                    f"{name} on rank {rank} ({'a member' if inside else 'outside the group'}"
                    f", async_op={async_op}) returned "
                    f"{'None' if none else 'a work handle'}"
                )

    prove(
        cases(),
        check,
        examples=[
            (1, ("default",), "SUM", "float64", 1 % world_size, False, False),
            (2, ("new_group", (world_size - 1,), True), "AVG", "float64", 0, True, True),
            (
                4,
                ("new_group", tuple(reversed(range(world_size))), not groupings.SORT_RANKS),
                "SUM",
                "float64",
                0,
                False,
                False,
            ),
            (3, ("by_enumeration", ((world_size - 1,),)), "BXOR", "int64", 0, False, False),
            *subgroups_of,
        ],
    )


# What each refusal says (torch 2.13's words, kept to the part that names the problem).
REFUSED = {
    "broadcast with src and group_src": r"ValueError: Can't specify both",
    "broadcast without a source": r"ValueError: Must specify global_rank or group_rank",
    "reduce with dst and group_dst": r"ValueError: Can't specify both",
    "gather_list on the wrong ranks": r"ValueError: Argument ``gather_list`` must",
    "scatter_list on the wrong ranks": r"ValueError: Argument ``scatter_list`` must",
    "all_gather into tensors of mixed dtypes": r"ValueError: Invalid usage of tensors with "
    r"different dtypes",
    "all_reduce of a list": r"TypeError: .*Expected parameter `tensor` of type torch.Tensor",
    "new_group with a rank beyond the world": r"ValueError: Rank \d+ is out of range",
    # device_id binds a group to an accelerator with an index: never to the CPU.
    "new_group bound to the CPU": r"ValueError: .*device_id parameter must be an accelerator",
    "new_group bound to an indexed CPU": r"ValueError: .*device_id parameter must be an "
    r"accelerator",
    "new_subgroups larger than the world": r"ValueError: .*must not exceed the world size",
    "new_subgroups of size 0": r"ValueError: .*must be positive",
    "new_subgroups_by_enumeration of nothing": r"ValueError: .*cannot be empty",
    "new_subgroups_by_enumeration with a rank twice": r"ValueError: Rank 0 has appeared in both",
}


def test_every_documented_refusal_of_a_collective_is_made_on_every_rank(world):
    # A regression that stops refusing lets a wrong call go on: a gather into lists on the
    # wrong ranks, a rank in two subgroups.
    results = world.run(collective_jobs.collective_refusals)
    for said in results:
        assert sorted(said) == sorted(REFUSED), sorted(set(said) ^ set(REFUSED))
    refusal_jobs.assert_refused(results, REFUSED, "c10d")


FUNCTIONAL_OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def _mesh_members(shape: tuple[int, ...], dim: int, rank: int) -> list[int]:
    """The ranks of ``rank``'s group along ``dim`` of a mesh of ``shape`` laid over the world
    in order."""
    if len(shape) == 1:
        return list(range(shape[0]))
    rows, columns = shape
    row, column = divmod(rank, columns)
    if dim == 0:
        return [column + columns * i for i in range(rows)]
    return [row * columns + j for j in range(columns)]


def test_functional_collectives_take_every_documented_form_of_group(world, prove):
    # DTensor and compiled code reach c10d through these, naming the group by a list of ranks,
    # a name, a mesh or a mesh dimension as well as a ProcessGroup: each form must name the
    # same ranks.
    world_size = world.size
    shapes = [(world_size,)] + [(a, world_size // a) for a in range(1, world_size + 1)
                                if world_size % a == 0]  # fmt: skip

    @st.composite
    def forms(draw: st.DrawFn) -> tuple[Any, ...]:
        kind = draw(st.sampled_from(["group", "ranks", "name", "mesh"]))
        if kind == "mesh":
            shape = draw(st.sampled_from(shapes))
            return ("mesh", shape, draw(st.integers(0, len(shape) - 1)))
        grouping = draw(groupings.groupings(world_size))
        if grouping[0] == "new_group":  # a list of ranks names the group in sorted order
            grouping = ("new_group", tuple(sorted(grouping[1])), True)
        return (kind, grouping)

    def check(case: tuple[Any, ...]) -> None:
        seed, form, op, root = case
        results = world.run(collective_jobs.functional_collectives, seed, form, op, root)
        for rank, got in enumerate(results):
            if form[0] == "mesh":
                members: list[int] | None = _mesh_members(tuple(form[1]), form[2], rank)
            else:
                members = groupings.members(form[1], rank, world_size)
            if members is None:
                assert got is None, f"rank {rank} is in no group of {form}, yet ran: {got}"
                continue
            n, me = len(members), members.index(rank)

            def inputs(r: int, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
                return collective_jobs.collective_inputs(seed + offset, r, shape, "float64")

            reduce_op = FUNCTIONAL_OPS[op]
            uneven = []
            for sender in range(n):
                sizes = [collective_jobs.uneven_split(seed, sender, j) for j in range(n)]
                sent = inputs(members[sender], (sum(sizes),), 6)
                uneven += sent[sum(sizes[:me]) : sum(sizes[: me + 1])].tolist()
            want = {
                "rank": me, "size": n,
                "all_reduce": _reduced(reduce_op, [inputs(r, (3,)) for r in members]).tolist(),
                "all_gather_tensor": torch.cat([inputs(r, (2,), 3) for r in members]).tolist(),
                "reduce_scatter_tensor": _reduced(
                    reduce_op, [inputs(r, (2 * n,), 4).view(n, 2)[me] for r in members]
                ).tolist(),
                "all_to_all_single": uneven,
                # Made only where the source's group and global ranks agree (see the job).
                "broadcast": inputs(members[root % n], (3,), 1).tolist()
                if members[root % n] == root % n else None,
            }  # fmt: skip
            for name, value in want.items():
                assert got is not None and _close(got[name], value), (
                    f"{name} over {form} ({op}, root {root}): rank {rank} holds "
                    f"{None if got is None else got[name]!r}, documented {value!r}"
                )

    prove(
        st.tuples(
            st.integers(0, 2**16),
            forms(),
            st.sampled_from(sorted(FUNCTIONAL_OPS)),
            st.integers(0, world_size - 1),
        ),
        check,
        examples=[
            (5, ("ranks", ("default",)), "sum", 0),
            (6, ("ranks", ("new_group", (world_size - 1,), True)), "avg", 0),
            (7, ("mesh", shapes[-1], 0), "max", world_size - 1),
        ],
    )


def test_groups_keep_the_documented_time_out_and_local_synchronization(world):
    if world.backend != "gloo":
        pytest.skip(f"reads gloo's options for the time-out; this world runs {world.backend}")
    seconds = 77
    default = 30 * 60.0  # every backend but NCCL, which this CPU world never is
    for rank, said in enumerate(world.run(collective_jobs.group_settings, seconds)):
        want: dict[str, Any] = {
            "new_group": default,
            "new_group with a time-out": float(seconds),
            "new_subgroups with a time-out": float(seconds),
            "new_subgroups_by_enumeration with a time-out": float(seconds),
            "backend by name": ("gloo", [2.0 * world.size]),
        }
        # The group reports the backend, or (torch 2.13) the configuration it was given.
        backend, reduced = said.pop("backend per device")
        assert backend in ("gloo", "cpu:gloo") and reduced == [2.0 * world.size], (
            f"rank {rank}: a group made with backend='cpu:gloo' says {backend!r}, {reduced}"
        )
        refused = said.pop("a time-out that is not a timedelta")
        assert refused is not None and "Expected timeout argument to be of type" in refused, (
            f"rank {rank}: new_group with a time-out of {seconds} (no timedelta): {refused!r}"
        )
        assert said == want, f"rank {rank}: {said}, documented {want}"


@known_torch_issue(
    "a group made with use_local_synchronization=True by its members alone (as documented: "
    "non-member ranks need not call new_group) moves their group counter one ahead of the "
    "other ranks' (_process_group_name counts hashed names too since 2.14), so the next group "
    "over the world gets another name on its members than elsewhere and its rendezvous never "
    "completes",
    raises=RankError,
    match=r"[Ww]ait timeout|did not finish within|can never complete",
    since="2.14",
    repro="findings/new_group_local_synchronization_counter.py",
)
def test_a_group_its_members_alone_make_leaves_the_others_free_to_make_the_next(world):
    # A group only its member made (use_local_synchronization) leaves every rank free to make
    # the next group with the others: every rank's counters still agree.
    for rank, said in enumerate(world.run(collective_jobs.local_group_then_world, 20)):
        want: dict[str, Any] = {"world after a local group": [float(world.size)]}
        if rank == world.size - 1:
            want["local group"] = [float(rank)]
        assert said == want, f"rank {rank}: {said}, documented {want}"


def test_point_to_point_passes_round_a_ring_of_any_group(world, prove):
    # Pipeline stages and some averaging schemes pass tensors rank to rank; a peer named by
    # its group rank must reach the same rank as by its global rank.
    if world.size < 2:
        pytest.skip("a ring needs two ranks")
    world_size = world.size

    def check(case: tuple[Any, ...]) -> None:
        seed, grouping, how, by_group_rank = case
        results = world.run(collective_jobs.point_to_point, seed, grouping, how, by_group_rank)
        for rank, got in enumerate(results):
            members = groupings.members(grouping, rank, world_size)
            said = f"{how} over {grouping} (peers by {'group' if by_group_rank else 'global'} rank)"
            if members is None or len(members) < 2:
                assert got is None, f"{said}: rank {rank} is in no ring, yet ran: {got}"
                continue
            before = members[(members.index(rank) - 1) % len(members)]
            sent = collective_jobs.collective_inputs(seed, before, (3,), "float64").tolist()
            assert got is not None and got["received"] == sent, (
                f"{said}: rank {rank} received {None if got is None else got['received']}, "
                f"rank {before} sent it {sent}"
            )
            if how == "batched":
                me = members.index(rank)
                n = len(members)
                want_peers = [[members[(me + 1) % n], (me + 1) % n], [before, (me - 1) % n]]
                assert got["peers"] == want_peers, (
                    f"{said}: rank {rank}'s P2POps name (peer, group_peer) {got['peers']}, "
                    f"documented {want_peers}"
                )
            if how == "blocking":
                assert got["sender"] == before, f"{said}: recv on rank {rank} named {got['sender']}"
                assert got["object"] == {"from": before, "values": sent}, (
                    f"{said}: rank {rank} received the object {got['object']!r}"
                )

    prove(
        st.tuples(
            st.integers(0, 2**16),
            groupings.groupings(world_size),
            st.sampled_from(["blocking", "async", "batched"]),
            st.booleans(),
        ),
        check,
        examples=[
            (1, ("default",), "batched", True),
            # Group ranks that are not the global ones: the peers by group rank.
            (
                2,
                ("new_group", tuple(reversed(range(world_size))), not groupings.SORT_RANKS),
                "blocking",
                True,
            ),
            (
                3,
                ("new_group", tuple(reversed(range(world_size))), not groupings.SORT_RANKS),
                "batched",
                True,
            ),
        ],
    )
