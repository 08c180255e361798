"""``torch.distributed.nn.functional``'s collectives, which carry gradients: each must give
the collective's value forward and, backward, the gradient of the sum of every rank's loss,
the closed form its definition gives (an all-gather's input gradient sums what every rank's
loss sends back to it; an all-reduce's sums every rank's; a broadcast's reaches the source
only; a reduce-scatter's chunk k gets what rank k's loss sends back; an all-to-all's slice
for rank k comes back from rank k), over the world and over subgroups (the sums run over the
group's ranks only). Contrastive losses gather features across ranks with these; an average
where a sum belongs, or a gradient left local, trains the towers at 1/W of their gradient."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import jobs
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.world import RankError

# Small integers: every sum is exact in float64, so the closed form is met exactly.
VALUES = st.integers(-4, 4).map(float)
KINDS = ["all_gather", "all_reduce", "broadcast", "reduce_scatter", "all_to_all_single",
         "gather", "scatter", "reduce", "all_to_all"]  # fmt: skip


def _vector(n: int) -> st.SearchStrategy:
    return st.lists(VALUES, min_size=n, max_size=n)


def cases(
    world_size: int, kind: str, groups: str = "any", ops: tuple[str, ...] = ("sum",)
) -> st.SearchStrategy:
    """(inputs per rank, weights per rank per output, the group's source rank, group size or
    None for the world, all-to-all splits per rank). ``groups``: ``"any"``, ``"world"`` (the
    world only) or ``"subgroups"`` (proper subgroups only)."""
    divisors = [d for d in range(1, world_size) if world_size % d == 0]
    sizes = {"any": st.none() | st.sampled_from([*divisors, world_size]), "world": st.none(),
             "subgroups": st.sampled_from(divisors)}[groups]  # fmt: skip

    @st.composite
    def draw(draw_):
        group_size = draw_(sizes)
        size = group_size or world_size
        n = draw_(st.integers(1, 3))
        splits = None
        if kind == "all_to_all_single":
            # splits[r][j]: what rank r sends to its group's j-th rank (0 included)
            row = st.lists(st.integers(0, 2), min_size=size, max_size=size).filter(any)
            splits = draw_(st.lists(row, min_size=world_size, max_size=world_size))
            lengths = [sum(s) for s in splits]
            received = [
                sum(splits[r - r % size + j][r % size] for j in range(size))
                for r in range(world_size)
            ]
            inputs = [draw_(_vector(m)) for m in lengths]
            weights = [[draw_(_vector(m))] for m in received]
        else:
            chunked = kind in ("reduce_scatter", "scatter", "all_to_all")
            width = n * size if chunked else n
            out = n if kind in ("all_gather", "reduce_scatter", "scatter", "gather",
                                "all_to_all") else width  # fmt: skip
            count = size if kind in ("all_gather", "gather", "all_to_all") else 1
            inputs = [draw_(_vector(width)) for _ in range(world_size)]
            weights = [[draw_(_vector(out)) for _ in range(count)] for _ in range(world_size)]
        src = draw_(st.integers(0, size - 1))
        if kind == "reduce":  # only the destination's output is defined: the others weigh 0
            weights = [[w if r == src else [0.0] * len(w) for w in ws]
                       for r, ws in enumerate(weights)]  # fmt: skip
        return inputs, weights, src, group_size, splits, draw_(st.sampled_from(ops))

    return draw()


def _sum(vectors):
    return [sum(column) for column in zip(*vectors, strict=True)]


def expected(kind, inputs, weights, src, group_size, splits, op="sum"):
    """Every rank's (outputs, input gradient), from the collective's definition: with
    ``op="avg"`` a reducing collective's output, and so its gradient, is its sum over the
    group's size."""
    sums = _expected_sums(kind, inputs, weights, src, group_size, splits)
    if op == "sum" or kind not in ("all_reduce", "reduce_scatter", "reduce"):
        return sums
    size = group_size or len(inputs)
    scaled = lambda v: [x / size for x in v]  # noqa: E731
    return [
        ([scaled(f) for f in forward] if forward else forward, scaled(grad))
        for forward, grad in sums
    ]


def _expected_sums(kind, inputs, weights, src, group_size, splits):
    world_size = len(inputs)
    size = group_size or world_size
    out = []
    for rank in range(world_size):
        first, mine = rank - rank % size, rank % size
        peers = range(first, first + size)
        if kind in jobs.ROOTED and group_size is not None and rank >= size:
            out.append(([], []))  # outside the first ranks' subgroup: it sits out
            continue
        n = len(inputs[rank]) // size
        if kind == "gather":
            dst = first + src
            forward = [inputs[p] if rank == dst else [0.0] * len(inputs[p]) for p in peers]
            grad = list(weights[dst][mine])
        elif kind == "scatter":
            forward = [inputs[first + src][mine * n : (mine + 1) * n]]
            grad = ([x for k in peers for x in weights[k][0]] if mine == src
                    else [0.0] * len(inputs[rank]))  # fmt: skip
        elif kind == "reduce":
            forward = [_sum([inputs[p] for p in peers])] if mine == src else None
            grad = list(weights[first + src][0])
        elif kind == "all_to_all":
            forward = [inputs[p][mine * n : (mine + 1) * n] for p in peers]
            grad = [x for k in peers for x in weights[k][mine]]
        elif kind == "all_gather":
            forward = [inputs[p] for p in peers]
            grad = _sum([weights[k][mine] for k in peers])
        elif kind == "all_reduce":
            forward = [_sum([inputs[p] for p in peers])]
            grad = _sum([weights[k][0] for k in peers])
        elif kind == "broadcast":
            forward = [inputs[first + src]]
            grad = (
                _sum([weights[k][0] for k in peers]) if mine == src else [0.0] * len(inputs[rank])
            )
        elif kind == "reduce_scatter":
            n = len(inputs[rank]) // size
            forward = [_sum([inputs[p][mine * n : (mine + 1) * n] for p in peers])]
            grad = [x for k in peers for x in weights[k][0]]
        else:  # all_to_all_single
            forward_values, grad = [], []
            for p in peers:
                start = sum(splits[p][:mine])
                forward_values += inputs[p][start : start + splits[p][mine]]
            for k_index, k in enumerate(peers):
                start = sum(splits[first + j][k_index] for j in range(mine))
                grad += weights[k][0][start : start + splits[rank][k_index]]
            forward = [forward_values]
        out.append((forward, grad))
    return out


def test_the_oracle_follows_the_definitions():
    # Two ranks, all-to-all: rank 0 sends [1] to itself and [2, 3] to rank 1; rank 1 sends
    # [4] to rank 0 and nothing to itself.
    got = expected("all_to_all_single", [[1.0, 2.0, 3.0], [4.0]], [[[10.0, 20.0]], [[30.0, 40.0]]],
                   0, None, [[1, 2], [1, 0]])  # fmt: skip
    assert got == [([[1.0, 4.0]], [10.0, 30.0, 40.0]), ([[2.0, 3.0]], [20.0])]
    got = expected("reduce_scatter", [[1.0, 2.0], [3.0, 4.0]], [[[5.0]], [[7.0]]], 0, None, None)
    assert got == [([[4.0]], [5.0, 7.0]), ([[6.0]], [5.0, 7.0])]
    # gather to rank 0: rank 1's outputs are zeros; each input's gradient is what rank 0's loss
    # puts on its slot.
    got = expected("gather", [[1.0], [2.0]], [[[10.0], [20.0]], [[30.0], [40.0]]], 0, None, None)
    assert got == [([[1.0], [2.0]], [10.0]), ([[0.0], [0.0]], [20.0])]
    # all_to_all: rank r's j-th output is rank j's r-th chunk, and back.
    got = expected("all_to_all", [[1.0, 2.0], [3.0, 4.0]], [[[5.0], [6.0]], [[7.0], [8.0]]], 0,
                   None, None)  # fmt: skip
    assert got == [([[1.0], [3.0]], [5.0, 7.0]), ([[2.0], [4.0]], [6.0, 8.0])]


def _close(a, b) -> bool:
    # Exact for sums of small integers; an average may round in its last place.
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12) for x, y in zip(a, b, strict=True)
    )


def _checker(world, kind):
    def check(case):
        inputs, weights, src, group_size, splits, op = case
        results = world.run(jobs.differentiable_collective, kind, *case)
        group = "the world" if group_size is None else f"subgroups of {group_size}"
        group += f", op={op.upper()}" if op != "sum" else ""
        for rank, ((got, grad), (forward, want)) in enumerate(
            zip(results, expected(kind, *case), strict=True)
        ):
            same = len(got) == len(forward or []) and all(
                _close(g, f) for g, f in zip(got, forward or [], strict=True)
            )
            assert forward is None or same, (
                f"torch.distributed.nn.functional.{kind} over {group} gave rank {rank} {got}, "
                f"the ranks sent {inputs}{f' (splits {splits})' if splits else ''}: expected "
                f"{forward}"
            )
            assert _close(grad, want), (
                f"torch.distributed.nn.functional.{kind} over {group}: rank {rank}'s input "
                f"gradient is {grad}; the gradient of the sum of every rank's loss is {want} "
                f"(weights {weights}{f', source {src}' if kind == 'broadcast' else ''}"
                f"{f', splits {splits}' if splits else ''})"
            )

    return check


@pytest.mark.parametrize("kind", KINDS)
def test_differentiable_collectives_give_the_gradient_of_every_ranks_loss(world, prove, kind):
    # Known torch issues (below), checked apart: broadcast over subgroups, and all_gather over
    # subgroups on gloo; the world only here.
    known = kind == "broadcast" or (kind == "all_gather" and world.backend == "gloo")
    # ReduceOp.AVG: all_reduce here; reduce_scatter's and reduce's are known issues (below).
    ops = ("sum", "avg") if kind == "all_reduce" else ("sum",)
    prove(cases(world.size, kind, "world" if known else "any", ops), _checker(world, kind))


def _over_the_second_subgroup(world, kind):
    """A case the known issues always meet: subgroups of half the world (1 for a world of
    2), the source the second subgroup's first rank (whose group rank is not its global one)."""
    size = world.size
    group = size // 2 if size % 2 == 0 else 1
    count = group if kind == "all_gather" else 1
    inputs = [[float(r + 1)] for r in range(size)]
    weights = [[[1.0]] * count for _ in range(size)]
    return inputs, weights, 0, group, None, "sum"


@known_torch_issue(
    "torch.distributed.nn.functional.broadcast over a subgroup zeroes the source's gradient "
    "where its group rank is not its global rank: the backward compares the global src with "
    "the group rank",
    raises=AssertionError,
    match=r"broadcast over subgroups of \d+: rank \d+'s input gradient",
    url="https://github.com/pytorch/pytorch/issues/130515",
    fixed_in="2.14",  # passes on 2.14.1 at world sizes 2 and 4
)
def test_differentiable_broadcast_over_subgroups(world, prove):
    _over_subgroups(world, prove, "broadcast")


@known_torch_issue(
    "torch.distributed.nn.functional.all_gather over a subgroup fails in its backward on gloo "
    "on the ranks of a subgroup without global rank 0: _AlltoAll's gloo path scatters from "
    "the group's rank where dist.scatter takes a global one",
    raises=RankError,
    match=r"Global rank \d+ is not part of group",
    repro="findings/differentiable_all_gather_subgroup_gloo.py",
    backends=("gloo",),
)
def test_differentiable_all_gather_over_subgroups_on_gloo(world, prove):
    if world.backend != "gloo":
        pytest.skip("checked with the other subgroups by the test above on this backend")
    _over_subgroups(world, prove, "all_gather")


def _over_subgroups(world, prove, kind: str) -> None:
    if world.size < 2:
        pytest.skip("a world of 1 has no proper subgroup")
    prove(
        cases(world.size, kind, "subgroups"),
        _checker(world, kind),
        examples=[_over_the_second_subgroup(world, kind)],
    )


@known_torch_issue(
    "torch.distributed.nn.functional.all_gather's backward on gloo gives a wrong gradient "
    "where the gradient reaching it is strided (the gathered tensor used transposed, as "
    "attention uses keys): _AlltoAll scatters into buffers shaped like the strided gradient, "
    "and gloo's scatter writes a non-contiguous output as if it were contiguous",
    raises=AssertionError,
    match=r"used transposed: rank \d+'s input gradient",
    url="https://github.com/pytorch/pytorch/issues/192920",
    repro="findings/differentiable_all_gather_strided_gloo.py",
    backends=("gloo",),
)
def test_differentiable_all_gather_of_a_tensor_used_transposed(world, prove):
    # Context parallelism gathers each rank's keys and values so; a gradient that arrives
    # strided must reach each rank's own piece as a contiguous one does.
    if world.size < 2:
        pytest.skip("a world of 1 gathers nothing from another rank")
    size = world.size

    @st.composite
    def matrices(draw):
        rows, cols = draw(st.integers(2, 3)), draw(st.integers(2, 3))

        def matrix(m, n):
            return draw(st.lists(st.lists(VALUES, min_size=n, max_size=n), min_size=m,
                                 max_size=m))  # fmt: skip

        return ([matrix(rows, cols) for _ in range(size)],
                [matrix(cols, size * rows) for _ in range(size)])  # fmt: skip

    def check(case):
        inputs, weights = case
        rows = len(inputs[0])
        got = world.run(jobs.differentiable_all_gather_used_transposed, inputs, weights)
        for rank, grad in enumerate(got):
            # d/dx_r of sum_k sum(stacked.T * W_k): every rank's weights, transposed, at
            # rank r's rows.
            want = [
                [sum(weights[k][j][rank * rows + i] for k in range(size))
                 for j in range(len(inputs[0][0]))]
                for i in range(rows)
            ]  # fmt: skip
            assert all(_close(g, w) for g, w in zip(grad, want, strict=True)), (
                f"torch.distributed.nn.functional.all_gather of {rows}-row matrices, stacked "
                f"and used transposed: rank {rank}'s input gradient is {grad}; the gradient "
                f"of the sum of every rank's loss is {want}"
            )

    prove(matrices(), check)


@known_torch_issue(
    "torch.distributed.nn.functional.reduce_scatter and reduce with op=ReduceOp.AVG: the "
    "backward ignores the op and passes the gradient on undivided, W times the derivative of "
    "an average",
    raises=AssertionError,
    match=r"op=AVG: rank \d+'s input gradient",
    repro="findings/differentiable_avg_backward.py",
)
@pytest.mark.parametrize("kind", ["reduce_scatter", "reduce"])
def test_differentiable_averages_give_the_gradient_of_an_average(world, prove, kind):
    if world.size < 2:
        pytest.skip("a world of 1 averages over one rank: the issue cannot show")
    size = world.size
    ones = ([[1.0] * size for _ in range(size)], [[[1.0]] for _ in range(size)])
    prove(
        cases(size, kind, "world", ("avg",)),
        _checker(world, kind),
        examples=[(*ones, 0, None, None, "avg")],
    )


def test_a_deprecated_collective_warns_the_line_that_called_it(world):
    # Where torch deprecates a collective of torch.distributed.nn.functional, its
    # FutureWarning is attributed to the caller's line (its stacklevel), so that a project's
    # warning filters by module (-W error::FutureWarning:mypackage) and pytest's summary name
    # the call to change, not torch's own file or a frame above the call.
    deprecated = 0
    for rank, said in enumerate(world.run(jobs.differentiable_deprecations)):
        file, line = said.pop("caller")
        for name, caught in said.items():
            mine = [w for w in caught if w[0] == "FutureWarning" and "is deprecated" in w[1]]
            deprecated += len(mine)
            for _, message, filename, lineno in mine:
                assert (os.path.samefile(filename, file), lineno) == (True, line), (
                    f"rank {rank}: torch.distributed.nn.functional.{name}'s warning "
                    f"{message!r} is attributed to {filename}:{lineno}, not to the line that "
                    f"called it ({file}:{line})"
                )
    if not deprecated:
        pytest.skip(f"torch {torch.__version__} deprecates none of these collectives")
