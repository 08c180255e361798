"""Samples known by what they are (issue 36): a language-model script that pads each
micro-batch to its own longest sequence, with a pad id that is also a real token and no
attention mask, trains the same samples at every layout; its tokens that count are read where
the loss is computed, so a per-micro-batch token mean is named as such."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.recorder import fingerprints
from ddp_verify.parity.recording import canonical
from ddp_verify.parity.run import run_parity

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "padded_lm.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip


def _identity(batch: torch.Tensor, row: int, pad_digest: str) -> str:
    rows, _ = fingerprints((batch,), {})
    return canonical(rows[row], {"0": pad_digest})


def test_a_sample_is_the_same_whatever_its_padding_and_its_last_token():
    # 0 pads, and 0 is a real token too: [4, 0] ends in it, [4, 7] does not.
    pad = fingerprints((torch.tensor([[9, 0]]),), {})[0][0].split("/")[1]
    alone = torch.tensor([[4, 7]])
    padded = torch.tensor([[4, 7, 0, 0], [1, 2, 3, 5]])
    assert _identity(alone, 0, pad) == _identity(padded, 0, pad)
    ends_in_pad = torch.tensor([[4, 0]])
    assert _identity(ends_in_pad, 0, pad) == _identity(torch.tensor([[4, 0, 0, 0]]), 0, pad)
    # Other samples stay apart.
    assert _identity(alone, 0, pad) != _identity(torch.tensor([[4, 8]]), 0, pad)
    # With no pad value chosen, the whole row is the identity (padding width shows).
    assert canonical(fingerprints((alone,), {})[0][0]) != canonical(
        fingerprints((padded,), {})[0][0]
    )


def test_a_packed_sequence_is_the_same_sample_whatever_it_is_packed_with():
    # TRL's padding-free batch: one row, position_ids restarting, flash-attention's
    # cu_seq_lens (1-d, sorted first by its name) and each sequence's index in its row.
    def flattened(sequences):
        ids = torch.tensor([[t for s in sequences for t in s]])
        labels = torch.tensor([[-100 if i == 0 else t for s in sequences for i, t in enumerate(s)]])
        positions = torch.tensor([[i for s in sequences for i in range(len(s))]])
        index = torch.tensor([[k for k, s in enumerate(sequences) for _ in s]])
        cu = torch.tensor([0, *torch.tensor([len(s) for s in sequences]).cumsum(0).tolist()])
        kwargs = {"input_ids": ids, "labels": labels, "position_ids": positions}
        return fingerprints((), {**kwargs, "cu_seq_lens_q": cu, "seq_idx": index})

    together, tokens = flattened([[5, 6, 7], [8, 9]])
    first, _ = flattened([[5, 6, 7]])
    second, _ = flattened([[3], [8, 9]])
    assert len(together) == 2 and tokens == [2, 1]
    assert together[0] == first[0] and together[1] == second[1]
    assert together[0] != together[1]


@pytest.mark.parametrize(
    ("mask", "layouts"),
    [
        (False, [Layout(2, 2), Layout(1, 4)]),
        pytest.param(True, [Layout(1, 4)], marks=pytest.mark.slow),
    ],
    ids=["no-mask", "mask"],
)
def test_a_dynamically_padded_script_trains_the_same_samples_at_every_layout(
    mask, layouts, tmp_path
):
    command = [*COMMAND, "--mask"] if mask else COMMAND
    result = run_parity(command, layouts=layouts, steps=2, global_batch=8, keep=tmp_path)
    assert result.exit_code == 0, result.report
    for row in result.layouts:
        assert row["verdict"] == "equivalent" and row["gradient_difference"] < 1e-10, row
    # Each layout's time in the report, the reference's first (issue 36, item 6).
    said = " ".join(f"{layout} [0-9.]+ s," for layout in ["1x1", *map(str, layouts)])
    assert re.search(f"Time per layout: {said.rstrip(',')}$", result.report), result.report


def test_tokens_counted_where_the_loss_is_computed_name_a_per_micro_batch_mean(tmp_path):
    # The labels never reach the model: the loss function's targets give the tokens.
    result = run_parity(
        [*COMMAND, "--variant", "per-micro-batch"],
        layouts=[Layout(1, 4)],
        steps=2,
        global_batch=8,
        keep=tmp_path,
    )
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.pattern == "micro:own-mean", result.report
    assert "of the step's" in first.text and "tokens" in first.text


def test_a_float32_kernel_in_a_float64_run_is_held_to_a_bound_measured_for_it(tmp_path):
    # Issue 36: a float32 head (TRL's kernels compute so) in a float64 run differed by about
    # 1e-7, read as "micro-batches weighted ... must count 1, 1, 1, 1": a factor of 1. The
    # recorder sees the float32 inside; a rounding-only variant at float32's unit roundoff
    # measures the bound, and the report says where the script computes in float32.
    command = [*COMMAND, "--loss-float32"]
    result = run_parity(command, layouts=[Layout(1, 4)], steps=2, global_batch=8, keep=tmp_path)
    assert result.exit_code == 0, result.report
    assert "in float32 inside (Tensor.float at " in result.report, result.report
    line = next(
        n
        for n, text in enumerate(SCRIPT.read_text().splitlines(), 1)
        if "self.head.weight.float()" in text
    )
    assert f"padded_lm.py:{line})" in result.report, result.report
    assert "rounding-only variant" in result.report


def test_a_mistake_behind_a_float32_kernel_is_still_named(tmp_path):
    command = [*COMMAND, "--loss-float32", "--variant", "per-micro-batch"]
    result = run_parity(command, layouts=[Layout(1, 4)], steps=2, global_batch=8, keep=tmp_path)
    assert result.exit_code == 1, result.report
    assert result.verdict.causes[0].pattern == "micro:own-mean", result.report


@pytest.mark.slow
def test_a_float32_kernel_passes_at_the_scripts_own_precision(tmp_path):
    # As precision:lower advises: at its own precision, held to a bound measured for it.
    native = run_parity(
        [*COMMAND, "--loss-float32"],
        layouts=[Layout(1, 4)],
        steps=2,
        global_batch=8,
        keep=tmp_path,
        float64=False,
    )
    assert native.exit_code == 0, native.report
    assert "rounding-only variant" in native.report


def test_inputs_padded_together_are_stripped_together():
    # Token ids padded with 0 and labels padded with -100, no mask: neither input alone makes
    # the layouts' samples agree, both together do.
    from ddp_verify.parity.recording import Recording, pads_between

    def recording(batches):
        rows = [
            fingerprints((), {"input_ids": ids, "labels": labels})[0] for ids, labels in batches
        ]
        step = {"batches": rows, "tokens": [[] for _ in rows]}
        return Recording("r", [{"meta": {}, "steps": [step]}])

    ids = torch.tensor([[4, 7, 0], [5, 1, 2]])
    labels = torch.tensor([[7, -100, -100], [1, 2, -100]])
    whole = recording([(ids, labels)])
    split = recording([(ids[:1, :2], labels[:1, :2]), (ids[1:], labels[1:])])
    pads = pads_between(whole, split, steps=1)
    assert sorted(pads) == ["input_ids", "labels"]
    assert whole.samples(0, pads) == split.samples(0, pads)
    assert whole.samples(0) != split.samples(0)


def test_the_precision_watch_sees_the_gradients_computation_not_its_counts():
    from ddp_verify.parity.recorder import _Lower

    meta: dict = {"lower_inside": None}
    weight = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with _Lower(meta):
        # A mask and a count made in float32 take no part in the gradient: not seen.
        counted = (weight > 0).float().sum()
        loss = (weight * weight).sum() / counted.double()
        assert meta["lower_inside"] is None
        head = weight.float() * 2  # the gradient passes through float32
    assert meta["lower_inside"]["dtype"] == "float32"
    assert meta["lower_inside"]["call"] == "Tensor.float"
    assert meta["lower_inside"]["where"].endswith(f"test_padding.py:{_line_of('weight.float()')}")
    assert loss.dtype == torch.float64 and head.dtype == torch.float32


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "head =" in line)


def test_a_float64_run_with_float32_inside_asks_for_a_variant_moved_by_float32():
    from ddp_verify.parity.compare import perturbation, rounding_dtype
    from ddp_verify.parity.recording import Recording

    def recording(lower):
        meta = {"float64": True, "param_dtypes": ["torch.float64"], "autocast": None}
        return Recording("1x1", [{"meta": {**meta, "lower_inside": lower}, "steps": []}])

    plain = recording(None)
    assert plain.float64 and perturbation(plain) == "1"
    inside = recording({"dtype": "float32", "call": "Tensor.float", "where": "train.py:9"})
    assert not inside.float64 and rounding_dtype(inside) == "float32"
    assert perturbation(inside) == "1:float32"
    assert inside.precision == "float64, in float32 inside (Tensor.float at train.py:9)"


def test_a_sequence_level_mean_per_micro_batch_is_named_in_sequences(tmp_path):
    # Issue 39, item 4: a script training one mean over the step's sequences that count (some
    # are prompts with no response) is right at every layout; taking each micro-batch's own
    # sequence mean is named in sequences, those that count, from the loss's targets.
    right = run_parity(
        [*COMMAND, "--variant", "seq-mean"], layouts=[Layout(1, 4), Layout(2, 2)], steps=2,
        global_batch=8, keep=tmp_path / "right",
    )  # fmt: skip
    assert right.exit_code == 0, right.report
    wrong = run_parity(
        [*COMMAND, "--variant", "seq-mean-per-micro-batch"], layouts=[Layout(1, 4)], steps=2,
        global_batch=8, keep=tmp_path / "wrong",
    )  # fmt: skip
    assert wrong.exit_code == 1, wrong.report
    first = wrong.verdict.causes[0]
    assert first.pattern == "micro:own-mean", wrong.report
    said = "averaged over its own sequences and the micro-batches weighted equally, where the "
    assert said + "reference layout takes one mean over the step's sequences" in first.text
    # Micro-batches of two sequences each, a blank one among some: 1 or 2 that count.
    counts = re.findall(
        r"micro-batch \d: (\d) of the step's (\d) sequences with a token that counts", first.text
    )
    assert {c for c, _ in counts} == {"1", "2"} and {t for _, t in counts} == {"6"}, first.text
