"""Declared objectives: what a loss over token sequences aggregates to on the whole global
batch, as LLM post-training declares it (verl's ``loss_agg_mode``, TRL's loss types).

An objective reads a per-token loss matrix ``[batch, seq]`` and a 0/1 mask of the tokens
that count. Sequences with no counted token are left out of every sequence mean (as verl and
OpenRLHF do):

- ``token-mean``: the sum over all counted tokens, over their number;
- ``seq-mean-token-mean``: the mean over sequences of each sequence's token mean;
- ``seq-mean-token-sum``: the mean over sequences of each sequence's token sum;
- ``seq-mean-token-sum-norm:C``: the sum over all counted tokens, over (sequences x C), the
  constant C declared (a maximum generation length);
- ``sum``: the sum over all counted tokens.

Each of the means is normalised per optimizer step unless it declares a *window*: the steps
that share one generation batch (TRL's ``steps_per_generation``, a DAPO normaliser counted
over the whole rollout). ``token-mean@window`` divides each step's token sum by the window's
tokens per step (the window's count over its steps, as TRL does); ``token-mean@window-total``
by the window's whole count, so that the steps of a window add up to its token mean. Against
the per-step objective a step then counts :func:`window_factor` times: its share of the
window's units, times the window's steps for ``@window``.

Every one of them is a *share-weighted* combination of its pieces: cut the global batch into
micro-batches and ranks (each padded to its own width), and the objective of the whole is the
sum over pieces of ``share x`` the piece's own objective, where a piece's share is its
:meth:`Objective.units` over the whole's (tokens for ``token-mean``, sequences that count for
the sequence means), or 1 for ``sum``. That is the one fact the engine's weighting, the
counts it hands to code and the diagnosis's words rest on: a denominator taken per piece
instead of over the whole is a wrong share.

Example::

    >>> import torch
    >>> losses = torch.tensor([[1.0, 3.0], [5.0, 0.0]])
    >>> mask = torch.tensor([[1, 1], [1, 0]])
    >>> float(objective("token-mean").value(losses, mask))  # (1 + 3 + 5) / 3
    3.0
    >>> float(objective("seq-mean-token-mean").value(losses, mask))  # (2 + 5) / 2
    3.5
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

__all__ = [
    "OBJECTIVES",
    "SAMPLE_MEAN",
    "SCOPES",
    "Objective",
    "combined",
    "objective",
    "sample_mean",
    "window_factor",
]


def _invalid(message: str) -> Exception:
    """hypothesis's ``InvalidArgument`` (a bad bound), imported where one is raised: code that
    only trains a declared objective (a reproducer) never imports hypothesis."""
    from hypothesis.errors import InvalidArgument

    return InvalidArgument(message)


# The mean over samples: what a loss that is no token loss (MSE, a classifier's
# cross-entropy) averages to, and the default. Declared by this name, it changes nothing; a
# token loss declares one of OBJECTIVES instead.
SAMPLE_MEAN = "sample-mean"

# Each declared objective's name, and the unit a piece's share is counted in ("" for a sum,
# whose pieces add unweighted).
OBJECTIVES: dict[str, str] = {
    "token-mean": "token",
    "seq-mean-token-mean": "sequence",
    "seq-mean-token-sum": "sequence",
    "seq-mean-token-sum-norm": "sequence",
    "sum": "",
}

# What a mean's count is taken over, each with what a step's sum is divided by: its own
# units (the default), the window's units per step, or the window's whole count.
SCOPES: dict[str, str] = {
    "step": "the step's own count",
    "window": "the window's count per step",
    "window-total": "the window's whole count",
}


@dataclasses.dataclass(frozen=True)
class Objective:
    """A declared objective: its ``name`` (one of :data:`OBJECTIVES`), for
    ``seq-mean-token-sum-norm`` the declared ``constant``, and the ``scope`` its count is
    taken over (one of :data:`SCOPES`)."""

    name: str
    constant: float | None = None
    scope: str = "step"

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise _invalid(
                f"objective {self.name!r} is none of {', '.join(OBJECTIVES)}: declare one of "
                "them (seq-mean-token-sum-norm with its constant, seq-mean-token-sum-norm:4096), "
                f"or {SAMPLE_MEAN} for a loss over samples"
            )
        normalised = self.name == "seq-mean-token-sum-norm"
        if normalised and (self.constant is None or not self.constant > 0):
            raise _invalid(
                "seq-mean-token-sum-norm divides by a constant you declare, as "
                "seq-mean-token-sum-norm:C with C > 0 (a maximum generation length, say); got "
                f"{self.constant!r}"
            )
        if not normalised and self.constant is not None:
            raise _invalid(f"{self.name} takes no constant; got {self.constant!r}")
        if self.scope not in SCOPES:
            raise _invalid(
                f"{self}: the count's scope after '@' is one of {', '.join(SCOPES)} "
                f"(token-mean@window), got {self.scope!r}"
            )
        if self.scope != "step" and not self.unit:
            raise _invalid(
                f"{self.name} divides by nothing, so it has no window to count over: declare "
                f"{self.name} alone"
            )

    def __str__(self) -> str:
        text = self.name if self.constant is None else f"{self.name}:{self.constant:g}"
        return text if self.scope == "step" else f"{text}@{self.scope}"

    def scoped(self, scope: str) -> Objective:
        """The same objective with its count taken over ``scope``.

        Example::

            >>> str(objective("token-mean").scoped("window"))
            'token-mean@window'
        """
        return dataclasses.replace(self, scope=scope)

    @property
    def unit(self) -> str:
        """What a piece's share is counted in: ``token``, ``sequence``, or ``""`` (a sum)."""
        return OBJECTIVES[self.name]

    def units(self, mask: torch.Tensor) -> int:
        """How many of this objective's units ``mask`` holds: the counted tokens, or the
        sequences with at least one; 1 for a sum.

        Example::

            >>> objective("seq-mean-token-sum").units(torch.tensor([[1, 0], [0, 0]]))
            1
        """
        counted = _counted(mask)
        if self.unit == "token":
            return int(counted.sum())
        if self.unit == "sequence":
            return int((counted.sum(dim=-1) > 0).sum())
        return 1

    def value(self, losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The objective on one batch: ``losses`` and ``mask`` are ``[batch, seq]``; 0 where
        nothing counts. Differentiable in ``losses``."""
        if losses.shape != mask.shape:
            raise ValueError(
                f"the loss matrix {tuple(losses.shape)} and its mask {tuple(mask.shape)} must "
                "have one shape, [batch, seq]"
            )
        counted = _counted(mask).to(losses.dtype)
        kept = losses * counted
        if self.name == "sum":
            return kept.sum()
        if self.name == "token-mean":
            return kept.sum() / counted.sum().clamp(min=1)
        tokens = counted.sum(dim=-1)
        present = tokens > 0
        sequences = present.sum().clamp(min=1)
        sums = kept.sum(dim=-1)
        if self.name == "seq-mean-token-mean":
            means = torch.where(present, sums / tokens.clamp(min=1), torch.zeros_like(sums))
            return means.sum() / sequences
        if self.name == "seq-mean-token-sum":
            return sums.sum() / sequences
        assert self.constant is not None
        return sums.sum() / (sequences * self.constant)

    def share(self, piece: torch.Tensor, whole: int) -> float:
        """The weight of a piece (its ``mask``) in the whole's objective, ``whole`` being
        the whole's :meth:`units`: 1 for a sum.

        Example::

            >>> objective("token-mean").share(torch.tensor([[1, 1, 0]]), whole=8)
            0.25
        """
        if not self.unit:
            return 1.0
        return self.units(piece) / whole if whole else 0.0


def sample_mean(declared: str, token_losses: bool) -> str:
    """``declared`` as the engine keeps it: :data:`SAMPLE_MEAN` is the default for losses
    over samples, kept as ``""``; for token losses it is no objective of theirs.

    Example::

        >>> sample_mean("sample-mean", token_losses=False), sample_mean("token-mean", True)
        ('', 'token-mean')
    """
    if declared != SAMPLE_MEAN:
        return declared
    if token_losses:
        raise _invalid(
            f"{SAMPLE_MEAN} averages samples, and a token loss averages tokens or sequences: "
            "declare token-mean (the default for token losses) or seq-mean-token-mean (the "
            "mean over sequences of each one's token mean)"
        )
    return ""


def objective(text: str | Objective) -> Objective:
    """The objective ``text`` declares (``token-mean``, ``seq-mean-token-sum-norm:4096``,
    ``token-mean@window``).

    Example::

        >>> objective("seq-mean-token-sum-norm:64")
        Objective(name='seq-mean-token-sum-norm', constant=64.0, scope='step')
        >>> objective("token-mean@window").scope
        'window'
        >>> objective("mean")
        Traceback (most recent call last):
        ...
        hypothesis.errors.InvalidArgument: objective 'mean' is none of token-mean, ...
    """
    if isinstance(text, Objective):
        return text
    return _parsed(str(text))


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> Objective:
    # Cached: the engine reads a scenario's declaration for every micro-batch it counts.
    text, at, scope = text.partition("@")
    if at:
        return dataclasses.replace(_parsed(text), scope=scope.strip())
    name, sep, constant = text.partition(":")
    if not sep:
        return Objective(name)
    try:
        value = float(constant)
    except ValueError:
        raise _invalid(
            f"{text!r}: the constant after ':' must be a number (seq-mean-token-sum-norm:4096)"
        ) from None
    return Objective(name, value)


def combined(
    declared: Objective, pieces: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The whole batch's objective from its pieces (each ``(losses, mask)`` at its own
    width): each piece's own objective times its share. Equal to the objective of the pieces
    laid side by side, whatever their widths: the property the engine rests on.

    Example::

        >>> whole = objective("seq-mean-token-mean")
        >>> a = (torch.tensor([[1.0, 3.0]]), torch.tensor([[1, 1]]))
        >>> b = (torch.tensor([[5.0]]), torch.tensor([[1]]))
        >>> float(combined(whole, [a, b]))
        3.5
    """
    total = sum(declared.units(mask) for _, mask in pieces)
    parts = [
        declared.share(mask, total) * declared.value(losses, mask)
        for losses, mask in pieces
        if declared.units(mask) or not declared.unit
    ]
    return torch.stack(parts).sum() if parts else torch.zeros(())


def window_factor(declared: Objective, units: Sequence[int], step: int) -> float:
    """How many times ``step`` counts under ``declared`` against the same objective
    normalised per step, ``units`` being the units of each step of its window in order
    (:meth:`Objective.units` of each step's global batch): 1 per step; the step's share of
    the window's units, times the window's steps, for ``@window``; the share alone for
    ``@window-total``.

    Example::

        >>> window_factor(objective("token-mean@window"), [30, 10], step=0)  # 30 / (40 / 2)
        1.5
        >>> window_factor(objective("token-mean@window-total"), [30, 10], step=1)
        0.25
    """
    if declared.scope == "step" or not declared.unit:
        return 1.0
    total = sum(units)
    share = units[step] / total if total else 0.0
    return share * len(units) if declared.scope == "window" else share


def _counted(mask: torch.Tensor) -> torch.Tensor:
    """A 0/1, bool or float mask as booleans: a token counts where its mask is not 0."""
    return mask != 0
