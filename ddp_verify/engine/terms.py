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

from .objectives import Objective, objective

__all__ = ["MICRO", "PER", "Term", "TermSum", "is_term_sum", "term_sum"]

# The scope of a term computed within each micro-batch, and its shorthand for a token mean.
MICRO = "micro"
_ALIASES = {"micro-mean": f"token-mean@{MICRO}"}
# Where a term's aggregation is computed: over the step's whole global batch, within each
# micro-batch (the step's micro-batches of every rank then averaged), or within each rank's
# share of it (the ranks' values then averaged). Where a rank holds one micro-batch the last
# two are one: the micro-batch, what code handed one micro-batch at a time sees, is said.
PER = ("step", MICRO, "rank")
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
    tensors = [t.tensor for t in terms]
    if len(set(tensors)) != len(tensors):
        raise _invalid(
            f"objective {text!r}: each term aggregates a tensor of its own; "
            f"{', '.join(sorted({n for n in tensors if tensors.count(n) > 1}))} is named twice"
        )
    clash = sorted(set(tensors) & {t.mask for t in terms if t.mask})
    if clash:
        raise _invalid(
            f"objective {text!r}: {', '.join(clash)} names both a term's tensor and a mask; "
            "name them apart"
        )
    return declared_sum
