"""What the harness trains of an objective of several terms (:mod:`.terms`): each term's
per-token values and mask, the same wherever a token is trained (the whole global batch or
a micro-batch at its own width), and each term's value on a step's global batch.

Example::

    values = term_values(scenario, 0, model(inputs), targets, per_token)
    loss = weighted(scenario, values)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .objectives import Objective
from .objectives import window_factor as objectives_window_factor
from .scenario import IGNORE_INDEX, Scenario
from .terms import MICRO, Term, term_sum

__all__ = [
    "aggregated",
    "term_factor",
    "term_losses",
    "term_mask",
    "term_targets",
    "term_values",
    "weighted",
]


def term_targets(targets: torch.Tensor, index: int, classes: int) -> torch.Tensor:
    """The targets term ``index``'s per-token values are the loss against: the loss
    matrix's own for the first term, each class moved on by ``index`` for the others (so
    that every term pulls the model its own way), ``IGNORE_INDEX`` kept.

    Example::

        >>> term_targets(torch.tensor([[6, -100]]), 2, classes=7).tolist()
        [[1, -100]]
    """
    if not index:
        return targets
    moved = (targets.clamp(min=0) + index) % classes
    return torch.where(targets == IGNORE_INDEX, targets, moved)


def term_mask(term: Term, targets: torch.Tensor) -> torch.Tensor:
    """The tokens ``term`` counts in a batch of ``targets`` (``[batch, seq]``): those that
    count, or with a ``mask`` the subset of them its token's target and position choose (a
    router's choice), the same wherever the token is trained.

    Example::

        >>> t = term_sum("token-mean(loss) + token-mean(aux[routed])").terms[1]
        >>> term_mask(t, torch.tensor([[2, 2, -100]])).tolist()
        [[False, True, False]]
    """
    counted = targets != IGNORE_INDEX
    if not term.mask:
        return counted
    positions = torch.arange(targets.shape[1], device=targets.device).expand_as(targets)
    chosen = (targets.clamp(min=0) + positions + term.index) % 2 == 0
    return counted & chosen


@functools.lru_cache(maxsize=64)
def term_units(scenario: Scenario, term: Term) -> tuple[int, ...]:
    """Per step, the units ``term`` counts on the step's whole global batch (tokens of its
    mask, sequences with one; 1 for a sum)."""
    from .models import build_data

    return tuple(
        term.aggregation.units(term_mask(term, targets))
        for _, targets in build_data(scenario, "float64")
    )


def term_factor(scenario: Scenario, term: Term, step: int) -> float:
    """How many times ``step`` counts under ``term``'s aggregation against the same one
    normalised per step (:func:`ddp_verify.engine.objectives.window_factor`)."""
    if scenario.window == 1 or term.micro:
        return 1.0
    window = scenario.window_of(step)
    units = term_units(scenario, term)
    return objectives_window_factor(
        term.aggregation, [units[s] for s in window], step - window.start
    )


def aggregated(
    scenario: Scenario,
    step: int,
    aggregation: Objective,
    per: str,
    losses: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """``aggregation`` of ``step``'s whole global batch of per-token ``losses`` under ``mask``
    (rows rank-major, then micro-batch order), computed ``per`` one of :data:`PER`.

    Example::

        value = aggregated(scenario, 0, objective("token-mean"), "micro", losses, mask)
    """
    if per == "step":
        return aggregation.value(losses, mask)
    pieces = []
    at = 0
    for sizes in scenario.schedule[step]:
        held = sizes if per == MICRO else (sum(sizes),)
        for size in held:
            rows = slice(at, at + size)
            pieces.append(aggregation.value(losses[rows], mask[rows]))
            at += size
    return torch.stack(pieces).mean()


def term_values(
    scenario: Scenario,
    step: int,
    logits: torch.Tensor,
    targets: torch.Tensor,
    per_token: torch.nn.Module,
) -> list[torch.Tensor]:
    """Each term's value (its weight left out) on ``step``'s whole global batch, given the
    model's ``logits`` on it: its aggregation over the global batch times its window factor,
    or for a ``@micro`` term the mean over every rank's micro-batches of its aggregation on
    each. ``per_token`` gives the per-token losses (``reduction='none'``).

    Example::

        values = term_values(scenario, 0, model(inputs), targets, per_token)
        loss = weighted(scenario, values)
    """
    values = []
    for term in term_sum(scenario.terms).terms:
        losses, mask = term_losses(term, logits, targets, per_token)
        per = MICRO if term.micro else "step"
        value = aggregated(scenario, step, term.aggregation, per, losses, mask)
        values.append(value * term_factor(scenario, term, step))
    return values


def term_losses(
    term: Term, logits: torch.Tensor, targets: torch.Tensor, per_token: torch.nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """``term``'s per-token values on a batch (the model's ``logits`` on it) and the mask of
    the tokens it counts."""
    values = per_token(logits, term_targets(targets, term.index, logits.shape[-1]))
    return values, term_mask(term, targets)


def weighted(scenario: Scenario, values: Sequence[torch.Tensor]) -> torch.Tensor:
    """The objective: each term's value times its declared weight, summed."""
    terms = term_sum(scenario.terms).terms
    return torch.stack([t.weight * v for t, v in zip(terms, values, strict=True)]).sum()
