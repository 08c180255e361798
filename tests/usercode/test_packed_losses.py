"""Packed (padding-free) rows for a loss-fn plug-in: a causal-LM loss that shifts its labels
meets several sequences in a row, with the label of each sequence's first position dropped
(as collators leave it) or kept (code that masks the boundary from ``position_ids`` must
drop it itself). Code right for both is equivalent on every packer; code that trusts the
collator is named with the boundary it counted, and as right padded, wrong packed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddp_verify import EquivalenceError, check
from ddp_verify.engine.models import PAD_ID
from ddp_verify.engine.packed_layout import packed_labels, unshifted_labels
from ddp_verify.engine.scenario import IGNORE_INDEX, ModelSpec, Scenario
from ddp_verify.usercode.kinds import KindError, check_signature
from tests.frontends.in_process import ddp_verify_here
from tests.user_code import load

ROOT = Path(__file__).resolve().parents[2]
PACKED = load("real_style/packed_lm_losses")
RUN = {"kind": "loss-fn", "world_size": 2, "max_examples": 25, "seed": 0, "labels": "unshifted"}


def _scenario(packing: str, boundary: str) -> Scenario:
    return Scenario(
        world_size=1, schedule=(((3,),),), loss="tokens", model=ModelSpec(kind="transformer"),
        labels="unshifted", packing=packing, boundary=boundary,
    )  # fmt: skip


def test_a_packed_row_puts_each_sequence_and_its_next_tokens_target_end_to_end():
    inputs = torch.tensor([[3, 4, PAD_ID, PAD_ID], [5, PAD_ID, PAD_ID, PAD_ID]])
    targets = torch.tensor([[4, 6, IGNORE_INDEX, IGNORE_INDEX], [2, IGNORE_INDEX, -100, -100]])
    logits = torch.arange(8, dtype=torch.float64).reshape(2, 4, 1).expand(2, 4, 2)
    for boundary, first in (("dropped", IGNORE_INDEX), ("kept", 5 % 7)):
        scenario = _scenario("flat", boundary)
        labels = unshifted_labels(scenario, inputs, targets)
        packed, rows, bounds = packed_labels(scenario, inputs, logits, labels, True)
        # Each sequence holds its tokens plus one slot: its last target sits one further on.
        assert bounds["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
        assert rows[0, :3].tolist() == [labels[0, 0].item(), 4, 6]
        # The second sequence's first label: what the first one's last slot would predict.
        assert rows[0, 3].item() == first and rows[0, 4].item() == 2
        assert packed[0, :, 0].tolist() == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert bounds["cu_seq_lens"].tolist() == [0, 3, 5]


def test_the_count_goes_by_name_where_a_bound_parameter_comes_first():
    call = check_signature(PACKED.causal_lm_loss_masking_boundaries, "loss-fn")
    assert call.count_keyword == "num_items_in_batch" and not call.count_positional
    assert "position_ids=<" in call.describe()


def test_a_loss_masking_its_boundaries_holds_on_every_packer_and_label(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fn = PACKED.causal_lm_loss_masking_boundaries
    for packing in ("flat", "rows"):
        verdict = check(fn, packings=(packing,), boundaries=("kept",), **RUN)
        assert verdict.examples == 25
    assert check(fn, **RUN).examples == 25  # its boundaries draw packing and both labels


def test_a_loss_trusting_the_collator_is_named_where_the_boundary_label_is_kept(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    fn = PACKED.causal_lm_loss_trusting_the_collator
    # Right where every boundary label is dropped, as the collators leave it.
    assert check(fn, packings=("flat", "rows"), boundaries=("dropped",), **RUN).examples == 25
    with pytest.raises(EquivalenceError) as caught:
        check(fn, **RUN)
    scenario = caught.value.scenario
    assert scenario.packing in ("flat", "rows") and scenario.boundary == "kept"
    patterns = [c.pattern for c in caught.value.causes]
    assert patterns[0] == "packed:boundary", caught.value.cause
    assert "divided by the step's count, as handed" in caught.value.causes[0].text
    assert "packed:disagrees" in patterns


def test_split_packing_is_refused_for_a_loss_that_shifts_within_rows():
    with pytest.raises(KindError, match="split cuts a sequence across rows"):
        check(PACKED.causal_lm_loss_masking_boundaries, packings=("split",), backend="nccl",
              **RUN)  # fmt: skip
    run = ddp_verify_here(
        "check", "fixtures/real_style/packed_lm_losses.py:causal_lm_loss_masking_boundaries",
        "--kind", "loss-fn", "--packing", "split", "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2 and "split cuts a sequence across rows" in run.stderr
