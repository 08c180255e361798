"""Adapters: a user's aggregation code, of one of five kinds, turned into a method.

| kind        | the user's callable                                  | called                      |
| grad-sync   | ``fn(model)`` or ``fn(model, num_samples)``          | after the local backward    |
| loss        | ``fn(local_loss, num_samples) -> tensor or float``   | with the rank's mean loss   |
| step        | ``fn(model, optimizer, micro_batches, loss_fn)``     | once per step, does it all  |
| comm-hook   | ``hook(state, bucket) -> Future``                    | registered on DDP           |
| wrapper     | ``fn(module) -> module``                             | once per scenario, like DDP |

Everything the user's code does not own, the harness does the correct way, so a divergence is
the user's code's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace
from ..methods.base import DistributedMethod
from ..methods.ddp import DDP
from ..methods.loop import RankRun, train_data_parallel, train_local_then_sync
from ..methods.manual import all_reduce_weighted
from ..world.protocol import modules_ranks_cannot_import
from .kinds import DEFAULT_BOUNDS, KINDS, SIGNATURES, Call, KindError, check_signature

__all__ = [
    "DEFAULT_BOUNDS",
    "KINDS",
    "SIGNATURES",
    "KindError",
    "adapt",
    "check_signature",
]


def adapt(fn: Callable[..., Any], kind: str) -> DistributedMethod:
    """The method that runs ``fn`` as a ``kind`` plug-in, after checking its signature.

    Example::

        method = adapt(average_gradients, "grad-sync")
        world.assert_equivalent(method, scenario)
    """
    call = check_signature(fn, kind)
    name = f"{kind} {getattr(fn, '__qualname__', repr(fn))}"
    method: DistributedMethod
    if kind == "grad-sync":
        method = GradSync(fn, name, call)
    elif kind == "loss":
        method = LossAggregation(fn, name, call)
    elif kind == "step":
        method = TrainingStep(fn, name)
    elif kind == "comm-hook":
        method = CommHook(fn, name)
    else:
        method = Wrapper(fn, name)
    method.call = call  # type: ignore[attr-defined]  # reports say how the code was called
    return method


class UserMethod(DistributedMethod):
    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.by_value = tuple(modules_ranks_cannot_import(fn))


class GradSync(UserMethod):
    """The harness does the local backward of each rank's mean loss; ``fn`` must leave the
    global mean gradient in every ``.grad``. It is called as ``call`` says (the count only
    where the signature asks for one)."""

    def __init__(self, fn: Callable[..., Any], name: str, call: Call) -> None:
        super().__init__(fn, name)
        self.call = call

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)

        def users_sync(step: int, local_sum: torch.Tensor) -> torch.Tensor:
            args, kwargs = self.call.arguments((run.model,), run.local_samples(step))
            self.fn(*args, **kwargs)
            dist.all_reduce(local_sum)
            return local_sum / run.global_samples(step)

        return train_local_then_sync(run, users_sync)


class LossAggregation(UserMethod):
    """The harness synchronises gradients correctly; ``fn`` turns each rank's mean loss into
    the global mean loss it reports (called as ``call`` says)."""

    def __init__(self, fn: Callable[..., Any], name: str, call: Call) -> None:
        super().__init__(fn, name)
        self.call = call

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        params = run.trainable()
        dtype = params[0].dtype if params else torch.float64

        def users_loss(step: int, local_sum: torch.Tensor) -> float:
            n = run.local_samples(step)
            all_reduce_weighted(params, float(n), run.global_samples(step))
            args, kwargs = self.call.arguments(((local_sum / n).to(dtype).clone(),), n)
            reported = self.fn(*args, **kwargs)
            return _as_float(reported, "loss")

        return train_local_then_sync(run, users_loss)


class TrainingStep(UserMethod):
    """``fn`` does the whole step (forward, backward, synchronisation, optimizer step) and
    returns the global mean loss. Its gradients are its own business: only losses and
    parameters are compared."""

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        run.trace.grads = None
        optimizer = run.optimizer()
        for step in range(scenario.steps):
            reported = self.fn(run.model, optimizer, run.micro_batches(step), run.loss_fn)
            run.record_step(_as_float(reported, "step"))
        return run.trace


class CommHook(DDP):
    """torch's DDP with the user's communication hook registered (``state=None``)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        super().__init__(comm_hook=fn)
        self.fn = fn
        self.name = name
        self.by_value = tuple(modules_ranks_cannot_import(fn))


class Wrapper(UserMethod):
    """``fn(module)`` wraps the model once, as DDP does, and must average gradients over the
    ranks during backward; trained as :func:`~ddp_verify.methods.loop.train_data_parallel`
    trains DDP (``no_sync()`` when the wrapper has it)."""

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        wrapped = self.fn(run.model)
        if not callable(wrapped):
            raise KindError(f"the wrapper returned {wrapped!r}, which cannot be called")
        params = wrapped.parameters() if hasattr(wrapped, "parameters") else None
        return train_data_parallel(run, wrapped, run.optimizer(params))


def _as_float(value: Any, kind: str) -> float:
    try:
        return float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise KindError(
            f"a {kind} plug-in must return the global mean loss as a number or a one-element "
            f"tensor, got {type(value).__name__}: {exc}"
        ) from None
