"""Layouts beyond data parallel under ``ddp-verify parity``: the notation (``dp2.pp2.a2``), the
placeholders a command takes each degree by, and a torchtitan-style script
(``fixtures/scripts/titan_parallel.py``: FSDP2, HSDP, tensor parallel, pipeline stages, all on
gloo CPU) held to one process on the whole batch, its gradients and parameters gathered whole
from the shards and stages, and each planted mistake caught at the layouts where it differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_verify.parity.layouts import (
    Layout,
    LayoutError,
    check_placeholders,
    fill,
    parse_layout,
    parse_layouts,
)
from ddp_verify.parity.run import run_parity

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "titan_parallel.py"
COMMAND = [
    "python", str(SCRIPT), "--batch-size", "{micro_batch}", "--grad-accum", "{grad_accum}",
    "--tp", "{tp}", "--pp", "{pp}", "--dp-shard", "{dp_shard}", "--dp-replicate",
    "{dp_replicate}", "--cp", "{cp}",
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "shown", "world", "data", "micro_batch"),
    [
        ("2x2", "2x2", 2, 2, 4),
        ("dp2.a2", "2x2", 2, 2, 4),
        ("tp2", "tp2", 2, 1, 16),
        ("dp2.pp2.a2", "dp2.pp2.a2", 4, 2, 4),
        ("dp_shard2.dp_replicate2", "dp_replicate2.dp_shard2", 4, 4, 4),
        ("a4.tp2.dp_shard2", "dp_shard2.tp2.a4", 4, 2, 2),
    ],
)
def test_a_layout_is_its_degrees_and_splits_the_batch_over_its_data_parallel_ranks(
    text, shown, world, data, micro_batch
):
    layout = parse_layout(text)
    assert str(layout) == shown and parse_layout(shown) == layout
    assert layout.world_size == world and layout.data_parallel == data
    assert layout.micro_batch(16) == micro_batch


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dp2.dp_shard2", "dp is plain data parallel"),
        ("tp2.tp2", "names tp twice"),
        ("tp0", "degree of at least 1"),
        ("ep2", "'ep2' is not one"),
    ],
)
def test_a_layout_that_says_nothing_runnable_is_a_usage_error(text, words):
    with pytest.raises(LayoutError, match=words):
        parse_layouts(text)


def test_each_degree_reaches_the_command_through_its_placeholder():
    layout = parse_layout("dp_shard2.tp2.a2")
    filled = fill(["t.py", "--tp={tp}", "{dp_shard}", "{dp}", "{data_parallel}",
                   "{total_grad_accum}", "{micro_batch}"], layout, global_batch=8)  # fmt: skip
    assert filled == ["t.py", "--tp=2", "2", "1", "2", "4", "2"]
    # A degree the command never passes: the script would run plain data parallel.
    with pytest.raises(LayoutError, match=r"never passes the script that degree: put \{pp\}"):
        check_placeholders(["t.py", "{micro_batch}", "{grad_accum}"],
                           [Layout(2, 2, pp=2)], global_batch=8)  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "layouts", "differs", "first"),
    [
        ("correct", "tp2,dp_shard2,pp2.a2,cp2", set(), None),
        # Summed over the sharded ranks: exactly the data-parallel degree, 2, named as such.
        (
            "fsdp-sum",
            "dp_shard2,pp2.a2",
            {"dp_shard2"},
            ("summed across ranks", "2 is the layout's dp_shard (FSDP2's shard degree)"),
        ),
        # Each context-parallel rank its own piece's token mean: the prompt that does not
        # count lies in the first piece, so the pieces' counts differ.
        (
            "cp-local-mean",
            "cp2,a2",
            {"cp2"},
            ("its own piece of the sequences", "the layout's cp is 2"),
        ),
        # The MLP's output reduced over the tensor-parallel ranks twice: the block whose own
        # forward departs, every module inside it agreeing, and the reduction's line.
        (
            "tp-double-reduce",
            "tp2,pp2.a2",
            {"tp2"},
            (
                "departs from the reference's at layers.0: its output differs while every",
                "all_reduce at ",
            ),
        ),
        # The row-wise projection's partial sums never reduced: that projection named.
        (
            "tp-no-reduce",
            "tp2",
            {"tp2"},
            (
                "at layers.0.feed_forward.w2: its output differs (a module with none inside)",
                "departing: layers.0.feed_forward.w2, layers.0.feed_forward, layers.0",
            ),
        ),
        # A mean of micro-batch means (the schedule's scale_grads): off on uneven tokens,
        # read on the last stage's contributions.
        (
            "micro-mean",
            "pp2.a2,tp2",
            {"pp2.a2"},
            ("averaged over its own tokens", "divided the gradients by 2 after the step's"),
        ),
    ],
)
def test_a_torchtitan_style_script_is_judged_at_every_parallel_layout(
    tmp_path, variant, layouts, differs, first
):
    result = run_parity(
        [*COMMAND, "--variant", variant], layouts=parse_layouts(layouts), steps=2,
        global_batch=4, keep=tmp_path,
    )  # fmt: skip
    assert result.exit_code == (1 if differs else 0), result.report
    failing = {row["layout"] for row in result.layouts if row["training"] != "equivalent"}
    assert failing == differs, result.report
    for row in result.layouts:
        if row["layout"] not in differs:
            # Gathered whole from shards and stages: float64 rounding, nothing more.
            assert row["gradient_difference"] < 1e-10, row
    if first is not None:
        cause = result.verdict.causes[0]
        assert first[0] in cause.text and first[1] in cause.evidence, result.report


def test_an_interleaved_schedule_two_stages_a_rank_trains_what_one_process_trains(tmp_path):
    # Each rank's second stage forwards the same micro-batches again, as activations: not
    # counted as micro-batches, and its module keeps the whole model's names.
    command = [*COMMAND, "--schedule", "interleaved"]
    result = run_parity(command, layouts=parse_layouts("pp2.a2"), steps=2, global_batch=4,
                        keep=tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.report
    assert result.layouts[0]["gradient_difference"] < 1e-10, result.layouts[0]
    mistaken = run_parity([*command, "--variant", "micro-mean"], layouts=parse_layouts("pp2.a2"),
                          steps=2, global_batch=4, keep=tmp_path / "micro-mean")  # fmt: skip
    assert mistaken.exit_code == 1, mistaken.report
    # Read on the last stage's backwards alone (the rank runs stage 1's too), each loss's
    # tokens its own micro-batch's though both were forwarded before either loss.
    cause = mistaken.verdict.causes[0]
    assert "averaged over its own tokens" in cause.text, mistaken.report
    assert "scale_grads" in cause.evidence, mistaken.report


@pytest.mark.slow
def test_four_rank_layouts_of_two_axes_train_what_one_process_trains(tmp_path):
    layouts = (
        "dp2.pp2.a2,dp_replicate2.dp_shard2,dp2.tp2,dp_shard2.tp2,dp2.cp2,cp2.tp2,dp_shard2.cp2"
    )
    result = run_parity(COMMAND, layouts=parse_layouts(layouts), steps=2, global_batch=8,
                        keep=tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.report
    assert {row["layout"] for row in result.layouts} == set(layouts.split(","))


def test_a_context_parallel_layouts_pieces_are_held_to_the_reference_cut_as_its_ranks_cut():
    # Two ranks of a cp group each see a piece of every sequence: in order, or load-balanced
    # (the first and last quarters on rank 0). Held to the reference's rows cut the same way,
    # whichever cut the layout's ranks show; nothing to hold them to where no cut was recorded.
    import torch

    from ddp_verify.parity.recorder import fingerprints, pieces
    from ddp_verify.parity.recording import Recording, as_seen_by

    ids = torch.arange(16).reshape(2, 8)

    def step(rows, cut=None):
        return {"batches": [rows], "tokens": [[]], "pieces": cut or {}}

    reference = Recording("1x1", [{"meta": {"layout": "1x1"}, "steps": [step(
        fingerprints((ids,), {})[0],
        {"2": [pieces((ids,), {}, 2)], "2z": [pieces((ids,), {}, 2, balanced=True)]},
    )]}])  # fmt: skip
    quarters = ids.chunk(4, dim=1)
    balanced = [torch.cat([quarters[0], quarters[3]], 1), torch.cat([quarters[1], quarters[2]], 1)]
    for held in (list(ids.chunk(2, dim=1)), balanced):
        ranks = [{"meta": {"layout": "cp2"}, "steps": [step(fingerprints((h,), {})[0])]}
                 for h in held]  # fmt: skip
        layout = Recording("cp2", ranks)
        seen = as_seen_by(reference, layout, steps=1)
        assert seen is not None and seen.samples(0) == layout.samples(0)
    # A cut of the wrong pieces (rank 0 holding the last half twice) trains other samples.
    last = fingerprints((ids[:, 4:],), {})[0]
    wrong = Recording("cp2", [{"meta": {"layout": "cp2"}, "steps": [step(last)]}] * 2)
    seen = as_seen_by(reference, wrong, steps=1)
    assert seen is not None and seen.samples(0) != wrong.samples(0)
    # Recorded without pieces (a reference run told of no cp layout): not held at all.
    bare = Recording("1x1", [{"meta": {"layout": "1x1"}, "steps": [step(["x"])]}])
    assert as_seen_by(bare, layout, steps=1) is None
