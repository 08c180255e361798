"""Pipeline parallelism (``torch.distributed.pipelining``) against one process: a chain of
layers cut into stages, one a rank (GPipe, 1F1B) or several a rank in a loop (looped BFS,
interleaved 1F1B, interleaved zero bubble: each backward split into the inputs' gradients and
the weights' later; zero bubble V-shaped, the first and the last stage on one rank), run over
the batch's micro-batches, each stage passing on one tensor or two, must leave each stage's
gradients what one process leaves backpropagating every micro-batch's loss in turn, divided
by the micro-batches where the schedule scales them (``scale_grads=True``, the default, for a
loss that is each micro-batch's mean) and not where it does not (a loss already normalised by
the step's count); and return the last stage's losses, one a micro-batch, as one process
computes them, and its outputs merged in the batch's order. Micro-batches hold uneven counts
of the labels that count, so a mean of micro-batch means and the step's token mean differ:
each schedule must compute the loss it is given, no other, whatever device the training made
the default, and whether each stage infers its tensors' shapes or is told them. The oracle is
plain autograd on one process, nothing of pipelining."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from ddp_verify.conformance import pipelining_jobs


def _rounds(micro_batches: int, world_size: int) -> int:
    return max(1, micro_batches // world_size)


@st.composite
def cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    schedule = draw(st.sampled_from(sorted(pipelining_jobs.SCHEDULES)))
    # As many micro-batches as stages a rank runs at least (1F1B's floor), and for the
    # interleaved schedule a whole number of rounds of them (its documented condition).
    counts = [n for n in (world_size, world_size + 1, 2 * world_size)
              if schedule != "interleaved_1f1b" or n % _rounds(n, world_size) == 0]  # fmt: skip
    micro_batches = draw(st.sampled_from(counts))
    size = draw(st.integers(1, 3))
    rows = micro_batches * size
    # Labels left out, never a whole micro-batch's: uneven counts, no empty mean.
    ignored = draw(st.sets(st.integers(0, rows - 1), max_size=rows // 2))
    ignored = {r for r in ignored if len(set(range((r // size) * size, (r // size + 1) * size))
                                          - ignored) > 0}  # fmt: skip
    loss = draw(st.sampled_from(("mean", "step count")))
    return {
        "seed": draw(st.integers(0, 2**16)),
        "schedule": schedule,
        "micro_batches": micro_batches,
        "micro_batch_size": size,
        "ignored": sorted(ignored),
        "loss": loss,
        # Each loss with the scaling it goes with, and the other way round.
        "scale_grads": draw(st.booleans()),
        "carry": draw(st.sampled_from(pipelining_jobs.CARRIES)),
        "default_device": draw(st.sampled_from([None, "meta"])),
        # Each stage infers its tensors' shapes by a forward of its own, or is told them.
        "metadata": draw(st.sampled_from(["inferred", "given"])),
    }


def _said(case: dict[str, Any]) -> str:
    return (
        f"{pipelining_jobs.SCHEDULES[case['schedule']][0]}(n_microbatches="
        f"{case['micro_batches']}, scale_grads={case['scale_grads']}) over micro-batches of "
        f"{case['micro_batch_size']}, labels ignored at {case['ignored']}, loss "
        f"{case['loss']}, stages carrying {case['carry'].replace('_', ' ')}"
        + (f", the default device {case['default_device']!r}" if case.get("default_device") else "")
        + (", each stage told its tensors" if case.get("metadata") == "given" else "")
    )


def test_a_pipeline_schedule_trains_what_one_process_trains(world, prove):
    def check(case: dict[str, Any]) -> None:
        stages = world.size * pipelining_jobs.SCHEDULES[case["schedule"]][1]
        want = pipelining_jobs.one_process(case, stages)
        said = _said(case)
        results = world.run(pipelining_jobs.pipelined, case)
        held = set()
        for rank, got in enumerate(results):
            for stage, grads in got["grads"].items():
                held.add(stage)
                for i, (mine, expected) in enumerate(zip(grads, want["grads"][stage], strict=True)):
                    assert mine is not None, f"{said}: stage {stage} on rank {rank}: no gradient"
                    if expected is None:
                        # No loss reaches it (it feeds only what the last stage leaves out):
                        # one process leaves no gradient; a stage, sent a zero gradient for
                        # that output, accumulates zeros. The same values.
                        expected = torch.zeros_like(mine)
                    torch.testing.assert_close(
                        mine, expected, rtol=1e-10, atol=1e-12,
                        msg=lambda m, s=stage, r=rank, i=i: f"{said}: stage {s} on rank {r}, "
                        f"parameter {i}: {m}",
                    )  # fmt: skip
            if got["losses"]:
                torch.testing.assert_close(
                    torch.stack(got["losses"]), torch.stack(want["losses"]), rtol=1e-10,
                    atol=1e-12, msg=lambda m, r=rank: f"{said}: losses on rank {r}: {m}",
                )  # fmt: skip
        assert held == set(range(stages)), f"{said}: stages run {sorted(held)} of {stages}"
        merged = [got["output"] for got in results if got["output"] is not None]
        assert merged, f"{said}: step() returned no output on the last stage's rank"
        torch.testing.assert_close(
            merged[0], want["output"], rtol=1e-10, atol=1e-12,
            msg=lambda m: f"{said}: the output step() returns, merged from the micro-batches: {m}",
        )  # fmt: skip
        assert any(got["losses"] for got in results), f"{said}: no rank returned the losses"

    size = world.size
    prove(
        cases(size),
        check,
        examples=[
            # The public mistake's ground: each micro-batch's mean, scaled by the schedule;
            # and a loss normalised by the step's count, not scaled again; uneven counts.
            {
                "seed": 1,
                "schedule": "1f1b",
                "micro_batches": 2 * size,
                "micro_batch_size": 2,
                "ignored": [0],
                "loss": "mean",
                "scale_grads": True,
                "carry": "one",
            },
            {
                "seed": 2,
                "schedule": "interleaved_1f1b",
                "micro_batches": 2 * size,
                "micro_batch_size": 2,
                "ignored": [1, 3],
                "loss": "step count",
                "scale_grads": False,
                "carry": "one",
            },
            # Two tensors between stages, the gradient of each sent back to its own; and a
            # last stage that leaves the second out (its gradient none).
            {
                "seed": 3,
                "schedule": "1f1b",
                "micro_batches": size,
                "micro_batch_size": 2,
                "ignored": [1],
                "loss": "mean",
                "scale_grads": True,
                "carry": "two",
            },
            # Zero bubble: the weights' gradients computed after the inputs', from the graph
            # the inputs' backward must keep.
            {
                "seed": 5,
                "schedule": "interleaved_zero_bubble",
                "micro_batches": 2 * size,
                "micro_batch_size": 2,
                "ignored": [2],
                "loss": "mean",
                "scale_grads": True,
                "carry": "two",
                # Another device the default: every buffer a stage makes, on its own.
                "default_device": "meta",
            },
            # V-shaped: the first and the last stage on one rank.
            {
                "seed": 7,
                "schedule": "zbv_zero_bubble",
                "micro_batches": 2 * size,
                "micro_batch_size": 2,
                "ignored": [0],
                "loss": "mean",
                "scale_grads": True,
                "carry": "two",
                "metadata": "given",
            },
            # Each stage told its inputs, outputs and their gradients (none for the data):
            # no forward of its own to infer them.
            {
                "seed": 6,
                "schedule": "1f1b",
                "micro_batches": size + 1,
                "micro_batch_size": 1,
                "ignored": [],
                "loss": "step count",
                "scale_grads": False,
                "carry": "two_last_ignores",
                "metadata": "given",
            },
            {
                "seed": 4,
                "schedule": "interleaved_1f1b",
                "micro_batches": 2 * size,
                "micro_batch_size": 1,
                "ignored": [],
                "loss": "step count",
                "scale_grads": False,
                "carry": "two_last_ignores",
            },
        ],
    )
