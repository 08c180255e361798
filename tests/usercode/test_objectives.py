"""A declared objective (``objective=``, ``--objective``) is what the reference trains on the
whole global batch, what the counts handed to code count, and what the report speaks of;
code right for it is equivalent, code right only for another objective is not."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis.errors import InvalidArgument

from ddp_verify import EquivalenceError, check
from ddp_verify.engine.models import (
    IGNORE_INDEX,
    blank_sequences,
    build_data,
    build_model,
    item_counts,
    token_weights,
)
from ddp_verify.engine.outcome import tokens_line
from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.tolerances import relative_deviation, rounding_variant
from ddp_verify.usercode.adapters import KindError
from tests.frontends.in_process import ddp_verify_here
from tests.user_code import load

ROOT = Path(__file__).resolve().parents[2]
GRAD_SYNC = load("grad_sync")


def _scenario(objective: str, schedule=(((2, 1), (3,)),)) -> Scenario:
    return Scenario(
        world_size=2,
        schedule=schedule,
        model=ModelSpec(kind="transformer", in_features=1),
        loss="tokens",
        objective=objective,
        seed=3,
    )


def _by_loops(objective: str, losses: torch.Tensor, targets: torch.Tensor) -> float:
    """The objective of the issue's formulas, sequence by sequence."""
    rows = [
        [float(loss) for loss, t in zip(ls, ts, strict=True) if t != IGNORE_INDEX]
        for ls, ts in zip(losses, targets, strict=True)
    ]
    present = [r for r in rows if r]
    if objective == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in present) / len(present)
    if objective == "seq-mean-token-sum":
        return sum(sum(r) for r in present) / len(present)
    if objective == "seq-mean-token-sum-norm:6":
        return sum(sum(r) for r in present) / (len(present) * 6)
    return sum(sum(r) for r in rows) / sum(len(r) for r in rows)


@pytest.mark.parametrize(
    "objective",
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm:6"],
)
def test_the_reference_trains_the_declared_objective_on_the_whole_batch(objective):
    scenario = _scenario(objective)
    inputs, targets = build_data(scenario, "float64")[0]
    logits = build_model(scenario, "float64")(inputs)
    losses = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    ).detach()
    reported = train_reference(scenario, "float64").ranks[0].losses[0]
    assert reported == pytest.approx(_by_loops(objective, losses, targets), rel=1e-12)


def test_sequence_means_draw_sequences_with_no_counted_token_but_no_empty_micro_batch():
    schedule = (((3, 3), (4, 2)),) * 3
    blanks = 0
    for seed in range(6):
        scenario = Scenario(
            world_size=2,
            schedule=schedule,
            model=ModelSpec(kind="transformer", in_features=1),
            loss="tokens",
            objective="seq-mean-token-mean",
            seed=seed,
        )
        for _, targets in build_data(scenario, "float64"):
            blanks += int(((targets != IGNORE_INDEX).sum(dim=1) == 0).sum())
        assert all(n >= 1 for step in item_counts(scenario) for rank in step for n in rank)
    assert blanks > 0


@pytest.mark.parametrize("objective", ["token-mean", "seq-mean-token-mean"])
def test_the_counts_code_gets_are_the_objectives_units(objective):
    scenario = _scenario(objective, schedule=(((3, 2), (4,)),))
    _, targets = build_data(scenario, "float64")[0]
    counted = targets != IGNORE_INDEX
    expected, start = [], 0
    for sizes in scenario.schedule[0]:
        mine = []
        for size in sizes:
            piece = counted[start : start + size]
            units = piece.sum() if objective == "token-mean" else piece.any(dim=1).sum()
            mine.append(int(units))
            start += size
        expected.append(tuple(mine))
    assert item_counts(scenario)[0] == tuple(expected)


def test_share_weighted_code_is_equivalent_under_a_sequence_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verdict = check(
        GRAD_SYNC.sample_weighted,
        kind="grad-sync",
        world_size=2,
        max_examples=25,
        seed=0,
        objective="seq-mean-token-mean",
    )
    assert verdict.examples == 25


def test_world_size_averaging_under_a_sequence_mean_is_named_in_sequences(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            GRAD_SYNC.average_gradients,
            kind="grad-sync",
            world_size=2,
            max_examples=25,
            seed=0,
            objective="seq-mean-token-sum",
        )
    first = caught.value.causes[0]
    assert first.pattern == "ranks:world", caught.value.cause
    assert "not weighted by each rank's sequences" in first.text
    report = str(caught.value)
    assert "objective='seq-mean-token-sum'" in report
    assert "sequences with a token that counts, per micro-batch:" in report


def _cli(*args: str) -> subprocess.CompletedProcess:
    # In this process: the usage error is the subject, not the command's process.
    return ddp_verify_here(
        "check", "fixtures/grad_sync.py:sample_weighted", "--kind", "grad-sync",
        "--world-size", "2", "--json", *args, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--objective", "seq-mean"), "objective 'seq-mean' is none of token-mean"),
        (("--objective", "seq-mean-token-sum-norm"), "seq-mean-token-sum-norm:C with C > 0"),
        (("--objective", "token-mean", "--losses", "mse"), "aggregates token losses"),
        (("--token-weights",), "a loss-agg function is given; a grad-sync plug-in never sees"),
        (("--objective", "sample-mean", "--losses", "tokens"), "'sample-mean' averages samples"),
    ],
)
def test_a_bad_declaration_is_a_usage_error_before_any_world(args, says):
    run = _cli(*args)
    assert run.returncode == 2, run.stderr[-2000:]
    assert says in run.stdout + run.stderr
    if run.stdout.strip():
        assert json.loads(run.stdout)["exit_code"] == 2


VERL = load("real_style/verl_losses")


def test_a_loss_aggregation_is_right_for_its_own_objective_and_no_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seq_mean = VERL.seq_mean_token_mean_over_global_sequences
    verdict = check(
        seq_mean, kind="loss-agg", world_size=2, max_examples=25, seed=0,
        objective="seq-mean-token-mean",
    )  # fmt: skip
    assert verdict.examples == 25
    with pytest.raises(EquivalenceError) as caught:
        check(seq_mean, kind="loss-agg", world_size=2, max_examples=25, seed=0)
    said = "the code computes seq-mean-token-mean where token-mean was declared"
    assert caught.value.causes[0].pattern == "objective:other" and said in caught.value.cause
    token_mean = VERL.token_mean_over_global_tokens
    with pytest.raises(EquivalenceError) as caught:
        check(
            token_mean, kind="loss-agg", world_size=2, max_examples=25, seed=0,
            objective="seq-mean-token-mean",
        )  # fmt: skip
    said = "the code computes token-mean where seq-mean-token-mean was declared"
    assert said in caught.value.cause


def _float_masks_and_int_counts_only(loss_mat, loss_mask, global_tokens, world_size):
    assert loss_mask.dtype == loss_mat.dtype, f"a {loss_mask.dtype} mask"
    assert isinstance(global_tokens, int), f"a count of type {type(global_tokens).__name__}"
    return (loss_mat * loss_mask).sum() / global_tokens * world_size


def test_masks_and_counts_come_in_every_form_rl_code_gets_them(tmp_path, monkeypatch):
    # bool, int or float masks; counts as ints or 0-d tensors: code that takes one form only
    # fails on a drawn scenario, with the form in its message.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            _float_masks_and_int_counts_only, kind="loss-agg", world_size=2, max_examples=25,
            seed=0,
        )  # fmt: skip
    assert caught.value.verdict.status.value == "error"
    assert "AssertionError: a torch." in str(caught.value) or "a count of type Tensor" in str(
        caught.value
    )


def test_the_trainers_division_by_the_accumulation_steps_is_declared(tmp_path, monkeypatch):
    # --trainer-divides on: what fn returns is divided by the accumulation steps before
    # backward. verl's global normaliser then counts every token 1/M of what it should (the
    # double division ms-swift shipped); code that multiplies back is right.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(
            VERL.token_mean_over_global_tokens, kind="loss-agg", world_size=2,
            max_examples=25, seed=0, trainer_divides=True,
        )  # fmt: skip
    assert caught.value.causes[0].key == "scale:1/M", caught.value.cause
    verdict = check(
        VERL.token_mean_times_accumulation_steps, kind="loss-agg", world_size=2,
        max_examples=25, seed=0, trainer_divides=True,
    )  # fmt: skip
    assert verdict.examples == 25


def test_the_trainers_division_applies_to_loss_aggregations_only():
    run = _cli("--trainer-divides", "on")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--trainer-divides on applies to loss-agg plug-ins, not grad-sync" in run.stdout


def test_token_weights_are_signed_and_follow_the_token_wherever_it_is_trained():
    scenario = Scenario(
        world_size=2, schedule=(((2, 1), (3,)),), model=ModelSpec(kind="transformer"),
        loss="tokens", objective="token-mean", token_weights=True, seed=3,
    )  # fmt: skip
    targets = build_data(scenario)[0][1]
    weights = token_weights(scenario.seed, targets)
    assert (weights > 0).any() and (weights < 0).any()
    assert weights.abs().min() >= 0.25
    # The second half of the batch alone, cut to its own longest sequence: the same weights.
    half = targets[len(targets) // 2 :]
    width = int((half != IGNORE_INDEX).any(dim=0).nonzero().max()) + 1
    assert torch.equal(
        token_weights(scenario.seed, half[:, :width]), weights[len(targets) // 2 :, :width]
    )
    # And the reference trains them: its first gradients differ from the unweighted ones.
    plain = train_reference(dataclasses.replace(scenario, token_weights=False))
    weighted = train_reference(scenario)
    assert not torch.allclose(
        plain.ranks[0].grads[0]["head.weight"], weighted.ranks[0].grads[0]["head.weight"]
    )


def _token_mean_of_non_negative_losses(loss_mat, loss_mask, global_tokens, world_size):
    # A guard that holds for a cross-entropy and not for a policy-gradient loss, whose tokens
    # carry advantages of either sign.
    return (loss_mat.clamp(min=0) * loss_mask).sum() / global_tokens * world_size


def test_code_that_assumes_non_negative_token_losses_is_caught_only_with_signed_weights(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    kwargs = {"kind": "loss-agg", "world_size": 2, "max_examples": 15, "seed": 0}
    assert check(_token_mean_of_non_negative_losses, **kwargs).examples == 15
    with pytest.raises(EquivalenceError) as caught:
        check(_token_mean_of_non_negative_losses, token_weights=True, **kwargs)
    assert "token_weights=True" in repr(caught.value.verdict.scenario)
    assert "per-token losses weighted (signed)" in str(caught.value)
    assert check(VERL.token_mean_over_global_tokens, token_weights=True, **kwargs).examples == 15


def test_the_report_says_which_sequences_were_drawn_with_no_token_that_counts():
    blanks = []
    for seed in range(8):
        scenario = Scenario(
            world_size=2, schedule=(((2, 1), (3,)),), model=ModelSpec(kind="transformer"),
            loss="tokens", objective="seq-mean-token-mean", seed=seed,
        )  # fmt: skip
        counted, blank = item_counts(scenario), blank_sequences(scenario)
        # Every sample of the schedule is a sequence that counts or a blank one.
        for sizes, c, b in zip(scenario.schedule[0], counted[0], blank[0], strict=True):
            assert [x + y for x, y in zip(c, b, strict=True)] == list(sizes)
        line = tokens_line(scenario)
        if any(n for rank in blank[0] for n in rank):
            blanks.append(seed)
            assert "sequences with no token that counts (left out of sequence means)" in line
            assert "rank 1: " + "+".join(map(str, blank[0][1])) in line.split("left out")[1]
        else:
            assert "no token that counts" not in line
    assert blanks and len(blanks) < 8  # drawn in some scenarios, not all
    # Without a declared objective none are drawn, and nothing is said.
    plain = Scenario(
        world_size=2, schedule=(((2, 1), (3,)),), model=ModelSpec(kind="transformer"),
        loss="tokens", seed=blanks[0],
    )  # fmt: skip
    assert not any(n for rank in blank_sequences(plain)[0] for n in rank)
    assert "no token that counts" not in tokens_line(plain)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_verls_signature_bound_is_right_for_each_mode_under_its_own_objective(
    mode, tmp_path, monkeypatch
):
    # One function, verl's signature: the mode a literal, the counts by --bind; its
    # seq-mean-token-sum-norm falls back to the padded width, so the constant is declared.
    monkeypatch.chdir(tmp_path)
    declared = "seq-mean-token-sum-norm:4" if mode.endswith("norm") else mode
    bind = {**VERL.VERL_BINDS, "loss_agg_mode": mode}
    if mode.endswith("norm"):
        bind["loss_scale_factor"] = 4
    kwargs = {"kind": "loss-agg", "world_size": 2, "max_examples": 15, "seed": 0}
    assert check(VERL.agg_loss, objective=declared, bind=bind, **kwargs).examples == 15
    if mode.endswith("norm"):
        # Left to its fallback, the padded width, it is the known mistake, named.
        with pytest.raises(EquivalenceError) as caught:
            check(
                VERL.agg_loss,
                objective=declared,
                bind=VERL.VERL_BINDS | {"loss_agg_mode": mode},
                **kwargs,
            )
        assert caught.value.causes[0].pattern == "micro:padded-width", caught.value.cause


def test_sample_mean_is_the_declared_default_of_losses_over_samples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = load("grad_sync")
    kwargs = {"kind": "grad-sync", "world_size": 2, "max_examples": 10, "seed": 0}
    assert check(plain.sample_weighted, objective="sample-mean", **kwargs).examples == 10
    with pytest.raises(EquivalenceError) as caught:
        check(plain.average_gradients, objective="sample-mean", **kwargs)
    # The same counterexample as undeclared: nothing declared changes the scenarios.
    with pytest.raises(EquivalenceError) as undeclared:
        check(plain.average_gradients, **kwargs)
    assert caught.value.verdict.scenario == undeclared.value.verdict.scenario
    assert "objective" not in repr(caught.value.verdict.scenario)
    assert Scenario(world_size=1, schedule=(((1,),),), objective="sample-mean").objective == ""
    with pytest.raises(ValueError, match="declare token-mean"):
        Scenario(
            world_size=1, schedule=(((1,),),), loss="tokens", model=ModelSpec(kind="transformer"),
            objective="sample-mean",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("bounds", "says"),
    [
        ({"token_weights": True}, "a grad-sync plug-in never sees it"),
        ({"objective": "sample-mean", "losses": ("tokens",)}, "'sample-mean' averages samples"),
        ({"objective": "token-mean", "losses": ("mse",)}, "aggregates token losses"),
    ],
)
def test_bounds_that_do_not_go_together_are_refused_before_any_world(bounds, says):
    # nccl on this CPU machine would fail to start a world: the bounds are refused first.
    plain = load("grad_sync")
    with pytest.raises(KindError, match=says):
        check(plain.sample_weighted, kind="grad-sync", world_size=2, backend="nccl", **bounds)


def test_a_declared_sum_is_trained_as_the_sum_of_the_global_batchs_token_losses():
    # The reference under sum: the token mean's gradient times the step's tokens.
    base = dict(world_size=2, schedule=(((2, 1), (3,)),), model=ModelSpec(kind="transformer"),
                loss="tokens", seed=5)  # fmt: skip
    summed = train_reference(Scenario(**base, objective="sum"))
    mean = train_reference(Scenario(**base, objective="token-mean"))
    tokens = sum(item_counts(Scenario(**base, objective="sum"))[0][0]) + sum(
        item_counts(Scenario(**base, objective="sum"))[0][1]
    )
    for name, grad in mean.ranks[0].grads[0].items():
        torch.testing.assert_close(summed.ranks[0].grads[0][name], grad * tokens)
    assert summed.ranks[0].losses[0] == pytest.approx(mean.ranks[0].losses[0] * tokens)


@pytest.mark.parametrize(
    ("loss", "model"),
    [("mse", ModelSpec()), ("cross_entropy", ModelSpec(out_features=3))],
)
def test_a_declared_sum_of_sample_losses_is_trained_as_the_sum_of_per_sample_losses(loss, model):
    # The reference under sum: the sample mean's gradient times the step's samples (a
    # sample's MSE is the mean over its outputs, as the mean counts it).
    base = dict(world_size=2, schedule=(((2, 1), (3,)),), model=model, loss=loss, seed=5)
    summed = train_reference(Scenario(**base, objective="sum"))
    mean = train_reference(Scenario(**base))
    for name, grad in mean.ranks[0].grads[0].items():
        torch.testing.assert_close(summed.ranks[0].grads[0][name], grad * 6)
    assert summed.ranks[0].losses[0] == pytest.approx(mean.ranks[0].losses[0] * 6)


def test_a_sum_of_sample_losses_is_a_scenario_and_the_other_objectives_are_not():
    assert Scenario(world_size=1, schedule=(((2,),),), objective="sum").objective == "sum"
    with pytest.raises(ValueError, match="aggregates token losses"):
        Scenario(world_size=1, schedule=(((2,),),), objective="token-mean")


def test_a_declared_sum_is_checked_for_loss_aggregations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kwargs = {"kind": "loss-agg", "world_size": 2, "max_examples": 15, "seed": 0}
    assert check(VERL.token_sum, objective="sum", **kwargs).examples == 15
    # A token mean where the sum was declared: divided by the step's tokens once too often.
    with pytest.raises(EquivalenceError) as caught:
        check(VERL.token_mean_over_global_tokens, objective="sum", **kwargs)
    first = caught.value.causes[0]
    assert first.key == "scale:1/N", caught.value.cause
    assert "divided by the global token count" in first.text
    # And the sum where a token mean was declared: N times too large.
    with pytest.raises(EquivalenceError) as caught:
        check(VERL.token_sum, **kwargs)
    assert caught.value.causes[0].key == "scale:N", caught.value.cause


def test_the_float32_bound_of_a_declared_sum_is_measured_on_runs_of_the_sum():
    # The rounding variants weight each chunk's own loss by its share: 1 in a sum.
    scenario = Scenario(
        world_size=2, schedule=(((2, 1), (3,)),), model=ModelSpec(kind="transformer"),
        loss="tokens", seed=5, objective="sum", dtype="float32",
    )  # fmt: skip
    reference = train_reference(scenario, "float64")
    for variant in range(3):
        assert relative_deviation(reference, rounding_variant(scenario, variant)) < 1e-4


def test_an_aggregation_that_never_applies_its_mask_is_caught_and_named(tmp_path, monkeypatch):
    # 0d3c99d drew loss_mat exactly 0 wherever the mask is 0 (F.cross_entropy's ignore_index),
    # so code that never multiplied by the mask passed: policy losses are not 0 there.
    monkeypatch.chdir(tmp_path)
    trl = load("real_style/trl_losses")
    options = dict(
        kind="loss-agg",
        world_size=2,
        max_examples=25,
        seed=0,
        bind={"num_items_in_batch": "global_tokens", "num_processes": "world_size"},
    )
    with pytest.raises(EquivalenceError) as caught:
        check(trl.dapo_unmasked, **options)
    assert caught.value.verdict.causes[0].pattern == "mask:ignored"
    # The same code with the mask applied passes the same search.
    check(trl.dapo, **options)


# -- windows of several optimizer steps (TRL's steps_per_generation) -----------------------
TRL = load("real_style/trl_losses")


def test_the_reference_divides_each_step_by_its_windows_count_per_step():
    # By hand: a step's token sum over the window's tokens per step, at the first step's
    # parameters, its gradient by autograd on that formula; against the per-step objective
    # the step counts its share of the window times the window's steps.
    windowed = dataclasses.replace(
        _scenario("token-mean@window", schedule=(((2, 1), (3,)),) * 3), window=2
    )
    data = build_data(windowed, "float64")
    tokens = [int((y != IGNORE_INDEX).sum()) for _, y in data]
    model = build_model(windowed, "float64")
    inputs, targets = data[0]
    losses = torch.nn.functional.cross_entropy(
        model(inputs).transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    loss = losses.sum() / ((tokens[0] + tokens[1]) / 2)
    loss.backward()
    truth = train_reference(windowed, "float64").ranks[0]
    assert truth.losses[0] == pytest.approx(loss.item(), rel=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(truth.grads[0][name], p.grad, rtol=1e-12, atol=1e-15)
    per_step = train_reference(dataclasses.replace(windowed, objective="token-mean"), "float64")
    ratio = truth.losses[0] / per_step.ranks[0].losses[0]
    assert ratio == pytest.approx(tokens[0] / ((tokens[0] + tokens[1]) / 2), rel=1e-12)
    assert tokens[0] != tokens[1], "a window whose steps hold as many tokens tells nothing"


def _per_window_step(loss_mat, loss_mask, window_tokens, window_steps, world_size):
    return (loss_mat * loss_mask).sum() / (window_tokens / window_steps) * world_size


def _per_window_step_in_sequences(loss_mat, loss_mask, window_sequences, window_steps,
                                  world_size):  # fmt: skip
    means = (loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
    return means.sum() / (window_sequences / window_steps) * world_size


def _whole_window(loss_mat, loss_mask, window_tokens, world_size):
    return (loss_mat * loss_mask).sum() / window_tokens * world_size


def test_the_window_counts_are_every_ranks_over_the_windows_steps():
    # The reference counts each step's units from the data (item_counts); the ranks count
    # their own micro-batches over the window's steps and all-reduce: code dividing by the
    # window's count per step agrees on a window and a partial one, in tokens and sequences,
    # and the window's whole count is 1/2 of it on the full window, as it should be.
    from ddp_verify.frontends.verifying import VerifyingWorld
    from ddp_verify.methods.equivalence import check_equivalent
    from ddp_verify.usercode.adapters import adapt

    schedule = (((2, 1), (3,)), ((1, 2), (2,)), ((3,), (1, 1)))
    tokens = dataclasses.replace(_scenario("token-mean@window", schedule), window=2)
    sequences = dataclasses.replace(tokens, objective="seq-mean-token-mean@window")
    with VerifyingWorld(2) as world:
        for fn, scenario in (
            (_per_window_step, tokens),
            (_per_window_step_in_sequences, sequences),
        ):
            outcome = check_equivalent(world, adapt(fn, "loss-agg"), scenario)
            assert outcome.equivalent, outcome.report()
        whole = check_equivalent(world, adapt(_whole_window, "loss-agg"), tokens)
    assert not whole.equivalent
    assert whole.got.ranks[0].losses[0] == pytest.approx(whole.reference.ranks[0].losses[0] / 2)


def test_a_window_normaliser_is_checked_and_each_steps_factor_named(tmp_path, monkeypatch):
    # TRL's dapo with steps_per_generation: the fixed normaliser is equivalent under a token
    # mean normalised by the window; the one before the fix, and dapo's per-step code handed
    # the generation batch's count, are named with each step's factor.
    monkeypatch.chdir(tmp_path)
    window = {"num_items_in_batch": "window_tokens", "num_processes": "world_size"}
    fixed = {**window, "steps_per_generation": "window_steps"}
    verdict = check(
        TRL.dapo_generation_batch, kind="loss-agg", world_size=2, max_examples=25, seed=0,
        objective="token-mean@window", bind=fixed,
    )  # fmt: skip
    assert verdict.examples == 25
    assert "windows of" in repr(verdict.scenario) or verdict.scenario is None
    for fn, declared, meant in (
        (TRL.dapo_generation_batch_unscaled, "token-mean@window", "the window's count per step"),
        (TRL.dapo_step_fed_generation_count, "token-mean", "the step's own count"),
    ):
        with pytest.raises(EquivalenceError) as caught:
            check(fn, kind="loss-agg", world_size=2, max_examples=25, seed=0,
                  objective=declared, bind=window)  # fmt: skip
        first = caught.value.causes[0]
        assert first.pattern == "objective:window", caught.value.cause
        assert f"by the window's whole count where {declared} was declared ({meant})" in first.text
        assert "step 0 counted" in first.text and "step 1 counted" in first.text
        assert caught.value.scenario.window > 1


@pytest.mark.parametrize(
    ("bounds", "says"),
    [
        ({"objective": "token-mean@window"}, "only code handed the counts can do"),
        ({"objective": "sum@window"}, "sum divides by nothing"),
        ({"window_steps": 2}, "a grad-sync plug-in is given none"),
    ],
)
def test_a_window_where_none_can_be_is_refused_before_any_world(bounds, says):
    plain = load("grad_sync")
    with pytest.raises((KindError, InvalidArgument), match=says):
        check(plain.sample_weighted, kind="grad-sync", world_size=2, backend="nccl", **bounds)


# -- packed (padding-free) batches ---------------------------------------------------------
PACKED = load("real_style/packed_losses")


def test_a_sequence_mean_over_segments_holds_on_every_layout_and_a_row_is_no_sequence(
    tmp_path, monkeypatch
):
    # The same verl-style per-row sequence mean is right on padded rows (a row is a
    # sequence) and wrong packed, named as a packed row taken for a sequence; the segment-id
    # form is right on both packers.
    monkeypatch.chdir(tmp_path)
    kwargs = {"kind": "loss-agg", "world_size": 2, "max_examples": 25, "seed": 0}
    declared = {"objective": "seq-mean-token-mean"}
    for packing in ("flat", "rows", "split"):
        verdict = check(PACKED.seq_mean_by_segment_ids, packings=(packing,), **declared, **kwargs)
        assert verdict.examples == 25
    assert check(PACKED.seq_mean_per_row, packings=("",), **declared, **kwargs).examples == 25
    with pytest.raises(EquivalenceError) as caught:
        check(PACKED.seq_mean_per_row, **declared, **kwargs)  # its boundaries draw packing
    first = caught.value.causes[0]
    assert first.pattern == "packed:rows", caught.value.cause
    assert "divided by the step's sequences" in first.text
    assert caught.value.scenario.packing in ("flat", "rows", "split")
    assert f"sequences packed ({caught.value.scenario.packing})" in str(caught.value)


def test_packing_for_code_handed_no_losses_is_refused_before_any_world():
    plain = load("grad_sync")
    with pytest.raises(KindError, match="a grad-sync plug-in is handed none"):
        check(plain.sample_weighted, kind="grad-sync", world_size=2, backend="nccl",
              packings=("flat",))  # fmt: skip
    run = ddp_verify_here(
        "check", "fixtures/real_style/packed_losses.py:seq_mean_by_segment_ids", "--kind",
        "loss-agg", "--packing", "greedy", "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2 and "packings are none, flat, rows and split" in run.stderr
