"""Recordings held to the reference layout's, and the words for what differs.

First the data: every layout must train on the reference's global batch at each step (as
multisets of sample fingerprints); if it does not, what went wrong with the data is said and
nothing else (every later number would differ for that reason alone). Then, with the engine's
comparison (:func:`~ddp_verify.engine.compare.compare_traces`): the gradients the optimizer saw
at each step, the loss the gradient is of, and the parameters after each step, within a
tolerance derived for the precision the script ran in, never a guessed constant: float64's
rounding where the recorder ran it in float64, or the measured deviation of a rounding-only
variant of the reference run where the script forces its own precision.

Example::

    comparison = compare_layouts(reference, recording, steps=3)
    comparison.equivalent, comparison.causes
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..engine.compare import Mismatch, compare_traces
from ..engine.tolerances import (
    FLOAT32_SAFETY,
    UNIT_ROUNDOFF,
    Float64Tolerance,
    MeasuredTolerance,
    Tolerance,
)
from ..usercode import findings as f
from ..usercode.diagnosis.engine import Hypothesis, choose
from ..usercode.findings import Cause
from ..world.naming import option
from .layouts import Layout
from .recording import Recording, as_seen_by, pads_between
from .reproducible import dropout_cause, launch_causes, start_cause

__all__ = [
    "Comparison",
    "compare_layouts",
    "derived_tolerance",
    "perturbation",
    "rounding_dtype",
    "scaled_difference",
    "told_apart",
]


@dataclasses.dataclass
class Comparison:
    """One layout against the reference: whether it trains the same, the first divergence,
    every cause found, and its figures."""

    label: str
    equivalent: bool
    mismatch: Mismatch | None
    causes: list[Cause]
    figures: dict[str, Any]
    # It trains what the reference trains, and only the loss it logs differs.
    only_log_differs: bool = False


def compare_layouts(
    reference: Recording, other: Recording, *, steps: int, tolerance: Tolerance | None = None
) -> Comparison:
    """``other`` held to ``reference`` over ``steps`` optimizer steps (``tolerance``: see
    :func:`derived_tolerance`; float64's rounding where both ran in float64)."""
    figures: dict[str, Any] = {
        "layout": other.label,
        "world_size": other.world_size,
        "grad_accum": other.grad_accum,
        "steps": other.steps,
        "precision": other.precision,
    }
    wanted = min(steps, reference.steps)
    launched = launch_causes(other)
    never = [c for c in launched if c.pattern == f.LAUNCH_NO_GROUP.code]
    if never:
        # The layout never ran as asked: what it trained says nothing of the layout.
        return Comparison(other.label, False, None, never, figures)
    start = start_cause(reference, other)
    if start is not None:
        # Not the reference's model: nothing after the first step can be read.
        return Comparison(other.label, False, None, [start], figures)
    # The reference's samples as this layout's ranks see them (a context-parallel rank sees
    # its pieces of each sequence); nothing to hold them to where no pieces were recorded.
    seen = as_seen_by(reference, other, min(wanted, other.steps))
    data = _data_causes(seen, other, min(wanted, other.steps)) if seen is not None else []
    dropout = dropout_cause(reference)
    if data and dropout is not None:
        # Dropout draws its masks from torch's global generator, an amount that follows the
        # micro-batch: where the steps before the samples part already differ, it is first.
        agree = _same_samples(seen or reference, other, min(wanted, other.steps))
        if agree:
            early = compare_traces(
                reference.trace(agree), other.trace(agree), agree, tolerance or Float64Tolerance()
            )
            if early is not None:
                return Comparison(other.label, False, early, [dropout, *launched, *data], figures)
    if data:
        # Another count of micro-batches than asked is why the data differ, where it is so.
        return Comparison(other.label, False, None, [*launched, *data], figures)
    settings = _settings_causes(reference, other, min(wanted, other.steps))
    if settings:
        return Comparison(other.label, False, None, settings, figures)
    causes: list[Cause] = []
    if other.steps < wanted:
        causes.append(f.SCRIPT_STEPS.cause(got=other.steps, wanted=wanted))
    n = min(wanted, other.steps)
    if tolerance is None:
        tolerance = Float64Tolerance()
    figures["tolerance"] = tolerance.describe()
    expected, got = reference.trace(n), other.trace(n)
    mismatch = compare_traces(expected, got, n, tolerance)
    figures.update(_differences(expected, got, n))
    logged = _logged_causes(reference, other, n, tolerance)
    if mismatch is None and not causes and not logged:
        return Comparison(other.label, True, None, [], figures)
    if mismatch is None and not causes:
        return Comparison(other.label, False, None, logged, figures, only_log_differs=True)
    if mismatch is not None and dropout is not None:
        # Other masks at every layout: no weighting can be read through them.
        return Comparison(other.label, False, mismatch, [*causes, dropout, *logged], figures)
    if mismatch is not None or causes:
        causes += [
            _in_coupled_terms(_with_documented(cause, reference, other), reference, other)
            for cause in _gradient_causes(reference, other, expected, got, tolerance)
        ]
        departs = _module_departs(reference, other)
        if departs is not None:
            # Where the forward itself departs: the place, before what the gradient reads.
            causes.insert(0, departs)
        if not causes:
            causes.append(
                f.UNEXPLAINED.cause(
                    read="are the reference's at step 0" if n else "were not recorded"
                )
            )
    return Comparison(other.label, False, mismatch, causes + logged, figures)


def derived_tolerance(reference: Recording, variant: Recording, steps: int) -> Tolerance:
    """The bound for a script that forces its own precision: ``FLOAT32_SAFETY`` x how far a
    rounding-only variant of the reference run (every parameter moved by one unit roundoff
    before the first step) lands from the reference run, per quantity and step, and never
    less than the rounding of a few sums in that precision.

    Example::

        tolerance = derived_tolerance(reference, perturbed_reference, steps=3)
    """
    unit = UNIT_ROUNDOFF[rounding_dtype(reference)]
    n = min(steps, reference.steps, variant.steps)
    exact, rounded = reference.trace(n), variant.trace(n)
    roundings = (reference.world_size + 2) * unit
    bounds: dict[tuple[str, int], float] = {}
    for step in range(n):
        pairs = {
            "gradient": (exact.ranks[0].grads[step], rounded.ranks[0].grads[step]),  # type: ignore[index]
            "parameter": (exact.ranks[0].params[step], rounded.ranks[0].params[step]),
        }
        for quantity, (a, b) in pairs.items():
            deviation, scale = 0.0, 0.0
            for name, value in a.items():
                other = b.get(name)
                if value is None or other is None:
                    continue
                deviation = max(deviation, float((value - other).abs().max()))
                scale = max(scale, float(value.abs().max()))
            bounds[quantity, step] = FLOAT32_SAFETY * max(deviation, roundings * scale)
        loss, moved = exact.ranks[0].losses[step], rounded.ranks[0].losses[step]
        bounds["loss", step] = FLOAT32_SAFETY * max(abs(loss - moved), roundings * abs(loss))
    return _VariantTolerance(
        bounds,
        runs=2,
        safety=FLOAT32_SAFETY,
        fallback=FLOAT32_SAFETY * roundings,
        precision=reference.precision,
    )


class _VariantTolerance(MeasuredTolerance):
    """:class:`MeasuredTolerance`, measured on the reference run and its variant."""

    def describe(self) -> str:
        return (
            f"{self.safety:g} × how far a rounding-only variant of the reference run (each "
            f"parameter moved by one unit roundoff) lands from it, in {self.precision}"
        )


def perturbation(recording: Recording, seed: int = 1) -> str:
    """The ``DDP_VERIFY_PERTURB`` value of the rounding-only variant of ``recording``'s run:
    the seed, and the precision to move by where the run computes in a lower one inside.

    Example::

        perturbation(reference)   # "1", or "1:float32" for a float64 run with float32 inside
    """
    return f"{seed}:{rounding_dtype(recording)}" if recording.lower_inside else str(seed)


def rounding_dtype(recording: Recording) -> str:
    """The precision whose rounding bounds a run's: autocast's, the lower precision it
    computes in inside, or its coarsest parameter dtype."""
    meta = recording.ranks[0]["meta"]
    lower = recording.lower_inside
    if lower and lower["dtype"] in UNIT_ROUNDOFF:
        return lower["dtype"]
    if meta["autocast"]:
        return str(meta["autocast"]).split(":")[-1]
    dtypes = [d.replace("torch.", "") for d in meta["param_dtypes"]]
    rounded = [d for d in dtypes if d in UNIT_ROUNDOFF]
    # The coarsest dtype the parameters are in.
    return max(rounded, key=lambda d: UNIT_ROUNDOFF[d]) if rounded else "float32"


# -- the data --------------------------------------------------------------------------------


def _data_causes(reference: Recording, other: Recording, steps: int) -> list[Cause]:
    # Samples are known by what they are: the trailing run of each input's pad value left
    # out, the pad value chosen by which makes the layouts agree (none where none does).
    pads = pads_between(reference, other, steps)
    everything = collections.Counter[str]()
    for step in range(steps):
        everything.update(reference.samples(step, pads))
    trained = collections.Counter[str]()  # what the layout trained at earlier steps
    for step in range(steps):
        want, got = reference.samples(step, pads), other.samples(step, pads)
        if want == got:
            trained.update(got)
            continue
        per_rank = [other.rank_samples(r, step, pads) for r in range(other.world_size)]
        if other.world_size > 1 and all(rows == per_rank[0] for rows in per_rank):
            return [f.DATA_SAME.cause(world=other.world_size)]
        extra, missing = got - want, want - got
        twice = sum(1 for row, count in got.items() if count > 1 and want[row] < count)
        if twice:
            details = f"step {step}: {twice} sample(s) more than once"
            return [f.DATA_DUPLICATED.cause(what=details)]
        # A padded epoch's last batch repeats samples the layout trained earlier.
        again = sum(count for row, count in extra.items() if row in trained)
        if again:
            details = f"step {step}: {again} sample(s) the layout trained at an earlier step"
            return [f.DATA_DUPLICATED.cause(what=details)]
        if sum(got.values()) < sum(want.values()):
            details = f"step {step}: {sum(missing.values())} of {sum(want.values())} missing"
            return [f.DATA_MISSING.cause(what=details)]
        elsewhere = sum(count for row, count in extra.items() if row in everything)
        details = (
            f"step {step}: {sum(extra.values())} of its {sum(got.values())} samples are not "
            f"the reference's at that step"
            + (
                f", {elsewhere} of them trained by the reference at another step"
                if elsewhere
                else ""
            )
        )
        why = _drawn(reference, other, step) + _documented(reference, other)
        return [f.DATA_ORDER.cause(what=details + why)]
    return []


def _same_samples(reference: Recording, other: Recording, steps: int) -> int:
    """How many of the first ``steps`` steps train the reference's samples."""
    pads = pads_between(reference, other, steps)
    for step in range(steps):
        if reference.samples(step, pads) != other.samples(step, pads):
            return step
    return steps


def _drawn(reference: Recording, other: Recording, upto: int) -> str:
    """Where torch's global generator was drawn by other amounts at ``other`` than at the
    reference, by the first step whose draws differ (up to ``upto``), on rank 0: whatever
    is drawn after those draws (the step's samples, where they come from it) depends on the
    layout. Empty where the draws agree, or were not recorded."""
    for step in range(upto + 1):
        want = reference.step(0, step).get("drawn", {})
        got = other.step(0, step).get("drawn", {})
        differ = [site for site in {**want, **got} if want.get(site, 0) != got.get(site, 0)]
        if not differ:
            continue
        said = "; ".join(
            f"{site}: {want.get(site, 0)} value(s) in the reference, {got.get(site, 0)} here"
            for site in sorted(differ)[:3]
        )
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        return (
            f"; torch's global generator was drawn other amounts on rank 0 than in the "
            f"reference by step {step} ({said}{more}), so whatever it draws after depends on "
            "the layout: draw each step's whole batch alike in every rank from a generator "
            "seeded alike at every layout, and anything else (an evaluation's batches, "
            "augmentation) from a torch.Generator of its own"
        )
    return ""


def _documented(reference: Recording, other: Recording) -> str:
    """A framework's documented data handling that makes the samples of a step depend on
    the layout, where the script trained with it."""
    used = set()
    for recording in (reference, other):
        used.update(recording.ranks[0]["meta"].get("frameworks", ()))
    if used & {"lightning", "pytorch_lightning"} and other.world_size != reference.world_size:
        return (
            "; Lightning (the Trainer, and Fabric's setup_dataloaders), as documented, puts "
            "a DistributedSampler that shuffles into a training loader under a distributed "
            "strategy and keeps the loader's own order on one device: give the loader a "
            "DistributedSampler of your own (the same shuffle and seed at every world size) "
            "with use_distributed_sampler=False, or give the reference the same strategy "
            "(Trainer(strategy='ddp'), fabric run --strategy ddp)"
        )
    return ""


def _with_documented(cause: Cause, reference: Recording, other: Recording) -> Cause:
    """``cause`` with the framework option that does it by design, where the script trained
    with that framework: a Trainer told not to count tokens across devices."""
    used = set()
    for recording in (reference, other):
        used.update(recording.ranks[0]["meta"].get("frameworks", ()))
    if cause.pattern == f.RANKS_WORLD.code and "tokens" in cause.text and "transformers" in used:
        note = (
            "; a Hugging Face Trainer (and TRL's trainers, which are Trainers) does so by "
            "design with average_tokens_across_devices=False: set it True"
        )
        return dataclasses.replace(cause, text=cause.text + note)
    return cause


def _in_coupled_terms(cause: Cause, reference: Recording, other: Recording) -> Cause:
    """A world-size scale said in the terms of a loss that couples samples across ranks,
    where the layout's run gathered features that carry gradient: every rank's gradient is
    the whole batch's (1/W after DDP's average), or the loss was multiplied by the world
    size where the gather already carries the gradient back (W)."""
    readings = {"scale:1/W": f.COUPLED_OVER_WORLD, "scale:W": f.COUPLED_TIMES_WORLD}
    if not other.exchanged or cause.reading not in readings:
        return cause
    ratio = fractions.Fraction(other.world_size, reference.world_size)
    factor = ratio if cause.reading == "scale:W" else 1 / ratio
    said = f.COUPLED_SCALE.cause(factor=str(factor), why=readings[cause.reading])
    where = "; ".join(other.exchanged[:3])
    return dataclasses.replace(
        said,
        reading="coupled:" + cause.reading,
        evidence=f"the script sends other ranks features that carry gradient: {where}"
        + (f"; {cause.evidence}" if cause.evidence else ""),
    )


# -- the optimizer's settings ------------------------------------------------------------------


def _settings_causes(reference: Recording, other: Recording, steps: int) -> list[Cause]:
    """The settings each step applied the gradient with (a scheduler's lr, momentum...) held
    to the reference's: where one differs, every later parameter differs for that alone."""
    for step in range(steps):
        want = reference.step(0, step).get("settings")
        have = other.step(0, step).get("settings")
        if want is None or have is None or len(want) != len(have):
            continue
        for group, (a, b) in enumerate(zip(want, have, strict=True)):
            for key in sorted(a.keys() & b.keys()):
                if math.isclose(a[key], b[key], rel_tol=1e-12, abs_tol=0.0):
                    continue
                where = f" of parameter group {group}" if len(want) > 1 else ""
                ratio = f", {b[key] / a[key]:.4g}x" if a[key] else ""
                what = (
                    f"step {step}: {key}{where} {b[key]:.6g}, the reference's {a[key]:.6g}{ratio}"
                )
                return [f.OPTIMIZER_SETTINGS.cause(what=what + _scheduled(reference, other))]
    return []


def _scheduled(reference: Recording, other: Recording) -> str:
    """A framework's documented scheduler stepping that makes the settings depend on the
    layout, where the script trained with it."""
    used = set()
    for recording in (reference, other):
        used.update(recording.ranks[0]["meta"].get("frameworks", ()))
    if "accelerate" in used and other.world_size != reference.world_size:
        return (
            "; accelerate, as documented, steps a prepared scheduler once per process at each "
            "optimizer step (the batch grows with the processes): with the global batch fixed, "
            "give Accelerator(split_batches=True) the global batch, or step the scheduler "
            "yourself, unprepared, once per optimizer step"
        )
    return ""


# -- the logged loss ---------------------------------------------------------------------------


def _logged_causes(
    reference: Recording, other: Recording, steps: int, tolerance: Tolerance
) -> list[Cause]:
    """The loss rank 0 logged at each step held to the one the reference logged, to the
    digits either printed (and the loss's own tolerance); where it differs, which quantity of
    the layout it is: rank 0's own loss, its last micro-batch's, the sum over ranks, the
    reference's divided once too often."""
    for step in range(steps):
        want, have = _logged(reference, step), _logged(other, step)
        if want is None or have is None:
            continue
        (expected, shown), (value, written) = want, have
        allowed = max(_half_unit(shown), _half_unit(written)) + float(
            tolerance.allowed("loss", step, "loss", torch.tensor(expected)).max()
        )
        if abs(value - expected) <= allowed:
            continue
        # The script's logging scale: what it logs for the loss its gradient is of.
        effective = reference.effective_loss(step)
        scale = expected / effective if effective else 1.0
        # The loss the layout's own gradient is of: the log is true to what it trained, and
        # a difference is the gradient's, said there.
        if abs(value - scale * other.effective_loss(step)) <= allowed + _half_unit(written):
            continue
        # Rank 0's own losses; a pipeline's are its last stage's, the first rank with any.
        holder = next((r for r in range(other.world_size) if other.backward_losses(r, step)), 0)
        own = other.backward_losses(holder, step)
        micro = len(other.step(0, step)["batches"])
        world = other.world_size
        evidence = (
            f"layout {other.label}, step {step}: rank 0 logged loss {written} where the "
            f"reference logged {shown}"
        )
        readings: list[tuple[bool, float, Cause]] = [
            (world > 1, scale * sum(own), f.LOSS_LOCAL.cause()),
            (micro > 1 and bool(own), scale * micro * (own or [0.0])[-1], f.LOSS_LAST_ONLY.cause()),
            (micro > 1, expected * micro, _scaled(micro, "A", _SUMMED_A)),
            (world > 1, expected * world, f.LOSS_SUM.cause()),
            (world > 1, expected / world, _scaled(1 / world, "1/W", _TWICE_W)),
            (micro > 1, expected / micro, _scaled(1 / micro, "1/A", _TWICE_A)),
        ]
        fits = [
            (candidate, cause)
            for applies, candidate, cause in readings
            if applies and abs(value - candidate) <= allowed + _half_unit(written)
        ]
        if not fits:
            return [f.LOG_DIFFERS.cause(evidence=evidence)]
        # A factor 2 at 2x2 is the micro-batches and the ranks alike: both are said.
        (candidate, cause), others = fits[0], [c for _, c in fits[1:]]
        also = "".join(f"; as well fits: {c.text}" for c in others)
        return [
            dataclasses.replace(
                cause,
                evidence=f"{evidence}; that reading gives {candidate:.6g}{also}",
                alternatives=tuple(c.key for c in others),
            )
        ]
    return []


def _scaled(factor: float, key: str, why: str) -> Cause:
    return dataclasses.replace(
        f.LOSS_SCALED.cause(factor=f"{factor:.4g} at every step", why=why),
        reading=f"loss:scaled:{key}",
    )


_SUMMED_A = " (the micro-batch losses summed, not divided by the accumulation steps)"
_TWICE_W = " (divided by the world size once too often)"
_TWICE_A = " (divided by the accumulation steps once too often)"


def _logged(recording: Recording, step: int) -> tuple[float, str] | None:
    """The first loss rank 0 logged after ``step``, and how it was written; None if none."""
    written = recording.step(0, step).get("logged") or []
    if not written:
        return None
    try:
        return float(written[0]), str(written[0])
    except ValueError:
        return None


def _half_unit(written: str) -> float:
    """Half a unit in the last digit printed: how far a printed number may be from its value.

    Example::

        >>> _half_unit("2.345"), _half_unit("1.5e-03")
        (0.0005, 5e-05)
    """
    mantissa, _, exponent = written.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


# -- the gradient ------------------------------------------------------------------------------


def _gradient_causes(
    reference: Recording,
    other: Recording,
    expected: Any,
    got: Any,
    tolerance: Tolerance,
) -> list[Cause]:
    causes: list[Cause] = []
    if not got.steps:
        return causes
    # The first step whose gradient departs: a weighting that is right for even splits goes
    # wrong only at the step that splits unevenly (a short last batch).
    step = _departing_step(expected, got, tolerance)
    # Ranks that disagree: gradients some parameters never synchronised.
    rank0 = got.ranks[0].grads[step]
    apart = sorted(
        name
        for name, value in rank0.items()
        if value is not None
        and any(
            (g := r.grads[step].get(name)) is not None
            and bool((g - value).abs().gt(tolerance.allowed("gradient", step, name, value)).any())
            for r in got.ranks[1:]
        )
    )
    if apart:
        causes.append(f.SYNC_LEFT_OUT.cause(names=", ".join(repr(n) for n in apart)))
    cleared = [
        f"rank {r}, before micro-batch {m + 2} of {len(other.step(r, step)['batches'])}"
        for r in range(other.world_size)
        for m, was in enumerate(other.step(r, step)["cleared"])
        if was
    ]
    if cleared:
        causes.append(f.MICRO_CLEARED.cause(where="; ".join(cleared[:4])))
        # What the gradient then is follows from it: no second cause for the same numbers.
        return causes
    scale = _scale(reference, other, expected, got, tolerance, step=step, exclude=set(apart))
    if scale is not None and scale.pattern not in _SETTLED and not apart:
        weighed = _weights(other, expected, got, step)
        if weighed is not None:
            scale = weighed
    if other.layout.cp > 1 and not apart and (scale is None or scale.pattern not in _SETTLED):
        # A context-parallel rank's gradient holds what every rank's loss sends back to its
        # piece's keys and values: no weights of its own to fit; its loss says instead.
        pieces = _piece_means(reference, other, step)
        if pieces is not None:
            scale = pieces
    if scale is not None:
        causes.append(scale)
    return causes


# Readings of the factor that the fitted weights cannot better (a count ratio; rounding).
_SETTLED = {f.SCALE.code, f.PRECISION_LOWER.code}


def _module_departs(reference: Recording, other: Recording) -> Cause | None:
    """Where a tensor-parallel layout's first forward departs from the reference's, by module:
    the modules whose output (held whole by the rank) differs, and of those the first whose
    inner modules all agree, so that the difference is made in its own forward (a reduction
    over the tensor-parallel ranks missing, or doubled). Only where rank 0's first
    micro-batch is the reference's (one micro-batch a step, every sample on every rank), so
    that the outputs are of the same inputs and the same parameters."""
    layout = other.layout
    if layout.tp == 1 or other.pipelined or not (reference.steps and other.steps):
        return None
    if other.step(0, 0)["batches"][:1] != reference.step(0, 0)["batches"][:1]:
        return None
    want = {o[0]: o for o in reference.meta.get("outputs") or ()}
    close = 1e-9 if other.float64 else 1e-3
    departed: list[tuple[str, float]] = []
    for rank in range(other.world_size):
        for name, shape, total, norm in other.ranks[rank]["meta"].get("outputs") or ():
            mine = want.get(name)
            if mine is None or list(mine[1]) != list(shape) or name in dict(departed):
                continue
            scale = max(abs(mine[3]), 1e-300)
            if abs(norm - mine[3]) > close * scale or abs(total - mine[2]) > close * scale:
                departed.append((name, norm / scale))
    if not departed:
        return None
    names = [n for n, _ in departed]
    # The first (in the order outputs returned: inner first) whose inner modules all agree.
    origin, ratio = next(
        (n, r) for n, r in departed if not any(o.startswith(n + ".") for o in names if o != n)
    )
    inside = any(o.startswith(origin + ".") for o in want) if origin != "(the model)" else True
    # The collectives the script's own code calls in that module's forward (or inside it).
    calls = [
        call
        for r in other.ranks
        for module, call in r["meta"].get("forward_collectives", ())
        if module == origin or module.startswith(origin + ".")
    ]
    where = f"; its forward calls {', '.join(dict.fromkeys(calls))}" if calls else ""
    return f.TP_MODULE.cause(
        module=origin,
        own="while every module inside it agrees" if inside else "(a module with none inside)",
        tp=layout.tp,
        evidence=(
            f"layout {other.label}, its first forward on the reference's first micro-batch: "
            f"{origin}'s output has {ratio:.4g} x the norm of the reference's; departing: "
            f"{', '.join(names[:6])}{where}"
        ),
    )


def _piece_means(reference: Recording, other: Recording, step: int) -> Cause | None:
    """Where each rank of a context-parallel layout averaged its loss over its own piece's
    tokens: at ``step`` (the first whose gradient departs, the parameters still the
    reference's), the ranks' losses weighted by their pieces' tokens give the reference's
    loss, and their plain average, which is what averaging the gradients over the ranks
    trains, does not. None where the losses say otherwise, or no tokens were recorded."""
    if other.pipelined or reference.steps <= step or other.steps <= step:
        return None
    losses, counts = [], []
    for rank in range(other.world_size):
        record = other.step(rank, step)
        losses.append(sum(record["losses"]) / record.get("grad_scale", 1))
        counts.append(sum(sum(t) for t in record["tokens"] if t))
    if not all(counts) or len(set(counts)) < 2:
        return None
    want = reference.effective_loss(step)
    weighted = sum(x * n for x, n in zip(losses, counts, strict=True)) / sum(counts)
    plain = sum(losses) / len(losses)
    close = (1e-9 if other.float64 else 1e-3) * max(abs(want), 1e-12)
    if abs(weighted - want) > close or abs(plain - want) <= close:
        return None
    # Each piece counted 1/R of the step where its share is n/N: N/(R n) times its share.
    said = "; ".join(
        f"rank {r}: {n} tokens, counted {sum(counts) / (len(counts) * n):.3g}x its share"
        for r, n in enumerate(counts[:8])
    )
    shown = ", ".join(f"{x:.6g}" for x in losses[:8])
    evidence = (
        f"layout {other.label}, step {step}: the ranks' losses {shown}, weighted by their "
        f"pieces' tokens ({said}), give the reference's loss {want:.6g}; averaged alike, as "
        f"the gradients are, {plain:.6g}; the layout's cp is {other.layout.cp} (context "
        "parallel: each rank holds a piece of every sequence)"
    )
    return f.RANKS_PIECE_MEAN.cause(unit="token", numbers=f" ({said})", evidence=evidence)


def _departing_step(expected: Any, got: Any, tolerance: Tolerance) -> int:
    """The first step at which some rank's gradient leaves the reference's (0 if none)."""
    for step in range(len(got.ranks[0].grads)):
        for name, want in expected.ranks[0].grads[step].items():
            if want is None:
                continue
            allowed = tolerance.allowed("gradient", step, name, want)
            for rank in got.ranks:
                have = rank.grads[step].get(name)
                if have is not None and bool((have - want).abs().gt(allowed).any()):
                    return step
    return 0


def _fit(columns: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Least-squares weights of ``columns`` that give ``target``, and the relative residual."""
    weights = torch.linalg.lstsq(columns, target.unsqueeze(1)).solution.squeeze(1)
    residual = float((columns @ weights - target).norm()) / max(float(target.norm()), 1e-300)
    return weights, residual


def _weights(other: Recording, expected: Any, got: Any, step: int) -> Cause | None:
    """What each rank's micro-batches added to their gradient before synchronisation is
    recorded: the weights that make those contributions the reference's gradient, fitted (more
    gradient entries than contributions), read against the contributions' tokens and samples.
    """
    # A pipeline's micro-batches are read where their losses are: its last stage's ranks,
    # each contribution on the parameters that stage holds.
    ranks = _last_stage(other)
    names = other.ranks[ranks[0]]["meta"].get("local_names")
    if not names:
        return None
    columns: list[torch.Tensor] = []
    where: list[str] = []
    samples: list[int] = []
    tokens: list[int] = []
    # Sequences with a token that counts: the unit of a sequence-level objective's mean.
    answered: list[int] = []
    by_rank: list[int] = []
    staged = False  # contributions kept of some of a rank's stages only
    for rank in ranks:
        record = other.step(rank, step)
        local = record.get("local") or []
        last = {n - 1 for _, n in other.stages(rank)}
        tagged = record.get("local_stages") or []
        if last and len(tagged) == len(local) and any(t not in last for t in tagged):
            # A rank of several stages (interleaved): its last stage's backwards are the
            # micro-batches the loss was computed on.
            local = [c for c, t in zip(local, tagged, strict=True) if t in last]
            staged = True
        if other.ranks[rank]["meta"].get("local_names") != names:
            return None
        if len(local) != len(record["batches"]) or not local:
            return None
        for m, contribution in enumerate(local):
            columns.append(contribution)
            by_rank.append(rank)
            samples.append(len(record["batches"][m]))
            tokens.append(sum(record["tokens"][m]) if record["tokens"][m] else 0)
            answered.append(sum(1 for t in record["tokens"][m] or () if t > 0))
            micro = f"micro-batch {m + 1}"
            if len(ranks) == 1:
                where.append(micro)
            else:
                where.append(f"rank {rank}" if len(local) == 1 else f"rank {rank} {micro}")
    reference = expected.ranks[0].grads[step]
    mine = got.ranks[0].grads[step]
    if any(reference.get(n) is None or mine.get(n) is None for n in names):
        return None
    matrix = torch.stack(columns, dim=1)
    target = torch.cat([reference[n].reshape(-1) for n in names])
    combined = torch.cat([mine[n].reshape(-1) for n in names])
    if matrix.shape[0] == target.numel() and staged:
        # The last stage's backwards touch its parameters only: the rank's other stages'
        # entries are no part of what they weigh.
        touched = matrix.abs().sum(dim=1) > 0
        matrix, target, combined = matrix[touched], target[touched], combined[touched]
    if matrix.shape[0] <= 2 * matrix.shape[1] or matrix.shape[0] != target.numel():
        return None  # too few entries for the weights to be determined
    close = 1e-6 if other.float64 else 1e-2
    weights, residual = _fit(matrix, target)
    # How the layout combined them (1/W each under DDP's average, 1 on one process).
    applied, applied_residual = _fit(matrix, combined)
    if residual > close or applied_residual > close:
        return None
    relative = [
        float(w) / float(a) if float(a) else math.inf for w, a in zip(weights, applied, strict=True)
    ]
    numbers = ", ".join(f"{x:.4g}" for x in relative)
    evidence = (
        f"layout {other.label}, step {step}: the contributions of {', '.join(where)} to the "
        f"gradient, weighted {numbers} x as the layout combined them, give the reference's "
        f"(residual {residual:.2g})"
    )
    scaled = {other.step(r, step).get("grad_scale", 1) for r in ranks} - {1}
    if scaled:
        # Where a pipeline schedule's own division is what weighs the micro-batches alike.
        evidence += (
            f"; the pipeline schedule divided the gradients by {scaled.pop()} after the "
            "step's backwards (scale_grads)"
        )
    equal = max(applied) - min(applied) <= close * float(applied.abs().max())
    shifted = [t - n for t, n in zip(tokens, samples, strict=True)] if any(tokens) else []
    # Each reading of the weights a hypothesis of the diagnosis's engine, scored by how far
    # the weights are from proportional to its counts; the fitted weights themselves are the
    # catch-all, dearer than any reading.
    made = [
        Hypothesis(
            "gradient",
            frozenset({"gradient"}),
            3.5,
            0.0,
            causes=(f.MICRO_WEIGHTS.cause(numbers=numbers, evidence=evidence),),
        )
    ]
    # Token data's samples are sequences, and where some have no token that counts (a prompt
    # with no response), a sequence-level mean counts only the others: each a reading.
    rows = "sequence" if any(tokens) else "sample"
    counted = "sequences with a token that counts"
    readings = (
        ("token", tokens, "tokens"),
        ("token", shifted, "tokens"),
        ("sequence", answered, counted),
        (rows, samples, f"{rows}s"),
    )
    for unit, counts, noun in readings:
        if len(counts) != len(columns) or not all(c > 0 for c in counts) or len(set(counts)) < 2:
            continue
        if not equal:
            continue  # the layout weighted its contributions unequally: no reading says why
        total = sum(counts)
        # Each contribution its own mean: the right weights go as its count.
        ratios = [float(w) / c for w, c in zip(weights, counts, strict=True)]
        said = "; ".join(
            f"{w}: {c} of the step's {total} {noun}" for w, c in zip(where, counts, strict=True)
        )
        own = (
            f.RANKS_WORLD.cause(unit=unit, evidence=f"{evidence}; {said}")
            if other.grad_accum == 1 and len(ranks) > 1
            else f.MICRO_OWN_MEAN.cause(
                unit=unit, numbers=f" ({said}; each counted alike)", evidence=evidence
            )
        )
        made.append(_spread(ratios, close, own))
        # Each rank its own mean, its micro-batches weighted right within it.
        per_rank_total = collections.Counter[int]()
        for c, r in zip(counts, by_rank, strict=True):
            per_rank_total[r] += c
        rank_counts = [per_rank_total[r] for r in by_rank]
        if len(ranks) > 1 and len(set(rank_counts)) > 1:
            per_rank = [float(w) / c for w, c in zip(weights, rank_counts, strict=True)]
            totals = sorted(set(zip(by_rank, rank_counts, strict=True)))
            said = "; ".join(f"rank {r}: {c} of the step's {total} {noun}" for r, c in totals)
            cause = f.RANKS_WORLD.cause(unit=unit, evidence=f"{evidence}; {said}")
            made.append(_spread(per_rank, close, cause))
    ((best, ties),), _ = choose(made)
    return dataclasses.replace(best.causes[0], alternatives=tuple(t.keys[0] for t in ties))


def _last_stage(recording: Recording) -> list[int]:
    """The ranks that run a pipeline's last stage (every rank where nothing is pipelined)."""
    last = [
        r for r in range(recording.world_size) if any(i == n - 1 for i, n in recording.stages(r))
    ]
    return last or list(range(recording.world_size))


def _spread(ratios: list[float], close: float, cause: Cause) -> Hypothesis:
    """The reading ``cause`` makes of weights whose ratios to its counts are ``ratios``:
    consistent where they are one number (within ``close`` of it)."""
    misfit = (max(ratios) - min(ratios)) / (close * abs(ratios[0]) or 1e-300)
    return Hypothesis("gradient", frozenset({"gradient"}), 1.0, misfit, causes=(cause,))


def _flat(grads: dict[str, torch.Tensor | None], names: Sequence[str]) -> torch.Tensor:
    parts = [grads[n].reshape(-1) for n in names if grads.get(n) is not None]  # type: ignore[union-attr]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _scale(
    reference: Recording,
    other: Recording,
    expected: Any,
    got: Any,
    tolerance: Tolerance,
    *,
    step: int,
    exclude: set[str],
) -> Cause | None:
    """The gradient at ``step`` as a multiple of the reference's, in words: a uniform factor
    with the count ratios it matches; or, where it is not a multiple, what was measured."""
    grads = expected.ranks[0].grads[step]
    names = [n for n, g in grads.items() if g is not None and n not in exclude]
    want = _flat(grads, names)
    have = _flat(got.ranks[0].grads[step], names)
    if not want.numel() or want.shape != have.shape:
        return None
    allowed = torch.cat(
        [tolerance.allowed("gradient", step, n, grads[n]).reshape(-1) for n in names]
    )
    if not bool(((have - want).abs() > allowed).any()):
        return None
    norm = float(want.norm())
    if norm == 0.0:
        return None
    k = float(have @ want) / norm**2
    residual = float((have - k * want).abs().max())
    relative = float((have - want).norm()) / norm
    if relative <= FLOAT32_ROUNDING and other.float64:
        # No count ratio is this close to 1: a float64 run off by a lower format's rounding
        # computes in it somewhere. Never "every sample counted 1x".
        return f.PRECISION_LOWER.cause(
            difference=relative,
            native=option("dtype", "native"),
            evidence=f"step-{step} gradient of layout {other.label} = {k:.9g} x the "
            f"reference's, {relative:.2g} apart (float64 rounding is about 1e-15)",
        )
    if residual <= float(allowed.max()) * max(1.0, abs(k)):
        # The diagnosis's chooser: each count ratio a hypothesis scored against k, the
        # cheapest consistent named, its equals its alternatives; any other factor costs more.
        made = _ratio_hypotheses(reference, other, k, close=1e-6 if other.float64 else 2e-2)
        made.append(_reading(1.5, 0.0, key="", why=f.SCALED))
        ((best, ties),), _ = choose(made)
        key, why = best.detail["key"], best.detail["why"]
        return dataclasses.replace(
            f.SCALE.cause(why=why, unit="sample", factor=k),
            reading=f"scale:{key}" if key else "scale",
            alternatives=tuple(f"scale:{t.detail['key']}" for t in ties),
            evidence=f"step-{step} gradient of layout {other.label} = {k:.6g} x the reference's "
            f"(largest departure from that multiple {residual:.3g})" + _axes_of(other.layout, k),
        )
    cosine = float(have @ want) / (float(have.norm()) * norm or math.inf)
    measured = f" (cosine {cosine:.4g} with it, norm ratio {float(have.norm()) / norm:.4g})"
    return f.GRAD_DIFFERS.cause(measured=measured)


# Each axis of a layout in words, for the axes a factor is the degree of.
_AXIS_WORDS = {
    "dp": "plain data-parallel ranks",
    "dp_replicate": "FSDP2's replicate degree",
    "dp_shard": "FSDP2's shard degree",
    "cp": "context-parallel ranks",
    "tp": "tensor-parallel ranks",
    "pp": "pipeline stages",
    "a": "micro-batches a step",
}


def _axes_of(layout: Layout, factor: float) -> str:
    """The axes of ``layout`` whose degree (or the product of several) ``factor`` or its
    inverse is, in words; empty where none is.

    Example::

        >>> print(_axes_of(Layout(4, 1, dp_shard=2, tp=2), 0.5))
        ; 1/2 is the layout's dp_shard (FSDP2's shard degree) or tp (tensor-parallel ranks)
    """
    degrees = {axis: d for axis, d in layout.degrees.items() if d > 1}
    for value, shown in ((factor, ""), (1 / factor if factor else 0.0, "1/")):
        n = round(value)
        if n < 2 or abs(value - n) > 1e-6 * n:
            continue
        named = []
        for size in range(1, len(degrees) + 1):
            for group in itertools.combinations(degrees, size):
                if math.prod(degrees[a] for a in group) == n:
                    named.append(" x ".join(f"{a} ({_AXIS_WORDS[a]})" for a in group))
            if named:
                break
        if named:
            return f"; {shown}{n} is the layout's {' or '.join(named)}"
    return ""


# A relative difference up to this is a lower format's rounding, not a weighting: float32's
# unit roundoff (6e-8) grown by a few hundred operations, far below any count ratio's
# distance from 1 (1/8 at most for these layouts).
FLOAT32_ROUNDING = 1e-4


# The count ratios a layout's gradient may be off by, against the reference layout's: a key,
# its value from (world size, accumulation steps, the reference's), and what it means.
RATIOS: tuple[tuple[str, Callable[[int, int, int, int], float], str], ...] = (
    (
        "A",
        lambda w, a, wr, ar: a / ar,
        "the micro-batch losses summed, not divided by the accumulation steps",
    ),
    (
        "1/A",
        lambda w, a, wr, ar: ar / a,
        "the loss divided by the accumulation steps once too often",
    ),
    (
        "W",
        lambda w, a, wr, ar: w / wr,
        "gradients summed across ranks, not averaged by the world size",
    ),
    ("1/W", lambda w, a, wr, ar: wr / w, "gradients divided by the world size once too often"),
    (
        "W*A",
        lambda w, a, wr, ar: (w * a) / (wr * ar),
        "a sum over micro-batches and ranks never divided",
    ),
    (
        "1/(W*A)",
        # With the global batch fixed, the micro-batch's size goes as 1/(W*A).
        lambda w, a, wr, ar: (wr * ar) / (w * a),
        "the loss summed over each micro-batch's samples, not averaged: the gradient goes "
        "with the micro-batch's size",
    ),
)
_MEANING = {key: words for key, _, words in RATIOS}


def _reading(cost: float, misfit: float, **detail: Any) -> Hypothesis:
    """A reading of a layout's gradient as a hypothesis of the diagnosis's engine, named by
    its key (the engine tells hypotheses apart by what they name: readings without a name
    were never one another's alternatives)."""
    key = detail["key"]
    named = Cause(detail["why"], "gradient", f.SCALE.code, reading=f"scale:{key}" if key else "")
    return Hypothesis(
        "gradient", frozenset({"gradient"}), cost, misfit, causes=(named,), detail=detail
    )


def _ratio_hypotheses(
    reference: Recording, other: Recording, k: float, *, close: float
) -> list[Hypothesis]:
    """Each count ratio between the layout and the reference (not 1) as a hypothesis about
    the factor ``k``, scored in units of ``close``, in the rows' order (plainest first)."""
    # The ranks that average: the data-parallel ones (tensor-parallel and pipeline ranks
    # hold the same samples, or other parameters).
    counts = (
        other.layout.data_parallel,
        max(other.grad_accum, 1),
        reference.layout.data_parallel,
        max(reference.grad_accum, 1),
    )
    made = []
    for key, ratio, words in RATIOS:
        value = ratio(*counts)
        if value != 1.0:
            made.append(_reading(1.0, abs(k - value) / (close * abs(value)), key=key, why=words))
    return made


def _differences(expected: Any, got: Any, steps: int) -> dict[str, float | None]:
    """The greatest differences from the reference, each as a fraction of its tensor's
    largest value (the larger of the two): gradients at step 0, parameters over every step
    (null where nothing was recorded). Per element, a parameter that crosses zero would make
    any difference look large (a relative difference of 60 between two equivalent runs);
    against its tensor's scale the figure is at most 2, and rounding's size where the runs
    are equivalent."""

    def largest(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
        values = [scaled_difference(e, g) for e, g in pairs if e.numel() and e.shape == g.shape]
        return max(values) if values else None

    if not steps:
        return {"gradient_difference": None, "parameter_difference": None}
    want0 = expected.ranks[0].grads[0]
    grads = [
        (want0[n], r.grads[0][n])
        for r in got.ranks
        for n in want0
        if want0[n] is not None and r.grads[0].get(n) is not None
    ]
    params = [
        (expected.ranks[0].params[s][n], r.params[s][n])
        for s in range(steps)
        for r in got.ranks
        for n in expected.ranks[0].params[s]
        if n in r.params[s]
    ]
    return {"gradient_difference": largest(grads), "parameter_difference": largest(params)}


def scaled_difference(expected: torch.Tensor, got: torch.Tensor) -> float:
    """The largest difference of two tensors as a fraction of the larger of their largest
    magnitudes: 0 where they are equal, at most 2.

    Example::

        >>> expected = torch.tensor([4.0, 1e-9], dtype=torch.float64)
        >>> scaled_difference(expected, torch.tensor([4.0, -1e-9], dtype=torch.float64))
        5e-10
    """
    scale = float(torch.maximum(expected.abs().max(), got.abs().max()))
    return float((got - expected).abs().max()) / scale if scale else 0.0


def told_apart(comparisons: list[Comparison]) -> list[Comparison]:
    """Scale readings that one layout's counts cannot tell apart (a factor 2 at 2x2 is the
    world size and the accumulation steps), settled by the reading every layout with a
    scale shares.

    Example::

        comparisons = told_apart([compare_layouts(ref, r, steps=3) for r in recordings])
    """
    scaled = [c for cmp in comparisons for c in cmp.causes if c.pattern == f.SCALE.code]
    common = None
    for cause in scaled:
        keys = {cause.key, *cause.alternatives}
        common = keys if common is None else common & keys
    if not common or len(common) != 1:
        return comparisons
    (key,) = common
    for cmp in comparisons:
        for i, cause in enumerate(cmp.causes):
            if cause.pattern == f.SCALE.code and cause.key != key and key in cause.alternatives:
                why = _MEANING[key.split(":", 1)[1]]
                # The same factor, said with the reading every layout shares.
                rest = cause.text[cause.text.index(": every") :]
                cmp.causes[i] = dataclasses.replace(
                    cause,
                    text=why + rest,
                    reading=key,
                    alternatives=(),
                    evidence=f"{cause.evidence}; the other layouts say which",
                )
            elif cause.pattern == f.SCALE.code and cause.key == key:
                cmp.causes[i] = dataclasses.replace(cause, alternatives=())
    return comparisons
