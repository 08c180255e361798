"""How far a method's values may be from the reference's: float64 and float32 allowances.

A :class:`Tolerance` answers, for a quantity (gradient, parameter, loss) at a step, how far
each element may be from the reference's; ``describe()`` says it in the words a report uses.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..world.backends import DEVICE
from .reference import objective_of_terms, train_reference
from .scenario import Scenario
from .trace import Trace
from .training import Step, train

# float64. Every method sums the same terms in another order (per micro-batch, per rank, then
# across ranks), which changes a float64 sum by a few units in the last place, ~1e-16 relative.
# Adam and AdamW amplify that: a gradient element that is zero in exact arithmetic but 1e-17
# after rounding moves its parameter by lr * 1e-17 / (sqrt(v) + eps) ~ lr * 1e-9. Measured over
# 600 generated scenarios at world sizes 2 and 3 (DDP and sample-weighted all-reduce against
# the reference), the largest difference was 5.5e-11. The smallest real aggregation bug in the
# same run (the world-size average on an uneven split whose ranks had similar gradients)
# differed by 2.7e-4. The bound sits three orders of magnitude from each:
# |got - expected| <= 1e-8 + 1e-7 * |expected|. tests/methods/test_tolerances.py keeps both
# margins under watch.
FLOAT64_RTOL = 1e-7
FLOAT64_ATOL = 1e-8

# float32 has no fixed bound that fits every model: its rounding error depends on magnitudes,
# on cancellation, and on how the optimizer turns a gradient's error into a step. Adam's first
# step moves a parameter by lr * g / (|g| + eps), whose derivative at |g| = 3e-8 is
# lr * 3e5: a gradient that lands 2e-10 away (a few roundings of the terms it sums) moves the
# parameter by 7e-5, which no multiple of a typical rounding error covers. So the bound is
# measured on the scenario at hand. A correct method computes the same sums as the reference
# in another order and grouping, with its losses scaled otherwise (m/n, n/N, world_size*m/N):
# its float32 run is one more float32 run of the same mathematics. The harness makes
# FLOAT32_VARIANTS such runs itself: each step's global batch permuted and cut into random
# chunks, each chunk's loss multiplied by a random factor in [1, 2) that is divided out of its
# gradient. In exact arithmetic nothing changes; every float32 rounding does (a power-of-two
# factor would change none, which is why the factor is random). Their deviations from the
# float64 reference, and the float32 reference's own, sample the rounding the method's run is
# subject to, Adam's amplification included.
#
# The bound is FLOAT32_SAFETY times the largest of those K + 1 deviations, pooled per quantity
# and step (the largest over all tensors: a gradient that is small because large terms cancel
# carries the rounding of those terms, which its own magnitude does not show). If one element
# dominates and its deviation is Gaussian, a new run exceeds S times the largest of K others
# with probability P(|X| > S max(|X_1..X_K|)) = 8.6e-7 for K = 8, S = 8; pooled over many
# elements it is far smaller. Never less than S times (world size + 2) float32 roundings of
# the quantity's largest value: a method may report its loss through a cast to float32, a
# scaling, a sum over the ranks and a division, which no reordering of the reference performs.
# benchmarks/float32_sweep.py measures it: over 2,100 drawn float32 scenarios (world sizes 2,
# 3, 4) DDP, sample-weighted all-reduce, ZeRO and FSDP2 never failed (7,622 runs); the largest
# used 0.46 of its allowance, the median 0.06; every buggy fixture was still caught in
# float32, its cause named. Real aggregation bugs are 1e-3 relative or more. With
# --dtype bfloat16: 1,998 scenarios, 7,250 runs, none failed (largest share 0.35, median
# 0.065); every buggy fixture caught in bfloat16 (after BRANCHING_VARIANTS, below, was added).
FLOAT32_VARIANTS = 8
FLOAT32_SAFETY = 8.0
FLOAT32_UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2
# The same measurement serves every rounded dtype, with the dtype's own unit roundoff in the
# floor: bfloat16 keeps 8 significant bits (u = 2^-8); TF32, which CUDA may use for float32
# matmuls and convolutions when a world allows it, keeps 11 (u = 2^-11). With TF32 allowed, the
# measuring runs use it too (they run on the ranks' kind of device, with the ranks' settings).
UNIT_ROUNDOFF = {
    "float32": FLOAT32_UNIT_ROUNDOFF,
    "bfloat16": torch.finfo(torch.bfloat16).eps / 2,
}
TF32_UNIT_ROUNDOFF = 2.0**-11


def unit_roundoff_of(dtype: str) -> float:
    """Half the distance from 1 to the next number of ``dtype`` (``"float64"``,
    ``"float32"``, ``"bfloat16"``, ``"float16"``): 2^-53, 2^-24, 2^-8, 2^-11.

    Example::

        >>> unit_roundoff_of("bfloat16") == 2.0**-8
        True
    """
    return float(torch.finfo(getattr(torch, dtype)).eps) / 2


def by_roundoff(dtype: str, measured: Mapping[str, float]) -> float:
    """A threshold for ``dtype`` from the values it was measured to need at other dtypes:
    log-linear in the unit roundoff between the two measured dtypes nearest it (beyond them,
    along the line through the nearest two), so that a dtype nobody measured (float16) gets
    one between its neighbours' rather than a KeyError, and the measured ones keep theirs.

    Example::

        >>> close = {"float64": 1e-6, "float32": 1e-3, "bfloat16": 5e-2}
        >>> by_roundoff("float32", close), 1e-3 < by_roundoff("float16", close) < 5e-2
        (0.001, True)
    """
    if dtype in measured:
        return measured[dtype]
    points = sorted((math.log(unit_roundoff_of(d)), math.log(v)) for d, v in measured.items())
    if len(points) < 2:
        raise ValueError(f"a threshold for {dtype} needs two measured dtypes, got {measured}")
    x = math.log(unit_roundoff_of(dtype))
    # The segment around x; outside the measured range, the nearest end segment.
    i = next((i for i in range(1, len(points) - 1) if x < points[i][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


# Adam and AdamW turn a gradient that is zero up to rounding into a step of +lr or -lr by its
# sign, so a run's rounding can land in one of two places, one of them rare: in bfloat16, a
# bias before a two-feature LayerNorm flipped sign in 4 of 200 runs of one scenario, and a
# correct method whose run flipped it failed a bound measured on 9 runs that had not. The
# spread of K runs misses a branch of probability p with chance (1 - p)^K. So with those
# optimizers a comparison that fails is measured again on BRANCHING_VARIANTS runs before it is
# called a divergence (a real bug fails that too: it is no rounding outcome at all); it costs
# only on failures, and its report says how many runs the bound came from.
BRANCHING_VARIANTS = 64
BRANCHING_OPTIMIZERS = ("adam", "adamw")


def rounding_may_branch(scenario: Scenario) -> bool:
    """Whether a rounded run of ``scenario`` can take a rare branch (see BRANCHING_VARIANTS).

    Example::

        if outcome.mismatch and rounding_may_branch(scenario): ...  # measure again
    """
    return scenario.dtype != "float64" and scenario.optimizer.name in BRANCHING_OPTIMIZERS


# Chunks a variant cuts a step's batch into, at most: each costs a forward and a backward.
MAX_CHUNKS = 4


class Tolerance:
    """How far a method's value may be from the reference's (elementwise).

    ``by_name`` says whether the allowance depends on the tensor's name; when it does not, a
    passing comparison is checked over whole flat traces at once.
    """

    by_name: bool = True

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def allowed_flat(
        self, quantity: str, expected: torch.Tensor, lengths: Sequence[int]
    ) -> torch.Tensor:
        """:meth:`allowed` for the values of every step laid end to end (step ``k`` holds
        ``lengths[k]`` of them), for a tolerance whose allowance does not depend on the name.

        Example::

            >>> flat = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
            >>> Float64Tolerance(rtol=0.5, atol=0.0).allowed_flat("parameter", flat, [2, 1])
            tensor([0.5000, 1.0000, 2.0000], dtype=torch.float64)
        """
        parts = expected.split(list(lengths))
        return torch.cat(
            [self.allowed(quantity, step, "", part) for step, part in enumerate(parts)]
        )

    def describe(self) -> str:
        raise NotImplementedError


class Float64Tolerance(Tolerance):
    by_name = False

    def __init__(self, rtol: float = FLOAT64_RTOL, atol: float = FLOAT64_ATOL) -> None:
        self.rtol, self.atol = rtol, atol

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        return self.atol + self.rtol * expected.double().abs()

    def allowed_flat(
        self, quantity: str, expected: torch.Tensor, lengths: Sequence[int]
    ) -> torch.Tensor:
        # The same at every step: one call for the whole trace (a check compares one per
        # example, and per-step calls were most of its cost).
        return self.allowed(quantity, 0, "", expected)

    def describe(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g} × |expected|, float64 rounding"


class TrainingOnly(Float64Tolerance):
    """float64's tolerance for gradients and parameters, and none for the loss: for code whose
    loss is an objective to backpropagate, which it may scale, rather than a value to log (a
    coupled loss multiplied by the world size to undo DDP's average trains right).

    Example::

        >>> float(TrainingOnly().allowed("loss", 0, "", torch.tensor(1.0)))
        inf
    """

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        if quantity == "loss":
            return torch.full_like(expected, math.inf, dtype=torch.float64)
        return super().allowed(quantity, step, name, expected)

    def describe(self) -> str:
        return f"{super().describe()}; the loss your code returns is not held, only training"


class MeasuredTolerance(Tolerance):
    """``safety`` × the largest deviation from the float64 reference among runs in the
    scenario's dtype (float32 or bfloat16) that differ from each other only in rounding,
    pooled per quantity and step (see above).

    Example::

        tolerance = MeasuredTolerance.derive(scenario, train_reference(scenario, "float64"))
    """

    by_name = False
    # Why a float64 scenario is held to it: "the code computes in float32" (set by the probe
    # of ddp_verify.usercode.precision), or empty when the scenario's own dtype asks for it.
    because = ""

    def __init__(
        self,
        bounds: Mapping[tuple[str, int], float],
        *,
        runs: int,
        safety: float = FLOAT32_SAFETY,
        fallback: float = 0.0,
        precision: str = "float32",
    ) -> None:
        self._bounds = dict(bounds)
        self.runs, self.safety, self.fallback = runs, safety, fallback
        self.precision = precision

    @classmethod
    def derive(
        cls,
        scenario: Scenario,
        reference64: Trace,
        *,
        device: torch.device | str | None = None,
        tf32: bool = False,
        variants: int = FLOAT32_VARIANTS,
        safety: float = FLOAT32_SAFETY,
    ) -> MeasuredTolerance:
        """Train the reference and ``variants`` reordered runs of ``scenario`` in its dtype
        (in this process, on ``device``: the ranks' kind of device) and measure how far each
        lands from ``reference64``. ``tf32``: float32 matmuls may round to TF32 here and on
        the ranks, so the floor uses TF32's unit roundoff."""
        dtype = scenario.dtype
        if dtype not in UNIT_ROUNDOFF:
            raise ValueError(f"a measured tolerance is for {tuple(UNIT_ROUNDOFF)}, not {dtype}")
        runs = [train_reference(scenario, dtype, device)]
        runs += [rounding_variant(scenario, v, device=device) for v in range(variants)]
        return cls.of_runs(
            scenario,
            reference64,
            runs,
            tf32=tf32 and DEVICE[torch.device(device or "cpu").type].tf32,
            safety=safety,
        )

    @classmethod
    def of_runs(
        cls,
        scenario: Scenario,
        reference64: Trace,
        runs: Sequence[Trace],
        *,
        tf32: bool = False,
        safety: float = FLOAT32_SAFETY,
    ) -> MeasuredTolerance:
        """The bound ``runs`` in ``scenario``'s dtype measure against ``reference64``: per
        quantity and step, ``safety`` x the largest deviation, never less than ``safety`` x
        (world size + 2) roundings of the quantity's largest value. ``tf32``: the runs'
        float32 matmuls may round to TF32.

        Example::

            MeasuredTolerance.of_runs(scenario, reference64, [run32])
        """
        dtype = scenario.dtype
        deviations: dict[tuple[str, int], float] = {}
        scales: dict[tuple[str, int], float] = {}
        for run in runs:
            for quantity, step, _, exact, rounded in _pairs(reference64, run):
                if exact is None or rounded is None or not exact.numel():
                    continue
                key = (quantity, step)
                # The runs trained on the ranks' device (cuda on GPUs), the truth on the CPU.
                exact64 = exact.to("cpu", torch.float64)
                deviation = float((rounded.to("cpu", torch.float64) - exact64).abs().max())
                deviations[key] = max(deviations.get(key, 0.0), deviation)
                scales[key] = max(scales.get(key, 0.0), float(exact64.abs().max()))
        unit = UNIT_ROUNDOFF[dtype]
        if tf32 and dtype == "float32":
            unit = TF32_UNIT_ROUNDOFF
        roundings = (scenario.world_size + 2) * unit
        bounds = {
            key: safety * max(deviation, roundings * scales[key])
            for key, deviation in deviations.items()
        }
        precision = "float32 (TF32 allowed)" if unit == TF32_UNIT_ROUNDOFF else dtype
        return cls(
            bounds,
            runs=len(runs),
            safety=safety,
            fallback=safety * roundings,
            precision=precision,
        )

    @property
    def bounds(self) -> dict[tuple[str, int], float]:
        """The allowed difference per ``(quantity, step)`` (``fallback`` where none)."""
        return dict(self._bounds)

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        bound = self._bounds.get((quantity, step), self.fallback)
        return torch.full_like(expected, bound, dtype=torch.float64)

    def describe(self) -> str:
        because = f"; {self.because}" if self.because else ""
        return (
            f"{self.safety:g} × the largest deviation of {self.runs} {self.precision} runs "
            f"that differ only in summation order and loss scaling{because}"
        )


class TrainingOnlyMeasured(MeasuredTolerance):
    """:class:`MeasuredTolerance` for gradients and parameters, none for the loss: a coupled
    loss in float32, measured on its own float32 run on one rank (see :class:`TrainingOnly`).
    """

    def allowed(self, quantity: str, step: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        if quantity == "loss":
            return torch.full_like(expected, math.inf, dtype=torch.float64)
        return super().allowed(quantity, step, name, expected)

    def describe(self) -> str:
        return (
            f"{self.safety:g} × how far your code's {self.precision} run on one rank lands "
            "from its float64 run; the loss your code returns is not held, only training"
        )


# The name it had while float32 was the only rounded dtype.
Float32Tolerance = MeasuredTolerance


def rounding_variant(
    scenario: Scenario, variant: int, *, device: torch.device | str | None = None
) -> Trace:
    """A training of ``scenario`` in its dtype (float32 or bfloat16) that differs from the
    reference only in rounding: each step's global batch permuted and cut into up to
    ``MAX_CHUNKS`` random chunks, each chunk's mean loss weighted by its share of the batch
    times a random factor in [1, 2) that is then divided out of its gradient. The same
    ``(scenario, variant)`` always gives the same run.

    Example::

        runs = [rounding_variant(scenario, v) for v in range(8)]
    """
    return _variant(scenario, variant, scenario.dtype, device)


def float32_variant(scenario: Scenario, variant: int) -> Trace:
    """:func:`rounding_variant` in float32 on the CPU, whatever the scenario's dtype.

    Example::

        runs = [float32_variant(scenario, v) for v in range(8)]
    """
    return _variant(scenario, variant, "float32", None)


def _variant(
    scenario: Scenario, variant: int, dtype: str, device: torch.device | str | None
) -> Trace:
    rng = random.Random(f"{scenario.seed}:{variant}")

    def reordered(step: Step) -> list[float]:
        if step.scenario.terms:
            return rescaled(step)
        n = len(step.inputs)
        order = torch.tensor(rng.sample(range(n), n), device=step.inputs.device)
        inputs, targets = step.inputs[order], step.targets[order]
        cuts = sorted(rng.sample(range(1, n), rng.randint(1, min(n, MAX_CHUNKS)) - 1))
        params = [p for p in step.model.parameters() if p.requires_grad]
        sums: list[torch.Tensor | None] = [None] * len(params)
        reported = 0.0
        for start, end in zip([0, *cuts], [*cuts, n], strict=True):
            factor = rng.uniform(1.0, 2.0)
            chunk = (inputs[start:end], targets[start:end])
            loss = step.loss(step.model, chunk)
            share = step.share(chunk)  # of the samples, or the tokens that count; 1 in a sum
            weight = share * factor
            grads = torch.autograd.grad(loss * weight, params, allow_unused=True)
            for i, grad in enumerate(grads):
                if grad is not None:
                    grad = grad / factor
                    sums[i] = grad if sums[i] is None else sums[i] + grad
            reported += loss.item() * share
        for p, summed in zip(params, sums, strict=True):
            p.grad = summed
        return [reported]

    def rescaled(step: Step) -> list[float]:
        # Terms are no share-weighted sum of pieces (a term per micro-batch weighs each
        # equally): the whole batch's objective times a random factor divided back out.
        factor = rng.uniform(1.0, 2.0)
        loss = objective_of_terms(step, step.model, step.inputs, step.targets)
        (loss * factor).backward()
        for p in step.model.parameters():
            if p.grad is not None:
                p.grad = p.grad / factor
        return [loss.item()]

    return train(scenario, reordered, dtype=dtype, device=device, name=f"{dtype} variant {variant}")


def relative_deviation(exact: Trace, got: Trace) -> float:
    """The largest difference between ``got`` (every rank) and the ``exact`` reference, each
    tensor's relative to its own largest magnitude: about the unit roundoff of the format the
    computation rounded in (1e-16 for float64 code, 1e-8 to 1e-6 for float32), or order one
    for a mistake.

    Example::

        relative_deviation(reference, ranks_trace)  # 3e-08: something rounded in float32
    """
    worst = 0.0
    for rank in got.ranks:
        for _, _, _, a, b in _pairs(exact, Trace(got.method, [rank])):
            if a is None or b is None or not a.numel():
                continue
            a64, b64 = a.to("cpu", torch.float64), b.to("cpu", torch.float64)
            scale = float(a64.abs().max())
            difference = float((b64 - a64).abs().max())
            worst = max(worst, difference / scale if scale else difference)
    return worst


def common_scale(exact: Trace, got: Trace) -> tuple[float, float]:
    """The factor ``s`` that brings ``got``'s gradients (every rank, every step) closest to
    ``exact``'s, least squares over all of them at once, and what is left then: the largest
    difference between ``got`` and ``s x exact``, each tensor's relative to its own largest
    magnitude (as :func:`relative_deviation` measures). Code whose denominator carries an
    epsilon (``count + 1e-8``) trains ``(1 - 1e-8 / count)`` times the reference's
    gradients: a factor near one and a rest at float64's rounding, where code that rounds in
    float32 leaves a rest of float32's.

    Example::

        scale, rest = common_scale(reference, ranks_trace)  # 0.9999999991, 3e-15
    """
    dot = norm = 0.0
    pairs = []
    for rank in got.ranks:
        for quantity, _, _, a, b in _pairs(exact, Trace(got.method, [rank])):
            if quantity != "gradient" or a is None or b is None or not a.numel():
                continue
            a64, b64 = a.to("cpu", torch.float64), b.to("cpu", torch.float64)
            dot += float((a64 * b64).sum())
            norm += float((a64 * a64).sum())
            pairs.append((a64, b64))
    if not norm:
        return 1.0, 0.0
    scale = dot / norm
    rest = 0.0
    for a64, b64 in pairs:
        magnitude = float(a64.abs().max())
        difference = float((b64 - scale * a64).abs().max())
        rest = max(rest, difference / magnitude if magnitude else difference)
    return scale, rest


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
