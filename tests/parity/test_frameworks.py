"""Parity on real framework clients. A Hugging Face Trainer on a tiny LlamaForCausalLM built
from a config (no download), sequences of different lengths padded per micro-batch: current
transformers normalise by the tokens that count across accumulation steps and ranks, so every
layout trains the same; a compute_loss that averages each micro-batch's own tokens does not,
nor does the Trainer told average_tokens_across_devices=False where ranks hold unequal tokens.
An accelerate loop with accelerator.accumulate: right, and wrong when the loss goes to
loss.backward() instead of accelerator.backward(). A Lightning Fabric loop with
no_backward_sync: right, and wrong with use_distributed_sampler=False. transformers, accelerate
and lightning come with the ``frameworks`` extra; without it these tests skip, saying so."""

from __future__ import annotations

import re
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


@pytest.mark.parametrize(
    "layouts",
    [
        [Layout(1, 4), Layout(2, 2)],
        # Four Trainer processes: CI's time goes to accumulation and to both at once.
        pytest.param([Layout(4, 1)], marks=pytest.mark.slow),
    ],
    ids=["1x4,2x2", "4x1"],
)
def test_a_trainer_with_padded_sequences_trains_the_same_at_every_layout(tmp_path, layouts):
    result = run_parity(COMMAND, layouts=layouts, steps=2, global_batch=8, keep=tmp_path)
    assert result.exit_code == 0, result.report
    assert [row["layout"] for row in result.layouts] == [str(layout) for layout in layouts]
    for row in result.layouts:
        assert row["gradient_difference"] < 1e-10, row


def test_a_compute_loss_that_averages_per_micro_batch_is_caught(tmp_path):
    result = run_parity(
        [*COMMAND, "--variant", "per-micro-batch"],
        layouts=[Layout(2, 2)],
        steps=2,
        global_batch=8,
        keep=tmp_path,
    )
    assert result.exit_code == 1, result.report
    # What each rank's micro-batches added before DDP averaged them is recorded: the weights
    # that give the reference's gradient go as their tokens.
    assert [row["causes"][0] for row in result.layouts] == ["micro:own-mean"], result.report
    first = result.verdict.causes[0]
    assert "averaged over its own tokens" in first.text and "of the step's" in first.text
    assert any("rank 1 micro-batch 2: " in c.text for c in result.verdict.causes), result.report


@pytest.mark.slow
def test_tokens_counted_per_device_are_caught_as_ranks_weighted_alike(tmp_path):
    # average_tokens_across_devices=False: each rank divides by its own tokens, right across
    # its micro-batches; DDP's average then counts the ranks alike.
    result = run_parity(
        [*COMMAND, "--variant", "tokens-per-device"],
        layouts=[Layout(2, 2)],
        steps=1,
        global_batch=8,
        keep=tmp_path,
    )
    assert result.exit_code == 1, result.report
    (first,) = result.verdict.causes
    assert first.key == "ranks:world" and "each rank's tokens" in first.text, result.report
    assert "by design with average_tokens_across_devices=False" in first.text
    # The ranks' own token counts, from the recording, say why: they differ.
    assert "rank 0: " in first.evidence and "rank 1: " in first.evidence


@pytest.mark.parametrize(
    ("variant", "equivalent"),
    [("correct", True), pytest.param("plain-backward", False, marks=pytest.mark.slow)],
)
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


def test_a_factor_one_layout_cannot_place_is_said_with_its_alternatives(tmp_path):
    # At 2x2 alone, a gradient twice the reference's is the accumulation steps or the world
    # size: both said (the readings were never one another's alternatives before: unnamed).
    command = ["python", str(SCRIPTS / "accelerate_loop.py"), "--grad-accum", "{grad_accum}",
               "--batch-size", "{micro_batch}", "--variant", "plain-backward"]  # fmt: skip
    result = run_parity(command, layouts=[Layout(2, 2)], steps=1, global_batch=16)
    assert result.exit_code == 1, result.report
    (cause,) = result.verdict.causes
    assert (cause.key, cause.alternatives) == ("scale:A", ("scale:W",)), result.report


def test_a_scheduler_prepared_by_accelerate_is_named_as_its_documented_stepping(tmp_path):
    # accelerate steps a prepared scheduler once per process at each optimizer step: with
    # the global batch fixed, the learning rate at step 1 depends on the world size.
    command = ["python", str(SCRIPTS / "accelerate_loop.py"), "--grad-accum", "{grad_accum}",
               "--batch-size", "{micro_batch}", "--scheduler", "prepared"]  # fmt: skip
    result = run_parity(command, layouts=[Layout(2, 2)], steps=3, global_batch=16)
    assert result.exit_code == 1, result.report
    (cause,) = result.verdict.causes
    assert cause.pattern == "optimizer:settings", result.report
    assert "step 1: lr 0.0025, the reference's 0.005, 0.5x" in cause.text, result.report
    assert "accelerate, as documented, steps a prepared scheduler" in cause.text


@pytest.mark.parametrize(
    ("variant", "layout", "pattern"),
    [
        ("correct", Layout(2, 2), None),
        pytest.param("no-sampler", Layout(2, 1), "data:same-samples", marks=pytest.mark.slow),
    ],
)
def test_a_lightning_fabric_loop(tmp_path, variant, layout, pattern):
    pytest.importorskip("lightning", reason="the frameworks extra: pip install -e '.[frameworks]'")
    command = ["python", str(SCRIPTS / "fabric_loop.py"), "--grad-accum", "{grad_accum}",
               "--batch-size", "{micro_batch}", "--variant", variant]  # fmt: skip
    result = run_parity(command, layouts=[layout], steps=2, global_batch=16)
    assert result.exit_code == (0 if pattern is None else 1), result.report
    assert [c.key for c in result.verdict.causes] == ([pattern] if pattern else []), result.report


LIGHTNING = SCRIPTS / "lightning_trainer.py"
LIGHTNING_COMMAND = ["python", str(LIGHTNING), "--grad-accum", "{grad_accum}", "--batch-size",
                     "{micro_batch}"]  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "layouts", "pattern"),
    [
        ("correct", [Layout(2, 2)], None),
        pytest.param("correct", [Layout(1, 4)], None, marks=pytest.mark.slow),
        # Lightning injects a shuffling DistributedSampler under DDP only: its documented
        # behaviour, and each layout trains other samples.
        pytest.param("injected", [Layout(2, 2)], "data:order", marks=pytest.mark.slow),
    ],
    ids=["correct-2x2", "correct-1x4", "injected-sampler"],
)
def test_a_lightning_trainer_that_steps_through_a_closure(tmp_path, variant, layouts, pattern):
    # Issue 36: every variant was misread ("0 samples a step", "parameters left out of
    # synchronisation", "has no gradient 'param0'"): the batch reached the DDP wrapper inside
    # a list, the wrapper's parameter names were not the model's, and the last micro-batch's
    # backward ran inside optimizer.step(closure), after the gradients were read.
    pytest.importorskip("lightning", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(
        [*LIGHTNING_COMMAND, "--variant", variant],
        layouts=layouts,
        steps=2,
        global_batch=8,
        keep=tmp_path,
    )
    if pattern is None:
        assert result.exit_code == 0, result.report
        for row in result.layouts:
            assert row["gradient_difference"] < 1e-10, row
    else:
        assert result.exit_code == 1, result.report
        assert result.verdict.causes[0].pattern == pattern, result.report
        assert (
            "Lightning (the Trainer, and Fabric's setup_dataloaders), as documented"
            in result.verdict.causes[0].text
        )


TRL = ["python", str(SCRIPTS / "trl_sft.py"), "--grad-accum", "{grad_accum}", "--batch-size",
       "{micro_batch}"]  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "pattern"),
    [
        ("correct", None),
        # The same pattern through the HF Trainer stays in CI
        # (test_a_compute_loss_that_averages_per_micro_batch_is_caught).
        pytest.param("own-mean", "micro:own-mean", marks=pytest.mark.slow),
        pytest.param("tokens-per-device", "ranks:world", marks=pytest.mark.slow),
    ],
)
def test_trl_sft_trainer_as_it_ships(tmp_path, variant, pattern):
    # Issue 36: TRL's SFTTrainer recomputes its forward inside backward (activation
    # checkpointing, on by default): read as five micro-batches a step. Llama's RMSNorm
    # computes in float32 inside a float64 run: held to float64's rounding, it was named "the
    # gradient is scaled: every sample counted 1x".
    pytest.importorskip("trl", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(
        [*TRL, "--variant", variant], layouts=[Layout(2, 2)], steps=2, global_batch=8,
        keep=tmp_path,
    )  # fmt: skip
    assert "1 micro-batch(es), 8 samples a step" in result.report, result.report
    assert "in float32 inside (Tensor.to at transformers/models/llama/" in result.report
    if pattern is None:
        assert result.exit_code == 0, result.report
        return
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.pattern == pattern, result.report
    # The tokens that count, from where the loss is computed: each counted once, though the
    # loss function runs under the recorder's precision watch (which calls it again).
    said = first.text + first.evidence
    counts = [int(n) for n in re.findall(r": (\d+) of the step's \d+ tokens", said)]
    total = int(re.search(r"of the step's (\d+) tokens", said).group(1))
    assert sum(counts) == total and total < 8 * 11, result.report


@pytest.mark.parametrize(
    ("flags", "pattern"),
    [
        (("--padding-free",), None),
        (("--padding-free", "--variant", "row-mean"), "micro:own-mean"),
        pytest.param(("--packing",), None, marks=pytest.mark.slow),
    ],
)
def test_trl_sft_trainer_on_packed_rows(tmp_path, flags, pattern):
    # Issue 65: TRL flattens each micro-batch's sequences into one row (padding_free=True;
    # packing=True packs the dataset into rows first), told apart by position_ids that
    # restart at 0. The layouts' samples are the packed sequences, and a sequence mean
    # written for padded batches takes the flattened row for one.
    pytest.importorskip("trl", reason="the frameworks extra: pip install -e '.[frameworks]'")
    result = run_parity(
        [*TRL, *flags], layouts=[Layout(2, 2)], steps=2, global_batch=8, keep=tmp_path
    )
    if pattern is None:
        assert result.exit_code == 0, result.report
        if "--padding-free" in flags:
            # Each packed sequence a sample: the step's 8, not one flattened row.
            assert "1 micro-batch(es), 8 samples a step" in result.report, result.report
        return
    assert result.exit_code == 1, result.report
    assert result.verdict.causes[0].pattern == pattern, result.report
