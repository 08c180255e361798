"""A GRPO-style loop of the user's own (fixtures/scripts/grpo_loop.py: generation by a tiny
causal LM, a reward function, group-normalised advantages, a policy term and a KL penalty to
a frozen reference, both over the step's generation batch) under ``ddp-verify parity``:
right at every layout, and a KL term mis-scaled is caught at the layouts where it differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.run import run_parity

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "grpo_loop.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip
LAYOUTS = [Layout(2, 2), Layout(1, 4)]


@pytest.mark.parametrize(
    ("variant", "differs"),
    [
        ("correct", set()),
        # Each micro-batch's own KL mean, added on every micro-batch: off wherever a step
        # holds several micro-batches across ranks.
        ("kl-per-micro-batch", {"2x2", "1x4"}),
        # The world-size factor left off the KL term only: off where there are ranks.
        ("kl-unscaled", {"2x2"}),
    ],
)
def test_a_grpo_loop_with_a_kl_term_is_judged_layout_by_layout(tmp_path, variant, differs):
    result = run_parity(
        [*COMMAND, "--variant", variant], layouts=LAYOUTS, steps=2, global_batch=8,
        keep=tmp_path,
    )  # fmt: skip
    assert result.exit_code == (1 if differs else 0), result.report
    failing = {row["layout"] for row in result.layouts if row["training"] != "equivalent"}
    assert failing == differs, result.report
    for row in result.layouts:
        if row["layout"] not in differs:
            # The same completions, advantages and counts at every layout: float64 rounding.
            assert row["gradient_difference"] < 1e-10, row
