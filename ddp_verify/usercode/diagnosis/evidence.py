"""What was observed of a diverged run, and the one tolerance table every prediction is held to.

:class:`Evidence` holds a run against its reference: per step, the micro-batches' float64
gradient columns and mean losses at the parameters each rank started from (computed once,
shared by every hypothesis), each rank's gradient as the optimizer saw it and the loss it
reported. :func:`tolerance` says how close a prediction must come, per dtype: measured for
float64, float32 and bfloat16, derived from the unit roundoff for the others.

Example::

    evidence = Evidence("grad-sync", scenario, reference, got)
    evidence.tolerance.residual  # 1e-06 for a float64 run
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...engine.models import (
    PAD_ID,
    build_data,
    build_model,
    count_items,
    global_items,
    loss_function,
    micro_batches,
    one_thread,
    padded_width,
    sums,
    window_factor,
)
from ...engine.objectives import objective
from ...engine.packing import pack
from ...engine.scenario import Scenario
from ...engine.tolerances import by_roundoff
from ...engine.trace import Trace
from ..findings import whole
from ..kinds import Kind
from .axes import Choice, Group, choice

Params = Mapping[str, torch.Tensor]

__all__ = [
    "Evidence",
    "Group",
    "Terms",
    "Tolerance",
    "flatten",
    "group_gradients",
    "group_terms",
    "observed_gradients",
    "starts_of",
    "tolerance",
    "unit_of",
]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How close a prediction must come, for one dtype.

    ``close``: a fitted factor or weight against a row's, relative; ``residual``: the share of
    a gradient a prediction may leave unexplained; ``loss``: a reported loss against a
    prediction, relative, at every step; ``match_rtol``/``match_atol``: a run against a
    simulated one, elementwise; ``noise``: the rounding an observed gradient carries,
    relative to its norm (what a fit's weights inherit, amplified by its conditioning)."""

    close: float
    residual: float
    loss: float
    match_rtol: float
    match_atol: float
    noise: float


# Measured: a float64 run's fit is exact to ~1e-12, float32 gradients carry ~1e-6 of
# rounding, bfloat16 ~1e-2. A simulated mistake need only be told apart from the others,
# which differ by far more: loose on purpose.
MEASURED: dict[str, Tolerance] = {
    "float64": Tolerance(
        close=1e-3, residual=1e-6, loss=1e-7, match_rtol=1e-5, match_atol=1e-7, noise=1e-12
    ),
    "float32": Tolerance(
        close=1e-3, residual=1e-3, loss=1e-4, match_rtol=1e-3, match_atol=1e-5, noise=1e-6
    ),
    "bfloat16": Tolerance(
        close=3e-2, residual=5e-2, loss=3e-2, match_rtol=4e-2, match_atol=4e-3, noise=1e-2
    ),
}
# A hook that may compress: float16 rounds each contribution by 2^-11 of its size and the
# sum again per rank, which moves fitted weights by a few parts in a thousand to a percent.
COMPRESSED = Tolerance(
    close=3e-2, residual=5e-2, loss=3e-2, match_rtol=2e-2, match_atol=1e-4, noise=2**-11
)


def tolerance(dtype: str, *, compressed: bool = False) -> Tolerance:
    """The tolerance for a run in ``dtype`` (``compressed``: by a hook that may compress).

    Example::

        >>> tolerance("float64").residual
        1e-06
        >>> tolerance("float64", compressed=True).residual
        0.05
    """
    fields = {
        name: by_roundoff(dtype, {d: getattr(t, name) for d, t in MEASURED.items()})
        for name in ("close", "residual", "loss", "match_rtol", "match_atol", "noise")
    }
    if compressed:
        fields = {k: max(v, getattr(COMPRESSED, k)) for k, v in fields.items()}
    return Tolerance(**fields)


def unit_of(scenario: Scenario) -> str:
    """What a loss item is in ``scenario``: ``token`` or ``sample``."""
    items = "token" if scenario.loss == "tokens" else "sample"
    if scenario.objective:
        return objective(scenario.objective).unit or items  # a sum adds the loss's items
    return items


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
    """Every micro-batch of ``step`` (rank-major) that holds a loss item: its mean-loss
    gradient, float64, as the columns of a ``(parameters, groups)`` matrix, and its mean
    loss, each at the parameters its rank started the step from (``starts[rank]``; the
    initial ones where None). An empty one (a rank that holds no sample) has none.

    Example::

        groups, columns, losses = group_terms(scenario)
    """
    with one_thread():
        inputs, targets = build_data(scenario, "float64")[step]
        loss_fn = loss_function(scenario)
        declared = objective(scenario.objective) if scenario.objective else None
        constant = float(declared.constant or 0.0) if declared else 0.0
        # A declared sum is the mean over the loss items times the step's items: each
        # micro-batch's column is that (its mean's gradient times N), so the share-weighted
        # reading is the right one, and a mean where the sum was due reads as divided by N
        # once too often.
        summed = declared is not None and not declared.unit
        if summed:
            builtin_tokens = scenario.loss == "tokens" and scenario.model.kind != "user"
            mean = "token-mean" if builtin_tokens else ""
            loss_fn = loss_function(dataclasses.replace(scenario, objective=mean))
            scale = float(global_items(scenario, step))
        # Where the objective normalises by its window, the step's objective counts its
        # window factor: each column too, so that the shares read as right.
        factor = window_factor(scenario, step)
        groups, columns, losses = [], [], []
        for rank in range(scenario.world_size):
            model = _model_at(scenario, None if starts is None else starts[rank])
            for micro, (x, y) in enumerate(micro_batches(scenario, step, rank, (inputs, targets))):
                if count_items(scenario, y) == 0:
                    continue  # nothing counts in it (a rank that holds no sample): no column
                model.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                if summed:
                    loss = loss * scale
                loss = loss * factor
                loss.backward()
                columns.append(flatten(model, {n: p.grad for n, p in model.named_parameters()}))
                losses.append(float(loss.detach()))
                rows, width = len(y), padded_width(scenario, y)
                if scenario.packing:
                    # The rows and width the code was handed: the packed ones.
                    lengths = (x != PAD_ID).sum(dim=1).clamp(min=1).tolist()
                    packed = pack(lengths, scenario.packing, width=y.shape[1])
                    rows, width = packed.rows, int(packed.source.shape[1])
                groups.append(Group(rank, micro, count_items(scenario, y), rows, width, constant))
    return groups, torch.stack(columns, dim=1), losses


def group_gradients(scenario: Scenario, step: int = 0) -> tuple[list[Group], torch.Tensor]:
    """The groups and gradient columns of :func:`group_terms` at the initial parameters."""
    groups, columns, _ = group_terms(scenario, step)
    return groups, columns


def observed_gradients(scenario: Scenario, got: Trace, step: int) -> list[dict[str, Any] | None]:
    """Each rank's gradient at ``step``: recorded, or (SGD at step 0, for step functions that
    keep their gradients to themselves) read back from the update, ``(p0 - p1) / lr`` less
    the weight decay. None where neither can be had (Adam's update is not linear in it, nor
    is the update of an optimizer or schedule of the user's known)."""
    if got.ranks[0].grads is not None and len(got.ranks[0].grads) > step:
        return [rank.grads[step] for rank in got.ranks]  # type: ignore[index]
    if step != 0 or scenario.optimizer.name != "sgd":
        return [None] * len(got.ranks)
    if scenario.recipe.optimizer or scenario.recipe.scheduler:
        # The user's own optimizer or schedule: its update says nothing linear of the gradient.
        return [None] * len(got.ranks)
    start = dict(build_model(scenario, "float64").named_parameters())
    lr, decay = scenario.optimizer.lr, scenario.optimizer.weight_decay
    found: list[dict[str, Any] | None] = []
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


def flatten(model: torch.nn.Module, grads: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
    """``grads`` as one float64 vector, in ``model``'s parameter order; a missing gradient
    counts as zeros."""
    parts = []
    for name, p in model.named_parameters():
        g = grads.get(name)
        parts.append(
            torch.zeros(p.numel(), dtype=torch.float64)
            if g is None
            else g.detach().to("cpu", torch.float64).reshape(-1)
        )
    return torch.cat(parts)


@dataclasses.dataclass(frozen=True)
class Terms:
    """One step's micro-batches (rank-major): their float64 mean-loss gradients as columns
    of a ``(parameters, groups)`` matrix and their mean losses, each at the parameters its
    rank started the step from."""

    step: int
    groups: tuple[Group, ...]
    columns: torch.Tensor
    losses: torch.Tensor


class Evidence:
    """A diverged run, its reference and what a hypothesis is predicted from."""

    def __init__(self, kind: Kind, scenario: Scenario, reference: Trace, got: Trace) -> None:
        self.kind = kind
        self.scenario = scenario
        self.reference = reference
        self.got = got
        self.unit = unit_of(scenario)
        # A declared sum, and what the words call the objective over the global batch.
        self.sums = sums(scenario)
        self.whole = whole(self.sums)
        self.compressed = kind.lossy
        self.tolerance = tolerance(scenario.dtype, compressed=self.compressed)

    def ladder(self) -> list[tuple[Choice, Tolerance]]:
        """The precisions a prediction is held to, tightest first: the run's own, then
        (for a float64 run) float32's, which code that upcasts inside computes in."""
        found = [(choice("precision", "as-run"), self.tolerance)]
        if self.scenario.dtype == "float64":
            lower = tolerance("float32", compressed=self.compressed)
            found.append((choice("precision", "float32"), lower))
        return found

    @property
    def world(self) -> int:
        return self.scenario.world_size

    @property
    def steps(self) -> int:
        return self.got.steps

    @functools.cache  # noqa: B019 (one Evidence per diagnosis, dropped with it)
    def terms(self, step: int) -> Terms:
        """Step ``step``'s micro-batch columns and losses at the ranks' own start."""
        with one_thread():
            groups, columns, losses = group_terms(
                self.scenario, step, starts_of(self.scenario, self.got, step)
            )
        return Terms(step, tuple(groups), columns, torch.tensor(losses, dtype=torch.float64))

    @functools.cache  # noqa: B019
    def gradients(self, step: int) -> tuple[torch.Tensor, ...] | None:
        """Each rank's gradient at ``step``, flat, float64, in the model's parameter order;
        None where it cannot be read (an optimizer whose update is not linear in it)."""
        observed = observed_gradients(self.scenario, self.got, step)
        if any(g is None for g in observed):
            return None
        model = build_model(self.scenario, "float64")
        return tuple(flatten(model, g).to(torch.float64) for g in observed)  # type: ignore[arg-type]

    @property
    def read_from_update(self) -> bool:
        """Whether the gradients were read back from the SGD update, not recorded (a step
        function keeps its own): a factor there may be the optimizer's, not the gradient's."""
        grads = self.got.ranks[0].grads
        return not grads

    @functools.cached_property
    def finite(self) -> bool:
        """Whether every loss and parameter the ranks reported is a number."""
        for trace in self.got.ranks:
            if not all(math.isfinite(v) for v in trace.losses[: self.steps]):
                return False
            for params in trace.params[: self.steps]:
                if not all(bool(torch.isfinite(t).all()) for t in params.values() if t is not None):
                    return False
        return True

    def reported(self, rank: int) -> list[float]:
        """The loss ``rank`` reported at every step."""
        return [float(v) for v in self.got.ranks[rank].losses[: self.steps]]

    def readable_steps(self) -> range:
        """The steps whose gradients can be read: every one that was recorded."""
        return range(self.steps)


class WithoutParameters(Evidence):
    """``evidence`` read without some parameters: their entries left out of every rank's
    gradient and every micro-batch's column, so the axes are scored on the others alone
    (a parameter reached by several names that the code treats once per name)."""

    def __init__(self, evidence: Evidence, names: Sequence[str]) -> None:
        super().__init__(evidence.kind, evidence.scenario, evidence.reference, evidence.got)
        model = build_model(evidence.scenario, "float64")
        keep = [
            torch.full((p.numel(),), name not in names, dtype=torch.bool)
            for name, p in model.named_parameters()
        ]
        self._keep = torch.cat(keep)
        self._of = evidence

    @functools.cache  # noqa: B019 (one per diagnosis, dropped with it)
    def terms(self, step: int) -> Terms:
        whole = self._of.terms(step)
        return dataclasses.replace(whole, columns=whole.columns[self._keep])

    @functools.cache  # noqa: B019
    def gradients(self, step: int) -> tuple[torch.Tensor, ...] | None:
        whole = self._of.gradients(step)
        return None if whole is None else tuple(g[self._keep] for g in whole)
