"""torch's learning-rate schedulers against the schedules their documentation writes out
(closed forms here, nothing of ``torch.optim.lr_scheduler`` computes them): the learning rate
each param group steps with after every scheduler step, ``get_last_lr()``, and the warning the
documentation gives where ``scheduler.step()`` is called before ``optimizer.step()``. A
schedule that drifts by one step, or by a factor, trains another model at every rank alike,
which no comparison of ranks sees."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ddp_verify.conformance.known import known_torch_issue

BASE = (0.1, 0.03)  # two param groups, each its own base learning rate
STEPS = 9


def _optimizer() -> torch.optim.Optimizer:
    a = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    b = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    return torch.optim.SGD([{"params": [a], "lr": BASE[0]}, {"params": [b], "lr": BASE[1]}])


# name -> (how torch builds it, given further keywords; the documented learning rate at
# epoch t from a base lr).
SCHEDULES: dict[str, tuple[Callable[[Any], Any], Callable[[float, int], float]]] = {
    "StepLR": (
        lambda o, **k: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5, **k),
        lambda lr, t: lr * 0.5 ** (t // 3),
    ),
    "MultiStepLR": (
        lambda o, **k: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5], gamma=0.1, **k),
        lambda lr, t: lr * 0.1 ** sum(t >= m for m in (2, 5)),
    ),
    "ExponentialLR": (
        lambda o, **k: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8, **k),
        lambda lr, t: lr * 0.8**t,
    ),
    "LambdaLR": (
        lambda o, **k: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1 / (1 + t), **k),
        lambda lr, t: lr / (1 + t),
    ),
    "LinearLR": (
        lambda o, **k: torch.optim.lr_scheduler.LinearLR(
            o, start_factor=0.25, end_factor=1.0, total_iters=4, **k
        ),
        lambda lr, t: lr * (0.25 + 0.75 * min(t, 4) / 4),
    ),
    "ConstantLR": (
        lambda o, **k: torch.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=3, **k),
        lambda lr, t: lr * (0.5 if t < 3 else 1.0),
    ),
    "CosineAnnealingLR": (
        lambda o, **k: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6, eta_min=0.001, **k),
        lambda lr, t: 0.001 + (lr - 0.001) * (1 + math.cos(math.pi * t / 6)) / 2,
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_scheduler_follows_its_documented_schedule(name):
    make, rule = SCHEDULES[name]
    optimizer = _optimizer()
    scheduler = make(optimizer)
    for t in range(STEPS + 1):
        want = [rule(lr, t) for lr in BASE]
        got = [group["lr"] for group in optimizer.param_groups]
        # CosineAnnealingLR computes its schedule recursively, as its documentation says of
        # it: equal to the closed form up to rounding.
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (
            f"{name}: the learning rates after {t} scheduler step(s) are {got}, the documented "
            f"schedule gives {want}"
        )
        assert scheduler.get_last_lr() == pytest.approx(got, rel=1e-15), name
        optimizer.step()
        scheduler.step()


def test_stepping_the_scheduler_first_is_warned_of_and_the_right_order_is_not():
    for scheduler_first in (True, False):
        optimizer = _optimizer()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                if scheduler_first:
                    scheduler.step()
                    optimizer.step()
                else:
                    optimizer.step()
                    scheduler.step()
        said = [str(w.message) for w in caught if "before `optimizer.step()`" in str(w.message)]
        assert bool(said) == scheduler_first, (scheduler_first, [str(w.message) for w in caught])


def _run_to(name: str, epochs: int) -> tuple[torch.optim.Optimizer, Any]:
    """A run of ``epochs`` epochs under ``name``'s schedule: its optimizer and scheduler."""
    make, _ = SCHEDULES[name]
    optimizer = _optimizer()
    scheduler = make(optimizer)
    for _ in range(epochs):
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


def _runs_on(name: str, optimizer: torch.optim.Optimizer, scheduler: Any, start: int,
             how: str) -> None:  # fmt: skip
    """The learning rates from epoch ``start`` on are the documented schedule's."""
    _, rule = SCHEDULES[name]
    for t in range(start, STEPS + 1):
        want = [rule(lr, t) for lr in BASE]
        got = [group["lr"] for group in optimizer.param_groups]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (
            f"{name} resumed at epoch {start} ({how}): the learning rates at epoch {t} are "
            f"{got}, the documented schedule gives {want}"
        )
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_schedule_resumed_from_its_state_dict_runs_on_as_documented(name):
    # The documented way to resume: the optimizer's and the scheduler's state_dict() saved,
    # and loaded into a fresh optimizer and scheduler built as the run built them.
    make, _ = SCHEDULES[name]
    for start in range(1, STEPS):
        run_optimizer, run_scheduler = _run_to(name, start)
        optimizer = _optimizer()
        scheduler = make(optimizer)
        optimizer.load_state_dict(run_optimizer.state_dict())
        scheduler.load_state_dict(run_scheduler.state_dict())
        _runs_on(name, optimizer, scheduler, start, "load_state_dict")


_RESUMED_AT_A_CHANGE = known_torch_issue(
    "a scheduler built with last_epoch to resume steps once in its constructor; pytorch#102261 "
    "made that step keep the optimizer's loaded learning rate for ExponentialLR, but StepLR, "
    "MultiStepLR and ConstantLR apply their change again where the run stopped on an epoch "
    "that changes the learning rate",
    raises=AssertionError,
    match=r"resumed at epoch \d+ \(last_epoch\)",
    url="https://github.com/pytorch/pytorch/issues/102261 (fixed for ExponentialLR only)",
    repro="findings/lr_scheduler_resume_at_a_boundary.py",
)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=_RESUMED_AT_A_CHANGE)
        if name in ("StepLR", "MultiStepLR", "ConstantLR")
        else name
        for name in SCHEDULES
    ],
)
def test_a_schedule_built_at_a_later_epoch_runs_on_from_it(name):
    # last_epoch, the other way to resume: the optimizer loaded from the run's checkpoint
    # (its learning rates those the run stopped at, its initial_lr the base ones) and the
    # scheduler built with last_epoch = the epochs run - 1, as its constructor's own step
    # brings it to the run's epoch (pytorch#102261): the schedule runs on from there.
    make, _ = SCHEDULES[name]
    for start in range(1, STEPS):
        run_optimizer, _ = _run_to(name, start)
        optimizer = _optimizer()
        optimizer.load_state_dict(run_optimizer.state_dict())
        scheduler = make(optimizer, last_epoch=start - 1)
        assert scheduler.last_epoch == start, (name, start, scheduler.last_epoch)
        _runs_on(name, optimizer, scheduler, start, "last_epoch")


def test_last_epoch_without_initial_learning_rates_is_refused():
    # Resuming needs each group's initial_lr (what a scheduler saved in it); an optimizer
    # that never had a scheduler has none, and the base of the schedule is unknown.
    with pytest.raises(KeyError, match="param 'initial_lr' is not specified in param_groups"):
        torch.optim.lr_scheduler.StepLR(_optimizer(), step_size=3, last_epoch=2)
