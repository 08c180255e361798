"""The ``coupled-loss`` kind: a loss whose samples interact across ranks (contrastive and
in-batch-negative training), trained on the harness's encoder under real DDP, and its
reference: the same loss on a world of one rank holding the whole global batch.

``fn(features_a, features_b, *negatives, **learned)`` is called on every rank with the
features of its local pairs (each view's tower's output, then one tensor per hard negative),
and the learned loss parameters it asks for by name (``logit_scale``, ``logit_bias``), which
are the harness model's own. What it returns is backpropagated, DDP averages the gradients
and the optimizer steps; the loss reported is what it returned, averaged over ranks. The
reference runs the very same code on a real one-rank process group (its collectives are
identities) with every rank's pairs in rank order, so the objective is "your loss on the
whole batch", and nothing about the loss is assumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..engine.coupled import (
    LEARNED,
    Pairs,
    build_towers,
    features,
    pairs,
    rank_micro_batches,
    whole_micro_batches,
)
from ..engine.models import training_optimizer
from ..engine.scenario import Scenario
from ..engine.trace import RankTrace, named_gradients, named_parameters
from ..world.naming import option
from ..world.runtime import rank_device
from .calling import UserMethod, anywhere_values, as_loss
from .kinds import Call, KindError, called_signature

__all__ = [
    "CoupledLoss",
    "Probed",
    "check_feature_count",
    "learned_parameters",
    "matched_on_ranks",
    "micro_batches",
    "micro_sizes",
    "predicted_on_one_rank",
    "probe_ranks",
]


def learned_parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The learned loss parameters ``fn`` asks for by name (of :data:`LEARNED`), in order.

    Example::

        >>> learned_parameters(lambda image, text, logit_scale: None)
        ('logit_scale',)
    """
    try:
        names = called_signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(name for name in LEARNED if name in names)


def single_process_defaults(fn: Callable[..., Any]) -> str:
    """What to say of a loss written as a class whose ``rank`` and ``world_size`` default to
    one process (open_clip's ``ClipLoss(rank=0, world_size=1)``): given as it is, every rank
    would compute a local loss and nothing would say so. Empty where ``fn`` is no such loss.

    Example::

        >>> class ClipLoss:
        ...     def __init__(self, rank=0, world_size=1): self.world_size = world_size
        ...     def __call__(self, image_features, text_features): ...
        >>> single_process_defaults(ClipLoss()).split(":")[0]
        'ClipLoss was built with world_size=1 (its default, one process)'
    """
    klass = fn if inspect.isclass(fn) else type(fn)
    try:
        parameters = inspect.signature(klass.__init__).parameters
    except (TypeError, ValueError):
        return ""
    if "world_size" not in parameters or "rank" not in parameters:
        return ""
    name = klass.__name__
    build = (
        f"check a function that builds it on each rank with the rank's values, such as: "
        f"def loss(*features, **learned): return {name}(rank=dist.get_rank(), "
        f"world_size=dist.get_world_size())(*features, **learned)"
    )
    if inspect.isclass(fn):
        return f"{name} is a class; a coupled loss is called with the features: {build}"
    if getattr(fn, "world_size", None) == 1:
        return (
            f"{name} was built with world_size=1 (its default, one process): every rank would "
            f"compute a local loss of its own pairs, whatever the world; {build}"
        )
    return ""


def check_feature_count(call: Call, negatives: int) -> None:
    """A :class:`KindError` where the code takes another number of feature tensors than the
    harness passes: the two views and ``negatives`` hard negatives."""
    most = call.most_positional or call.positional
    if not call.positional <= 2 + negatives <= most:
        # Where optional parameters could take more, the fewest it needs is what to say.
        takes = call.positional - 2
        raise KindError(
            f"{call.name} takes {call.positional} feature tensors, the two views and "
            f"{max(takes, 0)} hard negative(s); the harness passes {2 + negatives}: "
            f"{option('negatives', max(takes, 0))}"
        )


class CoupledLoss(UserMethod):
    """``fn`` as a coupled loss, called as ``call`` says (its feature tensors by position,
    the learned parameters and what is bound by keyword)."""

    call: Call

    def __init__(self, fn: Callable[..., Any], name: str, call: Call) -> None:
        super().__init__(fn, name)
        self.call = call

    # The reference is this code on one rank (methods.equivalence asks for it).
    whole_batch_reference = True

    def train_rank(self, scenario: Scenario) -> RankTrace:
        return self._train(scenario, whole=False)

    def train_whole(self, scenario: Scenario, variant: int = 0) -> RankTrace:
        """The reference: the whole global batch on this one-rank world. A ``variant`` above
        0 lays each micro-batch's pairs out in another order (seeded by it): the same loss
        of a correct contrastive loss, its float32 sums taken otherwise (a rounding-only
        variant, for float32's bound)."""
        return self._train(scenario, whole=True, variant=variant)

    def _train(self, scenario: Scenario, *, whole: bool, variant: int = 0) -> RankTrace:
        device = rank_device()
        model = build_towers(scenario, device=device)
        wrapped = DistributedDataParallel(model)
        optimizer, _ = training_optimizer(scenario, model.parameters())
        data = pairs(scenario, device=device)
        rank, world = dist.get_rank(), dist.get_world_size()
        check_feature_count(self.call, scenario.model.negatives)
        trace = RankTrace()
        for step in range(scenario.steps):
            optimizer.zero_grad(set_to_none=True)
            if whole:
                batches = whole_micro_batches(scenario, step, data[step])
                if variant:
                    batches = [_reordered(batch, variant) for batch in batches]
            else:
                batches = rank_micro_batches(scenario, step, rank, data[step])
            reported = torch.zeros((), dtype=torch.float64, device=device)
            for j, batch in enumerate(batches):
                last = j == len(batches) - 1
                with contextlib.nullcontext() if last else wrapped.no_sync():
                    given = features(wrapped, batch)
                    values = {
                        **anywhere_values(),
                        **{n: getattr(model, n) for n in scenario.model.learned},
                    }
                    args, kwargs = self.call.arguments(given, 0, values=values)
                    loss = _as_loss(self.fn(*args, **kwargs), self.call.name)
                    (loss / len(batches)).backward()
                reported += loss.detach().double() / len(batches)
            dist.all_reduce(reported)
            trace.record("grads", named_gradients(model))
            optimizer.step()
            trace.losses.append(float(reported) / world)
            trace.record("params", named_parameters(model))
        return trace

    def probe(
        self, scenario: Scenario, weights: tuple[tuple[float, ...], ...] | None = None
    ) -> Probed:
        """Step 0 on this rank from the initial parameters, without DDP: what ``fn`` returns
        (each micro-batch's times ``weights[rank][micro-batch]``, where given, over the
        micro-batches as training divides it) and the gradient its backward leaves here,
        through whatever its collectives send back, before any averaging."""
        rank = dist.get_rank()
        model = build_towers(scenario, device=rank_device())
        batches = rank_micro_batches(scenario, 0, rank, pairs(scenario, device=rank_device())[0])
        values = {**anywhere_values(), **{n: getattr(model, n) for n in scenario.model.learned}}
        reported = 0.0
        for m, batch in enumerate(batches):
            args, kwargs = self.call.arguments(features(model, batch), 0, values=values)
            loss = _as_loss(self.fn(*args, **kwargs), self.call.name)
            weight = 1.0 if weights is None else weights[rank][m]
            (loss * weight / len(batches)).backward()
            reported += float(loss.detach()) / len(batches)
        return Probed(reported, _with_zeros(model))

    def matched(self, scenario: Scenario) -> list[tuple[int, int, int]]:
        """Which pair each of this rank's pairs at step 0 was scored as matching: ``fn`` is
        given one-hot features (pair ``g``'s two views both the axis ``e_g``, every hard
        negative an axis of its own), so each pair is like itself and unlike every other;
        the gradient on a pair's first view is then most negative along the view it was
        pulled toward, its positive. ``(micro-batch, g, matched)`` for each pair whose
        gradient reads, ``g`` counted in its micro-batch across ranks (none where no
        gradient reaches the features; -1 where it pulls toward no view)."""
        rank, device = dist.get_rank(), rank_device()
        model = build_towers(scenario, device=device)
        values = {**anywhere_values(), **{m: getattr(model, m) for m in scenario.model.learned}}
        found = []
        for m in range(micro_batches(scenario)):
            sizes = micro_sizes(scenario, m)
            total, start, n = sum(sizes), sum(sizes[:rank]), sizes[rank]
            axes = torch.eye(total * (1 + scenario.model.negatives), dtype=torch.float64)
            given = tuple(
                axes[k * total + start : k * total + start + n].to(device).requires_grad_()
                for k in (0, 0, *range(1, 1 + scenario.model.negatives))
            )
            args, kwargs = self.call.arguments(given, 0, values=values)
            loss = _as_loss(self.fn(*args, **kwargs), self.call.name)
            if not loss.requires_grad:
                continue
            loss.backward()
            first = given[0].grad
            if first is None:
                continue
            # A row pulled toward no view (a padding row, a constant) matched nothing: -1.
            found += [
                (m, start + i, int(row.argmin()) if float(row.min()) < -1e-9 else -1)
                for i, row in enumerate(first.detach().cpu())
                if float(row.abs().max()) > 1e-9
            ]
        return found

    def predicted(self, scenario: Scenario, variant: str) -> Gradients:
        """On a one-rank world, step 0's gradient from the initial parameters were every rank
        to run ``fn`` as ``variant`` says on each of its micro-batches, DDP averaging:
        ``local-gradient`` (the whole micro-batch's loss on every rank, its gradient reaching
        that rank's features only), ``detached`` (no gradient reaching any feature),
        ``alone`` (each rank's pairs on their own, negatives from the local batch only)."""
        model = build_towers(scenario, device=rank_device())
        whole = pairs(scenario, device=rank_device())[0]
        values = {**anywhere_values(), **{n: getattr(model, n) for n in scenario.model.learned}}
        world, count = scenario.world_size, micro_batches(scenario)
        for m, batch in enumerate(whole_micro_batches(scenario, 0, whole)):
            if variant == "detached":
                # Every rank's loss the same, its features all constants: the average is one.
                given = tuple(f.detach() for f in features(model, batch))
                args, kwargs = self.call.arguments(given, 0, values=values)
                loss = self.fn(*args, **kwargs)
                if isinstance(loss, torch.Tensor) and loss.requires_grad:
                    (loss / count).backward()  # only the learned parameters can get one
                continue
            sizes = micro_sizes(scenario, m)
            for rank in range(world):
                if variant == "alone":
                    given = features(model, rank_micro_batches(scenario, 0, rank, whole)[m])
                else:
                    start, n = sum(sizes[:rank]), sizes[rank]
                    given = tuple(_rows_only(f, start, n) for f in features(model, batch))
                args, kwargs = self.call.arguments(given, 0, values=values)
                loss = _as_loss(self.fn(*args, **kwargs), self.call.name)
                (loss / (world * count)).backward()
        return _with_zeros(model)


def micro_batches(scenario: Scenario) -> int:
    """The micro-batches every rank holds at step 0 (as many on every rank)."""
    return len(scenario.schedule[0][0])


def micro_sizes(scenario: Scenario, m: int) -> list[int]:
    """Each rank's pairs in its micro-batch ``m`` of step 0, in rank order."""
    return [sizes[m] for sizes in scenario.schedule[0]]


@dataclasses.dataclass(frozen=True)
class Probed:
    """What one rank's call did at step 0: the loss ``fn`` returned and its gradient here."""

    loss: float
    grads: Gradients


Gradients = dict[str, "torch.Tensor | None"]


def _reordered(batch: Pairs, seed: int) -> Pairs:
    """``batch``'s pairs in the order a permutation seeded by ``seed`` lays them out, every
    view and negative of a pair moved together."""
    order = torch.randperm(len(batch[0]), generator=torch.Generator().manual_seed(seed))
    a, b, negatives = (t[order.to(t.device)] for t in batch)
    return a, b, negatives


def _with_zeros(model: torch.nn.Module) -> Gradients:
    """The model's gradients, a zero where none reached a parameter (as DDP leaves it)."""
    return {
        name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
    }


def _rows_only(features: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """``features`` whose gradient reaches rows ``start .. start + n`` only."""
    keep = torch.zeros(features.shape[0], dtype=torch.bool, device=features.device)
    keep[start : start + n] = True
    shape = (-1,) + (1,) * (features.dim() - 1)
    return torch.where(keep.view(shape), features, features.detach())


def probe_ranks(
    method: CoupledLoss, scenario: Scenario, weights: tuple[tuple[float, ...], ...] | None = None
) -> Probed:
    """The job every rank runs for :meth:`CoupledLoss.probe`."""
    return method.probe(scenario, weights)


def matched_on_ranks(method: CoupledLoss, scenario: Scenario) -> list[tuple[int, int, int]]:
    """The job every rank runs for :meth:`CoupledLoss.matched`."""
    return method.matched(scenario)


def predicted_on_one_rank(method: CoupledLoss, scenario: Scenario, variant: str) -> Gradients:
    """The job a one-rank world runs for :meth:`CoupledLoss.predicted`."""
    return method.predicted(scenario, variant)


def _as_loss(value: Any, name: str) -> torch.Tensor:
    return as_loss(value, name, "the features")
