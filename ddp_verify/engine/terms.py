"""Objectives of several terms: a weighted sum of declared aggregations, each over per-token
values of its own, as post-training losses are (a policy loss, a KL penalty, an auxiliary
load-balancing term, an entropy bonus).

A declaration reads ``token-mean(loss) + 0.1*seq-mean-token-mean(kl) -
0.01*token-mean@micro(aux[routed])``. Each term is ``[WEIGHT*]AGGREGATION(TENSOR[MASK])``:

- ``AGGREGATION`` is one of the objectives' table (:mod:`ddp_verify.engine.objectives`),
  with its ``@window`` scope where it has one; ``@micro`` instead computes it within each
  micro-batch, the step's micro-batches of every rank then weighing equally (an auxiliary
  loss from each micro-batch's router statistics). ``micro-mean`` is ``token-mean@micro``;
- ``TENSOR`` names the per-token values the code is handed: the first term's are the loss
  matrix it is handed first, whatever the name; every other term's come by that name (the
  code's parameter of that name, or ``--bind PARAM=term:TENSOR``);
- ``MASK``, where given, names a mask of a subset of the counted tokens (routed tokens,
  say) handed by that name, over which the term alone aggregates.

Example::

    >>> declared = term_sum("token-mean(loss) + 0.1*seq-mean-token-mean(kl)")
    >>> [str(t) for t in declared.terms]
    ['token-mean(loss)', '0.1*seq-mean-token-mean(kl)']
    >>> declared.handed()
    ('kl',)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

import torch

from .objectives import Objective, objective
from .objectives import window_factor as objectives_window_factor
from .scenario import IGNORE_INDEX, Scenario

__all__ = [
    "MICRO",
    "PER",
    "Term",
    "TermSum",
    "aggregated",
    "is_term_sum",
    "term_losses",
    "term_sum",
    "term_values",
    "weighted",
]

# The scope of a term computed within each micro-batch, and its shorthand for a token mean.
MICRO = "micro"
_ALIASES = {"micro-mean": f"token-mean@{MICRO}"}
# Names the code is handed already: a term's tensor or mask may not take one of them.
_TAKEN = frozenset(
    {
        "loss_mat",
        "loss_mask",
        "accumulation_steps",
        "tokens",
        "rank_tokens",
        "global_tokens",
        "sequences",
        "rank_sequences",
        "global_sequences",
        "window_tokens",
        "window_sequences",
        "window_steps",
        "position_ids",
        "segment_ids",
        "cu_seq_lens",
        "world_size",
        "rank",
    }
)
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_TERM = re.compile(
    rf"\s*(?P<sign>[+-])?\s*(?:(?P<weight>{_NUMBER})\s*\*\s*)?"
    r"(?P<aggregation>[A-Za-z][\w:.@-]*?)\s*\(\s*(?P<tensor>[A-Za-z_]\w*)\s*"
    r"(?:\[\s*(?P<mask>[A-Za-z_]\w*)\s*\]\s*)?\)\s*"
)


def _invalid(message: str) -> Exception:
    from hypothesis.errors import InvalidArgument

    return InvalidArgument(message)


@dataclasses.dataclass(frozen=True)
class Term:
    """One term: its ``weight``, its ``aggregation`` (an :class:`Objective`), the ``tensor``
    of per-token values it aggregates, the ``mask`` of the subset it counts ("" for every
    counted token), whether it is computed within each micro-batch (``micro``), and its
    ``index`` in the declaration (the harness's values for term ``index``)."""

    weight: float
    aggregation: Objective
    tensor: str
    mask: str = ""
    micro: bool = False
    index: int = 0

    def __str__(self) -> str:
        weight = "" if self.weight == 1 else f"{abs(self.weight):g}*"
        scope = f"@{MICRO}" if self.micro else ""
        mask = f"[{self.mask}]" if self.mask else ""
        return f"{weight}{self.aggregation}{scope}({self.tensor}{mask})"

    @property
    def name(self) -> str:
        """How reports name the term: by its tensor."""
        return self.tensor


@dataclasses.dataclass(frozen=True)
class TermSum:
    """A weighted sum of :class:`Term`; the first term's tensor is the loss matrix."""

    terms: tuple[Term, ...]

    def __str__(self) -> str:
        text = ""
        for term in self.terms:
            sign = "-" if term.weight < 0 else "+"
            if not text:
                text = f"-{term}" if sign == "-" else str(term)
            else:
                text += f" {sign} {term}"
        return text

    @property
    def main(self) -> Term:
        """The first term: the loss matrix's."""
        return self.terms[0]

    def handed(self) -> tuple[str, ...]:
        """The tensors and masks the code is handed by name: every term's but the first's
        tensor, in order, each once."""
        names: list[str] = []
        for term in self.terms:
            for name in ((term.tensor,) if term.index else ()) + (
                (term.mask,) if term.mask else ()
            ):
                if name not in names:
                    names.append(name)
        return tuple(names)


def is_term_sum(text: str) -> bool:
    """Whether ``text`` declares terms (``AGGREGATION(TENSOR)``), not one objective.

    Example::

        >>> is_term_sum("token-mean"), is_term_sum("token-mean(loss)")
        (False, True)
    """
    return "(" in text


def term_sum(text: str | TermSum) -> TermSum:
    """The terms ``text`` declares, checked (``InvalidArgument`` naming what is wrong).

    Example::

        >>> str(term_sum("token-mean(loss)+0.1*micro-mean(aux)"))
        'token-mean(loss) + 0.1*token-mean@micro(aux)'
        >>> term_sum("token-mean(loss) + kl")
        Traceback (most recent call last):
        ...
        hypothesis.errors.InvalidArgument: ...
    """
    if isinstance(text, TermSum):
        return text
    return _parsed(str(text))


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> TermSum:
    example = "token-mean(loss) + 0.1*seq-mean-token-mean(kl) + 0.01*token-mean@micro(aux)"
    at = 0
    terms: list[Term] = []
    while at < len(text):
        match = _TERM.match(text, at)
        if match is None or (terms and not match["sign"]):
            raise _invalid(
                f"objective {text!r}: cannot read a term at {text[at:].strip()!r}; an objective "
                f"of several terms reads WEIGHT*AGGREGATION(TENSOR[MASK]) joined by + or -, "
                f"as {example}"
            )
        at = match.end()
        weight = float(match["weight"]) if match["weight"] else 1.0
        if match["sign"] == "-":
            weight = -weight
        aggregation = _ALIASES.get(match["aggregation"], match["aggregation"])
        micro = aggregation.endswith(f"@{MICRO}")
        if micro:
            aggregation = aggregation[: -len(MICRO) - 1]
        declared = objective(aggregation)
        if micro and declared.scope != "step":
            raise _invalid(f"{match.group().strip()!r}: a term is @micro or @window, not both")
        if weight == 0:
            raise _invalid(f"{match.group().strip()!r}: a term of weight 0 counts nothing")
        terms.append(
            Term(weight, declared, match["tensor"], match["mask"] or "", micro, len(terms))
        )
    if not terms:
        raise _invalid(f"objective {text!r} declares no term; as {example}")
    declared_sum = TermSum(tuple(terms))
    names = [t.tensor for t in terms[1:]] + [t.mask for t in terms if t.mask]
    tensors = [t.tensor for t in terms]
    if len(set(tensors)) != len(tensors):
        raise _invalid(
            f"objective {text!r}: each term aggregates a tensor of its own; "
            f"{', '.join(sorted({n for n in tensors if tensors.count(n) > 1}))} is named twice"
        )
    clash = sorted((set(names) & _TAKEN) | (set(tensors) & {t.mask for t in terms if t.mask}))
    if clash:
        raise _invalid(
            f"objective {text!r}: {', '.join(clash)} already names what the code is handed; "
            "name the term's tensor or mask otherwise"
        )
    return declared_sum


# -- what the harness trains: each term's values and mask, the same wherever a token is ----


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


# Where a term's aggregation is computed: over the step's whole global batch, within each
# rank's share of it (the ranks' values then averaged), or within each micro-batch (the
# step's micro-batches of every rank then averaged).
PER = ("step", "rank", MICRO)


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
