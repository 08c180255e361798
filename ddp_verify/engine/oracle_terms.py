"""Whether a user's recipe trains what the harness's oracle can train, and the scenario it
trains in the oracle's own terms.

A recipe's loss is the oracle's where it gives the oracle's loss, and its gradient, on the
scenario's own first batch; its optimizer is the oracle's where it is exactly torch's SGD,
Adam or AdamW, in one param group, with settings the oracle's update rules write out
(:mod:`ddp_verify.engine.optimizers`). A scheduler is never: the oracle's only schedule is its
own decay. Where every part the recipe names is the oracle's, both references judge, and
must agree (:func:`ddp_verify.methods.equivalence.check_equivalent`).
"""

from __future__ import annotations

import dataclasses

import torch

from .models import build_data, build_model, loss_function, one_thread
from .optimizers import ADAM_BETAS, ADAM_EPS
from .scenario import OptimizerSpec, Recipe, Scenario

__all__ = ["oracle_scenario"]

# torch's classes the oracle's update rules write out, by the name an OptimizerSpec takes.
_OPTIMIZERS: dict[type[torch.optim.Optimizer], str] = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
}
# Settings whose value is the only one the oracle's rules know, beside lr, momentum, decay.
_FIXED: dict[str, dict[str, object]] = {
    "sgd": {"dampening": 0.0, "nesterov": False, "maximize": False},
    "adam": {"betas": ADAM_BETAS, "eps": ADAM_EPS, "amsgrad": False, "maximize": False},
}
_FIXED["adamw"] = _FIXED["adam"]


def oracle_scenario(scenario: Scenario) -> Scenario | None:
    """``scenario`` with its recipe said in the oracle's own terms (its loss and optimizer
    spec), or None where a part the recipe names is not the oracle's.

    Example::

        >>> split = (((2,), (1,)),)
        >>> mse = Scenario(2, split, loss="mse", recipe=Recipe(loss="torch.nn:MSELoss"))
        >>> oracle_scenario(mse).recipe
        Recipe()
        >>> l1 = Scenario(2, split, loss="mse", recipe=Recipe(loss="torch.nn:L1Loss"))
        >>> oracle_scenario(l1) is None
        True
    """
    recipe = scenario.recipe
    if not recipe or recipe.scheduler:
        return None
    plain = dataclasses.replace(scenario, recipe=Recipe())
    with one_thread():
        if recipe.loss and not _same_loss(scenario, plain):
            return None
        if not recipe.optimizer:
            return plain
        spec = _optimizer_spec(scenario)
    return None if spec is None else dataclasses.replace(plain, optimizer=spec)


def _same_loss(scenario: Scenario, plain: Scenario) -> bool:
    """Whether the recipe's loss and the oracle's give the same value and gradient on the
    scenario's first global batch, in float64."""
    model = build_model(plain, "float64")
    inputs, targets = build_data(plain, "float64")[0]
    values, grads = [], []
    for made in (scenario, plain):
        outputs = model(inputs)
        first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        first.retain_grad()
        try:
            value = loss_function(made)(outputs, targets)
        except Exception:  # the user's loss refusing the oracle's forms: not the oracle's
            return False
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            return False
        value.backward()
        values.append(value.detach().reshape(()))
        grads.append(first.grad)
    if grads[0] is None or grads[1] is None:
        return False
    return bool(
        torch.allclose(values[0], values[1], rtol=1e-10, atol=1e-12)
        and torch.allclose(grads[0], grads[1], rtol=1e-10, atol=1e-12)
    )


def _optimizer_spec(scenario: Scenario) -> OptimizerSpec | None:
    """The oracle's spec of the optimizer the recipe's factory builds, or None."""
    from .recipes import user_optimizer

    model = build_model(scenario, "float64")
    made = user_optimizer(scenario.recipe, model.parameters())
    name = _OPTIMIZERS.get(type(made))
    if name is None or len(made.param_groups) != 1:
        return None
    group = made.param_groups[0]
    if len(group["params"]) != len(list(model.parameters())):
        return None
    for key, value in _FIXED[name].items():
        if key in group and group[key] != value:
            return None
    if group.get("differentiable") or torch.is_tensor(group["lr"]):
        return None
    momentum = float(group.get("momentum", 0.0)) if name == "sgd" else 0.0
    try:
        return OptimizerSpec(
            name=name,  # type: ignore[arg-type]
            lr=float(group["lr"]),
            momentum=momentum,
            weight_decay=float(group["weight_decay"]),
        )
    except ValueError:
        return None
