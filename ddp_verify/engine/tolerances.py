"""How far a method's values may be from the reference's: float64 and float32 allowances.

A :class:`Tolerance` answers, for a quantity (gradient, parameter, loss) at a step, how far
each element may be from the reference's; ``describe()`` says it in the words a report uses.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .trace import Trace

# float64. Every method sums the same terms in another order (per micro-batch, per rank, then
# across ranks), which changes a float64 sum by a few units in the last place, ~1e-16 relative.
# Adam and AdamW amplify that: a gradient element that is zero in exact arithmetic but 1e-17
# after rounding moves its parameter by lr * 1e-17 / (sqrt(v) + eps) ~ lr * 1e-9. Measured over
# 600 generated scenarios at world sizes 2 and 3 (DDP and sample-weighted all-reduce against
# the reference), the largest difference was 5.5e-11. The smallest real aggregation bug in the
# same run (the world-size average on an uneven split whose ranks had similar gradients)
# differed by 2.7e-4. The bound sits three orders of magnitude from each:
# |got - expected| <= 1e-8 + 1e-7 * |expected|. tests/engine/test_tolerances.py keeps both
# margins under watch.
FLOAT64_RTOL = 1e-7
FLOAT64_ATOL = 1e-8

# float32 has no fixed bound that fits every model: its rounding error depends on magnitudes
# and on how errors grow through steps. So the bound is measured: run the reference in float32
# and in float64 from bit-identical starting values, and allow the method FLOAT32_SAFETY times
# the float32 reference's own error, never less than FLOAT32_SAFETY units in the last place of
# the largest value. Error and scale are pooled over all tensors of a quantity (gradients,
# parameters, loss) at a step: a gradient that is small because large terms cancel carries the
# rounding error of those terms, which its own magnitude does not show (a conv bias gradient of
# 4e-7 built from terms of 1e-2 missed a per-tensor bound by 10% in testing). Bugs are 1e-3
# relative or more, ~10^4 times float32's unit roundoff.
FLOAT32_SAFETY = 16.0
FLOAT32_EPS = torch.finfo(torch.float32).eps


class Tolerance:
    """How far a method's value may be from the reference's (elementwise).

    ``by_name`` says whether the allowance depends on the tensor's name; when it does not, a
    passing comparison is checked over whole flat traces at once.
    """

    by_name: bool = True

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class Float64Tolerance(Tolerance):
    by_name = False

    def __init__(self, rtol: float = FLOAT64_RTOL, atol: float = FLOAT64_ATOL) -> None:
        self.rtol, self.atol = rtol, atol

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        return self.atol + self.rtol * expected.double().abs()

    def describe(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g} × |expected|, float64 rounding"


class Float32Tolerance(Tolerance):
    """``FLOAT32_SAFETY`` × the float32 reference's own error against the float64 reference,
    pooled per quantity and step."""

    by_name = False

    def __init__(self, reference64: Trace, reference32: Trace, safety: float = FLOAT32_SAFETY):
        self.safety = safety
        errors: dict[tuple[str, int], float] = {}
        scales: dict[tuple[str, int], float] = {}
        for quantity, step, _, exact, rounded in _pairs(reference64, reference32):
            if exact is None or rounded is None or not exact.numel():
                continue
            key = (quantity, step)
            error = float((rounded.double() - exact.double()).abs().max())
            errors[key] = max(errors.get(key, 0.0), error)
            scales[key] = max(scales.get(key, 0.0), float(exact.double().abs().max()))
        self._bounds = {key: safety * max(errors[key], FLOAT32_EPS * scales[key]) for key in errors}

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        bound = self._bounds.get((quantity, step), self.safety * FLOAT32_EPS)
        return torch.full_like(expected, bound, dtype=torch.float64)

    def describe(self) -> str:
        return f"{self.safety:g} × the float32 reference's own error"


def _pairs(
    exact: Trace, rounded: Trace
) -> Iterator[tuple[str, int, str, torch.Tensor | None, torch.Tensor | None]]:
    a, b = exact.ranks[0], rounded.ranks[0]
    for step in range(exact.steps):
        yield "loss", step, "loss", torch.tensor(a.losses[step]), torch.tensor(b.losses[step])
        for name, value in a.params[step].items():
            yield "parameter", step, name, value, b.params[step][name]
        for name, grad in (a.grads[step] if a.grads else {}).items():
            yield "gradient", step, name, grad, (b.grads[step] if b.grads else {}).get(name)
