"""The preflight (issue 63): the reference layout must train the same twice before any
layout is held to it; where it does not, the source is named with its fix. Dropout, the same
at every run of a layout and other at every layout, and starting weights other than the
reference's are named where layouts differ. {total_grad_accum} for scripts whose
accumulation flag counts every rank's micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.run import run_parity
from tests.frontends.in_process import ddp_verify_here

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "plain_ddp.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip


def _line_of(text: str) -> int:
    """The line of SCRIPT that holds ``text`` (where the unseeded draw is)."""
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_reference_that_is_not_the_same_twice_is_the_report_with_its_source(tmp_path):
    result = run_parity(
        [*COMMAND, "--variant", "unseeded-data"],
        layouts=[Layout(2, 1)],
        steps=2,
        global_batch=16,
        keep=tmp_path,
    )
    assert result.exit_code == 2, result.report
    (cause,) = result.verdict.causes
    assert cause.pattern == "reference:unreproduced", cause
    # The unseeded draw, by file and line; not Python's or NumPy's, which it never drew from.
    site = f"torch.randn at {SCRIPT.as_posix()}:{_line_of('torch.randn(256, 6)  #')}"
    assert site in cause.text, cause.text
    assert "torch.manual_seed" in cause.text and "NumPy" not in cause.text
    assert "samples of step 0" in cause.text
    # No layout ran against it.
    assert not (tmp_path / "2x1").exists()


def test_dropout_is_named_where_layouts_differ_and_the_command_line_says_so(tmp_path):
    command = [*COMMAND, "--variant", "dropout"]
    result = run_parity(command, layouts=[Layout(2, 1)], steps=2, global_batch=16)
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.pattern == "model:dropout", [c.pattern for c in result.verdict.causes]
    assert "'2' p=0.1" in first.text
    # A seeded script is the same twice: the correct one passes the preflight and its layouts.
    cli = ddp_verify_here("parity", "--layouts", "2x1", "--global-batch", "16", "--steps", "2",
                          "--json", "--", *COMMAND, cwd=tmp_path)  # fmt: skip
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["verdict"] == "equivalent"


def test_a_layout_that_starts_from_other_weights_is_named_before_any_step(tmp_path):
    command = [*COMMAND, "--variant", "init-by-world"]
    result = run_parity(command, layouts=[Layout(2, 1)], steps=2, global_batch=16)
    assert result.exit_code == 1, result.report
    assert [c.pattern for c in result.verdict.causes] == ["weights:start"], result.report
    assert "ranks 0, 1 of layout 2x1" in result.verdict.causes[0].text


def test_a_total_accumulation_flag_is_filled_and_counts_as_telling_the_script():
    from ddp_verify.parity.layouts import LayoutError, check_placeholders, fill

    # nanoGPT's gradient_accumulation_steps: every rank's micro-batches, W x A.
    total = ["train.py", "--gradient_accumulation_steps={total_grad_accum}"]
    assert fill(total, Layout(4, 2), global_batch=None)[1] == "--gradient_accumulation_steps=8"
    check_placeholders([*total, "--batch_size={micro_batch}"], [Layout(2, 2)], global_batch=16)

    with pytest.raises(LayoutError, match="never passes the script how many"):
        check_placeholders(["train.py", "--bs", "{micro_batch}"], [Layout(2, 2)], global_batch=16)


def test_a_script_taking_the_total_accumulation_is_equivalent_at_every_layout():
    command = ["python", str(SCRIPT), "--total-grad-accum", "{total_grad_accum}",
               "--batch-size", "{micro_batch}"]  # fmt: skip
    result = run_parity(command, layouts=[Layout(2, 2), Layout(1, 2)], steps=2, global_batch=16)
    assert result.exit_code == 0, result.report
    assert [row["grad_accum"] for row in result.layouts] == [2, 2]


@pytest.mark.parametrize(
    ("variant", "layout", "pattern", "words"),
    [
        ("no-group", Layout(2, 1), "launch:no-group", "none called init_process_group"),
        ("accum-ignored", Layout(1, 2), "launch:micro-batches", "ran 1 micro-batch(es) a step"),
    ],
)
def test_a_layout_that_did_not_run_as_asked_is_named_as_that(variant, layout, pattern, words):
    command = [*COMMAND, "--variant", variant]
    result = run_parity(command, layouts=[layout], steps=2, global_batch=16)
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.pattern == pattern, [c.pattern for c in result.verdict.causes]
    assert words in first.text, first.text


def test_a_reference_that_trains_nothing_is_said_and_nothing_is_judged():
    command = [*COMMAND, "--variant", "trains-nothing"]
    result = run_parity(command, layouts=[Layout(2, 1)], steps=2, global_batch=16)
    assert result.exit_code == 2, result.report
    assert [c.pattern for c in result.verdict.causes] == ["reference:trains-nothing"]
    assert "exactly 0 at every step recorded (2)" in result.verdict.causes[0].text


def test_a_crash_is_told_by_the_rank_that_failed_first_its_traceback_whole(tmp_path):
    command = [*COMMAND, "--variant", "crash"]
    result = run_parity(command, layouts=[Layout(2, 1)], steps=2, global_batch=16)
    assert result.exit_code == 1, result.report
    told = result.report.split("Its output:\n", 1)[1]
    assert told.startswith("rank 1 failed first:\nTraceback (most recent call last):"), told
    assert 'raise RuntimeError("rank 1 found no data for its shard")' in told
    # Rank 0's follow-on error after it, on one line.
    assert told.index("then, after it:\nrank 0: ") > told.index("found no data for its shard")


ACCELERATE = SCRIPT.parent / "accelerate_loop.py"


@pytest.mark.parametrize(("variant", "verdict"), [("correct", 0), ("plain-backward", 1)])
def test_autocast_entered_inside_the_forward_is_seen_and_bounds_the_run(variant, verdict):
    # accelerate's mixed precision wraps the prepared model's forward in autocast: the
    # model's own call is outside it, the modules it runs inside (read as a weighting of
    # 0.9996, 1.003 under float32's bound before).
    pytest.importorskip("accelerate", reason="the frameworks extra: pip install -e '.[frameworks]'")
    command = ["python", str(ACCELERATE), "--grad-accum", "{grad_accum}", "--batch-size",
               "{micro_batch}", "--mixed-precision", "bf16", "--variant", variant]  # fmt: skip
    result = run_parity(command, layouts=[Layout(1, 2)], steps=2, global_batch=8, float64=False)
    assert result.exit_code == verdict, result.report
    assert "under autocast cpu:bfloat16" in result.report
    if verdict:
        assert result.verdict.causes[0].reading == "scale:A", result.report


NANOGPT = [
    "python",
    str(SCRIPT.parent / "nanogpt_style.py"),
    "--gradient_accumulation_steps={total_grad_accum}",
    "--batch_size={micro_batch}",
]


@pytest.mark.parametrize(
    ("config", "pattern", "words"),
    [
        # What it takes: one draw of the step's batch, no evaluation, no dropout. Rank 0
        # logs its own last micro-batch's loss: a warning, not a failure.
        (["--sample=global", "--eval_interval=0", "--dropout=0.0"], None, "the rank's local loss"),
        # The evaluation at iteration 0 draws its batches from the training generator, an
        # amount that follows the micro-batch size: named by its call, not as a shuffle.
        (["--sample=global", "--dropout=0.0"], "data:order", "in estimate_loss: 32 value(s)"),
        # As nanoGPT is: each rank's own seed and micro-batch-sized draws.
        (["--eval_interval=0", "--dropout=0.0"], "data:order", "in <module>: 16 value(s)"),
        (["--sample=global", "--eval_interval=0"], "model:dropout", "'block.drop' p=0.1"),
    ],
    ids=["configured", "evaluation-draws", "per-rank-draws", "dropout"],
)
def test_a_nanogpt_shaped_script(config, pattern, words):
    result = run_parity([*NANOGPT, *config], layouts=[Layout(2, 1)], steps=2, global_batch=16)
    if pattern is None:
        assert result.exit_code == 0, result.report
        assert words in result.report, result.report
        return
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.pattern == pattern, result.report
    assert words in first.text, first.text


def test_devices_and_nodes_are_filled_per_layout():
    from ddp_verify.parity.layouts import fill

    flags = ["train.py", "--devices", "{nproc_per_node}", "--num-nodes", "{nnodes}"]
    assert fill(flags, Layout(4, 1), global_batch=None, nnodes=2)[2::2] == ["2", "2"]
    # A layout of one rank runs on one node, whatever the others span.
    assert fill(flags, Layout(1, 4), global_batch=None, nnodes=2)[2::2] == ["1", "1"]
