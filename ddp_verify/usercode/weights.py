"""What each sample (or token) effectively counted for: a divergence explained by its weights.

At a step, every rank starts from known parameters, and what a data-parallel step leaves in
``.grad`` is (for the linear mistakes: weightings, sums, dropped micro-batches, another rank's
gradient) a weighted sum of the micro-batches' mean-loss gradients there; the loss a rank
reports is likewise a weighted sum of the micro-batches' mean losses. The correct weighting
gives each loss item (sample, or token that counts) ``1/N`` of the global batch's ``N``.

:func:`fit_gradient` fits the gradient's weights by least squares over the micro-batches'
float64 gradients, whatever form the code took, and :func:`gradient_causes` says in words, with
the numbers, which ranks and micro-batches counted for how much and why that is wrong.
:func:`loss_causes` does the same for the reported loss, which is one number per rank and step:
it is held against every weighting of ranks (by share, 1/world size, summed, its own only, item
sums) and micro-batches (by items, equally, last only), carried over steps or not. Gradients and
losses are explained separately, so a mistake in one never hides the other.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..engine.models import (
    build_data,
    build_model,
    count_items,
    loss_function,
    micro_batches,
    one_thread,
)
from ..engine.scenario import Scenario
from ..engine.trace import Trace

Params = Mapping[str, torch.Tensor]

# How close (relative) a weight must come to a pattern's to be that pattern, by dtype: the
# fit of a float64 run is exact to ~1e-12; float32 gradients carry ~1e-6 of rounding; bfloat16
# ~1e-2.
CLOSE = {"float64": 1e-3, "float32": 1e-3, "bfloat16": 3e-2}
# A fit explains the gradient when what it leaves over is below this share of it.
RESIDUAL = {"float64": 1e-6, "float32": 1e-3, "bfloat16": 5e-2}


@dataclasses.dataclass(frozen=True)
class Cause:
    """One cause of a divergence. ``subject``: what it is about (``gradient``, ``loss``,
    ``parameters``, ``run``); ``pattern``: a stable code for the finding (``ranks:world``,
    ``micro:equal``, ...), derived from the fitted weights, never from the code's text;
    ``evidence``: the numbers behind it; ``weights``: the fitted weights, per rank and
    micro-batch, where a fit found it.

    Example::

        cause.text      # "gradients averaged over ranks by the world size, ..."
        cause.pattern   # "ranks:world"
    """

    text: str
    subject: str
    pattern: str
    evidence: str = ""
    weights: tuple[dict[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.text,
            "subject": self.subject,
            "pattern": self.pattern,
            "evidence": self.evidence,
            "weights": list(self.weights),
        }


@dataclasses.dataclass(frozen=True)
class Group:
    """One micro-batch of one rank at the fitted step: ``items`` loss items (samples, or
    tokens that count)."""

    rank: int
    micro: int
    items: int
    samples: int = 0


@dataclasses.dataclass(frozen=True)
class WeightFit:
    """The per-item weight each micro-batch carried in one rank's gradient at ``step``.

    ``expected`` is ``1/N`` for every group; ``residual`` is the share of the observed
    gradient that no weighting of the micro-batches explains (near 0: the fit holds);
    ``identifiable`` is False when the micro-batches' gradients are linearly dependent, so
    that other weights would explain it as well.
    """

    world_size: int
    rank: int
    step: int
    groups: tuple[Group, ...]
    fitted: tuple[float, ...]
    expected: float
    residual: float
    identifiable: bool
    unit: str = "sample"

    def ratio(self, index: int) -> float:
        return self.fitted[index] / self.expected

    def rank_total(self, rank: int) -> float:
        """The weight rank ``rank``'s items carried together (its share of the gradient)."""
        return sum(
            w * g.items for w, g in zip(self.fitted, self.groups, strict=True) if g.rank == rank
        )

    def rank_items(self, rank: int) -> int:
        return sum(g.items for g in self.groups if g.rank == rank)

    def table(self) -> tuple[dict[str, Any], ...]:
        """Every group's fitted and expected per-item weight, for reports and ``--json``."""
        return tuple(
            {
                "rank": g.rank,
                "micro_batch": g.micro,
                "items": g.items,
                "weight": w,
                "expected": self.expected,
            }
            for g, w in zip(self.groups, self.fitted, strict=True)
        )

    def evidence(self) -> str:
        per = ", ".join(
            f"rank {g.rank} mb {g.micro}: {g.items} x {w:.4g}"
            for g, w in zip(self.groups, self.fitted, strict=True)
        )
        return (
            f"weights fitted to rank {self.rank}'s gradient at step {self.step} (per {self.unit}, "
            f"expected {self.expected:.4g} each; residual {self.residual:.1e}): {per}"
        )


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else unit + "s"


def _near(value: float, target: float, close: float, scale: float | None = None) -> bool:
    return abs(value - target) <= close * (abs(target) if scale is None else scale) + 1e-15


def explain_fit(fit: WeightFit, close: float) -> list[tuple[str, str]]:
    """``(pattern, text)`` for what is wrong with ``fit``'s weights, most telling first; empty
    when every item counted ``1/N``.

    Example::

        explain_fit(fit, 1e-3)
        # [('ranks:world', "gradients averaged over ranks by the world size, ...")]
    """
    n = len(fit.groups)
    if all(_near(fit.ratio(i), 1.0, close, 1.0) for i in range(n)):
        return []
    unit, world = fit.unit, fit.world_size
    ranks = sorted({g.rank for g in fit.groups})
    ratios = [fit.ratio(i) for i in range(n)]
    if max(ratios) - min(ratios) <= close * max(1.0, abs(max(ratios))):
        k = ratios[0]
        if world > 1 and _near(k, world, close):
            why = "gradients summed across ranks but not divided by the world size"
        elif world > 1 and _near(k, 1 / world, close):
            why = "gradients divided by the world size once too often"
        else:
            why = "the gradient is scaled"
        return [("scale", f"{why}: every {unit} counted {k:.4g}x what it should")]
    found: list[tuple[str, str]] = []
    totals = {r: fit.rank_total(r) for r in ranks}
    shares = {r: fit.rank_items(r) * fit.expected for r in ranks}
    # Micro-batches first: a dropped one also shrinks its rank's total, which is then no
    # mistake of its own; the ranks' weighting is wrong only if the items that did count
    # counted other than 1/N.
    found.extend(_micro_patterns(fit, totals, close))
    counted = [i for i in range(n) if not _near(ratios[i], 0.0, close, 1.0)]
    surviving_right = all(_near(ratios[i], 1.0, close, 1.0) for i in counted)
    wrong_totals = any(not _near(totals[r], shares[r], close, max(shares.values())) for r in ranks)
    if wrong_totals and not (found and surviving_right):
        found.append(_rank_pattern(fit, totals, shares, close))
    return found


def _rank_pattern(
    fit: WeightFit, totals: dict[int, float], shares: dict[int, float], close: float
) -> tuple[str, str]:
    unit, world, me = fit.unit, fit.world_size, fit.rank
    ranks = sorted(totals)
    nonzero = [r for r in ranks if not _near(totals[r], 0.0, close, 1.0)]
    wrong = [r for r in ranks if not _near(totals[r], shares[r], close, max(shares.values()))]
    numbers = "; ".join(
        f"rank {r}'s {fit.rank_items(r)} {_plural(unit, fit.rank_items(r))} counted "
        f"{totals[r]:.4g} in all instead of {shares[r]:.4g}"
        for r in wrong
    )
    if nonzero == [me] and fit.world_size > 1:
        return (
            "ranks:own",
            f"gradients never synchronised: rank {me}'s gradient is made of its own {unit}s "
            f"only ({numbers})",
        )
    if len(nonzero) == 1 and fit.world_size > 1:
        source = nonzero[0]
        return (
            "ranks:one",
            f"rank {source}'s gradient used on rank {me} (broadcast or copied from rank "
            f"{source} instead of combined over ranks) ({numbers})",
        )
    values = list(totals.values())
    same = max(values) - min(values) <= close * max(abs(v) for v in values)
    rows = {r: sum(g.samples for g in fit.groups if g.rank == r) for r in ranks}
    by_rows = {r: rows[r] / sum(rows.values()) for r in ranks}
    by_samples = unit == "token" and all(_near(totals[r], by_rows[r], close) for r in ranks)
    # Where ranks hold as many samples, weighting by samples is averaging by the world size:
    # the plainer reading is said.
    if by_samples and not (same and _near(values[0], 1 / world, close)):
        return (
            "ranks:samples",
            "ranks weighted by their samples, not by the tokens that count (a count of "
            f"sequences where the loss averages tokens): {numbers}",
        )
    if same and _near(values[0], 1 / world, close):
        tokens = (
            " (normalised per rank by its own token count instead of the global count)"
            if unit == "token"
            else ""
        )
        return (
            "ranks:world",
            "gradients averaged over ranks by the world size, not weighted by each rank's "
            f"{unit}s{tokens}: {numbers}",
        )
    if same and _near(values[0], 1.0, close):
        return (
            "ranks:sum",
            f"gradients summed across ranks but not divided: each rank's mean counted 1 in "
            f"all instead of its share of the {unit}s ({numbers})",
        )
    total = sum(fit.rank_items(r) for r in ranks)
    if same and _near(values[0], 1 / total, close):
        return (
            "ranks:means-over-count",
            f"each rank's mean gradient summed and divided by the global {unit} count "
            f"({total}): a mean is already divided by its own count, so weight it by its "
            f"share, or sum the ranks' sums ({numbers})",
        )
    if same:
        return (
            "ranks:equal",
            f"every rank's gradient counted {values[0]:.4g} in all, whatever its share of the "
            f"{unit}s ({numbers})",
        )
    return ("ranks:other", f"ranks weighted wrongly: {numbers}")


def _micro_patterns(
    fit: WeightFit, totals: dict[int, float], close: float
) -> list[tuple[str, str]]:
    """Micro-batches weighted wrongly within a rank, whatever the rank's total."""
    unit = fit.unit
    by_rank: dict[int, list[int]] = {}
    for i, g in enumerate(fit.groups):
        by_rank.setdefault(g.rank, []).append(i)
    found: dict[str, list[int]] = {}
    details: dict[str, list[str]] = {}
    for rank, indices in by_rank.items():
        total = totals[rank]
        if len(indices) < 2 or _near(total, 0.0, close, 1.0):
            continue
        items = fit.rank_items(rank)
        shares = [fit.fitted[i] * fit.groups[i].items / total for i in indices]
        expected = [fit.groups[i].items / items for i in indices]
        if all(_near(s, e, close, 1.0) for s, e in zip(shares, expected, strict=True)):
            continue
        m = len(indices)
        rows = [fit.groups[i].samples for i in indices]
        if all(_near(s, 1 / m, close, 1.0) for s in shares):
            pattern = "micro:equal"
        elif unit == "token" and all(
            _near(s, r / sum(rows), close, 1.0) for s, r in zip(shares, rows, strict=True)
        ):
            pattern = "micro:samples"
        elif all(_near(s, 0.0, close, 1.0) for s in shares[:-1]) and _near(shares[-1], 1, close):
            pattern = "micro:last-only"
        elif any(_near(s, 0.0, close, 1.0) for s in shares):
            pattern = "micro:dropped"
        else:
            pattern = "micro:other"
        found.setdefault(pattern, []).append(rank)
        details.setdefault(pattern, []).append(
            f"rank {rank}: "
            + ", ".join(
                f"micro-batch {j} ({fit.groups[i].items} {_plural(unit, fit.groups[i].items)}) "
                f"{s:.3g} of the rank instead of {e:.3g}"
                for j, (i, s, e) in enumerate(zip(indices, shares, expected, strict=True))
            )
        )
    texts = {
        "micro:equal": (
            "normalised per micro-batch by its own token count instead of the global count: "
            "each micro-batch's mean counted the same, whatever its tokens"
            if unit == "token"
            else "micro-batch losses divided by the number of micro-batches instead of "
            "weighted by their sizes (a mean of micro-batch means)"
        ),
        "micro:last-only": "only the last micro-batch's gradient kept (zero_grad() inside the "
        "accumulation loop)",
        "micro:dropped": "some micro-batches counted 0 (their gradients were dropped)",
        "micro:samples": "micro-batches weighted by their samples, not by the tokens that count",
        "micro:other": "micro-batches weighted wrongly within a rank",
    }
    return [
        (pattern, f"{texts[pattern]}: {'; '.join(details[pattern])}")
        for pattern in (
            "micro:last-only",
            "micro:equal",
            "micro:samples",
            "micro:dropped",
            "micro:other",
        )
        if pattern in found
    ]


def _unit(scenario: Scenario) -> str:
    return "token" if scenario.loss == "tokens" else "sample"


def _model_at(scenario: Scenario, params: Params | None) -> torch.nn.Module:
    model = build_model(scenario, "float64")
    if params is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in params:
                    p.copy_(params[name].detach().to("cpu", torch.float64))
    return model


def group_terms(
    scenario: Scenario, step: int = 0, starts: Sequence[Params | None] | None = None
) -> tuple[list[Group], torch.Tensor, list[float]]:
    """Every micro-batch of ``step`` (rank-major): its mean-loss gradient, float64, as the
    columns of a ``(parameters, groups)`` matrix, and its mean loss, each at the parameters
    its rank started the step from (``starts[rank]``; the initial ones where None).

    Example::

        groups, columns, losses = group_terms(scenario)
    """
    with one_thread():
        inputs, targets = build_data(scenario, "float64")[step]
        loss_fn = loss_function(scenario)
        groups, columns, losses = [], [], []
        for rank in range(scenario.world_size):
            model = _model_at(scenario, None if starts is None else starts[rank])
            for micro, (x, y) in enumerate(micro_batches(scenario, step, rank, (inputs, targets))):
                model.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                columns.append(_flat(model, {n: p.grad for n, p in model.named_parameters()}))
                losses.append(float(loss.detach()))
                groups.append(Group(rank, micro, count_items(scenario, y), len(y)))
    return groups, torch.stack(columns, dim=1), losses


def group_gradients(scenario: Scenario, step: int = 0) -> tuple[list[Group], torch.Tensor]:
    """The groups and gradient columns of :func:`group_terms` at the initial parameters."""
    groups, columns, _ = group_terms(scenario, step)
    return groups, columns


def fit_gradient(
    scenario: Scenario,
    observed: Mapping[str, torch.Tensor | None],
    step: int = 0,
    *,
    rank: int = 0,
    starts: Sequence[Params | None] | None = None,
) -> WeightFit:
    """The weights that explain ``observed`` (``rank``'s ``.grad`` by parameter name at
    ``step``, every rank having started it from ``starts``) as a weighted sum of the
    micro-batches' mean gradients.

    Example::

        fit = fit_gradient(outcome.scenario, outcome.got.ranks[3].grads[0], rank=3)
        print(explain_fit(fit, 1e-3))
    """
    groups, columns, _ = group_terms(scenario, step, starts)
    with one_thread():
        model = build_model(scenario, "float64")
        target = _flat(model, observed).to(torch.float64)
        solution = torch.linalg.lstsq(columns, target.unsqueeze(1), driver="gelsd").solution
        coefficients = solution.squeeze(1)
        scale = float(target.norm()) or 1.0
        residual = float((columns @ coefficients - target).norm()) / scale
        matrix_rank = int(torch.linalg.matrix_rank(columns))
        if matrix_rank < len(groups):
            # Many weightings explain it equally well, and least squares picks the smallest,
            # not the true one: the simplest structured weighting that explains it instead.
            structured = _structured(groups, rank, columns, target, RESIDUAL[scenario.dtype])
            if structured is not None:
                coefficients, residual = structured
    total = sum(g.items for g in groups)
    return WeightFit(
        world_size=scenario.world_size,
        rank=rank,
        step=step,
        groups=tuple(groups),
        fitted=tuple(float(c) / g.items for c, g in zip(coefficients, groups, strict=True)),
        expected=1 / total,
        residual=residual,
        identifiable=matrix_rank == len(groups),
        unit=_unit(scenario),
    )


def _structured(
    groups: list[Group], rank: int, columns: torch.Tensor, target: torch.Tensor, limit: float
) -> tuple[torch.Tensor, float] | None:
    """Each group's total weight under the simplest weighting of ranks (by share, 1/world
    size, summed, over the global count, this rank alone, one rank alone; or the right one
    scaled) and of micro-batches within a rank (by items, equally, last only, by samples) that
    explains ``target`` to within ``limit``; None if none does."""
    items = torch.tensor([float(g.items) for g in groups], dtype=torch.float64)
    rows = torch.tensor([float(g.samples or g.items) for g in groups], dtype=torch.float64)
    ranks = sorted({g.rank for g in groups})
    of = torch.tensor([g.rank for g in groups])
    per_rank = {r: (of == r) for r in ranks}
    last = torch.tensor(
        [g.micro == max(h.micro for h in groups if h.rank == g.rank) for g in groups],
        dtype=torch.float64,
    )
    total = float(items.sum())

    def micro(mode: str) -> torch.Tensor:
        weights = {"items": items, "equal": torch.ones_like(items), "last": last, "samples": rows}
        share = torch.zeros(len(groups), dtype=torch.float64)
        for mask in per_rank.values():
            share[mask] = weights[mode][mask] / weights[mode][mask].sum()
        return share

    def by_rank(mode: str) -> torch.Tensor:
        out = torch.zeros(len(groups), dtype=torch.float64)
        for r, mask in per_rank.items():
            held = float(items[mask].sum())
            value = {
                "share": held / total,
                "world": 1 / len(ranks),
                "sum": 1.0,
                "means-over-count": 1 / total,
                "own": 1.0 if r == rank else 0.0,
            }.get(mode)
            if value is None:  # "one:S": rank S's alone
                value = 1.0 if r == int(mode.split(":")[1]) else 0.0
            out[mask] = value
        return out

    scale = float(target.norm()) or 1.0
    modes = ["share", "world", "sum", "means-over-count", "own"] + [f"one:{r}" for r in ranks]
    for micro_mode in ("items", "equal", "last", "samples"):
        for rank_mode in modes:
            coefficients = by_rank(rank_mode) * micro(micro_mode)
            explained = columns @ coefficients
            if rank_mode == "share" and micro_mode == "items":
                # The right weighting, scaled by k (summed, not averaged: k = world size).
                k = float(explained @ target) / (float(explained @ explained) or 1.0)
                coefficients, explained = coefficients * k, explained * k
            residual = float((explained - target).norm()) / scale
            if residual <= limit:
                return coefficients, residual
    return None


def observed_gradients(scenario: Scenario, got: Trace, step: int) -> list[dict | None]:
    """Each rank's gradient at ``step``: recorded, or (SGD at step 0, for step functions that
    keep their gradients to themselves) read back from the update, ``(p0 - p1) / lr`` less
    the weight decay. None where neither can be had (Adam's update is not linear in it)."""
    if got.ranks[0].grads is not None and len(got.ranks[0].grads) > step:
        return [rank.grads[step] for rank in got.ranks]  # type: ignore[index]
    if step != 0 or scenario.optimizer.name != "sgd":
        return [None] * len(got.ranks)
    start = dict(build_model(scenario, "float64").named_parameters())
    lr, decay = scenario.optimizer.lr, scenario.optimizer.weight_decay
    found: list[dict | None] = []
    for rank in got.ranks:
        grads = {}
        for name, after in rank.params[0].items():
            if not start[name].requires_grad:
                continue
            before = start[name].detach()
            after = after.to("cpu", torch.float64)
            moved = before - after
            # A parameter that did not move had no gradient: SGD skips it, decay included.
            grads[name] = (
                moved / lr - decay * before if bool(moved.any()) else torch.zeros_like(moved)
            )
        found.append(grads)
    return found


def starts_of(scenario: Scenario, got: Trace, step: int) -> list[Params | None]:
    """The parameters each rank started ``step`` from (the initial ones at step 0)."""
    if step == 0:
        return [None] * scenario.world_size
    # A one-process trace (the reference's) stands for every rank.
    return [
        got.ranks[min(r, len(got.ranks) - 1)].params[step - 1] for r in range(scenario.world_size)
    ]


def gradient_fits(scenario: Scenario, got: Trace, *, compressed: bool = False) -> list[WeightFit]:
    """Every rank's fit at the first step whose gradients some rank got wrong (empty when
    no step's gradient can be read or every one is right)."""
    close, limit = _bounds(scenario, compressed)
    for step in range(got.steps):
        observed = observed_gradients(scenario, got, step)
        if any(g is None for g in observed):
            return []
        starts = starts_of(scenario, got, step)
        fits = [
            fit_gradient(scenario, g, step, rank=r, starts=starts)  # type: ignore[arg-type]
            for r, g in enumerate(observed)
        ]
        if any(explain_fit(f, close) or f.residual > limit for f in fits):
            return fits
    return []


def _bounds(scenario: Scenario, compressed: bool) -> tuple[float, float]:
    """How close a weight must be, and how small the residual, for this run: a comm hook
    may compress (float16 rounds each contribution by 2^-11 and the sum again), which moves
    fitted weights by a few parts in a thousand to a percent."""
    close, limit = CLOSE[scenario.dtype], RESIDUAL[scenario.dtype]
    return (max(close, 3e-2), max(limit, 5e-2)) if compressed else (close, limit)


def gradient_causes(
    scenario: Scenario, fits: list[WeightFit], *, compressed: bool = False
) -> list[Cause]:
    """What the fitted weights say is wrong with the gradients, one cause per finding (said
    once when every rank shows it), most telling first; a cause saying the gradient is not a
    weighted sum of the micro-batches' when the fit does not hold."""
    if not fits:
        return []
    close, limit = _bounds(scenario, compressed)
    if any(f.residual > limit for f in fits):
        worst = max(fits, key=lambda f: f.residual)
        return [
            Cause(
                "the gradient is not a weighted sum of the micro-batches' gradients (not a "
                "linear mistake: the optimizer stepped between micro-batches, gradients "
                "were clipped or compressed, or the loss was changed)",
                "gradient",
                "nonlinear",
                worst.evidence(),
                worst.table(),
            )
        ]
    per_rank = [(f, explain_fit(f, close)) for f in fits]
    causes: list[Cause] = []
    patterns = [tuple(p for p, _ in found) for _, found in per_rank]
    if len(fits) > 1 and all(p == ("ranks:own",) for p in patterns):
        f = fits[0]
        causes.append(
            Cause(
                f"gradients never synchronised: each rank trained on its own {f.unit}s only",
                "gradient",
                "ranks:own",
                "; ".join(fit.evidence() for fit in fits),
                f.table(),
            )
        )
        return causes
    sources = {_only_source(f, close) for f in fits}
    if len(fits) > 1 and len(sources) == 1 and None not in sources:
        (source,) = sources
        f = fits[-1]
        causes.append(
            Cause(
                f"rank {source}'s gradient used on every rank (broadcast or copied from rank "
                f"{source} instead of combined over ranks): the other ranks' {f.unit}s counted 0",
                "gradient",
                "ranks:one",
                f.evidence(),
                f.table(),
            )
        )
        return causes
    seen: dict[str, Cause] = {}
    for fit, found in per_rank:
        for pattern, text in found:
            if pattern in seen:
                continue
            same = all(pattern in p for p in patterns)
            where = "" if same or len(fits) == 1 else f" (on rank {fit.rank})"
            seen[pattern] = Cause(text + where, "gradient", pattern, fit.evidence(), fit.table())
    causes.extend(seen.values())
    if causes and not all(f.identifiable for f in fits):
        causes = [
            dataclasses.replace(
                c,
                evidence=c.evidence + " (the micro-batches' gradients are linearly dependent "
                "here, so other weights would explain it as well)",
            )
            for c in causes
        ]
    return causes


def _only_source(fit: WeightFit, close: float) -> int | None:
    """The one rank whose items carry every weight in ``fit``, if there is one."""
    ranks = sorted({g.rank for g in fit.groups})
    nonzero = [r for r in ranks if not _near(fit.rank_total(r), 0.0, close, 1.0)]
    return nonzero[0] if len(nonzero) == 1 else None


# Reported-loss weightings: how ranks, then micro-batches within a rank, are weighted, and
# whether the value carries over steps. Simplest (fewest mistakes) first.
_RANKS = ("share", "own", "sum", "world", "items")
_MICROS = ("items", "equal", "last")


def _loss_weights(groups: list[Group], rank: int, ranks_mode: str, micro_mode: str) -> list[float]:
    total = sum(g.items for g in groups)
    counts: dict[int, int] = {}
    pieces: dict[int, int] = {}
    for g in groups:
        counts[g.rank] = counts.get(g.rank, 0) + g.items
        pieces[g.rank] = pieces.get(g.rank, 0) + 1
    last = {g.rank: g.micro for g in groups}
    world = len(counts)
    weights = []
    for g in groups:
        rank_weight = {
            "share": counts[g.rank] / total,
            "own": 1.0 if g.rank == rank else 0.0,
            "sum": 1.0,
            "world": 1 / world,
            "items": float(counts[g.rank]),
        }[ranks_mode]
        micro_weight = {
            "items": g.items / counts[g.rank],
            "equal": 1 / pieces[g.rank],
            "last": 1.0 if g.micro == last[g.rank] else 0.0,
        }[micro_mode]
        weights.append(rank_weight * micro_weight)
    return weights


_LOSS_TEXTS = {
    "own": "the reported loss is the rank's local loss, not the global mean",
    "sum": "the reported loss is summed across ranks but not divided",
    "world": "the reported loss is the unweighted mean of rank means (only right when every "
    "rank holds as many {unit}s)",
    "items": "the reported loss is the sum of per-{unit} losses, not divided by their count",
    "equal": "the reported loss averages micro-batch means, not weighted by their {unit}s",
    "last": "the reported loss is the last micro-batch's only",
    "carry": "the reported loss accumulates across steps (never reset)",
}
_LOSS_PATTERNS = {
    "own": "loss:local",
    "sum": "loss:sum",
    "world": "loss:world",
    "items": "loss:item-sum",
    "equal": "loss:micro-equal",
    "last": "loss:last-only",
    "carry": "loss:carried",
}


def loss_causes(scenario: Scenario, reference: Trace, got: Trace) -> list[Cause]:
    """What is wrong with the loss each rank reports: the simplest weighting of the
    micro-batches' mean losses (at the parameters each rank really had) that reproduces every
    step, with the numbers; or, when none does, the reported and the global mean side by side.

    Example::

        loss_causes(scenario, reference, got)
        # [Cause('the reported loss is the rank's local loss, not the global mean', ...)]
    """
    unit = _unit(scenario)
    terms = [group_terms(scenario, s, starts_of(scenario, got, s)) for s in range(got.steps)]
    rtol = {"float64": 1e-7, "float32": 1e-4, "bfloat16": 3e-2}[scenario.dtype]
    candidates = sorted(
        itertools.product(_RANKS, _MICROS, (False, True)),
        key=lambda c: (c[0] != "share") + (c[1] != "items") + c[2],
    )
    found: dict[str, tuple[str, ...]] = {}
    unexplained = []
    for r, rank in enumerate(got.ranks):
        reported = rank.losses
        for ranks_mode, micro_mode, carry in candidates:
            total = 0.0
            ok = True
            for s, (groups, _, losses) in enumerate(terms):
                value = sum(
                    w * ell
                    for w, ell in zip(
                        _loss_weights(groups, r, ranks_mode, micro_mode), losses, strict=True
                    )
                )
                total = total + value if carry else value
                if abs(reported[s] - total) > rtol * max(abs(total), 1e-3):
                    ok = False
                    break
            if ok:
                parts = tuple(
                    p
                    for p, wrong in (
                        (ranks_mode, ranks_mode != "share"),
                        (micro_mode, micro_mode != "items"),
                        ("carry", carry),
                    )
                    if wrong
                )
                found[f"rank {r}"] = parts
                break
        else:
            unexplained.append(r)
    causes: list[Cause] = []
    everyone = {parts for parts in found.values()}
    said: set[str] = set()
    for r, parts in ((int(k.split()[1]), v) for k, v in found.items()):
        for part in parts:
            if part in said:
                continue
            said.add(part)
            on_all = len(everyone) == 1 and not unexplained
            where = "" if on_all or len(got.ranks) == 1 else f" (rank {r})"
            said_first = got.ranks[r].losses[0]
            causes.append(
                Cause(
                    _LOSS_TEXTS[part].format(unit=unit) + where,
                    "loss",
                    _LOSS_PATTERNS[part],
                    f"rank {r} reported {said_first:.6g} at step 0, the global mean there is "
                    f"{reference.ranks[0].losses[0]:.6g}; every step of it is reproduced by "
                    f"that weighting of the micro-batches' mean losses",
                )
            )
    if unexplained:
        r = unexplained[0]
        steps = ", ".join(
            f"step {s}: {got.ranks[r].losses[s]:.6g} vs {reference.ranks[0].losses[s]:.6g}"
            for s in range(got.steps)
        )
        causes.append(
            Cause(
                "the reported loss fits no weighting of the micro-batches' mean losses tried "
                f"(by share, own, summed, 1/world size, item sums; micro-batches by {unit}s, "
                "equally, last only; carried over steps or not)",
                "loss",
                "loss:unexplained",
                f"rank {r} reported vs the global mean: {steps}",
            )
        )
    return causes


def _flat(model: torch.nn.Module, grads: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
    # Parameters in the model's order; a missing gradient counts as zeros.
    parts = []
    for name, p in model.named_parameters():
        g = grads.get(name)
        parts.append(
            torch.zeros(p.numel(), dtype=torch.float64)
            if g is None
            else g.detach().to("cpu", torch.float64).reshape(-1)
        )
    return torch.cat(parts)
