"""DeviceMesh, the layout FSDP2, HSDP and tensor parallelism name their groups by, against the
arithmetic it stands for: a mesh of shape ``(d0, d1, ...)`` lays the world's ranks out in
row-major order; a rank's coordinate is its index unravelled; the group (and the one-dimensional
submesh) of a dimension holds the ranks that differ from it in that coordinate alone; sizes and
local ranks follow; a submesh of every dimension in order is the mesh again, one of any
dimensions in order is the layout with the others fixed at the rank's coordinate, and so is
that choice flattened into one dimension (row-major); a dimension unflattened into two is the
layout viewed with one more dimension. The meshes it documents as invalid (more ranks than the
world, names of another length or repeated, two dimensions of more than one rank out of
order, a flattened dimension sliced beside one of its own) are refused. A dimension given its
own backend or options (``backend_override``) holds them, no other dimension does. A mesh
whose groups hold other ranks reduces over the wrong replicas, on every rank alike."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import collective_jobs
from ddp_verify.conformance.known import known_torch_issue

REFUSED = {
    "a mesh of more ranks than the world": r"RuntimeError: Mesh should not be bigger than",
    "names of another length": r"RuntimeError: mesh_shape and mesh_dim_names should have same "
    r"length",
    "a name twice": r"RuntimeError: Each mesh_dim_name must be unique",
    "dimensions out of order": r"KeyError: .*Mesh dim indices should be in ascending order",
    "a flattened dimension beside one of its own": r"RuntimeError: Slicing overlapping dim_names",
    "a group of no dimension named": r"RuntimeError: .*Found the DeviceMesh have \d+ dimensions",
}


def _shapes(world_size: int) -> list[tuple[int, ...]]:
    """Every way of writing the world as a product of one to three sizes (ones included)."""
    found: list[tuple[int, ...]] = [(world_size,)]
    for a in range(1, world_size + 1):
        if world_size % a == 0:
            found.append((a, world_size // a))
            rest = world_size // a
            found += [(a, b, rest // b) for b in range(1, rest + 1) if rest % b == 0]
    return found


def _documented(shape: tuple[int, ...], names: tuple[str, ...], rank: int) -> dict[str, Any]:
    layout = torch.arange(math.prod(shape)).view(shape)
    coordinate = [int(c) for c in torch.unravel_index(torch.tensor(rank), shape)]

    def held(dims: tuple[int, ...]) -> torch.Tensor:
        # The layout with every coordinate outside ``dims`` fixed at this rank's.
        index = [slice(None) if e in dims else coordinate[e] for e in range(len(shape))]
        return layout[tuple(index)]

    def unflattened(d: int, a: int) -> list[Any]:
        split = (*shape[:d], a, shape[d] // a, *shape[d + 1 :])
        view = layout.view(split)
        where = [int(c) for c in torch.unravel_index(torch.tensor(rank), split)]
        return [view.tolist(), where, [
            view[tuple(slice(None) if f == e else where[f] for f in range(len(split)))].tolist()
            for e in range(len(split))
        ]]  # fmt: skip

    groups = []
    for d in range(len(shape)):
        index = [slice(None) if e == d else coordinate[e] for e in range(len(shape))]
        groups.append(layout[tuple(index)].tolist())
    return {
        "mesh": layout.tolist(),
        "coordinate": coordinate,
        "size": [math.prod(shape), *shape],
        "ndim": len(shape),
        "names": list(names),
        "local ranks": coordinate,
        "groups": groups,
        "groups by name": groups,
        "submeshes": groups,
        "all dimensions": layout.tolist() if len(shape) > 1 else None,
        "equal to another of the same shape": True,
        "equal to one made in another thread": True,
        "submesh groups": groups,
        "all groups": groups,
        "shape": list(shape),
        "rank": rank,
        "ordered submeshes": {
            ",".join(names[d] for d in s): held(s).tolist()
            for s in collective_jobs._ordered_subsets(len(shape))
            if len(s) > 1
        },
        # A flattened choice of dimensions: the ranks that differ from this one in those
        # coordinates alone, in row-major order of them, one group.
        "flattened": {
            ",".join(names[d] for d in s): [held(s).flatten().tolist()] * 2
            for s in collective_jobs._ordered_subsets(len(shape))
        },
        # A dimension of n unflattened into (a, n / a): the same ranks in the same order, the
        # layout viewed with one more dimension.
        "unflattened": {
            f"{d}:{a}": unflattened(d, a)
            for d, n in enumerate(shape)
            for a in range(1, n + 1)
            if n % a == 0
        },
    }


def test_a_device_mesh_is_the_layout_it_stands_for(world, prove):
    def check(shape: tuple[int, ...]) -> None:
        names = tuple(f"d{i}" for i in range(len(shape)))
        for rank, got in enumerate(world.run(collective_jobs.device_mesh_views, shape, names)):
            for key, want in _documented(shape, names, rank).items():
                assert got[key] == want, (
                    f"{key} of a mesh of shape {shape} on rank {rank}: {got[key]!r}, "
                    f"documented {want!r}"
                )
            for what, pattern in REFUSED.items():
                # Out of order matters only between two dimensions of more than one rank
                # (size-1 dimensions leave the layout the same, and torch takes it).
                if what == "dimensions out of order" and sum(n > 1 for n in shape) < 2:
                    continue
                if what == "a group of no dimension named" and len(shape) < 2:
                    continue  # a one-dimensional mesh's only group is given
                if what == "a flattened dimension beside one of its own" and (
                    sum(n > 1 for n in shape) < 2 or what not in got["refused"]
                ):
                    continue  # two dimensions of more than one rank, and _flatten, needed
                said = got["refused"][what]
                assert said is not None and re.match(pattern, said), (
                    f"{what} (mesh {shape}) on rank {rank}: {said!r}, expected {pattern!r}"
                )

    shapes = _shapes(world.size)
    prove(st.sampled_from(shapes), check, examples=shapes[: min(len(shapes), 4)])


def test_a_mesh_given_outright_is_the_layout_its_tensor_says(world):
    # DeviceMesh(device, tensor): the tensor's entries are global ranks (its documentation),
    # here the world in its own order; a rank outside a mesh has no coordinate.
    order = list(range(world.size))
    for rank, got in enumerate(world.run(collective_jobs.meshes_given_outright, order)):
        assert got["coordinate"] == [rank], got
        assert got["alone"] == ([0] if rank == 0 else None), got
        assert got["group"] == order, got
        assert got["distributed shard"] == [2.0 * rank, 2.0 * rank + 1], got
        assert got["from_local whole"] == [float(i) for i in range(2 * world.size)], got


@known_torch_issue(
    "DeviceMesh made from a tensor of ranks in another order than their own ([1, 0]): "
    "get_coordinate() gives each rank its place in the tensor, but distribute_tensor places "
    "shard i on the rank of group rank i (the group's ranks sorted) and full_tensor() "
    "assembles in group-rank order, so a DTensor built from_local by coordinates comes back "
    "whole out of order",
    raises=AssertionError,
    match=r"in another order",
    repro="findings/device_mesh_permuted_order.py",
)
def test_a_mesh_of_ranks_in_another_order_shards_by_its_coordinates(world):
    if world.size < 2:
        pytest.skip("another order needs two ranks")
    order = list(reversed(range(world.size)))
    for rank, got in enumerate(world.run(collective_jobs.meshes_given_outright, order)):
        place = order.index(rank)
        assert got["coordinate"] == [place], got
        whole = [float(i) for i in range(2 * world.size)]
        assert got["distributed shard"] == [2.0 * place, 2.0 * place + 1], (
            f"a mesh of the ranks in another order ({order}): rank {rank} at coordinate "
            f"{place} holds {got['distributed shard']}, not shard {place}"
        )
        assert got["from_local whole"] == whole, (
            f"a mesh of the ranks in another order ({order}): shards given by coordinate "
            f"come back whole as {got['from_local whole']}"
        )


def test_a_mesh_dimension_given_its_own_backend_has_it(world, prove):
    # backend_override: a dimension (by index or name) given its own backend, options, or
    # both, as init_device_mesh documents (DeviceMesh: a pair a dimension); here gloo with a
    # time-out of its own. That dimension's group holds them, no other; every group still
    # reduces over its own members.
    import inspect

    from torch.distributed.device_mesh import init_device_mesh

    if "backend_override" not in inspect.signature(init_device_mesh).parameters:
        pytest.skip(f"torch {torch.__version__}'s init_device_mesh has no backend_override")

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[Any, ...]:
        shape = draw(st.sampled_from(_shapes(world.size)))
        dim = draw(st.integers(0, len(shape) - 1))
        form = draw(st.sampled_from(["options", "both", "name"]))
        return (shape, dim, draw(st.booleans()), form, draw(st.booleans()))

    def check(case: tuple[Any, ...]) -> None:
        shape, dim, by_name, form, outright = case
        made = f"{'DeviceMesh' if outright else 'init_device_mesh'} {shape}"
        key = f"d{dim}" if by_name else dim
        layout = torch.arange(world.size).reshape(shape)
        for rank, got in enumerate(world.run(collective_jobs.mesh_backend_overridden, *case)):
            coordinate = (layout == rank).nonzero()[0].tolist()
            for d, held in enumerate(got["groups"]):
                # The ranks that differ from this one in coordinate d alone.
                line = tuple(slice(None) if i == d else c for i, c in enumerate(coordinate))
                members = layout[line].tolist()
                said = f"{made}, backend_override {{{key!r}: {form}}}, rank {rank}, group {d}"
                assert held["backend"] == "gloo", f"{said}: backend {held['backend']}"
                assert held["sum"] == float(sum(members)), (
                    f"{said}: all-reduce gave {held['sum']}, its members {members} sum to "
                    f"{sum(members)}"
                )
                if held["timeout"] is None:
                    continue
                # The options given hold for their dimension alone (the others, and a
                # backend named without options, keep a default of their own).
                own = d == dim and form != "name"
                assert (held["timeout"] == 123.0) == own, (
                    f"{said}: time-out {held['timeout']} s, "
                    f"{'the options given say 123 s' if own else 'not the options given'}"
                )

    prove(cases(), check)
