"""Compare traces: ranks with each other, each method with the reference, step by step.

The first divergence is reported the way ``torch.testing.assert_close`` reports a mismatch
(what differs, where, by how much, against what allowance), followed by the scenario. How
much is allowed is :mod:`ddp_verify.engine.tolerances`' business.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .scenario import Scenario
from .tolerances import Tolerance
from .trace import Layout, RankTrace, Trace, step_lengths


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
        # A missing tensor has no shape to show (the placeholder's (0,) would mislead).
        shown = shape and not self.note
        subject = f"{self.quantity} {self.name!r}" + (f" (shape {shape})" if shown else "")
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


def compare(
    reference: Trace, got: Trace, scenario: Scenario, tolerance: Tolerance
) -> Mismatch | None:
    """The first divergence of ``got`` from ``reference`` or among ``got``'s ranks, if any.

    At each step, in order: ranks agree on gradients and parameters; gradients (when both
    traces have them), losses and parameters match the reference.
    """
    return compare_traces(reference, got, scenario.steps, tolerance)


def only_the_loss_differs(reference: Trace, got: Trace, steps: int, tolerance: Tolerance) -> bool:
    """Whether ``got`` trains what ``reference`` trains (its gradients and parameters within
    ``tolerance`` at every step) while the loss it reports differs: a logging mistake, not a
    training one.

    Example::

        only_the_loss_differs(reference, got, 3, Float64Tolerance())  # True for a rank-local
                                                                       # logged loss
    """
    if compare_traces(reference, got, steps, tolerance) is None:
        return False
    expected = reference.ranks[0].losses
    as_reported = Trace(
        got.method,
        [dataclasses.replace(r, losses=list(expected[: len(r.losses)])) for r in got.ranks],
    )
    return compare_traces(reference, as_reported, steps, tolerance) is None


def compare_traces(
    reference: Trace, got: Trace, steps: int, tolerance: Tolerance
) -> Mismatch | None:
    """:func:`compare` for traces of ``steps`` steps that no scenario describes (a whole
    training script's recordings).

    Example::

        mismatch = compare_traces(reference, got, 3, Float64Tolerance())
    """
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
        if compare_grads and expected_rank.grads is not None:
            found = _against_reference(
                "gradient",
                step,
                steps,
                expected_rank.grads[step],
                got,
                tolerance,
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


def allowance_used(reference: Trace, got: Trace, tolerance: Tolerance) -> float:
    """The largest ``|got - expected| / allowed`` over every loss, gradient and parameter of
    every rank at every step: how much of its allowance a run used (below 1 passes).

    Example::

        print(f"{allowance_used(outcome.reference, outcome.got, outcome.tolerance):.2f}")
    """
    used = 0.0
    quantities = ["loss", "parameter"] + (["gradient"] if got.has_grads else [])
    for step in range(reference.steps):
        for quantity in quantities:
            expected = _values(reference, 0, quantity, step)
            for rank in range(len(got.ranks)):
                values = _values(got, rank, quantity, step)
                for name, exp in expected.items():
                    value = values.get(name)
                    if exp is None or value is None:
                        continue
                    allowed = tolerance.allowed(quantity, step, name, exp)
                    value64, exp64 = value.to("cpu", torch.float64), exp.to("cpu", torch.float64)
                    ratio = (value64 - exp64).abs() / allowed.cpu()
                    used = max(used, float(ratio.max()))
    return used


def outside(value: torch.Tensor, expected: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Where ``value`` is further from ``expected`` than ``allowed``; NaN counts as outside
    unless both are NaN (a NaN must never pass for a number)."""
    # On the CPU: a rank's trace may hold CUDA tensors, the truth never does.
    v, e = value.to("cpu", torch.float64), expected.to("cpu", torch.float64)
    inside = ((v - e).abs() <= allowed.cpu()) | (v == e) | (v.isnan() & e.isnan())
    return ~inside


# The fields compared over whole flat traces, with the quantity their allowance is for.
_FIELDS = (("params", "parameter"), ("grads", "gradient"))


@dataclasses.dataclass
class _Expected:
    """The reference's half of the whole-trace comparison of one field under one tolerance:
    its flat values, its layout (and names and shapes), its steps' lengths, its allowances."""

    tolerance: Tolerance
    layout: Layout
    flat: torch.Tensor
    names: list[list[tuple[str, object]]]
    lengths: list[int]
    allowed: torch.Tensor


def prepare_comparison(reference: Trace, tolerance: Tolerance) -> None:
    """Work out now the reference's half of comparing traces with ``reference`` under
    ``tolerance`` (its allowances, its layout's names and shapes), so that what is left
    when a trace arrives is that trace's half. A check calls it while its ranks still
    train: the controller then does less after their answers, where the ranks wait for it.
    The verdict is the same either way: what was worked out is used only while the
    reference's record is as it arrived (never unpacked, so never edited), for the same
    tolerance and the same losses.

    Example::

        prepare_comparison(reference, tolerance)       # the ranks still training
        mismatch = compare(reference, got, scenario, tolerance)
    """
    if tolerance.by_name:
        return  # compared tensor by tensor: nothing whole to work out
    record = reference.ranks[0]
    for field, quantity in _FIELDS:
        # Only what can be kept: a field built here (not received) is worked out when compared.
        if record.as_arrived(field):
            _expected(record, field, quantity, tolerance)
    _expected_losses(record, tolerance)


def _expected(
    record: RankTrace, field: str, quantity: str, tolerance: Tolerance
) -> _Expected | None:
    arrived = record.as_arrived(field)
    kept = record._memo.get(field)
    if arrived and kept is not None and kept.tolerance is tolerance:
        return kept
    packed = record.packed(field)
    if packed is None:
        return None
    layout, flat = packed
    lengths = step_lengths(layout)
    allowed = tolerance.allowed_flat(quantity, flat, lengths)
    made = _Expected(tolerance, layout, flat, _names_and_shapes(layout), lengths, allowed)
    if arrived:
        record._memo[field] = made
    return made


def _expected_losses(record: RankTrace, tolerance: Tolerance) -> tuple[torch.Tensor, torch.Tensor]:
    kept = record._memo.get("losses")
    if kept is not None and kept[0] is tolerance and kept[1] == record.losses:
        return kept[2], kept[3]
    losses = torch.tensor(record.losses, dtype=torch.float64)
    allowed = tolerance.allowed_flat("loss", losses, [1] * len(losses))
    record._memo["losses"] = (tolerance, list(record.losses), losses, allowed)
    return losses, allowed


def _all_within(reference: Trace, got: Trace, tolerance: Tolerance, grads: bool) -> bool:
    """Every rank agrees with rank 0 and with the reference, checked over whole flat traces
    at once: the verdict the per-tensor comparison would reach when it finds nothing."""
    if tolerance.by_name:
        return False  # the allowance may differ from tensor to tensor
    record = reference.ranks[0]
    for field, quantity in _FIELDS if grads else _FIELDS[:1]:
        expected = _expected(record, field, quantity, tolerance)
        packed = [r.packed(field) for r in got.ranks]
        if expected is None or any(p is None for p in packed):
            return False
        first = packed[0]
        assert first is not None
        # The ranks' layouts, dtypes included, are the same (compared as they are); rank 0's
        # names and shapes are the reference's (whose dtype may differ: the same layout
        # settles it at once).
        if any(p[0] != first[0] for p in packed[1:]):  # type: ignore[index]
            return False
        if first[0] != expected.layout and _names_and_shapes(first[0]) != expected.names:
            return False
        flats = torch.stack([p[1] for p in packed])  # type: ignore[index]
        if not _within(flats, expected.flat, expected.allowed):
            return False
        # Ranks equal to rank 0 bit for bit agree with it within any allowance (a NaN is
        # never equal, and goes to the rule that says how NaNs compare).
        others = flats[1:]
        if len(others) and not torch.equal(others, flats[0].expand_as(others)):
            allowed = tolerance.allowed_flat(quantity, flats[0], expected.lengths)
            if not _within(others, flats[0], allowed):
                return False
    losses, allowed = _expected_losses(record, tolerance)
    got_losses = torch.tensor([r.losses for r in got.ranks], dtype=torch.float64)
    return _within(got_losses, losses, allowed)


def _within(value: torch.Tensor, expected: torch.Tensor, allowed: torch.Tensor) -> bool:
    """Whether no element of ``value`` is :func:`outside`: the plain difference first, which
    settles a passing example; what it does not settle (a NaN, an infinity against itself)
    goes to the full rule."""
    v, e = value.to("cpu", torch.float64), expected.to("cpu", torch.float64)
    if bool(((v - e).abs() <= allowed.cpu()).all()):
        return True
    return not bool(outside(v, e, allowed).any())


def _names_and_shapes(layout: Layout) -> list[list[tuple[str, object]]]:
    return [[(name, shape) for name, shape, _ in entry] for entry in layout]


def _values(trace: Trace, rank: int, quantity: str, step: int) -> dict[str, torch.Tensor | None]:
    record = trace.ranks[rank]
    if quantity == "gradient":
        assert record.grads is not None, f"{trace.method} recorded no gradients"
        return record.grads[step]
    if quantity == "loss":
        return {"loss": torch.tensor(record.losses[step], dtype=torch.float64)}
    return record.params[step]


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
                    if not torch.equal(_values(got, r, quantity, step)[name], base)
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
