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

from ddp_verify.conformance.known import known_torch_issue

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


def _documented_shared(
    gradients: list[tuple[float, float]], init: float, growth: float, backoff: float, interval: int
) -> list[tuple[float, float, float]]:
    """Two optimizers, one scaler (AMP's "multiple models, losses and optimizers"): each
    optimizer steps unless its own gradients hold an inf or NaN; the scale backs off once if
    either's did and counts the step towards growth only if neither's did."""
    values, scale, unskipped, out = [1.0, 1.0], init, 0, []
    for pair in gradients:
        finite = [math.isfinite(g * scale) for g in pair]
        for i, g in enumerate(pair):
            if finite[i]:
                values[i] -= LR * g
        if all(finite):
            unskipped += 1
            if unskipped == interval:
                scale, unskipped = scale * growth, 0
        else:
            scale, unskipped = scale * backoff, 0
        out.append((values[0], values[1], scale))
    return out


def test_one_scaler_shared_by_two_optimizers_skips_each_on_its_own_gradients(prove):
    # The scale is updated once an iteration from the infs every optimizer found: a scaler that
    # consulted one optimizer's would grow on an overflow the other saw.
    def check(case):
        gradients, (init, growth, backoff, interval) = case
        params = [torch.nn.Parameter(torch.ones(3, dtype=torch.float64)) for _ in range(2)]
        optimizers = [torch.optim.SGD([p], lr=LR) for p in params]
        scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=growth,
                                      backoff_factor=backoff, growth_interval=interval)  # fmt: skip
        want = _documented_shared(gradients, init, growth, backoff, interval)
        for step, (pair, (a, b, expected_scale)) in enumerate(zip(gradients, want, strict=True)):
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss = sum((p * torch.tensor(g, dtype=torch.float64)).sum()
                       for p, g in zip(params, pair, strict=True))  # fmt: skip
            scaler.scale(loss).backward()
            for optimizer in optimizers:
                scaler.step(optimizer)
            scaler.update()
            said = (f"after step {step} of gradients {gradients} (init {init}, growth {growth}, "
                    f"backoff {backoff}, interval {interval})")  # fmt: skip
            assert scaler.get_scale() == expected_scale, (
                f"{said}: the scale is {scaler.get_scale()}, documented {expected_scale}"
            )
            for i, value in enumerate((a, b)):
                torch.testing.assert_close(
                    params[i].detach(), torch.full((3,), value, dtype=torch.float64),
                    msg=lambda m, i=i, said=said: f"{said}: optimizer {i}'s parameter is not "
                    f"SGD's on its own finite unscaled gradients.\n{m}")  # fmt: skip

    pair = st.tuples(st.sampled_from([1.0, -2.0, math.inf, math.nan]),
                     st.sampled_from([0.5, 3.0, math.inf]))  # fmt: skip
    example = ([(1.0, math.inf), (math.nan, 0.5), (1.0, 0.5)], (16.0, 2.0, 0.5, 1))
    prove(st.tuples(st.lists(pair, min_size=1, max_size=6), SETTINGS), check, examples=[example])


def test_scale_multiplies_each_tensor_of_an_iterable_keeping_its_shape():
    # Documented: "a tensor or list of tensors", "outputs (Tensor or iterable of Tensors)": a
    # list or tuple comes back as one (nested ones too), any other iterable as an iterable.
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    a, b, c = (torch.tensor(v, dtype=torch.float64) for v in (1.0, -2.0, 0.25))
    got = scaler.scale([a, (b, [c])])
    assert isinstance(got, list) and isinstance(got[1], tuple) and isinstance(got[1][1], list)
    for out, x in ((got[0], a), (got[1][0], b), (got[1][1][0], c)):
        torch.testing.assert_close(out, x * 8.0)
    generated = list(scaler.scale(x for x in (a, b)))
    torch.testing.assert_close(generated, [a * 8.0, b * 8.0])
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        scaler.scale([a, 3.0])


def _updated_to(new_scale: float | torch.Tensor) -> tuple[float, float]:
    """The scale after ``update(new_scale)`` on a grown scale, and after one step more."""
    run = GradScalerRun({"init_scale": 16.0, "growth_interval": 1})
    run.steps([1.0])  # grown to 32
    run.optimizer.zero_grad()
    run.scaler.scale(run.param.sum()).backward()
    run.scaler.step(run.optimizer)
    run.scaler.update(new_scale)
    given = run.scaler.get_scale()
    run.steps([1.0])  # the schedule runs on from the scale given
    return given, run.scaler.get_scale()


@pytest.mark.parametrize("new_scale", [4.0, torch.tensor(4.0)], ids=["float", "0-dim"])
def test_update_takes_a_new_scale_as_a_float_or_a_one_element_tensor(new_scale):
    # update(new_scale=...) replaces the scale (no backoff or growth that step), given as a
    # float or as a one-element float tensor without grad; any other tensor is refused.
    assert _updated_to(new_scale) == (4.0, 8.0), new_scale
    words = "new_scale should be a float or a 1-element"
    for bad in (torch.tensor([4.0, 4.0]), torch.tensor(4.0, requires_grad=True)):
        run = GradScalerRun({"init_scale": 16.0})
        run.steps([1.0])
        with pytest.raises(AssertionError, match=words):
            run.scaler.update(bad)


@known_torch_issue(
    "GradScaler.update(new_scale) refuses the 1-element tensor of shape (1,) its documentation "
    "names: the scale is 0-dim and copy_ does not broadcast (1,) into it",
    raises=RuntimeError,
    match=r"output with shape \[\] doesn't match the broadcast shape \[1\]",
    repro="findings/grad_scaler_update_one_element_tensor.py",
)
def test_update_takes_a_new_scale_as_a_tensor_of_shape_one():
    assert _updated_to(torch.tensor([4.0])) == (4.0, 8.0)


def test_calls_out_of_their_documented_order_are_refused():
    # step() once per optimizer between updates, unscale_() before step() and not after, no
    # closure, and an update() or step() with no inf checks behind it: each refused, naming it.
    def scaled():
        run = GradScalerRun({"init_scale": 16.0})
        run.optimizer.zero_grad()
        run.scaler.scale(run.param.sum()).backward()
        return run

    run = scaled()
    run.scaler.step(run.optimizer)
    with pytest.raises(RuntimeError, match=re.escape("step() has already been called since")):
        run.scaler.step(run.optimizer)
    with pytest.raises(RuntimeError, match=re.escape("unscale_() is being called after step()")):
        run.scaler.unscale_(run.optimizer)
    run = scaled()
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        run.scaler.step(run.optimizer, closure=lambda: None)
    run = scaled()
    run.param.grad = None  # nothing to check for infs: a step on it checked nothing
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        run.scaler.step(run.optimizer)
    run = scaled()
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        run.scaler.update()


def test_half_precision_gradients_are_refused_by_unscale():
    # Unscaling float16 gradients in place would lose what the scale protected: refused.
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    optimizer = torch.optim.SGD([p], lr=LR)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(p.float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(optimizer)
