"""Calls found by probing: the layout a kind's code is called in is chosen by what it did in
each on the simplest even scenario, never by a default (ddp_verify/usercode/layouts.py)."""

from __future__ import annotations

import pytest

from ddp_verify import check
from ddp_verify.usercode.kinds import KindError
from ddp_verify.usercode.layouts import (
    LayoutPinError,
    Tried,
    candidates,
    choose,
    equal_items_scenario,
    parse_layout,
)

FLAT = {"logits": "2d", "labels": "aligned"}
FULL = {"logits": "3d", "labels": "aligned"}
SHIFT = {"logits": "3d", "labels": "unshifted"}
PAIRS, DICTS = {"batches": "pairs"}, {"batches": "dicts"}


def test_agreeing_beats_scaled_beats_running_whatever_the_order():
    scaled = Tried(FULL, factor=2.0)
    agreeing = Tried(FLAT, agrees=True, factor=1.0)
    wrong = Tried(SHIFT)
    assert choose("loss-fn", [wrong, scaled, agreeing]).layout == FLAT
    assert choose("loss-fn", [wrong, scaled]).layout == FULL
    chosen = choose("loss-fn", [wrong, Tried(FLAT, error="RuntimeError: no")])
    assert chosen.layout == SHIFT and not chosen.settled
    assert "no layout agreed with the reference" in chosen.reason
    # Two that agree alike: the first of the axis's order breaks the tie, and says so.
    tie = choose("loss-fn", [Tried(FULL, agrees=True), Tried(FLAT, agrees=True)])
    assert tie.layout == FULL and "(positions, vocab) logits: ran and agreed too" in tie.reason


def test_a_layout_whose_result_is_nothing_does_not_agree_up_to_a_factor():
    # Issue 35: a causal loss that shifts its labels, called with aligned ones on the probe
    # (padding last), ignores every target: its gradient is 0, which is "the reference's x0"
    # to a least-squares factor, and was chosen over the unshifted layout's true x2.
    import torch

    from ddp_verify.engine.trace import RankTrace, Trace
    from ddp_verify.usercode.layouts import compared

    def trace(scale: float) -> Trace:
        grads = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) * scale}
        return Trace("probe", [RankTrace(losses=[scale], params=[grads], grads=[grads])] * 2)

    reference = trace(1.0)
    assert compared(FULL, reference, trace(0.0)).factor is None
    assert compared(SHIFT, reference, trace(2.0)).factor == pytest.approx(2.0)
    chosen = choose(
        "loss-fn", [compared(FULL, reference, trace(0.0)), compared(SHIFT, reference, trace(2.0))]
    )
    assert chosen.layout == SHIFT


def test_no_layout_that_runs_is_a_usage_error_naming_each():
    with pytest.raises(LayoutPinError) as info:
        choose("loss-fn", [Tried(FULL, error="ValueError: a"), Tried(FLAT, error="TypeError: b")])
    message = str(info.value)
    assert "(batch, seq, vocab) logits, labels aligned: raised ValueError: a" in message
    assert "(positions, vocab) logits, labels aligned: raised TypeError: b" in message
    assert isinstance(info.value, KindError)  # a usage error, exit 2


def test_one_error_in_every_layout_is_the_codes_own_for_the_search_to_report():
    same = "AssertionError: the model is not in the team's wrapper"
    chosen = choose("step", [Tried(PAIRS, error=same), Tried(DICTS, error=same)])
    assert chosen.layout == PAIRS and not chosen.settled and chosen.reason == ""


def test_pins_narrow_the_candidates_and_bad_pins_say_what_fits():
    assert candidates("loss-fn", {"logits": "2d"}, tokens=True) == [
        {"logits": "2d", "labels": "aligned"},
        {"logits": "2d", "labels": "unshifted"},
    ]
    # A class loss's logits are (batch, classes) either way: nothing to probe.
    assert candidates("loss-fn", {}, tokens=False) == [FULL]
    assert candidates("grad-sync", {}, tokens=True) == [{}]
    with pytest.raises(KindError, match="logits must be one of 3d, 2d"):
        parse_layout("loss-fn", "logits=4d")
    with pytest.raises(KindError, match="applies to loss-fn plug-ins, not to grad-sync"):
        parse_layout("grad-sync", None, logits="2d")
    with pytest.raises(KindError, match="AXIS=VALUE"):
        parse_layout("reduce", "list")


def test_the_probe_holds_as_many_tokens_on_every_rank():
    from ddp_verify.engine.models import item_counts
    from ddp_verify.engine.scenario import ModelSpec, Scenario

    probe = Scenario(
        world_size=4,
        schedule=(((1,),) * 4,),
        model=ModelSpec(kind="transformer", in_features=1),
        loss="tokens",
        labels="unshifted",
    )
    even = equal_items_scenario(probe)
    assert len({sizes for sizes in item_counts(even)[0]}) == 1
    assert len({sizes for sizes in item_counts(probe)[0]}) > 1  # seed 0 alone is not even


def average_stacked(x):
    """A logging helper that takes a list (Megatron's style) under a name that says
    nothing: the probe, not the name, finds that it takes a list."""
    import torch
    import torch.distributed as dist

    stacked = torch.stack([t.detach().clone() for t in x])
    dist.all_reduce(stacked)
    return [v for v in stacked / dist.get_world_size()]


def test_a_list_helper_is_called_with_a_list_whatever_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception) as info:
        check(average_stacked, kind="reduce", world_size=2, max_examples=10, seed=0)
    verdict = info.value.verdict
    assert verdict.status.value == "not-equivalent"  # a world-size mean of rank means
    assert verdict.call == "average_stacked([tensor[]])"
    assert verdict.layout.startswith("a list of one tensor, as it agreed with the reference")
    assert "a tensor: raised TypeError: iteration over a 0-d tensor" in verdict.layout
    assert {c.pattern for c in verdict.causes} & {"loss:world"}


def test_the_probe_runs_in_the_most_precise_dtype_the_check_allows():
    from ddp_verify.usercode.probe import _probe

    assert _probe(2, {"dtypes": ("float32", "float64")}).dtype == "float64"
    # A check held to float32 only is still probed (it was called in the default layout,
    # unprobed, and a loss written for (positions, vocab) logits crashed on every example).
    only = _probe(2, {"dtypes": ("float32",)})
    assert only.dtype == "float32" and only.loss == "tokens"
    assert _probe(2, {"dtypes": ("bfloat16", "float32")}).dtype == "float32"


def flat_logits_mean(logits, labels):
    # Written for (positions, vocab) logits (3d ones raise in F.cross_entropy), and a mean
    # over its own tokens: wrong wherever ranks hold different numbers of them.
    import torch.nn.functional as F

    return F.cross_entropy(logits, labels, ignore_index=-100)


def test_a_float32_only_check_calls_the_code_in_the_layout_it_runs_in(tmp_path, monkeypatch):
    from ddp_verify.usercode.verdict import NotEquivalent

    monkeypatch.chdir(tmp_path)  # its reproducer is written under ./.ddp_verify

    with pytest.raises(NotEquivalent) as info:
        check(
            flat_logits_mean,
            kind="loss-fn",
            world_size=2,
            max_examples=5,
            seed=0,
            dtypes=("float32",),
        )
    verdict = info.value.verdict
    assert verdict.layout and "pin it: logits='2d'" in verdict.layout
    assert info.value.scenario.dtype == "float32"
    assert info.value.causes, "a float32 counterexample gets its likely cause"
