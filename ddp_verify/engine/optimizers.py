"""The reference's own optimizers and gradient clipping: the published update rules, written
out here, so that the oracle shares no code with what the conformance suite gates
(``torch.optim`` and ``torch.nn.utils.clip_grad_norm_``). A regression there moves the ranks
and never the reference.

The rules are torch's documented ones, for the settings a scenario draws:

- SGD (``momentum`` mu, ``weight_decay`` wd, no dampening, no Nesterov)::

      g = grad + wd * p;  b = g at the first step, else mu * b + g;  p -= lr * b

- Adam (betas 0.9, 0.999; eps 1e-8; ``weight_decay`` added to the gradient)::

      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
      p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

- AdamW: Adam with the decay decoupled, ``p *= 1 - lr * wd`` before the update.
- A learning rate that decays (``lr_decay`` d, a scheduler's ``LambdaLR`` on the ranks):
  step t (from 0) uses ``lr * d^t``.
- Two param groups (``param_groups=2``): one-dimensional parameters (biases, norms) step
  with ``lr * SECOND_GROUP_LR`` and no weight decay, the others with the spec's settings.
- Clipping the total norm: ``n = sqrt(sum of every gradient's squares)``; where
  ``max_norm / (n + 1e-6) < 1`` every gradient is multiplied by it.

Example::

    optimizer = ReferenceOptimizer(OptimizerSpec("adam", lr=0.01), model.parameters())
    loss.backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch

from .scenario import SECOND_GROUP_LR, OptimizerSpec

__all__ = [
    "ADAM_BETAS",
    "ADAM_EPS",
    "CLIP_EPS",
    "ParamGroup",
    "ReferenceOptimizer",
    "clip_total_norm",
    "param_groups",
    "scheduled_rates",
    "scheduled_settings",
]

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# What clip_grad_norm_ adds to the norm before dividing (its documented behaviour).
CLIP_EPS = 1e-6


@dataclasses.dataclass
class ParamGroup:
    """Parameters that step with one learning rate (before any decay) and weight decay."""

    params: list[torch.Tensor]
    lr: float
    weight_decay: float


def param_groups(spec: OptimizerSpec, params: Iterable[torch.Tensor]) -> list[ParamGroup]:
    """``params`` in the spec's groups, in order, none empty: all of them, or with
    ``param_groups=2`` the multi-dimensional ones and then the one-dimensional ones (at
    ``lr * SECOND_GROUP_LR``, no weight decay). Sharded parameters (DTensors) count by their
    whole shape, so every rank and the reference group alike.

    Example::

        >>> spec = OptimizerSpec("sgd", lr=0.1, weight_decay=0.01, param_groups=2)
        >>> groups = param_groups(spec, torch.nn.Linear(2, 1).parameters())
        >>> [(len(g.params), g.lr, g.weight_decay) for g in groups]
        [(1, 0.1, 0.01), (1, 0.05, 0.0)]
    """
    params = list(params)
    if spec.param_groups == 1:
        return [ParamGroup(params, spec.lr, spec.weight_decay)]
    matrices = [p for p in params if p.dim() > 1]
    vectors = [p for p in params if p.dim() <= 1]
    groups = [
        ParamGroup(matrices, spec.lr, spec.weight_decay),
        ParamGroup(vectors, spec.lr * SECOND_GROUP_LR, 0.0),
    ]
    return [g for g in groups if g.params]


def clip_total_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale the gradients of ``params`` so that their total 2-norm is at most ``max_norm``;
    the norm before clipping.

    Example::

        >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([3.0, 4.0])
        >>> clip_total_norm([p], 1.0), round(float(p.grad.norm()), 4)
        (5.0, 1.0)
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    coefficient = max_norm / (total + CLIP_EPS)
    if coefficient < 1.0:
        with torch.no_grad():
            for g in grads:
                g.mul_(coefficient)
    return total


def scheduled_rates(spec: OptimizerSpec, step: int) -> tuple[float, ...]:
    """The learning rates ``spec``'s optimizer steps at in ``step`` (from 0), by the rules
    above: the spec's, decayed where it decays, and its second group's where it has one.

    Example::

        >>> scheduled_rates(OptimizerSpec(lr=0.1, lr_decay=0.5, param_groups=2), 1)
        (0.05, 0.025)
    """
    rate = spec.lr * (spec.lr_decay or 1.0) ** step
    return (rate, rate * SECOND_GROUP_LR) if spec.param_groups == 2 else (rate,)


def scheduled_settings(spec: OptimizerSpec, step: int) -> tuple[tuple[tuple[str, float], ...], ...]:
    """The settings ``spec``'s optimizer steps with in ``step``, per param group, as
    :func:`~ddp_verify.engine.trace.optimizer_settings` records a torch optimizer's: its
    scheduled learning rate, SGD's momentum or Adam's betas, the group's weight decay.

    Example::

        >>> scheduled_settings(OptimizerSpec("adam", lr=0.01), 0)
        ((('lr', 0.01), ('beta1', 0.9), ('beta2', 0.999), ('weight_decay', 0.0)),)
    """
    rates = scheduled_rates(spec, step)
    decays = (spec.weight_decay, 0.0)
    found = []
    for group, rate in enumerate(rates):
        moments = (
            (("momentum", spec.momentum),)
            if spec.name == "sgd"
            else (("beta1", ADAM_BETAS[0]), ("beta2", ADAM_BETAS[1]))
        )
        found.append((("lr", rate), *moments, ("weight_decay", decays[group])))
    return tuple(found)


class ReferenceOptimizer:
    """The optimizer ``spec`` describes, over ``params``, written out (see the module text):
    ``zero_grad()`` and ``step()`` as a training loop calls them, nothing of ``torch.optim``.
    ``step()`` clips first where the spec says so."""

    def __init__(self, spec: OptimizerSpec, params: Iterable[torch.nn.Parameter]) -> None:
        self.spec = spec
        self.groups = param_groups(spec, params)
        self.params = [p for group in self.groups for p in group.params]
        self.steps = 0  # the learning rate of step t is lr * lr_decay**t
        # Per parameter: SGD's momentum buffer, or Adam's two moments and its own step count.
        self.state: dict[int, dict[str, Any]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        if self.spec.max_norm is not None:
            clip_total_norm(self.params, self.spec.max_norm)
        decay = (self.spec.lr_decay or 1.0) ** self.steps
        for group in self.groups:
            lr, wd = group.lr * decay, group.weight_decay
            for p in group.params:
                if p.grad is None:
                    continue  # a parameter the step never reached is left as it is
                state = self.state.setdefault(id(p), {})
                if self.spec.name == "sgd":
                    self._sgd(p, p.grad, state, lr, wd)
                else:
                    self._adam(p, p.grad, state, lr, wd, decoupled=self.spec.name == "adamw")
        self.steps += 1

    def _sgd(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], lr: float, wd: float
    ) -> None:
        spec = self.spec
        g = grad + wd * p if wd else grad.clone()
        if spec.momentum:
            if "momentum" not in state:
                state["momentum"] = g.clone()
            else:
                state["momentum"] = spec.momentum * state["momentum"] + g
            g = state["momentum"]
        p.sub_(lr * g)

    def _adam(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        lr: float,
        wd: float,
        *,
        decoupled: bool,
    ) -> None:
        b1, b2 = ADAM_BETAS
        # Each parameter counts its own steps: one a step did not reach is not bias-corrected
        # for it (torch keeps a step per parameter too).
        t = state["step"] = state.get("step", 0) + 1
        if decoupled:
            p.mul_(1 - lr * wd)
            g = grad
        else:
            g = grad + wd * p if wd else grad
        m = state.get("m", torch.zeros_like(p))
        v = state.get("v", torch.zeros_like(p))
        state["m"] = m = b1 * m + (1 - b1) * g
        state["v"] = v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        p.sub_(lr * m_hat / (v_hat.sqrt() + ADAM_EPS))
