"""Tensor parallelism (``parallelize_module``) against one process: a block of a LayerNorm, a
linear map up, tanh and a linear map down, parallelised over every rank by the plans training
code writes (Megatron's column-wise up and row-wise down; the up projection's output gathered
whole; sequence parallel, the norm and the block's input and output each rank's piece of the
sequence; the block handed the sequence in pieces and gathering it first), must give every
rank its piece of the output one process gives, and, made whole, the gradient of every
parameter one process gives for the same loss (each rank's part of it, where the output is in
pieces); where each rank's weights differ, those of the rank ``src_data_rank`` names are the
ones distributed. The oracle is plain autograd on one process, nothing of DTensor."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from ddp_verify.conformance import tensor_parallel_jobs


@st.composite
def cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    return {
        "seed": draw(st.integers(0, 2**16)),
        "plan": draw(st.sampled_from(tensor_parallel_jobs.PLANS)),
        # Columns cut evenly over the ranks: a style rebuilds each rank's piece as an even
        # share of the whole (DTensor.from_local without a shape), as its docs require.
        # Not a hidden width of 1 (a mesh of one rank sharding a dimension of size 1: torch
        # 2.13's view rules refuse the backward, "would remove or reshape sharded dimension").
        "hidden": world_size * draw(st.integers(2 if world_size == 1 else 1, 3)),
        "batch": draw(st.integers(1, 3)),
        # The plan's weights alike on every rank (the default source, rank 0, given none), or
        # each rank's own, the source's distributed.
        "src_data_rank": draw(st.none() | st.integers(0, world_size - 1)),
    }


def test_a_tensor_parallel_plan_computes_what_one_process_computes(world, prove):
    def check(case: dict[str, Any]) -> None:
        want = tensor_parallel_jobs.one_process(case, world.size)
        said = f"parallelize_module(plan {case['plan']!r}) of a block {case['hidden']} wide"
        if case.get("src_data_rank") is not None:
            said += f", src_data_rank={case['src_data_rank']} (each rank's weights its own)"
        for rank, got in enumerate(world.run(tensor_parallel_jobs.parallelised, case)):
            output = want["output"]
            if got["pieces"]:
                output = output.chunk(world.size, dim=1)[rank]
            torch.testing.assert_close(
                got["output"], output, rtol=1e-10, atol=1e-12,
                msg=lambda m, r=rank: f"{said}: output on rank {r}: {m}",
            )  # fmt: skip
            for name, expected in want["grads"].items():
                mine = got["grads"][name]
                assert mine is not None, f"{said}: {name} has no gradient on rank {rank}"
                torch.testing.assert_close(
                    mine, expected, rtol=1e-10, atol=1e-12,
                    msg=lambda m, n=name, r=rank: f"{said}: gradient of {n} on rank {r}: {m}",
                )  # fmt: skip

    size = world.size
    prove(
        cases(size),
        check,
        examples=[
            {"seed": 1, "plan": plan, "hidden": 2 * size, "batch": 2, "src_data_rank": None}
            for plan in tensor_parallel_jobs.PLANS
        ]
        # The last rank's weights distributed, each rank holding its own.
        + [
            {
                "seed": 2,
                "plan": "megatron",
                "hidden": 2 * size,
                "batch": 1,
                "src_data_rank": size - 1,
            }
        ],
    )
