"""The coupled-loss kind: its reference is the user's own loss on one rank holding every
pair, its harness takes ranks holding no pair, and what cannot run on uneven batches or as
a single-process loss is said as such. Real worlds throughout."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument, NoSuchExample

from ddp_verify import VerifyingWorld, check
from ddp_verify.engine.coupled import build_towers, features, pairs
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.strategies import coupled_scenarios
from ddp_verify.engine.tolerances import TrainingOnlyMeasured
from ddp_verify.methods.base import train_whole_variants
from ddp_verify.methods.equivalence import check_equivalent
from ddp_verify.usercode.adapters import adapt
from ddp_verify.usercode.coupled import matched_on_ranks
from ddp_verify.usercode.diagnosis.coupled import coupled_causes
from ddp_verify.usercode.kinds import KindError
from ddp_verify.usercode.verdict import CodeFailed
from tests.user_code import load

OPEN_CLIP = load("real_style/open_clip_losses")


@pytest.fixture(scope="module")
def world2():
    with VerifyingWorld(2) as world:
        yield world


MNRL = load("real_style/sentence_transformers_losses")


def _scenario(*pairs_per_rank: int, **model: object) -> Scenario:
    spec = ModelSpec(kind="towers", in_features=3, hidden=(), out_features=4, **model)
    return Scenario(
        world_size=len(pairs_per_rank),
        schedule=(tuple((n,) for n in pairs_per_rank),),
        model=spec,
        loss="coupled",
        seed=3,
    )


def local_clip(features_a, features_b):
    """No gather: the loss of whatever pairs the rank holds."""
    logits = features_a @ features_b.T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def test_the_reference_is_your_loss_on_one_rank_holding_every_pair_in_rank_order(world2):
    scenario = _scenario(2, 1)
    outcome = check_equivalent(world2, adapt(local_clip, "coupled-loss"), scenario)
    # The same loss on all three pairs, computed here with no process group at all.
    model = build_towers(scenario)
    local_clip(*features(model, pairs(scenario)[0])).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(outcome.reference.ranks[0].grads[0][name], p.grad)
    # Each rank's own pairs alone are not the whole batch: negatives from the local batch.
    assert not outcome.equivalent


def test_a_rank_that_holds_no_pair_takes_part_in_the_gathers(world2):
    outcome = check_equivalent(world2, adapt(MNRL.mnrl_gathered, "coupled-loss"), _scenario(2, 0))
    assert outcome.equivalent, outcome.report()


def test_a_gather_of_unequal_sizes_is_reported_as_code_that_cannot_take_uneven_batches(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CodeFailed) as caught:
        check(OPEN_CLIP.clip_loss_gather_with_grad, kind="coupled-loss", world_size=2, seed=0)
    cause = caught.value.verdict.causes[0]
    assert cause.pattern == "coupled:uneven", cause
    assert "--even-batches" in cause.text and "pad to the longest" in cause.text
    assert caught.value.verdict.scenario is not None
    assert not caught.value.verdict.scenario.even


def test_positives_offset_by_rank_times_local_batch_are_said_to_assume_even_batches(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CodeFailed) as caught:
        check(MNRL.mnrl_rank_offset, kind="coupled-loss", world_size=2, seed=0)
    cause = caught.value.verdict.causes[0]
    assert cause.pattern == "coupled:uneven"
    assert "label fell outside the gathered batch" in cause.text


class ClipLoss:
    """open_clip's shape: rank and world_size given at construction, one process by default."""

    def __init__(self, local_loss=False, rank=0, world_size=1):
        self.rank, self.world_size = rank, world_size

    def __call__(self, image_features, text_features):
        return local_clip(image_features, text_features)


def test_positives_offset_by_rank_that_stay_in_the_batch_are_measured_as_wrong_pairs(world2):
    # Rank 1 holds one pair, the third of the batch; its label 1 x 1 points at the second.
    scenario = _scenario(2, 1)
    method = adapt(MNRL.mnrl_rank_offset, "coupled-loss")
    outcome = check_equivalent(world2, method, scenario)
    assert not outcome.equivalent
    causes = coupled_causes(world2, method, scenario, outcome.reference, outcome.got)
    assert causes[0].pattern == "coupled:wrong-positives", causes
    assert "pair 2 (rank 1's pair 0) with pair 1" in causes[0].text
    # The right offset, probed alike, matches every pair with itself.
    right = adapt(MNRL.mnrl_gathered, "coupled-loss")
    assert world2.run_job(matched_on_ranks, (right.shipped(), scenario)) == [
        [(0, 0, 0), (0, 1, 1)],
        [(0, 2, 2)],
    ]


def test_a_loss_built_for_one_process_is_called_out_before_any_world():
    # nccl on this CPU machine could not start a world: the call is refused first.
    with pytest.raises(KindError, match="built with world_size=1"):
        check(ClipLoss(), kind="coupled-loss", world_size=2, backend="nccl")
    with pytest.raises(KindError, match="ClipLoss is a class"):
        check(ClipLoss, kind="coupled-loss", world_size=2, backend="nccl")


def test_a_loss_takes_as_many_feature_tensors_as_negatives_are_drawn():
    def with_hard_negatives(q_reps, p_reps, hard_negatives):
        return local_clip(q_reps, p_reps)

    with pytest.raises(KindError, match="negatives=1"):
        check(with_hard_negatives, kind="coupled-loss", world_size=2, backend="nccl")


@settings(max_examples=60, database=None)
@given(coupled_scenarios(world_size=3, learned=("logit_scale",)))
def test_coupled_scenarios_hold_pairs_on_one_micro_batch_per_rank(scenario):
    assert scenario.loss == "coupled" and scenario.model.learned == ("logit_scale",)
    assert all(len(sizes) == 1 for sizes in scenario.schedule[0])
    assert scenario.global_batch(0) >= 1


def test_coupled_scenarios_draw_ranks_with_no_pair_and_keep_even_batches_even():
    empty = find(coupled_scenarios(world_size=2), lambda s: 0 in s.samples(0))
    assert empty.samples(0) in ([1, 0], [0, 1])
    even = find(coupled_scenarios(world_size=2, even=True), lambda s: s.global_batch(0) > 2)
    assert len(set(even.samples(0))) == 1
    with pytest.raises(InvalidArgument, match="a 16-bit one is not measured"):
        coupled_scenarios(world_size=2, dtypes=("bfloat16",)).example()


def test_a_coupled_scenario_that_accumulates_says_its_negatives_come_from_each_micro_batch():
    scenario = Scenario(
        world_size=2,
        schedule=(((1, 2), (2, 1)),),
        model=ModelSpec(kind="towers", hidden=()),
        loss="coupled",
    )
    assert "in-batch negatives come from each micro-batch" in scenario.describe()
    assert "in-batch" not in _scenario(1, 2).describe()


@pytest.mark.parametrize(
    ("bounds", "says"),
    [
        ({"models": None}, "models chooses the models or losses other kinds train"),
        ({"objective": "sum"}, "objective chooses"),
        ({"same_micro_batch_counts": False}, "hold as many micro-batches"),
        ({"tower": 1}, "'tower' is not a scenario bound of a coupled-loss check"),
    ],
)
def test_bounds_a_coupled_loss_does_not_draw_are_refused_before_any_world(bounds, says):
    with pytest.raises(KindError, match=says):
        check(local_clip, kind="coupled-loss", world_size=2, backend="nccl", **bounds)
    with pytest.raises(KindError, match="negatives=1 shapes the encoder"):
        check(
            load("grad_sync").sample_weighted, kind="grad-sync", world_size=2, backend="nccl",
            negatives=1,
        )  # fmt: skip


def test_in_float32_a_coupled_loss_is_held_to_its_own_reordered_runs_on_one_rank(world2):
    scenario = dataclasses.replace(_scenario(2, 1), dtype="float32")
    right = check_equivalent(world2, adapt(MNRL.mnrl_gathered, "coupled-loss"), scenario)
    assert right.equivalent, right.report()
    # Measured as far as the verdict needs: within the first run's bound, so that run alone.
    assert isinstance(right.tolerance, TrainingOnlyMeasured) and right.tolerance.runs == 1
    every = check_equivalent(
        world2, adapt(MNRL.mnrl_gathered, "coupled-loss"), scenario, measure_all=True
    )
    assert every.equivalent and every.tolerance.runs == 8
    # The bound is float32's rounding, far below what a per-rank mean does to the gradient;
    # a result outside the first run's bound is judged against all eight, as measure_all is.
    wrong = check_equivalent(world2, adapt(MNRL.mnrl_rank_mean, "coupled-loss"), scenario)
    assert not wrong.equivalent and wrong.tolerance.runs == 8
    wrong_every = check_equivalent(
        world2, adapt(MNRL.mnrl_rank_mean, "coupled-loss"), scenario, measure_all=True
    )
    assert str(wrong.mismatch) == str(wrong_every.mismatch)
    assert wrong.tolerance.bounds == wrong_every.tolerance.bounds  # the same eight runs
    # Rounded scenarios step with optimizers that follow the gradient's size.
    drawn = coupled_scenarios(world_size=2, dtypes=("float32",))
    with pytest.raises(NoSuchExample):
        find(drawn, lambda s: s.optimizer.name in ("adam", "adamw"), settings=settings(
            max_examples=200, database=None))  # fmt: skip
    assert find(coupled_scenarios(world_size=2), lambda s: s.optimizer.name == "adam")


def test_variants_trained_after_the_first_are_the_ones_a_single_job_trains(world2):
    # A staged bound trains variant 0 first and the rest only when asked: the same runs.
    scenario = dataclasses.replace(_scenario(3, 2), dtype="float32")
    shipped = adapt(MNRL.mnrl_gathered, "coupled-loss").shipped()
    whole = world2.solo.run_job(train_whole_variants, (shipped, scenario, 8))[0]
    later = world2.solo.run_job(train_whole_variants, (shipped, scenario, 8, 1))[0]
    assert [run.losses for run in later] == [run.losses for run in whole[1:]]
    assert len({tuple(run.losses) for run in whole}) > 1  # the variants do differ


@pytest.mark.parametrize(
    ("fn", "micro_batches", "pattern"),
    [
        ("open_clip_losses.clip_loss_default", ((1, 2), (1, 2)), "coupled:local-gradient"),
        ("sentence_transformers_losses.mnrl_rank_mean", ((2, 1), (1, 2)), "coupled:ranks-equal"),
        (
            "sentence_transformers_losses.mnrl_rank_offset_wrapped",
            ((2, 1), (1, 2)),
            "coupled:wrong-positives",
        ),
        (
            "open_clip_losses.clip_loss_local_without_grad",
            ((2, 1), (2, 1)),
            "coupled:constant-features",
        ),
    ],
)
def test_the_probes_read_ranks_that_accumulate_several_micro_batches(
    world2, fn, micro_batches, pattern
):
    # Each micro-batch is its own set of in-batch negatives, on the ranks and in the reference.
    module, name = fn.split(".")
    scenario = dataclasses.replace(
        _scenario(1, 1, learned=("logit_scale",) if "clip" in name else ()),
        schedule=(micro_batches,),
    )
    method = adapt(getattr(load(f"real_style/{module}"), name), "coupled-loss")
    outcome = check_equivalent(world2, method, scenario)
    assert not outcome.equivalent
    causes = coupled_causes(world2, method, scenario, outcome.reference, outcome.got)
    assert causes[0].pattern == pattern, causes
