"""The ground-truth table in CI: a fixed sample of cases the diagnosis gets right (one or
more per kind, the mistakes it once got wrong among them) must stay right, and the corpus
keeps its reach. The whole table: ``python benchmarks/diagnosis_table.py``."""

from __future__ import annotations

import pytest

from tests.groundtruth.corpus import OPERATORS, SHAPES, cases
from tests.groundtruth.table import run_case

CASES = {case.name: case for case in cases()}
# Right today, each for a reason a change could break: a probed layout, state carried from
# the last step (hypothesis once saw it as flaky: a harness error), a first cause that was
# "unexplained" before a named one (the zero-filled unused parameter), weighting, scale and
# report findings.
SAMPLE = (
    "grad-sync-loop.zero-fill-unused",
    "grad-sync-flat.means-over-count",
    "loss.previous-count",
    "grad-sync-flat.divided-twice",
    "reduce-list.local-report",
    "reduce-dict.sum-of-means",
    "loss-fn-flat.own-count",
    "loss-fn-causal.correct",
    "step.zero-grad-inside",
    "wrapped-step.micro-mean",
    "comm-hook-state.scale-w",
    "wrapper.parameter-left-out",
    "loss-agg.micro-count",
    "loss-agg-seq.row-count",
    "loss-agg-norm.padded-width",
    "grad-sync-sum.sum-weighted-as-mean",
    "step-sum.sum-micro-mean",
    "coupled-clip.gather-local-put-back",
    # Issue 60: a temperature with a default (refused as a hard negative on 0d3c99d), a
    # forgotten mask (equivalent on 0d3c99d, whose drawn losses were 0 under the mask).
    "coupled-temperature.correct",
    "loss-agg.mask-forgotten",
    # Issue 62: the user's recipe (a step against its own run, a criterion returning a
    # tuple), and what is no weighting: a warm-up per micro-batch, an EMA left in the model,
    # a truncated sum, label 0 taken for padding, a sync on the first micro-batch only.
    "step-scheduler.scheduler-per-micro-batch",
    "grad-sync-criterion.world-average",
    "step-ema.ema-left-in",
    "reduce-tensor.int-truncated",
    "loss-fn-masked.label-zero-as-padding",
    "wrapped-step-flag.flag-first-only",
    # A partitioned optimizer (each rank steps what it owns: a false alarm before the
    # gradients a step records were taken from the rank that stepped them), its broadcast
    # left out, and a loss scale divided out twice.
    "step-zero.correct",
    "step-zero.shard-not-broadcast",
    "step-scaler.unscaled-twice",
    # Tied weights synchronised once per name: a weighted average is left as it is, a
    # missing division compounds on the tied weight alone (read as the scale, and the tied
    # weight beside it).
    "grad-sync-tied.correct",
    "grad-sync-tied.no-divide",
    # Issue 65: windows of steps sharing a generation batch, normalised by the whole window
    # where its count per step was declared, and a per-step mean handed a window's count.
    "loss-agg-window.window-whole-count",
    "loss-agg-step-window.window-count-per-step",
    # Objectives of several terms: one term at M times its weight, another over every token
    # where its mask was declared; and a packed causal loss counting its boundaries.
    "loss-agg-terms.term-times-accumulation",
    "loss-agg-terms.term-unmasked",
    "loss-fn-packed.boundary-unmasked",
    # A step over packed dict micro-batches whose model is not told the position_ids.
    "step-packed.position-ids-dropped",
)


@pytest.mark.parametrize("name", SAMPLE)
def test_a_case_that_was_right_stays_right(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # reproducers are written under the working directory
    row = run_case(CASES[name], tmp_path)
    assert row.verdict == row.expected, row
    if row.truth:
        assert row.first in row.truth, f"{name}: first cause {row.first}, truth {row.truth}"


def test_the_corpus_spans_the_shapes_and_mistakes_it_promises():
    assert len(SHAPES) >= 12 and len(OPERATORS) >= 15
    assert len({shape.kind for shape in SHAPES}) >= 8
    for operator in OPERATORS:
        applied = [name for name, case in CASES.items() if case.operator is operator]
        assert operator.truth, operator.name
        assert any(any(f in shape.families for f in operator.edits) for shape in SHAPES), (
            f"{operator.name} applies to no shape"
        )
        assert applied or operator.name, operator.name
    # Every shape's correct form is in the table, and each mistake changes its source.
    for shape in SHAPES:
        correct = CASES[f"{shape.name}.correct"].source()
        mutants = [c for c in CASES.values() if c.shape is shape and c.operator is not None]
        assert mutants, shape.name
        assert all(m.source() != correct for m in mutants)
