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

BASE = (0.1, 0.03)  # two param groups, each its own base learning rate
STEPS = 9


def _optimizer() -> torch.optim.Optimizer:
    a = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    b = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    return torch.optim.SGD([{"params": [a], "lr": BASE[0]}, {"params": [b], "lr": BASE[1]}])


# name -> (how torch builds it, the documented learning rate at epoch t from a base lr).
SCHEDULES: dict[str, tuple[Callable[[Any], Any], Callable[[float, int], float]]] = {
    "StepLR": (
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
        lambda lr, t: lr * 0.5 ** (t // 3),
    ),
    "MultiStepLR": (
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5], gamma=0.1),
        lambda lr, t: lr * 0.1 ** sum(t >= m for m in (2, 5)),
    ),
    "ExponentialLR": (
        lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8),
        lambda lr, t: lr * 0.8**t,
    ),
    "LambdaLR": (
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1 / (1 + t)),
        lambda lr, t: lr / (1 + t),
    ),
    "LinearLR": (
        lambda o: torch.optim.lr_scheduler.LinearLR(
            o, start_factor=0.25, end_factor=1.0, total_iters=4
        ),
        lambda lr, t: lr * (0.25 + 0.75 * min(t, 4) / 4),
    ),
    "ConstantLR": (
        lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=3),
        lambda lr, t: lr * (0.5 if t < 3 else 1.0),
    ),
    "CosineAnnealingLR": (
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6, eta_min=0.001),
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
