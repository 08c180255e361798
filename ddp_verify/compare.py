"""Compare traces: ranks with each other, each method with the reference, step by step.

The first divergence is reported the way ``torch.testing.assert_close`` reports a mismatch
(what differs, where, by how much, against what allowance), followed by the scenario.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch

from .scenario import Scenario
from .trace import Layout, Trace, step_lengths

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


@dataclasses.dataclass
class Mismatch:
    """The first place where a trace leaves the reference (or its ranks leave each other)."""

    step: int
    steps: int
    quantity: str  # "parameter", "gradient", "loss", or "rank agreement on <quantity>"
    name: str
    ranks: list[int]
    expected: torch.Tensor
    got: torch.Tensor
    got_rank: int
    allowed: torch.Tensor
    allowance: str
    expected_label: str = "reference"
    note: str = ""

    @property
    def abs_diff(self) -> torch.Tensor:
        return (self.got.double() - self.expected.double()).abs()

    @property
    def rel_diff(self) -> torch.Tensor:
        return self.abs_diff / self.expected.double().abs().clamp_min(1e-300)

    @property
    def max_abs(self) -> float:
        return float(self.abs_diff.max()) if self.abs_diff.numel() else math.nan

    def render(self) -> str:
        where = f"step {self.step} of {self.steps}"
        shape = tuple(self.expected.shape)
        subject = f"{self.quantity} {self.name!r}" + (f" (shape {shape})" if shape else "")
        lines = [f"First divergence: {where}, {subject}, on {_ranks(self.ranks)}"]
        if self.note:
            lines.append(self.note)
            return "\n".join(lines)
        if self.got.shape != self.expected.shape:
            lines.append(
                f"rank {self.got_rank} has shape {tuple(self.got.shape)} where the "
                f"{self.expected_label} has shape {shape}"
            )
            return "\n".join(lines)
        abs_diff, rel_diff = self.abs_diff, self.rel_diff
        bad = outside(self.got, self.expected, self.allowed)
        total = abs_diff.numel()
        count = int(bad.sum())
        lines.append(f"Mismatched elements: {count} / {total} ({100.0 * count / total:.1f}%)")
        i_abs = _argmax(abs_diff)
        i_rel = _argmax(rel_diff)
        lines.append(
            f"Greatest absolute difference: {_g(abs_diff.flatten()[i_abs])} at index "
            f"{_index(i_abs, shape)} (up to {_g(self.allowed.double().flatten()[i_abs])} "
            f"allowed: {self.allowance})"
        )
        lines.append(
            f"Greatest relative difference: {_g(rel_diff.flatten()[i_rel])} at index "
            f"{_index(i_rel, shape)}"
        )
        lines.append(
            f"At the greatest absolute difference: expected {_g(self.expected.flatten()[i_abs])} "
            f"({self.expected_label}), got {_g(self.got.flatten()[i_abs])} (rank {self.got_rank})"
        )
        return "\n".join(lines)


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


def compare(
    reference: Trace, got: Trace, scenario: Scenario, tolerance: Tolerance
) -> Mismatch | None:
    """The first divergence of ``got`` from ``reference`` or among ``got``'s ranks, if any.

    At each step, in order: ranks agree on gradients and parameters; gradients (when both
    traces have them), losses and parameters match the reference.
    """
    steps = scenario.steps
    if got.steps != steps or any(len(r.losses) != steps for r in got.ranks):
        return _structural(0, steps, "trace", f"{got.method} recorded {got.steps} step(s)")
    expected_rank = reference.ranks[0]
    compare_grads = got.has_grads and reference.has_grads
    if _all_within(reference, got, tolerance, compare_grads):
        return None  # what follows would find nothing; it finds and describes divergences
    for step in range(steps):
        quantities = (["gradient"] if compare_grads else []) + ["parameter"]
        for quantity in quantities:
            found = _rank_disagreement(got, quantity, step, steps, tolerance)
            if found:
                return found
        if compare_grads:
            found = _against_reference(
                "gradient",
                step,
                steps,
                expected_rank.grads[step],
                got,
                tolerance,  # type: ignore[index]
            )
            if found:
                return found
        losses = {"loss": torch.tensor(expected_rank.losses[step], dtype=torch.float64)}
        found = _against_reference("loss", step, steps, losses, got, tolerance)
        if found:
            return found
        found = _against_reference(
            "parameter", step, steps, expected_rank.params[step], got, tolerance
        )
        if found:
            return found
    return None


def outside(value: torch.Tensor, expected: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Where ``value`` is further from ``expected`` than ``allowed``; NaN counts as outside
    unless both are NaN (a NaN must never pass for a number)."""
    v, e = value.double(), expected.double()
    inside = ((v - e).abs() <= allowed) | (v == e) | (v.isnan() & e.isnan())
    return ~inside


def _all_within(reference: Trace, got: Trace, tolerance: Tolerance, grads: bool) -> bool:
    """Every rank agrees with rank 0 and with the reference, checked over whole flat traces
    at once: the verdict the per-tensor comparison would reach when it finds nothing."""
    if tolerance.by_name:
        return False  # the allowance may differ from tensor to tensor
    fields = [("params", "parameter")] + ([("grads", "gradient")] if grads else [])
    for field, quantity in fields:
        expected = reference.ranks[0].packed(field)
        packed = [r.packed(field) for r in got.ranks]
        if expected is None or any(p is None for p in packed):
            return False
        shape = _names_and_shapes(expected[0])
        if any(_names_and_shapes(p[0]) != shape for p in packed):  # type: ignore[index]
            return False
        lengths = step_lengths(expected[0])
        flats = torch.stack([p[1] for p in packed])  # type: ignore[index]
        for against in (expected[1], flats[0]):
            allowed = torch.cat(
                [
                    tolerance.allowed(quantity, step, "", part)
                    for step, part in enumerate(against.split(lengths))
                ]
            )
            if bool(outside(flats, against, allowed).any()):
                return False
    losses = torch.tensor(reference.ranks[0].losses, dtype=torch.float64)
    allowed = torch.cat(
        [tolerance.allowed("loss", step, "", loss.view(1)) for step, loss in enumerate(losses)]
    )
    got_losses = torch.tensor([r.losses for r in got.ranks], dtype=torch.float64)
    return not bool(outside(got_losses, losses, allowed).any())


def _names_and_shapes(layout: Layout) -> list[list[tuple[str, object]]]:
    return [[(name, shape) for name, shape, _ in entry] for entry in layout]


def _values(trace: Trace, rank: int, quantity: str, step: int) -> dict[str, torch.Tensor | None]:
    record = trace.ranks[rank]
    if quantity == "gradient":
        return record.grads[step]  # type: ignore[index,return-value]
    if quantity == "loss":
        return {"loss": torch.tensor(record.losses[step], dtype=torch.float64)}
    return record.params[step]  # type: ignore[return-value]


def _against_reference(
    quantity: str,
    step: int,
    steps: int,
    expected: dict[str, torch.Tensor | None],
    got: Trace,
    tolerance: Tolerance,
) -> Mismatch | None:
    worst: Mismatch | None = None
    for name, exp in expected.items():
        failing: list[int] = []
        candidate: Mismatch | None = None
        for rank in range(len(got.ranks)):
            values = _values(got, rank, quantity, step)
            if name not in values:
                return _structural(
                    step, steps, quantity, f"{got.method} has no {quantity} {name!r}"
                )
            value = values[name]
            if (exp is None) != (value is None):
                return _missing(step, steps, quantity, name, rank, exp is None)
            if exp is None or value is None:
                continue
            allowed = tolerance.allowed(quantity, step, name, exp)
            if value.shape != exp.shape or bool(outside(value, exp, allowed).any()):
                failing.append(rank)
                m = Mismatch(
                    step,
                    steps,
                    quantity,
                    name,
                    [],
                    exp,
                    value,
                    rank,
                    allowed,
                    tolerance.describe(),
                )
                if candidate is None or m.max_abs > candidate.max_abs:
                    candidate = m
        if candidate is not None:
            candidate.ranks = failing
            # Report the tensor whose divergence is largest relative to its allowance.
            if worst is None or _severity(candidate) > _severity(worst):
                worst = candidate
    return worst


def _rank_disagreement(
    got: Trace, quantity: str, step: int, steps: int, tolerance: Tolerance
) -> Mismatch | None:
    first = _values(got, 0, quantity, step)
    for rank in range(1, len(got.ranks)):
        values = _values(got, rank, quantity, step)
        for name, base in first.items():
            value = values.get(name)
            if (base is None) != (value is None):
                return _missing(step, steps, quantity, name, rank, base is None, rank_zero=True)
            if base is None or value is None:
                continue
            allowed = tolerance.allowed(quantity, step, name, base)
            if value.shape != base.shape or bool(outside(value, base, allowed).any()):
                differing = [
                    r
                    for r in range(1, len(got.ranks))
                    if not torch.equal(_values(got, r, quantity, step)[name], base)  # type: ignore[arg-type]
                ]
                return Mismatch(
                    step,
                    steps,
                    f"rank agreement on {quantity}",
                    name,
                    differing,
                    base,
                    value,
                    rank,
                    allowed,
                    tolerance.describe(),
                    expected_label="rank 0",
                )
    return None


def _missing(
    step: int,
    steps: int,
    quantity: str,
    name: str,
    rank: int,
    expected_none: bool,
    rank_zero: bool = False,
) -> Mismatch:
    other = "rank 0" if rank_zero else "the reference"
    note = (
        f"rank {rank} has a {quantity} where {other} has none"
        if expected_none
        else f"rank {rank} has no {quantity} where {other} has one"
    )
    empty = torch.zeros(0)
    return Mismatch(step, steps, quantity, name, [rank], empty, empty, rank, empty, "", note=note)


def _structural(step: int, steps: int, quantity: str, note: str) -> Mismatch:
    empty = torch.zeros(0)
    return Mismatch(step, steps, quantity, "", [], empty, empty, 0, empty, "", note=note)


def _severity(m: Mismatch) -> float:
    ratio = m.abs_diff / m.allowed.double().clamp_min(1e-300)
    return float(ratio.max()) if ratio.numel() else math.inf


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


def _argmax(t: torch.Tensor) -> int:
    flat = torch.nan_to_num(t.flatten(), nan=math.inf)
    return int(flat.argmax()) if flat.numel() else 0


def _index(flat_index: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return "()"
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return str(tuple(reversed(idx)))


def _g(value: torch.Tensor | float) -> str:
    return f"{float(value):.6g}"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "every rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
