"""DTensor, the tensor FSDP2, tensor parallelism and distributed checkpoints are made of,
against the plain tensors it stands for: a tensor laid out on a one- or two-dimensional mesh
(sharded along either dimension, unevenly and with fewer rows than ranks, replicated, or a
partial sum) must be whole again as it was; redistributed to any other layout, the same; (to
a partial sum: refused, as documented); and every operation training runs on it
(elementwise, reductions, a matrix product, softmax, layout changes) must give what the
operation gives on the whole tensors, and its gradient what autograd gives there. A wrong
sharding rule or redistribution trains every rank alike on wrong values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import dtensor_jobs
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.world import RankError

PLACEMENTS = ("shard0", "shard1", "replicate", "partial")


def _meshes(world_size: int) -> list[tuple[int, ...]]:
    twos = [(a, world_size // a) for a in range(1, world_size + 1) if world_size % a == 0]
    return [(world_size,), *twos]


def _shards(mesh: tuple[int, ...], placements: tuple[str, ...]) -> list[int]:
    """How many shards each dimension of a 2-D tensor is cut into."""
    parts = [1, 1]
    for size, p in zip(mesh, placements, strict=True):
        if p.startswith("shard"):
            parts[int(p[-1])] *= size
    return parts


def _even(shape: tuple[int, ...], mesh: tuple[int, ...], placements: tuple[str, ...]) -> bool:
    return all(n % k == 0 for n, k in zip(shape, _shards(mesh, placements), strict=True))


def _rows_left_empty(rows: int, mesh: tuple[int, ...], placements: tuple[str, ...]) -> bool:
    """Whether some rank holds no rows (shards are torch.chunk's: ceil(rows / k) each)."""
    k = _shards(mesh, placements)[0]
    return -(-rows // -(-rows // k)) < k


@st.composite
def cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    mesh = draw(st.sampled_from(_meshes(world_size)))
    sides = st.integers(1, world_size + 2)  # fewer rows than ranks, and uneven shards
    rows, columns, k = draw(sides), draw(sides), draw(sides)
    layout = st.tuples(*[st.sampled_from(PLACEMENTS)] * len(mesh))
    a_placements = draw(layout)
    names = draw(st.lists(st.sampled_from(sorted(dtensor_jobs.OPERATIONS)), min_size=1,
                          max_size=4, unique=True))  # fmt: skip
    sharded = any(p.startswith("shard") for p in a_placements)
    by_rows = a_placements == ("shard0",) and _even((rows, columns), mesh, a_placements)
    if sharded and not by_rows:
        # Flattening is refused (torch asks for a redistribution first) unless the tensor is
        # whole on every rank or cut evenly by rows over a one-dimensional mesh (a shard over
        # a mesh dimension of one rank included); the rest take any layout.
        names = [n for n in names if n != "flatten"]
    if _rows_left_empty(rows, mesh, a_placements):
        names = [n for n in names if n != "amax_rows"]  # the known issue below
    names = names or ["add"]
    return {
        "seed": draw(st.integers(0, 2**16)),
        "mesh": mesh,
        "a_shape": (rows, columns),
        "b_shape": (columns, k),
        "a_placements": a_placements,
        "b_placements": draw(layout),
        # Not to a partial sum: refused to users (checked on its own).
        "target": draw(st.tuples(*[st.sampled_from(PLACEMENTS[:3])] * len(mesh))),
        "operations": names,
    }


def _documented(case: dict[str, Any]) -> dict[str, Any]:
    a = dtensor_jobs.full_value(case["seed"], 0, tuple(case["a_shape"]))
    b = dtensor_jobs.full_value(case["seed"], 1, tuple(case["b_shape"]))
    want: dict[str, Any] = {"laid out": a, "redistributed": a}
    for name in case["operations"]:
        op = dtensor_jobs.OPERATIONS[name]
        want[name] = op(a, b)
        if name in dtensor_jobs.DIFFERENTIABLE and "partial" not in case["a_placements"]:
            leaf = a.clone().requires_grad_()
            result = op(leaf, b)
            weights = dtensor_jobs.full_value(case["seed"], 2, tuple(result.shape))
            (result * weights).sum().backward()
            want[f"{name} gradient"] = leaf.grad
    return want


def _shard_to_partial_documented() -> bool:
    # The installed release's own word: newer ones document Shard(dim) -> Partial("sum") as
    # the one redistribution to a partial sum users may make; older ones refuse them all.
    from torch.distributed.tensor import DTensor

    doc = DTensor.redistribute.__doc__ or ""
    return 'Shard(dim)`` -> ``Partial("sum")' in doc


def _assert_redistributed_to_partial(got: Any, whole: torch.Tensor, case: dict[str, Any],
                                     where: str) -> None:  # fmt: skip
    said = f"{where}, redistributed to a partial sum"
    if _shard_to_partial_documented() and all(p.startswith("shard") for p in case["a_placements"]):
        # Each rank's shard at its offset in zeros: summed over the ranks, the whole tensor.
        assert isinstance(got, torch.Tensor), f"{said}: refused ({got}), where torch documents it"
        torch.testing.assert_close(got, whole, rtol=1e-12, atol=1e-12,
                                   msg=lambda m: f"{said}: {m}")  # fmt: skip
        return
    refusals = ("internal use only", "only Shard to Partial(sum) redistribution is supported")
    assert isinstance(got, str) and any(r in got for r in refusals), (
        f"{said}: {got!r}, where torch refuses it to users"
    )


def test_dtensor_is_the_whole_tensor_it_stands_for(world, prove):
    def check(case: dict[str, Any]) -> None:
        want = _documented(case)
        layout = (f"{case['a_shape']} as {case['a_placements']} on mesh {case['mesh']}, "
                  f"b {case['b_shape']} as {case['b_placements']}")  # fmt: skip
        for rank, got in enumerate(world.run(dtensor_jobs.operations, case)):
            if "partial" not in case["a_placements"]:
                _assert_redistributed_to_partial(got["to partial"], want["laid out"], case,
                                                 f"{layout} on rank {rank}")  # fmt: skip
            for name, value in want.items():
                held = got[name]
                assert isinstance(held, torch.Tensor), f"{name} of {layout}: rank {rank} {held}"
                torch.testing.assert_close(
                    held, value, rtol=1e-12, atol=1e-12,
                    msg=lambda m, name=name, rank=rank: f"{name} of {layout} (redistributed to "
                    f"{case['target']}) on rank {rank}: {m}",
                )  # fmt: skip

    world_size = world.size
    prove(
        cases(world_size),
        check,
        examples=[
            # A matrix with fewer rows than ranks, sharded by rows; a partial sum made whole.
            {
                "seed": 1,
                "mesh": (world_size,),
                "a_shape": (1, 3),
                "b_shape": (3, 2),
                "a_placements": ("shard0",),
                "b_placements": ("partial",),
                "target": ("shard1",),
                "operations": ["matmul", "sum_rows", "softmax"],
            },
        ],
    )


@known_torch_issue(
    "amax (and max) over a dimension sharded so that a rank holds none of it raises "
    "IndexError on that rank ('Expected reduction dim 0 to have non-zero size') while the "
    "others wait in the reduction: a sum over the same layout works",
    raises=RankError,
    match=r"to have non-zero size",
    repro="findings/dtensor_amax_empty_shard.py",
)
def test_dtensor_amax_over_a_dimension_some_rank_holds_none_of(world):
    if world.size < 2:
        pytest.skip("a rank without rows needs more ranks than rows")
    case = {"seed": 3, "mesh": (world.size,), "a_shape": (1, 2), "b_shape": (2, 1),
            "a_placements": ("shard0",), "b_placements": ("replicate",),
            "target": ("replicate",), "operations": ["amax_rows"]}  # fmt: skip
    want = _documented(case)["amax_rows"]
    for rank, got in enumerate(world.run(dtensor_jobs.operations, case)):
        torch.testing.assert_close(
            got["amax_rows"], want, msg=lambda m, rank=rank: f"rank {rank}: {m}"
        )
