"""DTensor, the tensor FSDP2, tensor parallelism and distributed checkpoints are made of,
against the plain tensors it stands for: a tensor laid out on a one- or two-dimensional mesh
(sharded along either dimension, unevenly and with fewer rows than ranks, replicated, or a
partial sum) must be whole again as it was; redistributed to any other layout, the same; (to
a partial sum: refused, as documented); and every operation training runs on it
(elementwise, reductions, a matrix product, softmax, layout changes) must give what the
operation gives on the whole tensors, and its gradient what autograd gives there. The
keyword forms its constructors and conversions document (whose data a source rank names, a
replica check, an uneven shape given, the dtypes of a redistribution and of its gradient, a
gradient hinted partial) do what their docstrings say. An operation whose inputs' pieces
are all each rank needs runs without communication, its result laid out as the arithmetic
leaves it; an update written in place, into an out tensor or over a list of tensors at once
(as optimizers write theirs), and aten's functional form of an operation that writes an
input (as ``torch.compile`` makes of it), is its functional form; an out tensor keeps its
layout, whatever was written into another before; each rank holds the piece its placements
name. A wrong sharding rule or redistribution trains every rank alike on wrong
values; a wrong choice among them moves whole tensors a step needs none of."""

from __future__ import annotations

import itertools
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
    # A batched product views its rows and the columns it contracts as one matrix, which
    # DTensor refuses (forward or backward) for most layouts of either operand: taken in
    # the rows-cut example only.
    drawn = sorted(set(dtensor_jobs.operations_held()) - {"matmul_batched"})
    names = draw(st.lists(st.sampled_from(drawn), min_size=1, max_size=4, unique=True))
    sharded = any(p.startswith("shard") for p in a_placements)
    by_rows = (a_placements == ("shard0",) and rows > 1
               and _even((rows, columns), mesh, a_placements))  # fmt: skip
    if sharded and not by_rows:
        # Flattening is refused (torch asks for a redistribution first) unless the tensor is
        # whole on every rank or cut evenly by rows over a one-dimensional mesh (a shard over
        # a mesh dimension of one rank included), more than one (a sharded dimension of one
        # is removed, not merged); the rest take any layout.
        names = [n for n in names if n not in ("flatten", "reshaped")]
    if _rows_left_empty(rows, mesh, a_placements):
        names = [n for n in names if n != "amax_rows"]  # the known issue below
    if "partial" in a_placements and sharded:
        names = [n for n in names if n != "new_tensors"]  # the known issue below
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
        "weights": draw(st.sampled_from(("replicate", "as result"))),
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
            # A matrix with fewer rows than ranks, sharded by rows; a partial sum made whole;
            # lists of one tensor (never left to the draw of operations).
            {
                "seed": 1,
                "mesh": (world_size,),
                "a_shape": (1, 3),
                "b_shape": (3, 2),
                "a_placements": ("shard0",),
                "b_placements": ("partial",),
                "target": ("shard1",),
                "operations": ["matmul", "sum_rows", "softmax", *_held("list_of_one")],
            },
            # One tensor dimension cut by both dimensions of a mesh (the first, then the second).
            {
                "seed": 2,
                "mesh": _two_dimensional(world_size),
                "a_shape": (world_size + 1, 3),
                "b_shape": (3, 2),
                "a_placements": ("shard0", "shard0"),
                "b_placements": ("shard0", "shard1"),
                "target": ("replicate", "shard0"),
                # Linear algebra's factorizations check their input for errors through an
                # operation that returns nothing.
                "operations": ["add", "sum_rows", "matmul", *_held("linear_algebra")],
            },
            # Samples cut by rows, unevenly: tensors made from them, an expansion, indexing
            # and upsampling forward and back, the gradient arriving cut by rows (each
            # backward is told the whole input's size: each rank's own is what it holds).
            {
                "seed": 3,
                "mesh": (world_size,),
                "a_shape": (world_size + 1, 3),
                "b_shape": (3, 2),
                "a_placements": ("shard0",),
                "b_placements": ("replicate",),
                "target": ("shard1",),
                "operations": _held(*_MADE_AND_INDEXED, *_UPSAMPLING),
                "weights": "as result",
            },
        ],
    )


_UPSAMPLING = ("upsample_1d", "upsample_2d", "upsample_3d")


def _held(*names: str) -> list[str]:
    """Those of ``names`` held against the installed torch (``add`` where none is)."""
    return [name for name in names if name in dtensor_jobs.operations_held()] or ["add"]


_MADE_AND_INDEXED = ("new_tensors", "expand", "slice_columns", "select_column", "view_sizes",
                     "matmul_batched", "view_copy", "expand_copy")  # fmt: skip


def _two_dimensional(world_size: int) -> tuple[int, int]:
    """The squarest two-dimensional mesh of the world (one of its sides 1 where prime)."""
    return max(((a, world_size // a) for a in range(1, world_size + 1) if world_size % a == 0),
               key=min)  # fmt: skip


def _api_forms(seed: int, shape: tuple[int, int], size: int, rank: int) -> dict[str, Any]:
    """What each of :func:`dtensor_jobs.api_forms`'s forms documents rank ``rank`` holds."""

    def own(r: int) -> torch.Tensor:
        return dtensor_jobs.full_value(seed, 0, shape) + r

    def chunk(t: torch.Tensor, r: int) -> torch.Tensor:
        # torch.chunk's r-th piece; empty past the last (fewer rows than ranks).
        pieces = t.chunk(size)
        return pieces[r] if r < len(pieces) else t[:0]

    whole = dtensor_jobs.full_value(seed, 1, shape)
    grad = dtensor_jobs.full_value(seed, 2, shape) * (1 + 2.0**-12)
    summed = sum((grad + r for r in range(size)), torch.zeros(shape, dtype=torch.float64))
    want: dict[str, Any] = {}
    for source in (0, size - 1, None):
        # An int: that rank's tensor, scattered or broadcast; None: each rank's own data.
        held = own(rank if source is None else source)
        want[f"distributed shard0 from {source}"] = chunk(held, rank)
        want[f"distributed replicate from {source}"] = held
    want["distributed, no placements"] = own(0)  # replicated from the first rank
    want["from_local replicas, run_check=False"] = own(rank)
    want["from_local replicas, run_check=True"] = own(0)  # broadcast from the first rank
    want["from_local uneven, whole"] = whole
    want["from_local uneven, shape"] = list(shape)
    want["forward_dtype"] = ["torch.float32", whole.float()]
    want["backward_dtype=None"] = ["torch.float64", grad]
    rounded = grad.to(torch.bfloat16).to(torch.float64)
    want["backward_dtype=torch.bfloat16"] = ["torch.float64", rounded]
    want["async_op"] = whole
    # Unhinted, a rank's own gradient is taken for the replica it is said to be (for a
    # sharded leaf, its shard of it); hinted partial, the ranks' gradients are summed.
    want["to_local grad_placements=False"] = grad + rank
    want["to_local grad_placements=True"] = summed
    want["full_tensor grad_placements=False"] = torch.cat([chunk(grad + r, r) for r in range(size)])
    want["full_tensor grad_placements=True"] = summed
    # from_local's hint: the local gradient is each rank's own contribution, left partial;
    # unhinted, the replicated whole its placements say.
    want["from_local grad_placements=False"] = summed
    want["from_local grad_placements=True"] = grad + rank
    return want


def test_dtensor_keyword_forms_do_what_they_document(world, prove):
    # Whose data distribute_tensor's src_data_rank takes, what from_local's run_check,
    # shape and stride do, redistribute's dtypes and async_op, and the gradient placements
    # to_local and full_tensor are hinted: each against its docstring, computed here.
    def check(case: tuple[int, tuple[int, int]]) -> None:
        seed, shape = case
        for rank, got in enumerate(world.run(dtensor_jobs.api_forms, seed, shape)):
            for name, want in _api_forms(seed, shape, world.size, rank).items():
                said = f"{name}, a float64 {shape} on a mesh of {world.size}, rank {rank}"
                held = got[name]
                if isinstance(want, list) and len(want) == 2 and isinstance(want[1], torch.Tensor):
                    assert held[0] == want[0], f"{said}: dtype {held[0]}, documented {want[0]}"
                    held, want = held[1], want[1]
                if isinstance(want, torch.Tensor):
                    torch.testing.assert_close(held, want, rtol=0, atol=0,
                                               msg=lambda m, said=said: f"{said}: {m}")  # fmt: skip
                else:
                    assert held == want, f"{said}: {held}, documented {want}"

    shapes = st.tuples(st.integers(0, 2 * world.size + 1), st.integers(1, 3))
    prove(st.tuples(st.integers(0, 2**16), shapes), check,
          examples=[(0, (2 * world.size + 1, 2)), (1, (1, 1))])  # fmt: skip


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


@known_torch_issue(
    "new_full and new_ones on a DTensor cut on one mesh dimension and a partial sum on "
    "another lay the new tensor out as the input, the partial sum included: every rank "
    "holds the value given, so the tensor stands for their sum (the value times the ranks "
    "of that dimension); new_zeros hides it (a sum of zeros), and made from a partial sum "
    "alone the new tensor is replicated, as it should be",
    raises=AssertionError,
    match=r"tensors made from",
    url="not found in torch's tracker; pytorch/pytorch#180511 meant these factories to "
    "replicate where the input is a partial sum",
    repro="findings/dtensor_new_full_cut_partial_sum.py",
    since="2.13",
)
def test_a_tensor_made_from_a_cut_partial_sum_holds_the_value_given(world):
    if world.size < 2:
        pytest.skip("a partial sum needs two ranks")
    if "new_tensors" not in dtensor_jobs.operations_held():
        pytest.skip("tensors made from a DTensor are held from torch 2.13 on")
    case = {"seed": 4, "mesh": (1, world.size), "a_shape": (2, 2), "b_shape": (2, 1),
            "a_placements": ("shard0", "partial"), "b_placements": ("replicate", "replicate"),
            "target": ("replicate", "replicate"), "operations": ["new_tensors"]}  # fmt: skip
    want = _documented(case)["new_tensors"]
    for rank, got in enumerate(world.run(dtensor_jobs.operations, case)):
        torch.testing.assert_close(
            got["new_tensors"], want,
            msg=lambda m, rank=rank: f"tensors made from (shard0, partial), rank {rank}: {m}",
        )  # fmt: skip


# What each operation's result is laid out as, a mesh dimension at a time, when every rank
# can compute its piece of it from the pieces it holds (a missing entry: some rank needs
# another's data). Read from the operations' arithmetic: an elementwise result is cut as its
# input is; a sum over the cut dimension leaves each rank a partial sum; a row-cut matrix
# times a whole one is row-cut, a whole one times a column-cut one column-cut, and a
# column-cut times a row-cut one a partial sum of outer blocks.
# A linear operation of a partial sum is the partial sum of its results (where torch keeps it
# so: the mean of one it reduces first, a choice, not a need, and not held here).
_SAME = {"shard0": "shard0", "shard1": "shard1", "replicate": "replicate"}
_LINEAR: dict[tuple[str, ...], str] = {("partial",): "partial"}
FITTING: dict[str, dict[tuple[str, ...], str]] = {
    **{name: {(p,): q for p, q in _SAME.items()} for name in ("relu", "exp")},
    **{name: {**{(p,): q for p, q in _SAME.items()}, **_LINEAR} for name in ("add", "neg")},
    "sum": {("shard0",): "partial", ("shard1",): "partial", ("replicate",): "replicate",
            **_LINEAR},
    "sum_rows": {("shard0",): "partial", ("shard1",): "shard0", ("replicate",): "replicate",
                 **_LINEAR},
    "sum_columns": {("shard0",): "shard0", ("shard1",): "partial", ("replicate",): "replicate",
                    **_LINEAR},
    "softmax": {("shard0",): "shard0", ("replicate",): "replicate"},
    "transpose": {("shard0",): "shard1", ("shard1",): "shard0", ("replicate",): "replicate",
                  **_LINEAR},
    "slice_columns": {("shard0",): "shard0", ("replicate",): "replicate", **_LINEAR},
    "cat": {("shard1",): "shard1", ("replicate",): "replicate", **_LINEAR},
    "matmul": {("shard0", "replicate"): "shard0", ("replicate", "shard1"): "shard1",
               ("shard1", "shard0"): "partial", ("replicate", "replicate"): "replicate",
               ("partial", "replicate"): "partial"},
}  # fmt: skip


def _labelled(placements: Any, mesh: tuple[int, ...]) -> tuple[str, ...]:
    """``placements`` as compared: over a mesh dimension of one rank every placement is the
    same tensor (a sum of one, a shard that is the whole), so any label is right there."""
    return tuple(p if n > 1 else "any" for p, n in zip(placements, mesh, strict=True))


def _fitting(case: dict[str, Any]) -> tuple[str, ...] | None:
    """The result's placements if no rank needs another's data, else None."""
    table = FITTING[case["operation"]]
    binary = case["operation"] == "matmul"
    out = []
    for i in range(len(case["mesh"])):
        key = (case["a_placements"][i], case["b_placements"][i])[: 2 if binary else 1]
        if key not in table:
            return None
        out.append(table[key])
    return tuple(out)


@st.composite
def fitting_cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    mesh = draw(st.sampled_from(_meshes(world_size)))
    operation = draw(st.sampled_from(sorted(FITTING)))
    keys = sorted(FITTING[operation])
    # Per mesh dimension, a pair of placements that needs no other rank's data.
    chosen = [draw(st.sampled_from(keys)) for _ in mesh]
    a_placements = tuple(c[0] for c in chosen)
    b_placements = tuple(c[-1] if len(c) > 1 else "replicate" for c in chosen)
    # Unevenly cut, but never into more pieces than a dimension has elements: a strategy
    # leaving a rank none of a dimension it cuts is one torch documents it does not pick
    # (``is_tensor_shardable``), so the whole is gathered instead.
    a_cuts, b_cuts = _shards(mesh, a_placements), _shards(mesh, b_placements)
    most = 2 * world_size + 1
    rows = draw(st.integers(a_cuts[0], most))
    columns = draw(st.integers(max(a_cuts[1], b_cuts[0]), most))
    k = draw(st.integers(b_cuts[1], most))
    return {
        "seed": draw(st.integers(0, 2**16)),
        "mesh": mesh,
        "operation": operation,
        "a_shape": (rows, columns),
        "b_shape": (columns, k),
        "a_placements": a_placements,
        "b_placements": b_placements,
    }


def test_an_operation_whose_inputs_fit_communicates_nothing(world, prove):
    # DTensor picks, of an operation's sharding strategies, the one its cost model rates
    # cheapest: where every rank can compute its piece of the result from its own pieces, that
    # is no communication at all, and the result laid out as the arithmetic leaves it.
    def check(case: dict[str, Any]) -> None:
        want_placements = _fitting(case)
        assert want_placements is not None  # drawn so
        a = dtensor_jobs.full_value(case["seed"], 0, tuple(case["a_shape"]))
        b = dtensor_jobs.full_value(case["seed"], 1, tuple(case["b_shape"]))
        whole = dtensor_jobs.OPERATIONS[case["operation"]](a, b)
        said = (
            f"{case['operation']} of {case['a_shape']} as {case['a_placements']} "
            f"(b {case['b_shape']} as {case['b_placements']}) on mesh {case['mesh']}"
        )
        for rank, got in enumerate(world.run(dtensor_jobs.communication, case)):
            assert got["collectives"] == {}, (
                f"{said}, rank {rank}: issued {got['collectives']} where each rank holds what "
                f"its piece of the result needs ({list(want_placements)})"
            )
            held = _labelled(got["placements"], case["mesh"])
            assert held == _labelled(want_placements, case["mesh"]), (
                f"{said}, rank {rank}: result laid out as {got['placements']}, where the "
                f"placement needing no communication is {list(want_placements)}"
            )
            torch.testing.assert_close(
                got["whole"], whole, rtol=1e-12, atol=1e-12,
                msg=lambda m, rank=rank: f"{said}, rank {rank}: {m}",
            )  # fmt: skip

    ws = world.size
    prove(
        fitting_cases(ws),
        check,
        examples=[
            {"seed": 0, "mesh": (ws,), "operation": "matmul", "a_shape": (3, 5), "b_shape": (5, 2),
             "a_placements": ("shard1",), "b_placements": ("shard0",)},
            {"seed": 1, "mesh": (ws,), "operation": "sum_rows", "a_shape": (ws + 1, 2),
             "b_shape": (2, 1), "a_placements": ("shard0",), "b_placements": ("replicate",)},
            # Megabytes: where a gather's estimated time is its bandwidth more than its
            # latency, so a cost model gone wrong in the bandwidth term shows.
            {"seed": 2, "mesh": (ws,), "operation": "sum_columns", "a_shape": (512, 1024),
             "b_shape": (1024, 1), "a_placements": ("shard1",), "b_placements": ("replicate",)},
            {"seed": 3, "mesh": (ws,), "operation": "matmul", "a_shape": (4, 2**16),
             "b_shape": (2**16, 4), "a_placements": ("shard1",), "b_placements": ("shard0",)},
            {"seed": 4, "mesh": (ws, 1), "operation": "sum_columns", "a_shape": (512, 1024),
             "b_shape": (1024, 1), "a_placements": ("shard1", "shard1"),
             "b_placements": ("replicate", "replicate")},
        ],
    )  # fmt: skip


def _forms(shape: tuple[int, int], mesh: tuple[int, ...], placements: tuple[str, ...]) -> list[str]:
    """The forms of :data:`dtensor_jobs.FORMS` that apply to a case of ``shape`` laid out as
    ``placements`` over ``mesh``."""
    forms = sorted(dtensor_jobs.FORMS)
    if not dtensor_jobs.derives_forms():
        forms = [name for name in forms if name not in dtensor_jobs.DERIVED]
    if "partial" in placements:
        # An out tensor laid out as a partial sum cannot take a result that needs the sum
        # first (it is written where it lies): refused, so not drawn.
        forms = [name for name in forms if not name.endswith(" out")]
    if shape[0] < 2 or any(p.shape[1] == 0 for p in _pieces(shape, mesh, placements)):
        # Statistics over a batch need two samples; and a rank holding no channel runs
        # aten's batch norm on its empty piece, which aten refuses ("input tensor must have
        # at least one element"; 2.13: the functional form only, F.batch_norm replicates).
        forms = [name for name in forms if name not in dtensor_jobs.BATCHED]
    if not _every_rank_holds_some(shape, mesh, placements):
        forms = [name for name in forms if name != "max out"]  # the known issue below
    return forms


@st.composite
def form_cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    mesh = draw(st.sampled_from(_meshes(world_size)))
    sides = st.integers(1, world_size + 2)  # fewer rows than ranks, and uneven shards
    placements = draw(st.tuples(*[st.sampled_from(PLACEMENTS)] * len(mesh)))
    shape = (draw(sides), draw(sides))
    forms = _forms(shape, mesh, placements)
    return {
        "seed": draw(st.integers(0, 2**16)),
        "mesh": mesh,
        "shape": shape,
        "placements": placements,
        "forms": draw(st.lists(st.sampled_from(forms), min_size=1, max_size=6, unique=True)),
    }


def _check_forms(world: Any, case: dict[str, Any]) -> None:
    whole = dtensor_jobs.form_values(case["seed"], tuple(case["shape"]))
    layout = f"{case['shape']} as {case['placements']} on mesh {case['mesh']}"
    for rank, got in enumerate(world.run(dtensor_jobs.forms, case)):
        for name in case["forms"]:
            said = f"{name} of {layout}, rank {rank}"
            held = got[name]
            assert isinstance(held, dict), f"{said}: {held}"
            want = dtensor_jobs.FORMS[name](*whole)
            torch.testing.assert_close(held["whole"], want, rtol=1e-12, atol=1e-12,
                                       msg=lambda m, said=said: f"{said}: {m}")  # fmt: skip
            if "partial" in case["placements"] or name in dtensor_jobs.REDUCING:
                # A partial sum: linear forms keep it, the rest sum it first; the values
                # are what is held.
                continue
            assert held["collectives"] == {}, f"{said}: issued {held['collectives']}"
            placed = _labelled(held["placements"], case["mesh"])
            assert placed == _labelled(case["placements"], case["mesh"]), (
                f"{said}: result laid out as {held['placements']}"
            )


def test_an_update_written_in_place_into_out_or_over_lists_is_its_functional_form(world, prove):
    # An optimizer on sharded parameters (FSDP2's, tensor parallelism's) writes its update in
    # place, into out tensors or over lists at once (foreach): forms DTensor registers from
    # each operation's own rule. Each must give what the same form gives on the whole
    # tensors, laid out as its inputs, with no communication (every input holds its piece).
    ws = world.size
    prove(
        form_cases(ws),
        lambda case: _check_forms(world, case),
        examples=[{"seed": 0, "mesh": (ws,), "shape": (ws + 1, 2), "placements": ("shard0",),
                   "forms": _forms((ws + 1, 2), (ws,), ("shard0",))},
                  # Cut by columns: a batch norm's channels, each rank's own statistics.
                  {"seed": 1, "mesh": (ws,), "shape": (3, ws + 1), "placements": ("shard1",),
                   "forms": _forms((3, ws + 1), (ws,), ("shard1",))}],
    )  # fmt: skip


@known_torch_issue(
    "torch.max(x, dim, out=(values, indices)) on a DTensor cut by rows where a rank holds "
    "no row, the out tensors laid out as the result is: sharding propagation of "
    "aten.max.dim_max finds no strategy for them ('min() arg is an empty sequence') on "
    "every rank; without out, or where every rank holds a row, it works",
    raises=AssertionError,
    match=r"min\(\) arg is an empty sequence",
    repro="findings/dtensor_max_out_empty_shard.py",
)
def test_a_reduction_into_out_tensors_where_a_rank_holds_no_row(world):
    if world.size < 2:
        pytest.skip("a rank without rows needs more ranks than rows")
    _check_forms(world, {"seed": 2, "mesh": (world.size,), "shape": (1, 3),
                         "placements": ("shard0",), "forms": ["max out"]})  # fmt: skip


@st.composite
def write_cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    mesh = draw(st.sampled_from(_meshes(world_size)))
    sides = st.integers(1, world_size + 2)
    layouts = st.tuples(*[st.sampled_from(PLACEMENTS)] * len(mesh))
    # An out tensor is never a partial sum (it is written where it lies: refused).
    out_layouts = st.tuples(*[st.sampled_from(PLACEMENTS[:-1])] * len(mesh))
    shape = (draw(sides), draw(sides))
    placements = draw(layouts)
    names = st.sampled_from(sorted(dtensor_jobs.INTO))
    if _every_rank_holds_some(shape, mesh, placements):
        writes = st.tuples(names, out_layouts).filter(
            lambda write: _every_rank_holds_some(shape, mesh, write[1])
        )
    else:
        # Where a rank holds nothing (of the inputs or the out tensor), torch 2.13 plans no
        # redistribution into an out tensor (a cut changed, a sum reduced: "min() arg is an
        # empty sequence"): there inputs and out tensors are laid out alike, none a sum, as
        # what is checked is the layout kept and the values, not that refusal.
        placements = tuple("replicate" if p == "partial" else p for p in placements)
        writes = st.tuples(names, st.just(placements))
    return {
        "seed": draw(st.integers(0, 2**16)),
        "mesh": mesh,
        "shape": shape,
        "placements": placements,
        "writes": draw(st.lists(writes, min_size=1, max_size=4)),
    }  # fmt: skip


def _every_rank_holds_some(shape: tuple[int, int], mesh: tuple[int, ...],
                           placements: tuple[str, ...]) -> bool:  # fmt: skip
    return all(p.numel() > 0 for p in _pieces(shape, mesh, placements))


def _pieces(shape: tuple[int, int], mesh: tuple[int, ...],
            placements: tuple[str, ...]) -> list[torch.Tensor]:  # fmt: skip
    """What each rank of ``mesh`` holds of a tensor of ``shape`` laid out as ``placements``."""
    whole = torch.empty(shape)
    return [_piece(whole, mesh, placements, list(at))
            for at in itertools.product(*(range(size) for size in mesh))]  # fmt: skip


def test_an_out_tensor_keeps_its_layout_and_takes_the_result(world, prove):
    # ``out=`` writes the result into the tensor given, laid out as it is: the inputs are
    # redistributed to it, never it to them. Several writes of the same inputs into out
    # tensors laid out in turn otherwise, in one process: a plan cached for one out tensor
    # must not be taken for the next (the out tensor's layout is part of what is planned).
    if not dtensor_jobs.derives_forms():
        pytest.skip("this torch does not derive DTensor's out forms from each operation")

    def check(case: dict[str, Any]) -> None:
        whole = dtensor_jobs.form_values(case["seed"], tuple(case["shape"]))
        layout = f"{case['shape']} as {case['placements']} on mesh {case['mesh']}"
        for rank, got in enumerate(world.run(dtensor_jobs.written_into, case)):
            for (name, placements), held in zip(case["writes"], got, strict=True):
                said = f"{name} of {layout} into an out tensor as {placements}, rank {rank}"
                assert isinstance(held, dict), f"{said}: {held}"
                assert held["returned out"], f"{said}: returned another tensor than out"
                placed = _labelled(held["placements"], case["mesh"])
                assert placed == _labelled(placements, case["mesh"]), (
                    f"{said}: the out tensor is now laid out as {held['placements']}"
                )
                blank = torch.empty(case["shape"], dtype=torch.float64)
                want = dtensor_jobs.INTO[name](*whole, blank)
                torch.testing.assert_close(held["whole"], want, rtol=1e-12, atol=1e-12,
                                           msg=lambda m, said=said: f"{said}: {m}")  # fmt: skip

    ws = world.size
    prove(
        write_cases(ws),
        check,
        examples=[{"seed": 0, "mesh": (ws,), "shape": (2 * ws, ws), "placements": ("shard0",),
                   "writes": [("add", ("shard0",)), ("add", ("replicate",)),
                              ("add", ("shard1",))]}],
    )  # fmt: skip


def _piece(full: torch.Tensor, mesh: tuple[int, ...], placements: tuple[str, ...],
           coordinate: list[int]) -> torch.Tensor:  # fmt: skip
    """What a rank at ``coordinate`` holds, as DTensor documents it: the placements applied
    one mesh dimension after another, left to right, each shard ``torch.chunk``'s piece
    (empty past the last)."""
    piece = full
    for size, placement, index in zip(mesh, placements, coordinate, strict=True):
        if placement.startswith("shard"):
            dim = int(placement[-1])
            chunks = piece.chunk(size, dim=dim)
            piece = chunks[index] if index < len(chunks) else piece.narrow(dim, 0, 0)
    return piece


def _span(shape: tuple[int, ...], mesh: tuple[int, ...], placements: tuple[str, ...],
          coordinate: list[int]) -> tuple[list[int], list[int]]:  # fmt: skip
    """Where :func:`_piece`'s piece lies in the whole: its offsets and sizes."""
    low, high = [0] * len(shape), list(shape)
    for size, placement, index in zip(mesh, placements, coordinate, strict=True):
        if placement.startswith("shard"):
            dim = int(placement[-1])
            step = -(-(high[dim] - low[dim]) // size)  # torch.chunk's piece
            start = min(low[dim] + index * step, high[dim])
            low[dim], high[dim] = start, min(start + step, high[dim])
    return low, [h - lo for lo, h in zip(low, high, strict=True)]


@st.composite
def piece_cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    mesh = draw(st.sampled_from(_meshes(world_size)))
    sides = st.integers(1, world_size + 2)
    return {
        "seed": draw(st.integers(0, 2**16)),
        "mesh": mesh,
        "shape": (draw(sides), draw(sides)),
        "placements": draw(st.tuples(*[st.sampled_from(PLACEMENTS[:3])] * len(mesh))),
    }


def test_each_rank_holds_the_piece_its_placements_name(world, prove):
    # A round trip (laid out, made whole) cannot tell which rank holds which piece; a
    # checkpoint written by one layout and read by another, a local optimizer state or a
    # rank's own loss can, and a checkpoint records each piece where the rank says it lies.
    # Placements go left to right over the mesh's dimensions, a tensor dimension cut by two
    # of them cut by the first, then each piece by the second.
    def check(case: dict[str, Any]) -> None:
        full = dtensor_jobs.full_value(case["seed"], 0, tuple(case["shape"]))
        for rank, got in enumerate(world.run(dtensor_jobs.pieces, case)):
            want = _piece(full, case["mesh"], case["placements"], got["coordinate"])
            said = (f"{case['shape']} as {case['placements']} on mesh {case['mesh']}, rank "
                    f"{rank} at {got['coordinate']}")  # fmt: skip
            torch.testing.assert_close(got["piece"], want, rtol=0, atol=0,
                                       msg=lambda m, said=said: f"{said}: {m}")  # fmt: skip
            if "chunks" not in got:
                continue
            offsets, sizes = _span(tuple(case["shape"]), case["mesh"], case["placements"],
                                   got["coordinate"])  # fmt: skip
            assert [c[1] for c in got["chunks"]] == [sizes], f"{said}: chunks {got['chunks']}"
            if 0 not in sizes:  # an empty chunk lies nowhere: any offset says so
                assert got["chunks"][0][0] == offsets, (
                    f"{said}: its chunk recorded at {got['chunks'][0][0]}, where its piece "
                    f"lies at {offsets}"
                )

    ws = world.size
    prove(
        piece_cases(ws),
        check,
        examples=[{"seed": 0, "mesh": _two_dimensional(ws), "shape": (ws + 1, 3),
                   "placements": ("shard0", "shard0")}],
    )  # fmt: skip
