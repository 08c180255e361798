"""torch's optimizers and gradient clipping, held to the published rules the reference is
built on (:mod:`ddp_verify.engine.optimizers`, which imports nothing of ``torch.optim`` or
``torch.nn.utils``): every implementation torch has (the for-loop, foreach and, where it
exists, fused paths), and ``clip_grad_norm_`` with and without foreach, its total norm and
each gradient it leaves. The other properties compare the ranks with that reference, so a
regression here would move both sides alike; this is where it fails."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance.implementations import IMPLEMENTATIONS
from ddp_verify.engine.models import optimizer_settings, scheduling, torch_param_groups
from ddp_verify.engine.optimizers import ReferenceOptimizer, clip_total_norm
from ddp_verify.engine.scenario import OPTIMIZERS, OptimizerSpec
from ddp_verify.engine.strategies import optimizers

# Parameter shapes: a matrix, a vector, a scalar-like one, as a model's layers give them.
SHAPES = ((3, 4), (4,), (1,))
# Bit-for-bit agreement is not promised (torch orders its operations its own way); a wrong
# rule is off by far more than float64's rounding over a few steps.
RTOL, ATOL = 1e-10, 1e-13


def _parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=torch.float64))
        for shape in SHAPES
    ]


def _gradients(seed: int, steps: int) -> list[list[torch.Tensor | None]]:
    """Per step, a gradient for each parameter; the last parameter gets none at odd steps (a
    parameter a step did not reach: no update, and Adam's step count for it does not move)."""
    generator = torch.Generator().manual_seed(seed + 1)
    return [
        [
            None
            if i == len(SHAPES) - 1 and step % 2
            else torch.randn(shape, generator=generator, dtype=torch.float64)
            for i, shape in enumerate(SHAPES)
        ]
        for step in range(steps)
    ]


def _torch_optimizer(
    spec: OptimizerSpec, params: list[torch.nn.Parameter], implementation: str
) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_settings(spec)
    try:
        groups = torch_param_groups(spec, params)
        optimizer = cls(groups, **kwargs, **IMPLEMENTATIONS[implementation])
    except (RuntimeError, ValueError, TypeError) as exc:  # no such path in this torch
        pytest.skip(f"{cls.__name__} has no {implementation} implementation here: {exc}")
    # A learning rate edited in param_groups between steps (a scheduler) must be followed,
    # in each group (the vectors' group has its own learning rate and no weight decay).
    return scheduling(spec, optimizer)


CASES = st.tuples(
    optimizers(clip=False, schedules=True, groups=True), st.integers(0, 2**16), st.integers(1, 4)
)
# Every setting at once, for each optimizer, never left to the draw: momentum (SGD), weight
# decay, a decaying learning rate and two param groups with settings of their own.
EVERY_SETTING = [
    (
        OptimizerSpec(
            name,
            lr=0.05,
            momentum=0.9 if name == "sgd" else 0.0,
            weight_decay=0.01,
            lr_decay=0.5,
            param_groups=2,
        ),
        0,
        3,
    )
    for name in OPTIMIZERS
]


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_torch_optimizers_follow_the_published_rules(prove, implementation):
    def check(case):
        spec, seed, steps = case
        mine, theirs = _parameters(seed), _parameters(seed)
        reference = ReferenceOptimizer(spec, mine)
        optimizer = _torch_optimizer(spec, theirs, implementation)
        for step, grads in enumerate(_gradients(seed, steps)):
            for params in (mine, theirs):
                for p, g in zip(params, grads, strict=True):
                    p.grad = None if g is None else g.clone()
            reference.step()
            optimizer.step()
            for i, (want, got) in enumerate(zip(mine, theirs, strict=True)):
                torch.testing.assert_close(
                    got,
                    want,
                    rtol=RTOL,
                    atol=ATOL,
                    msg=lambda m, i=i, step=step: (
                        f"{type(optimizer).__name__} ({implementation}) {spec.describe()}: "
                        f"parameter {i} (shape {SHAPES[i]}) after step {step} is not what the "
                        f"published rule gives.\n{m}"
                    ),
                )

    prove(CASES, check, examples=EVERY_SETTING)


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
def test_clip_grad_norm_follows_its_definition(prove, foreach):
    def check(case):
        max_norm, seed, scale = case
        (grads,) = _gradients(seed, 1)
        mine, theirs = _parameters(seed), _parameters(seed)
        for params in (mine, theirs):
            for p, g in zip(params, grads, strict=True):
                p.grad = None if g is None else g * scale
        want = clip_total_norm(mine, max_norm)
        got = torch.nn.utils.clip_grad_norm_(theirs, max_norm, foreach=foreach)
        assert float(got) == pytest.approx(want, rel=RTOL), (
            f"clip_grad_norm_(foreach={foreach}) returned the total norm {float(got)!r}, the "
            f"gradients' 2-norm is {want!r}"
        )
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            torch.testing.assert_close(
                b.grad,
                a.grad,
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, i=i: (
                    f"clip_grad_norm_(max_norm={max_norm}, foreach={foreach}) left gradient {i} "
                    f"(scaled {scale}, total norm {want:.6g}) other than its definition.\n{m}"
                ),
            )

    # Gradients small and large against the bound: clipped, and left alone.
    scales = st.sampled_from((1e-3, 0.1, 1.0, 10.0))
    prove(st.tuples(st.sampled_from((0.1, 1.0, 5.0)), st.integers(0, 2**16), scales), check)


def _p_norm(grads: list[torch.Tensor], norm_type: float) -> float:
    """The total ``norm_type``-norm of ``grads``, from its definition, in float64."""
    values = torch.cat([g.detach().double().reshape(-1) for g in grads]).abs()
    if norm_type == math.inf:
        return float(values.max())
    return float((values**norm_type).sum() ** (1.0 / norm_type))


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
def test_clip_grad_norm_follows_its_definition_in_every_norm(prove, foreach):
    def check(case):
        max_norm, norm_type, seed, scale, count, form = case
        (grads,) = _gradients(seed, 1)
        # One parameter, or several: a lone tensor takes paths of its own.
        params, grads = _parameters(seed)[:count], grads[:count]
        given = [g * scale for g in grads if g is not None]
        for p, g in zip(params, grads, strict=True):
            p.grad = None if g is None else g * scale
        want = _p_norm(given, norm_type)
        # The documented forms: a lone tensor where it is one, 'inf' as a string, and the two
        # halves clip_grad_norm_ is documented as (get_total_norm, then clip_grads_with_norm_).
        what: Any = params[0] if form == "tensor" and count == 1 else params
        kind: Any = "inf" if form == "string" and math.isinf(norm_type) else norm_type
        if form == "halves":
            got = torch.nn.utils.get_total_norm(
                [p.grad for p in params if p.grad is not None], kind, foreach=foreach
            )
            torch.nn.utils.clip_grads_with_norm_(what, max_norm, got, foreach=foreach)
        else:
            got = torch.nn.utils.clip_grad_norm_(what, max_norm, norm_type=kind, foreach=foreach)
        said = (f"clip_grad_norm_(max_norm={max_norm}, norm_type={kind!r}, foreach={foreach}, "
                f"given as {form})")  # fmt: skip
        assert float(got) == pytest.approx(want, rel=RTOL), (
            f"{said} returned the total norm {float(got)!r}; the gradients' "
            f"{norm_type}-norm is {want!r}"
        )
        # torch's documented coefficient: max_norm / (total + 1e-6), applied where below 1.
        coefficient = min(1.0, max_norm / (want + 1e-6))
        kept = [p.grad for p in params if p.grad is not None]
        for i, (g, before) in enumerate(zip(kept, given, strict=True)):
            torch.testing.assert_close(
                g,
                before * coefficient,
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, i=i: f"{said} left gradient {i} other than its definition.\n{m}",
            )

    norms = st.sampled_from((1.0, 2.0, 3.0, math.inf))
    scales = st.sampled_from((1e-3, 1.0, 10.0))
    counts = st.integers(1, len(SHAPES))
    # get_total_norm and clip_grads_with_norm_ are newer than some torch the suite runs on.
    halves = hasattr(torch.nn.utils, "get_total_norm")
    forms = st.sampled_from(("list", "tensor", "string", *(("halves",) if halves else ())))
    cases = st.tuples(
        st.sampled_from((0.1, 1.0, 5.0)), norms, st.integers(0, 2**16), scales, counts, forms
    )
    prove(
        cases,
        check,
        examples=[
            (1.0, 2.0, 1, 10.0, 1, "tensor"),
            (1.0, math.inf, 2, 10.0, 3, "string"),
            (0.1, 3.0, 3, 10.0, 3, "halves" if halves else "list"),
        ],
    )


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_clip_grad_norm_raises_on_a_nonfinite_norm_only_when_asked(foreach, bad):
    def params():
        made = _parameters(0)
        for p in made:
            p.grad = torch.ones_like(p)
        made[0].grad.view(-1)[0] = bad
        return made

    raised: RuntimeError | None = None
    try:
        torch.nn.utils.clip_grad_norm_(params(), 1.0, error_if_nonfinite=True, foreach=foreach)
    except RuntimeError as exc:
        raised = exc
    assert raised is not None and "non-finite" in str(raised), (
        f"clip_grad_norm_(error_if_nonfinite=True, foreach={foreach}) on gradients holding "
        f"{bad} did not raise the documented RuntimeError (got {raised!r})"
    )
    total = torch.nn.utils.clip_grad_norm_(params(), 1.0, error_if_nonfinite=False, foreach=foreach)
    assert not math.isfinite(float(total)), (
        f"clip_grad_norm_(foreach={foreach}) returned {float(total)} for gradients holding "
        f"{bad}: the norm is not finite"
    )


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
def test_clip_grad_norm_of_no_gradients_is_zero_and_warns_on_an_empty_generator(foreach):
    # The documented "Iterable[Tensor]" includes a generator (model.parameters()) and one with
    # nothing in it: the norm of no gradients is 0, nothing is clipped, and an empty generator
    # (a model's parameters() already consumed) is warned about; a nonempty one is not.
    params = _parameters(0)
    total = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
    assert float(total) == 0.0 and all(p.grad is None for p in params), total
    for empty in ([], ()):
        assert float(torch.nn.utils.clip_grad_norm_(empty, 1.0, foreach=foreach)) == 0.0
    with pytest.warns(UserWarning, match="empty generator"):
        total = torch.nn.utils.clip_grad_norm_((p for p in params[:0]), 1.0, foreach=foreach)
    assert float(total) == 0.0
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    want = _p_norm([p.grad for p in params], 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = torch.nn.utils.clip_grad_norm_((p for p in params), 1.0, foreach=foreach)
    assert float(total) == pytest.approx(want, rel=RTOL), (float(total), want)
    for p in params:
        torch.testing.assert_close(p.grad, torch.full_like(p, 3.0 / (want + 1e-6)),
                                   rtol=RTOL, atol=ATOL)  # fmt: skip
