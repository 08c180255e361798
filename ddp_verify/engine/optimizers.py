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
- Clipping the total norm: ``n = sqrt(sum of every gradient's squares)``; where
  ``max_norm / (n + 1e-6) < 1`` every gradient is multiplied by it.

Example::

    optimizer = ReferenceOptimizer(OptimizerSpec("adam", lr=0.01), model.parameters())
    loss.backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from .scenario import OptimizerSpec

__all__ = ["ADAM_BETAS", "ADAM_EPS", "CLIP_EPS", "ReferenceOptimizer", "clip_total_norm"]

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# What clip_grad_norm_ adds to the norm before dividing (its documented behaviour).
CLIP_EPS = 1e-6


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


class ReferenceOptimizer:
    """The optimizer ``spec`` describes, over ``params``, written out (see the module text):
    ``zero_grad()`` and ``step()`` as a training loop calls them, nothing of ``torch.optim``.
    ``step()`` clips first where the spec says so."""

    def __init__(self, spec: OptimizerSpec, params: Iterable[torch.nn.Parameter]) -> None:
        self.spec = spec
        self.params = list(params)
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
        lr = self.spec.lr * (self.spec.lr_decay or 1.0) ** self.steps
        for p in self.params:
            if p.grad is None:
                continue  # a parameter the step never reached is left as it is
            state = self.state.setdefault(id(p), {})
            if self.spec.name == "sgd":
                self._sgd(p, p.grad, state, lr)
            else:
                self._adam(p, p.grad, state, lr, decoupled=self.spec.name == "adamw")
        self.steps += 1

    def _sgd(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], lr: float) -> None:
        spec = self.spec
        g = grad + spec.weight_decay * p if spec.weight_decay else grad.clone()
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
        *,
        decoupled: bool,
    ) -> None:
        spec, (b1, b2) = self.spec, ADAM_BETAS
        # Each parameter counts its own steps: one a step did not reach is not bias-corrected
        # for it (torch keeps a step per parameter too).
        t = state["step"] = state.get("step", 0) + 1
        if decoupled:
            p.mul_(1 - lr * spec.weight_decay)
            g = grad
        else:
            g = grad + spec.weight_decay * p if spec.weight_decay else grad
        m = state.get("m", torch.zeros_like(p))
        v = state.get("v", torch.zeros_like(p))
        state["m"] = m = b1 * m + (1 - b1) * g
        state["v"] = v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        p.sub_(lr * m_hat / (v_hat.sqrt() + ADAM_EPS))
