"""How far a gradient-compressing communication hook may move training from the reference.

``fp16_compress_hook`` and ``bf16_compress_hook`` divide each rank's bucket by the world size,
cast it to the format, all-reduce it there and cast the sum back. Casting rounds each rank's
contribution ``c_i`` by at most ``u |c_i|`` (``u`` the format's unit roundoff: 2**-11 for
float16, 2**-8 for bfloat16) and the sum in the format rounds at most ``world_size - 1`` times,
so a gradient element is off by at most about ``world_size * u * sum_i |c_i|``, plus, for
float16, ``world_size`` times its smallest subnormal where contributions underflow.
Contributions can be far larger than their sum (two ranks' cross-entropy bias gradients of
+-0.5 summing to 0.002), so ``sum_i |c_i|`` is computed here: the reference's training is
replayed and, at each step, every rank's share ``n_i / N * g_i`` of the global gradient is
taken at the reference's parameters. At the first step, where the ranks' parameters are the
reference's, the bound is per element (``sum_i |c_i|`` of that element): a hook that is off by
more than rounding anywhere (a low-rank approximation, 118% off on a small element) fails it.
Later steps' gradients are taken at parameters the rounding already moved, so, as for float32
(see :mod:`ddp_verify.engine.tolerances`), their scale is pooled per step (the largest element
over all gradients).

A rounding can also move a later step's gradient by more than rounding: where an activation is
not smooth (a ReLU at its kink), parameters a rounding moved a little can put a unit on the
other side, and the run's next gradients are another function's. So a run the bound above
refuses is judged once more along its own parameters (``along=``): each step's reference
gradient and loss are taken at the parameters the run started that step from, each
element held to its own contributions there, as the first step's are. A hook that is off by
more than rounding is off at some step from its own parameters; a correct one never is.

Parameters move by ``lr`` times the gradient error; with momentum (``mu <= 1``) an error made
at step ``k`` is in every update from ``k`` on, so the error at step ``s`` is at most
``lr * sum_k (s - k + 1) * grad_bound(k)``. That holds for SGD (with momentum and weight
decay) only: Adam divides by the gradient's running magnitude, so a near-zero element whose
sign rounding flips moves by up to ``lr``, whatever the format. Losses are allowed
``world_size * u`` of their size. Every bound is multiplied by ``COMPRESSION_SAFETY`` for what
the analysis leaves out (gradients taken at already-perturbed parameters).
"""

from __future__ import annotations

import dataclasses

import torch

from .compare import compare
from .outcome import Outcome
from .scenario import Scenario
from .tolerances import FLOAT64_ATOL, Tolerance
from .trace import Trace
from .training import Step, train

COMPRESSION_SAFETY = 4.0
FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def unit_roundoff(fmt: str) -> float:
    """Half the distance from 1 to the next number of ``fmt``: 2**-11 (float16), 2**-8
    (bfloat16)."""
    return torch.finfo(FORMATS[fmt]).eps / 2


class CompressionTolerance(Tolerance):
    """The allowance for a hook that all-reduces gradients in ``fmt`` (see module docstring).

    Example::

        tolerance = CompressionTolerance(scenario, "float16")
        outcome = world.check_equivalent(method, scenario, tolerance=tolerance)
    """

    # The first step's bound is per element, of each gradient by name.
    by_name = True

    def __init__(
        self,
        scenario: Scenario,
        fmt: str,
        *,
        safety: float = COMPRESSION_SAFETY,
        along: Trace | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
        if scenario.optimizer.name != "sgd":
            raise ValueError(
                f"a compression tolerance is derived for SGD only, not {scenario.optimizer.name}"
                ": Adam turns a gradient's rounding into a step of up to lr"
            )
        self.fmt, self.safety = fmt, safety
        u, size = unit_roundoff(fmt), scenario.world_size
        # float16's smallest subnormal, 2**-24: the absolute step of a contribution too small
        # to be normal. bfloat16 has float32's range.
        underflow = size * 2.0**-24 if fmt == "float16" else 0.0
        self.unit = safety * size * u
        self.along = along is not None
        sums, self.reference = contributions(scenario, along)
        scales = [_largest(s) for s in sums]
        self._grad = [self.unit * scale + safety * underflow + FLOAT64_ATOL for scale in scales]
        # Per element at the first step, and at every step when taken along the run's own
        # parameters (then no step's gradients were taken where a rounding moved them).
        self._by_element = [
            {
                name: self.unit * total + safety * underflow + FLOAT64_ATOL
                for name, total in s.items()
            }
            for s in (sums if self.along else sums[:1])
        ]
        lr = scenario.optimizer.lr
        self._param = [
            FLOAT64_ATOL + lr * sum((s - k + 1) * self._grad[k] for k in range(s + 1))
            for s in range(scenario.steps)
        ]

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        element = None
        if quantity == "gradient" and step < len(self._by_element):
            element = self._by_element[step].get(name)
        if element is not None and element.shape == expected.shape:
            return element.to(device=expected.device, dtype=torch.float64)
        if quantity == "gradient":
            bound = self._grad[step]
        elif quantity == "parameter":
            bound = self._param[step]
        else:
            return FLOAT64_ATOL + self.unit * expected.double().abs()
        return torch.full_like(expected, bound, dtype=torch.float64)

    def describe(self) -> str:
        where = (
            "per element at every step, taken along the run's own parameters"
            if self.along
            else "per element at the first step, the largest at later ones"
        )
        return (
            f"{self.fmt} compression: {self.safety:g} × world size × unit roundoff "
            f"{unit_roundoff(self.fmt):.3g} × the sum of the ranks' |contributions| ({where}; "
            "parameters: lr × the gradient bounds so far)"
        )


def along_the_run(outcome: Outcome, fmt: str) -> Outcome:
    """``outcome`` (a run held to :class:`CompressionTolerance` against the reference), judged
    once more along the run's own parameters where that bound refused it: the reference
    taken from the parameters the run started each step from, every gradient element held to
    its own contributions there. Returned as it is where it passed, or where there is no
    run to follow.

    Example::

        outcome = along_the_run(world.check_equivalent(method, scenario, tolerance=bound), fmt)
    """
    got = outcome.got
    if outcome.equivalent or not got.ranks or not got.ranks[0].params:
        return outcome
    along = CompressionTolerance(outcome.scenario, fmt, along=got)
    assert along.reference is not None  # taken along the run: its own reference
    mismatch = compare(along.reference, got, outcome.scenario, along)
    return dataclasses.replace(
        outcome, reference=along.reference, mismatch=mismatch, tolerance=along
    )


def contribution_scales(
    scenario: Scenario, first: dict[str, torch.Tensor] | None = None
) -> list[float]:
    """Per step, the largest element of ``sum_i |n_i / N * g_i|`` over every gradient: the
    size of what the ranks add up, whatever cancels in the sum (reference training, float64).
    ``first`` is filled with the first step's sums themselves, by parameter name.

    Example::

        contribution_scales(scenario)  # [0.51, 0.47] for a two-step scenario
    """
    sums, _ = contributions(scenario)
    if first is not None and sums:
        first.update(sums[0])
    return [_largest(s) for s in sums]


def _largest(sums: dict[str, torch.Tensor]) -> float:
    """The largest element of a step's sums, over every parameter."""
    return max((float(t.max()) for t in sums.values() if t.numel()), default=0.0)


def contributions(
    scenario: Scenario, along: Trace | None = None
) -> tuple[list[dict[str, torch.Tensor]], Trace | None]:
    """Per step and parameter, ``sum_i |n_i / N * g_i|`` element by element, from reference
    training in float64; ``along`` a run's trace, each step taken from the parameters that
    run started it from (its rank 0's), and that reference trace returned too (else None).

    Example::

        sums, _ = contributions(scenario)
        sums[0]["head.weight"]  # tensor of the first step's sums
    """
    sums: list[dict[str, torch.Tensor]] = []
    starts = along.ranks[0].params if along is not None else []

    def measure_then_full_batch(step: Step) -> list[float]:
        named = [(n, p) for n, p in step.model.named_parameters() if p.requires_grad]
        if 0 < step.index <= len(starts):
            # The run's own parameters: its momentum stays the reference's own.
            with torch.no_grad():
                for name, p in step.model.named_parameters():
                    p.copy_(starts[step.index - 1][name].to(p))
        params = [p for _, p in named]
        total = [torch.zeros_like(p) for p in params]
        for rank in range(scenario.world_size):
            step.model.zero_grad(set_to_none=True)
            batch = step.rank_batch(rank)
            share = step.share(batch)
            (step.loss(step.model, batch) * share).backward()
            for acc, p in zip(total, params, strict=True):
                if p.grad is not None:
                    acc.add_(p.grad.abs())
        sums.append(
            {name: t.detach().double().cpu() for (name, _), t in zip(named, total, strict=True)}
        )
        step.model.zero_grad(set_to_none=True)
        loss = step.loss(step.model, (step.inputs, step.targets))
        loss.backward()
        return [loss.item()]

    name = "the reference along the run" if along is not None else "contribution scales"
    trace = train(scenario, measure_then_full_batch, dtype="float64", name=name)
    return sums, (trace if along is not None else None)
