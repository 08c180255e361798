"""Parity on real framework clients. A Hugging Face Trainer on a tiny LlamaForCausalLM built
from a config (no download), sequences of different lengths padded per micro-batch: current
transformers normalise by the tokens that count across accumulation steps and ranks, so every
layout trains the same; a compute_loss that averages each micro-batch's own tokens does not.
An accelerate loop with accelerator.accumulate: right, and wrong when the loss goes to
loss.backward() instead of accelerator.backward(). transformers and accelerate come with the
``frameworks`` extra; without it these tests skip, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.run import run_parity

pytest.importorskip("transformers", reason="the frameworks extra: pip install -e '.[frameworks]'")
pytest.importorskip("accelerate", reason="the frameworks extra: pip install -e '.[frameworks]'")

SCRIPTS = Path(__file__).resolve().parents[2] / "fixtures" / "scripts"
TRAINER = SCRIPTS / "hf_trainer.py"
COMMAND = ["python", str(TRAINER), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip


def test_a_trainer_with_padded_sequences_trains_the_same_at_every_layout(tmp_path):
    result = run_parity(
        COMMAND, layouts=[Layout(1, 4), Layout(2, 2)], steps=2, global_batch=8, keep=tmp_path
    )
    assert result.exit_code == 0, result.report
    for row in result.layouts:
        assert row["gradient_difference"] < 1e-10, row


def test_a_compute_loss_that_averages_per_micro_batch_is_caught(tmp_path):
    result = run_parity(
        [*COMMAND, "--variant", "per-micro-batch"],
        layouts=[Layout(1, 4)],
        steps=2,
        global_batch=8,
        keep=tmp_path,
    )
    assert result.exit_code == 1, result.report
    # On one process what each micro-batch added is known: the weights that give the
    # reference's gradient are in proportion to the micro-batches' tokens.
    first = result.verdict.causes[0]
    assert first.key == "micro:own-mean", result.report
    assert "averaged over its own tokens" in first.text and "of the step's" in first.text


@pytest.mark.parametrize(("variant", "equivalent"), [("correct", True), ("plain-backward", False)])
def test_an_accelerate_loop_with_accumulate(tmp_path, variant, equivalent):
    command = ["python", str(SCRIPTS / "accelerate_loop.py"), "--grad-accum", "{grad_accum}",
               "--batch-size", "{micro_batch}", "--variant", variant]  # fmt: skip
    # At 2x2 a factor 2 is the world size and the accumulation steps alike; 1x2 says which.
    result = run_parity(command, layouts=[Layout(1, 2), Layout(2, 2)], steps=2, global_batch=16)
    assert result.exit_code == (0 if equivalent else 1), result.report
    if not equivalent:
        # Nothing divided the two micro-batches' losses by the accumulation steps.
        for cause in result.verdict.causes:
            assert (cause.key, cause.alternatives) == ("scale:A", ()), result.report
