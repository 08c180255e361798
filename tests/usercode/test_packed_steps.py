"""Packed (padding-free) micro-batches for a step plug-in: dicts of ``input_ids``, ``labels``
and the boundaries, the harness's transformer told the ``position_ids`` as Hugging Face
models are. A sequence trains the same packed or alone there, so a correct step is
equivalent on every packer; a step that forgets the ``position_ids`` is right padded and
named as wrong packed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddp_verify import EquivalenceError, check
from ddp_verify.engine.models import PAD_ID, VOCABULARY, build_model
from ddp_verify.engine.packed_layout import micro_batch_dict
from ddp_verify.engine.scenario import IGNORE_INDEX, ModelSpec, Scenario
from ddp_verify.usercode.kinds import KindError
from tests.frontends.in_process import ddp_verify_here
from tests.user_code import load

ROOT = Path(__file__).resolve().parents[2]
STEPS = load("real_style/packed_steps")
RUN = {
    "kind": "step",
    "world_size": 2,
    "max_examples": 25,
    "seed": 0,
    "loss_reduction": "sum",
    "losses": ("tokens",),
}


def _scenario(packing: str) -> Scenario:
    return Scenario(
        world_size=1, schedule=(((3,),),), loss="tokens", model=ModelSpec(kind="transformer"),
        packing=packing, dtype="float64",
    )  # fmt: skip


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(1, VOCABULARY, (3, 4), generator=generator)
    targets = torch.randint(0, VOCABULARY, (3, 4), generator=generator)
    for row, length in enumerate((3, 1, 2)):
        inputs[row, length:] = PAD_ID
        targets[row, length:] = IGNORE_INDEX
    return inputs, targets


@pytest.mark.parametrize("packing", ["flat", "rows"])
def test_a_packed_sequence_gets_the_logits_it_gets_alone_given_its_position_ids(packing):
    scenario = _scenario(packing)
    model = build_model(scenario)
    inputs, targets = _batch()
    alone = model(inputs)
    batch = micro_batch_dict(scenario, inputs, targets)
    packed = model(batch["input_ids"], position_ids=batch["position_ids"])
    counted = batch["labels"] != IGNORE_INDEX
    # The same tokens that count, each with the logits it has alone.
    assert int(counted.sum()) == int((targets != IGNORE_INDEX).sum())
    expected = torch.cat([alone[r][targets[r] != IGNORE_INDEX] for r in range(3)])
    torch.testing.assert_close(packed[counted], expected)
    # Told nothing, the later sequences of a row see the earlier ones: other logits.
    blind = model(batch["input_ids"])
    assert not torch.allclose(blind[counted], expected)


def test_an_unpacked_dict_is_the_padded_batch_with_a_sequence_a_row():
    inputs, targets = _batch()
    batch = micro_batch_dict(_scenario(""), inputs, targets)
    assert torch.equal(batch["input_ids"], inputs) and torch.equal(batch["labels"], targets)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3]] * 3
    assert batch["cu_seq_lens"].tolist() == [0, 4, 8, 12]


def test_a_padding_free_step_holds_on_every_packer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fn = STEPS.padding_free_step
    for packing in ("flat", "rows"):
        verdict = check(fn, packings=(packing,), **RUN)
        assert verdict.examples == 25
        assert "batches=dicts" in verdict.layout


def test_a_step_that_forgets_the_position_ids_is_right_padded_and_named_packed(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    fn = STEPS.forgets_position_ids
    assert check(fn, packings=("",), **RUN).examples == 25
    with pytest.raises(EquivalenceError) as caught:
        check(fn, **RUN)  # the dicts it takes draw packed layouts
    assert caught.value.scenario.packing in ("flat", "rows")
    patterns = [c.pattern for c in caught.value.causes]
    assert patterns == ["packed:disagrees"], caught.value.cause


def test_packings_for_a_step_of_pairs_say_the_dicts_they_need(tmp_path):
    run = ddp_verify_here(
        "check", "fixtures/real_style/token_steps.py:global_token_count", "--kind", "step",
        "--loss-reduction", "sum", "--losses", "tokens", "--packing", "flat",
        "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--layout batches=dicts" in run.stderr and "pairs" in run.stderr


@pytest.mark.parametrize(
    ("bounds", "words"),
    [
        ({"packings": ("split",)}, "split cuts a sequence across rows"),
        (
            {"packings": ("flat",), "objective": "seq-mean-token-mean"},
            "take each packed row for a sequence",
        ),
        ({"packings": ("flat",), "losses": ("mse",)}, "packs the built-in token data"),
    ],
)
def test_packed_steps_the_harness_cannot_hand_over_are_refused_before_a_world(bounds, words):
    run = {**RUN, **bounds}
    with pytest.raises(KindError, match=words):
        check(STEPS.padding_free_step, backend="nccl", **run)
