"""``torch.amp.GradScaler`` against what its documentation says it does, written out here:
``scale`` multiplies the loss by the current scale; ``step`` steps the optimizer on the
unscaled gradients unless one is inf or NaN, and skips the step then; ``update`` multiplies
the scale by ``backoff_factor`` after a skipped step and by ``growth_factor`` after
``growth_interval`` steps in a row that were not (a growth factor of at most 1, or a backoff
of at least 1, refused); ``unscale_`` once per optimizer between
updates (a second call is refused); ``state_dict`` carries the schedule to a new scaler; and
``enabled=False`` leaves everything as it would be without a scaler. A scaler that skips a
step it should take, or takes one it should skip, moves every rank alike: no comparison of
ranks sees it."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import strategies as st

LR = 0.1


def _run(scaler: torch.amp.GradScaler, gradients: list[float], explicit_unscale: bool):
    """SGD on one parameter through ``scaler``, one step per gradient value (the loss is the
    parameter's sum times it); the parameters and the scale after each step."""
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    optimizer = torch.optim.SGD([p], lr=LR)
    seen = []
    for g in gradients:
        optimizer.zero_grad()
        scaler.scale((p * torch.tensor(g, dtype=torch.float64)).sum()).backward()
        if explicit_unscale:
            scaler.unscale_(optimizer)  # as before clipping
        scaler.step(optimizer)
        scaler.update()
        seen.append((p.detach().clone(), scaler.get_scale()))
    return seen


def _documented(gradients: list[float], init: float, growth: float, backoff: float,
                interval: int) -> list[tuple[float, float]]:  # fmt: skip
    """(each parameter's value, the scale) after each step, as documented."""
    value, scale, unskipped, out = 1.0, init, 0, []
    for g in gradients:
        if math.isfinite(g * scale):
            value -= LR * g
            unskipped += 1
            if unskipped == interval:
                scale, unskipped = scale * growth, 0
        else:
            scale, unskipped = scale * backoff, 0
        out.append((value, scale))
    return out


GRADIENTS = st.lists(st.sampled_from([1.0, -2.0, 0.5, math.inf, math.nan]), min_size=1,
                     max_size=8)  # fmt: skip
SETTINGS = st.tuples(
    st.sampled_from([2.0**4, 2.0**10]),  # init_scale
    st.sampled_from([2.0, 4.0]),  # growth_factor
    st.sampled_from([0.5, 0.25]),  # backoff_factor
    st.integers(1, 3),  # growth_interval
)


@pytest.mark.parametrize("explicit_unscale", [False, True], ids=["step", "unscale-then-step"])
def test_the_scaler_steps_skips_and_schedules_as_documented(prove, explicit_unscale):
    def check(case):
        gradients, (init, growth, backoff, interval) = case
        scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=growth,
                                      backoff_factor=backoff, growth_interval=interval)  # fmt: skip
        got = _run(scaler, gradients, explicit_unscale)
        want = _documented(gradients, init, growth, backoff, interval)
        for step, ((param, scale), (value, expected_scale)) in enumerate(
            zip(got, want, strict=True)
        ):
            assert scale == expected_scale, (
                f"after step {step} of gradients {gradients} the scale is {scale}, the "
                f"documented schedule gives {expected_scale} (init {init}, growth {growth}, "
                f"backoff {backoff}, interval {interval})"
            )
            torch.testing.assert_close(param, torch.full((3,), value, dtype=torch.float64),
                                       msg=lambda m, step=step: f"after step {step} of "
                                       f"{gradients}: the parameter is not SGD's on the "
                                       f"unscaled finite gradients.\n{m}")  # fmt: skip

    prove(st.tuples(GRADIENTS, SETTINGS), check,
          examples=[([1.0, math.inf, 1.0, 1.0, math.nan, 2.0], (16.0, 2.0, 0.5, 2))])  # fmt: skip


def test_a_disabled_scaler_changes_nothing():
    gradients = [1.0, -2.0, 0.5]
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss = torch.tensor(3.0, dtype=torch.float64)
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    got = _run(scaler, gradients, explicit_unscale=False)
    values = [v for v, _ in _documented(gradients, 1.0, 2.0, 0.5, 10**9)]
    for (param, _), value in zip(got, values, strict=True):
        torch.testing.assert_close(param, torch.full((3,), value, dtype=torch.float64))


def test_a_second_unscale_before_update_is_refused():
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    optimizer = torch.optim.SGD([p], lr=LR)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(p.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(optimizer)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"growth_factor": 1.0}, "The growth factor must be > 1.0."),
        ({"growth_factor": 0.5}, "The growth factor must be > 1.0."),
        ({"backoff_factor": 1.0}, "The backoff factor must be < 1.0."),
        ({"backoff_factor": 2.0}, "The backoff factor must be < 1.0."),
    ],
)
def test_a_schedule_that_cannot_back_off_or_grow_is_refused(settings, words):
    # A growth factor of at most 1 or a backoff of at least 1 would never shrink a scale
    # that overflows (or never grow one): the constructor refuses both, at their edge too.
    with pytest.raises(AssertionError, match=re.escape(words)):
        torch.amp.GradScaler("cpu", **settings)
    # Just inside the edge: accepted.
    torch.amp.GradScaler("cpu", growth_factor=1.0 + 1e-6, backoff_factor=1.0 - 1e-6)


def test_the_state_dict_carries_the_schedule_to_a_new_scaler():
    # Half the run, saved, loaded into a fresh scaler with other settings: the rest follows
    # the saved settings and where the schedule stood (scale and unskipped steps).
    gradients = [1.0, 1.0, math.inf, 1.0, 1.0, 1.0, 1.0]
    settings = {"init_scale": 16.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                "growth_interval": 3}  # fmt: skip
    whole = GradScalerRun(settings).steps(gradients)
    first = GradScalerRun(settings)
    first.steps(gradients[:4])
    second = GradScalerRun({"init_scale": 2.0, "growth_interval": 100})
    second.scaler.load_state_dict(first.scaler.state_dict())
    second.param.data.copy_(first.param.data)
    rest = second.steps(gradients[4:])
    assert [s for _, s in rest] == [s for _, s in whole[4:]]
    for (a, _), (b, _) in zip(rest, whole[4:], strict=True):
        torch.testing.assert_close(a, b)


class GradScalerRun:
    """A parameter, its SGD and a scaler, stepped gradient by gradient."""

    def __init__(self, settings: dict[str, float]) -> None:
        self.param = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.optimizer = torch.optim.SGD([self.param], lr=LR)
        self.scaler = torch.amp.GradScaler("cpu", **settings)

    def steps(self, gradients: list[float]) -> list[tuple[torch.Tensor, float]]:
        out = []
        for g in gradients:
            self.optimizer.zero_grad()
            self.scaler.scale((self.param * g).sum()).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            out.append((self.param.detach().clone(), self.scaler.get_scale()))
        return out


def test_a_schedule_changed_between_steps_runs_on_from_then():
    # set_growth_factor / set_backoff_factor / set_growth_interval change the schedule from the
    # next update; the getters give what is in force.
    gradients = [1.0, 1.0, math.inf, 1.0, 1.0, 1.0]
    run = GradScalerRun({"init_scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                         "growth_interval": 2})  # fmt: skip
    first = run.steps(gradients[:2])
    scaler = run.scaler
    scaler.set_growth_factor(4.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(3)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval()) == (4.0, 0.25, 3)  # fmt: skip
    rest = run.steps(gradients[2:])
    # Documented: two unskipped steps grew 16 to 32; then the inf backs off by 0.25 (8), and
    # three unskipped steps at the new interval grow it by 4 (32).
    want = [s for _, s in _documented(gradients[:2], 16.0, 2.0, 0.5, 2)]
    want += [s for _, s in _documented(gradients[2:], want[-1], 4.0, 0.25, 3)]
    assert [s for _, s in first + rest] == want, ([s for _, s in first + rest], want)
