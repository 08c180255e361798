"""The user's recipe (issue 62): their own loss, optimizer and scheduler, and the reference a
check then judges by: the engine's loop trained with them, or a training step's own run on
one rank holding the whole batch in one micro-batch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis.errors import InvalidArgument

from ddp_verify import NotEquivalent, Scenario, VerifyingWorld, check
from ddp_verify.engine.compare import compare
from ddp_verify.engine.recipes import RecipeError, losses_it_takes, reference_of
from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import ModelSpec, Recipe
from ddp_verify.engine.strategies import scenarios
from ddp_verify.engine.tolerances import Float64Tolerance
from ddp_verify.engine.trace import Trace
from ddp_verify.methods.base import train_whole_variants
from ddp_verify.methods.equivalence import _on_one_rank
from ddp_verify.usercode.adapters import adapt
from tests.frontends.in_process import ddp_verify_here

HERE = __file__


def smoothed(outputs, targets):
    # A fairseq-style criterion: the summed loss, its sample size, a logging output.
    summed = F.cross_entropy(outputs, targets, label_smoothing=0.1, reduction="sum")
    return summed, len(targets), {"loss": summed.detach()}


def smooth(outputs, targets):
    return F.cross_entropy(outputs, targets, label_smoothing=0.1)


def focal(outputs, targets):
    chosen = F.log_softmax(outputs, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
    return (-((1 - chosen.exp()) ** 2) * chosen).mean()


def adamw(params):
    return torch.optim.AdamW(params, lr=0.02, weight_decay=0.1)


def warmup(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / 4))


def weighted_sync(model, num_samples):
    total = torch.tensor([float(num_samples)], dtype=torch.float64)
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(num_samples)
            dist.all_reduce(p.grad)
            p.grad.div_(total.item())


def averaged_sync(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def _step(
    model, optimizer, micro_batches, loss_fn, scheduler=None, *, per_micro_batch=False, steps=1
):
    optimizer.zero_grad()
    local = sum(len(y) for _, y in micro_batches)
    total = torch.tensor([float(local)], dtype=torch.float64)
    dist.all_reduce(total)
    reported = torch.zeros((), dtype=torch.float64)
    for x, y in micro_batches:
        loss = loss_fn(model(x), y) * len(y)
        loss.backward()
        reported += loss.detach().double()
        if scheduler is not None and per_micro_batch:
            scheduler.step()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(total.item())
    for _ in range(steps):
        optimizer.step()
    if scheduler is not None and not per_micro_batch:
        scheduler.step()
    dist.all_reduce(reported)
    return reported / total.item()


def warmed_up_step(model, optimizer, micro_batches, loss_fn, scheduler):
    return _step(model, optimizer, micro_batches, loss_fn, scheduler)


def warmed_up_per_micro_batch(model, optimizer, micro_batches, loss_fn, scheduler):
    return _step(model, optimizer, micro_batches, loss_fn, scheduler, per_micro_batch=True)


def plain_step(model, optimizer, micro_batches, loss_fn):
    return _step(model, optimizer, micro_batches, loss_fn)


def stepped_twice(model, optimizer, micro_batches, loss_fn):
    # Wrong on one rank as on many: the optimizer steps twice on each step's gradients.
    return _step(model, optimizer, micro_batches, loss_fn, steps=2)


def momentum_sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def amsgrad(params):
    return torch.optim.Adam(params, lr=0.01, amsgrad=True)


def grouped_sgd(params):
    params = list(params)
    return torch.optim.SGD([{"params": params[:1]}, {"params": params[1:], "lr": 0.01}], lr=0.1)


@pytest.fixture(scope="module")
def world2():
    with VerifyingWorld(2) as world:
        yield world


UNEVEN = Scenario(
    world_size=2,
    schedule=(((1, 2), (4,)), ((2,), (1,))),
    model=ModelSpec(out_features=3),
    loss="cross_entropy",
)


def distill(outputs, targets, temperature=2.0):
    # A teacher's logits as the targets: its tempered distribution against the student's.
    student = F.log_softmax(outputs / temperature, dim=-1)
    teacher = F.softmax(targets / temperature, dim=-1)
    return F.kl_div(student, teacher, reduction="batchmean") * temperature**2


def test_a_loss_runs_on_the_target_forms_it_takes_and_nothing_else():
    focal_loss = Recipe(loss=reference_of(focal, "loss"))
    assert losses_it_takes(focal_loss, ("mse", "cross_entropy", "tokens")) == ("cross_entropy",)
    mse = Recipe(loss="torch.nn:MSELoss")
    assert losses_it_takes(mse, ("mse", "cross_entropy")) == ("mse",)
    # Class ids broadcast against as many logits as samples: never probed so.
    kl = Recipe(loss=reference_of(distill, "loss"))
    assert losses_it_takes(kl, ("mse", "cross_entropy", "tokens")) == ("mse",)
    with pytest.raises(RecipeError, match=r"runs on none of the target forms.*--losses"):
        losses_it_takes(focal_loss, ("mse",))


def test_a_callable_no_rank_can_import_is_refused_with_the_fix():
    with pytest.raises(RecipeError, match=r"lambda, a closure.*PATH\.py:NAME"):
        reference_of(lambda o, t: o.sum(), "loss")
    with pytest.raises(InvalidArgument, match="cannot import the optimizer's module"):
        scenarios(world_size=2, optimizer="no_such_module_here:make")
    linear = r"optimizer factory torch\.nn:Linear failed.*TypeError"
    with pytest.raises(InvalidArgument, match=linear):
        scenarios(world_size=2, optimizer="torch.nn:Linear")


def test_a_tuple_criterion_is_its_sum_over_its_count():
    recipe = Recipe(loss=reference_of(smoothed, "loss"))
    scenario = dataclasses.replace(UNEVEN, recipe=recipe)
    harness = dataclasses.replace(UNEVEN, recipe=Recipe())
    # Label smoothing moves the loss: the recipe's reference is not the harness's own.
    ours, theirs = train_reference(scenario, "float64"), train_reference(harness, "float64")
    assert abs(ours.ranks[0].losses[0] - theirs.ranks[0].losses[0]) > 1e-3
    outputs = torch.randn(3, 3, dtype=torch.float64)
    targets = torch.tensor([0, 2, 1])
    from ddp_verify.engine.recipes import mean_loss

    mean = mean_loss(recipe, len)(outputs, targets)
    expected = F.cross_entropy(outputs, targets, label_smoothing=0.1)
    assert torch.allclose(mean, expected)


def test_code_trained_with_the_users_loss_and_optimizer_is_judged_by_the_engines_loop(world2):
    from ddp_verify.methods.equivalence import check_equivalent

    recipe = Recipe(
        loss=reference_of(smoothed, "loss"),
        optimizer=reference_of(adamw, "optimizer"),
        scheduler=reference_of(warmup, "scheduler"),
    )
    scenario = dataclasses.replace(UNEVEN, recipe=recipe)
    right = check_equivalent(world2, adapt(weighted_sync, "grad-sync"), scenario)
    assert right.equivalent, right
    assert "your loss" in right.reference.method and "scheduler" in right.reference.method
    wrong = check_equivalent(world2, adapt(averaged_sync, "grad-sync"), scenario)
    assert not wrong.equivalent
    assert "Judged against: the reference (one process, the whole batch" in wrong.report()


def test_a_steps_own_reference_agrees_with_the_oracle_where_both_apply():
    # The harness's mse is torch's MSELoss on one output: the step's own run on one rank,
    # with MSELoss handed in as the user's loss, must train what the oracle trains.
    scenario = Scenario(world_size=2, schedule=(((1, 2), (3,)), ((2,), (1,))))
    mine = dataclasses.replace(scenario, recipe=Recipe(loss="torch.nn:MSELoss"))
    method = adapt(plain_step, "step")
    own = _on_one_rank(lambda: train_whole_variants(method, mine, 1))[0]
    oracle = train_reference(scenario, "float64")
    assert compare(oracle, Trace("own", [own]), scenario, Float64Tolerance()) is None
    # And it is a real comparison: another loss trains something else.
    other = dataclasses.replace(scenario, recipe=Recipe(loss="torch.nn:SmoothL1Loss"))
    moved = _on_one_rank(lambda: train_whole_variants(method, other, 1))[0]
    assert compare(oracle, Trace("own", [moved]), scenario, Float64Tolerance()) is not None


def test_a_step_with_its_own_warm_up_is_equivalent_and_judged_against_itself(tmp_path):
    verdict = check(
        warmed_up_step,
        kind="step",
        world_size=2,
        seed=0,
        max_examples=10,
        loss_fn=focal,
        optimizer=adamw,
        scheduler=warmup,
        losses=("cross_entropy",),
    )
    assert verdict.equivalent


def test_a_warm_up_stepped_per_micro_batch_is_named_with_the_references_rate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(
            warmed_up_per_micro_batch,
            kind="step",
            world_size=2,
            seed=0,
            max_examples=25,
            loss_fn=focal,
            optimizer=adamw,
            scheduler=warmup,
            losses=("cross_entropy",),
        )
    verdict = info.value.verdict
    first = verdict.causes[0]
    assert first.pattern == "optimizer:settings", [c.pattern for c in verdict.causes]
    assert "where the reference's (your code on one rank) is" in first.text, first.text
    assert "your code on one rank, the whole batch in one micro-batch" in (
        verdict.outcome.reference.method
    )
    # The reproducer carries the recipe, judges by the same reference, and fails.
    script = Path(verdict.reproducer)
    assert "Recipe(" in script.read_text()
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "your code on one rank" in ran.stdout, ran.stdout


def test_the_command_line_takes_the_recipe_and_says_what_is_wrong(tmp_path):
    target = f"{HERE}:warmed_up_step"
    given = ("--loss-fn", f"{HERE}:focal", "--optimizer", f"{HERE}:adamw")
    options = ("--kind", "step", "--world-size", "2", "--losses", "cross_entropy")
    result = ddp_verify_here("check", target, *options, *given, "--max-examples", "3",
                             cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "takes 'scheduler', the scheduler it steps" in (result.stdout + result.stderr)
    assert "--scheduler PATH.py:FACTORY" in (result.stdout + result.stderr)
    bad = ddp_verify_here("check", target, "--kind", "step", "--loss-fn", "nowhere.py:focal",
                          cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "cannot import the loss's module" in (bad.stdout + bad.stderr)
    good = ddp_verify_here("check", target, "--kind", "step", "--world-size", "2", *given,
                           "--scheduler", f"{HERE}:warmup", "--losses", "cross_entropy",
                           "--max-examples", "3", cwd=tmp_path)  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    assert "equivalent on 3 generated scenarios" in (good.stdout + good.stderr)


def test_the_oracle_says_a_recipe_in_its_own_terms_only_where_it_trains_the_same():
    from ddp_verify.engine.oracle_terms import oracle_scenario

    def given(**parts):
        return oracle_scenario(dataclasses.replace(UNEVEN, recipe=Recipe(**parts)))

    # torch's cross-entropy is the oracle's own loss; label smoothing and focal are not.
    assert given(loss="torch.nn:CrossEntropyLoss") == dataclasses.replace(UNEVEN)
    assert given(loss=reference_of(smoothed, "loss")) is None
    assert given(loss=reference_of(focal, "loss")) is None
    sgd = given(optimizer=reference_of(momentum_sgd, "optimizer"))
    assert sgd is not None and sgd.recipe == Recipe()
    assert (sgd.optimizer.name, sgd.optimizer.lr, sgd.optimizer.momentum) == ("sgd", 0.05, 0.9)
    assert given(optimizer=reference_of(adamw, "optimizer")).optimizer.weight_decay == 0.1
    # Settings and shapes its update rules do not write out; a schedule of the user's.
    assert given(optimizer=reference_of(amsgrad, "optimizer")) is None
    assert given(optimizer=reference_of(grouped_sgd, "optimizer")) is None
    scheduled = reference_of(warmup, "scheduler")
    assert given(loss="torch.nn:CrossEntropyLoss", scheduler=scheduled) is None


def test_references_that_disagree_are_a_harness_error_never_a_verdict(tmp_path):
    from ddp_verify.methods.equivalence import HarnessError, check_equivalent

    # The oracle's own loss, handed in: both references apply, and a step that is wrong on
    # one rank too makes them disagree.
    scenario = dataclasses.replace(UNEVEN, recipe=Recipe(loss="torch.nn:CrossEntropyLoss"))
    with VerifyingWorld(2) as world:
        right = check_equivalent(world, adapt(plain_step, "step"), scenario)
        assert right.equivalent, right
        with pytest.raises(HarnessError, match="the two references disagree") as info:
            check_equivalent(world, adapt(stepped_twice, "step"), scenario)
        assert "check it without the recipe" in str(info.value)
        # A loss the oracle does not train: the step's own run alone judges, and a step that
        # is the same at every world size trains what it trains on one rank.
        smoothing = dataclasses.replace(UNEVEN, recipe=Recipe(loss=reference_of(smooth, "loss")))
        assert check_equivalent(world, adapt(stepped_twice, "step"), smoothing).equivalent
    target = f"{HERE}:stepped_twice"
    cli = ddp_verify_here("check", target, "--kind", "step", "--world-size", "2",
                          "--loss-fn", "torch.nn:CrossEntropyLoss", "--losses", "cross_entropy",
                          "--max-examples", "3", cwd=tmp_path)  # fmt: skip
    assert cli.returncode == 3, cli.stdout + cli.stderr
    assert "the two references disagree" in cli.stdout + cli.stderr


def fussy(outputs, targets):
    if len(targets) > 4:
        raise ValueError("fussy: at most 4 items a batch")
    return F.cross_entropy(outputs, targets)


def test_a_users_loss_that_raises_on_the_whole_batch_is_the_codes_failure(world2):
    from ddp_verify import RankError
    from ddp_verify.methods.equivalence import check_equivalent

    scenario = dataclasses.replace(UNEVEN, recipe=Recipe(loss=reference_of(fussy, "loss")))
    # The ranks' micro-batches hold 4 items at most; the reference's whole batch 7.
    with pytest.raises(RankError, match="fussy: at most 4 items") as info:
        check_equivalent(world2, adapt(weighted_sync, "grad-sync"), scenario)
    assert "the reference" in str(info.value)


def logs_a_mean(outputs, targets):
    summed = F.cross_entropy(outputs, targets, reduction="sum")
    right = (outputs.argmax(-1) == targets).double()
    logging = {"loss": summed.detach(), "accuracy": right.mean(), "correct": right.sum()}
    return summed, len(targets), logging


def returns_a_mean(outputs, targets):
    return F.cross_entropy(outputs, targets), len(targets), {}


def test_what_a_criterion_logs_that_does_not_add_up_is_named():
    from ddp_verify.engine.recipes import criterion_notes

    forms = ("cross_entropy",)
    (note,) = criterion_notes(Recipe(loss=reference_of(logs_a_mean, "loss")), forms)
    assert "'accuracy'" in note and "'correct'" not in note and "reduce_metrics" in note
    assert criterion_notes(Recipe(loss=reference_of(smoothed, "loss")), forms) == ()
    (mean,) = criterion_notes(Recipe(loss=reference_of(returns_a_mean, "loss")), forms)
    assert "first element is not a sum" in mean
    # Said with the verdict, which the logging does not change.
    verdict = check(weighted_sync, kind="grad-sync", world_size=2, seed=0, max_examples=3,
                    loss_fn=logs_a_mean, losses=("cross_entropy",))  # fmt: skip
    assert verdict.equivalent
    assert any("'accuracy'" in n for n in verdict.notes), verdict.notes
    assert "Note: your loss" in verdict.report
