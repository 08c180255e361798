"""User code that raises, hangs or breaks a collective: a verdict with the reason, in time,
with no process left behind, and the next check works."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from ddp_verify import EquivalenceError, check
from tests.user_code import load


def raises_on_rank_1(model):
    if dist.get_rank() == 1:
        raise RuntimeError("my sync is broken")
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def hangs_on_rank_0(model):
    # An extra collective here would meet the harness's own loss all-reduce and abort in gloo
    # (covered below); a rank that blocks is the hang.
    if dist.get_rank() == 0:
        time.sleep(120)


def mismatched_shapes(model):
    dist.all_reduce(torch.ones(4 if dist.get_rank() == 0 else 8))


correct = load("grad_sync").sample_weighted


@pytest.mark.parametrize(
    ("fn", "words", "timeout"),
    [
        (raises_on_rank_1, "rank 1 raised RuntimeError: my sync is broken", 60),
        (hangs_on_rank_0, "did not finish within the 8 s timeout", 8),
        (mismatched_shapes, "killed by SIGABRT", 60),
    ],
    ids=["raises", "hangs", "gloo-abort"],
)
def test_misbehaving_code_is_a_verdict_with_the_reason(fn, words, timeout):
    with pytest.raises(EquivalenceError) as info:
        check(fn, kind="grad-sync", world_size=2, max_examples=5, timeout=timeout)
    report = str(info.value)
    assert "failed to run on a world of 2" in report and words in report
    if fn is not hangs_on_rank_0:
        assert "did not finish within" not in report  # reported as it happened, not timed out
    assert info.value.scenario is not None
    # The next check in the same process works on a relaunched world.
    verdict = check(correct, kind="grad-sync", world_size=2, max_examples=3, timeout=60)
    assert verdict.examples == 3


def test_the_world_fixture_checks_user_code_too(world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the reproducer is written under the working directory
    verdict = world.check(correct, kind="grad-sync", max_examples=5, seed=3)
    assert (verdict.world_size, verdict.examples) == (world.size, 5)
    with pytest.raises(EquivalenceError, match="Likely cause: gradients summed"):
        world.check(_summing, kind="grad-sync", max_examples=10, seed=3)


def _summing(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def syncs_per_micro_batch(model, optimizer, micro_batches, loss_fn):
    """Right whenever every rank holds as many micro-batches."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.tensor([float(sum(len(x) for x, _ in micro_batches))], dtype=torch.float64)
    dist.all_reduce(total)
    optimizer.zero_grad()
    reported = torch.zeros((), dtype=torch.float64)
    for x, y in micro_batches:
        loss = loss_fn(model(x), y) * (len(x) / total.item())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                dist.all_reduce(g)
                p.grad = g if p.grad is None else p.grad + g
        reported += loss.detach().double()
    optimizer.step()
    dist.all_reduce(reported)
    return reported


def _check_step_on_varied_counts(fn, **options):
    """``check()`` of a step function on schedules whose ranks hold different numbers of
    micro-batches (not the default for steps)."""
    return check(fn, kind="step", world_size=2, seed=0, same_micro_batch_counts=False, **options)


def test_collectives_split_by_different_micro_batch_counts_are_named():
    # Step functions get equal counts by default; asked for varied ones, a function that
    # synchronises per micro-batch leaves some ranks waiting in a collective the others
    # never call.
    with pytest.raises(EquivalenceError) as info:
        _check_step_on_varied_counts(syncs_per_micro_batch, max_examples=10, timeout=8)
    cause = info.value.cause
    assert cause is not None and "different numbers of micro-batches" in cause, cause
    counts = [len(sizes) for step in info.value.scenario.schedule for sizes in step]
    assert len(set(counts)) > 1
    assert "same_micro_batch_counts=True" in str(info.value)
    # With the counts a training loop gives, the same function is right.
    verdict = check(syncs_per_micro_batch, kind="step", world_size=2, max_examples=10, seed=0)
    assert verdict.examples == 10


def raises_on_uneven_counts(model, optimizer, micro_batches, loss_fn):
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(micro_batches))  # one collective per step: no hang
    if len(set(counts)) > 1:
        raise ValueError("my own bug")
    return syncs_per_micro_batch(model, optimizer, micro_batches, loss_fn)


def test_a_plain_exception_is_not_blamed_on_micro_batch_counts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a reproducer would be written
    with pytest.raises(EquivalenceError, match="my own bug") as info:
        _check_step_on_varied_counts(raises_on_uneven_counts, max_examples=50, timeout=60)
    counts = [len(sizes) for step in info.value.scenario.schedule for sizes in step]
    assert len(set(counts)) > 1  # the counts differed, yet they are not blamed
    assert info.value.cause is None
