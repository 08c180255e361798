"""How a kind's code is called where the kind accepts several layouts, found by probing.

A layout is one choice per axis (:data:`AXES`): a token loss's logits flattened to
``(positions, vocab)`` or kept ``(batch, seq, vocab)``; its labels aligned with the logits or
unshifted (it shifts them itself); a training step's micro-batches ``(inputs, targets)``
pairs or dicts as a padding-free collator gives them (whose sequences a scenario may pack);
a reduce helper's input a tensor or a list of tensors. No
layout is assumed: before the search, the code is called in every candidate layout on the
simplest even scenario (every rank as many loss items, one micro-batch, one step), in one job
on the world, and the layout kept is chosen by evidence:

1. the layouts that run (no exception on any rank); none: a usage error listing each layout
   with its error and the option that pins one, unless every layout raised the same error
   (the code fails whatever the layout: the search meets it and reports it);
2. of those, the ones whose result agrees with the reference there (on an even scenario the
   usual weighting mistakes agree too);
3. else the ones whose gradient is the reference's up to one overall factor (a mistake in
   the weighting, read later by the diagnosis, but the right targets);
4. else the first that ran, and the report says that no layout agreed.

The words of the choice (which layouts failed and how, which agreed) go in the report's
``Called as`` line. A user pins an axis with ``--logits``/``--labels``/``--layout``
(``check(layout=...)``); the candidates' order below is the one default there is, used only
to break a tie between layouts the evidence cannot tell apart.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..world.naming import option, public
from .kinds import REGISTRY, Kind, KindError, as_kind, takes_a_list


@dataclass(frozen=True)
class Choice:
    """One way to lay out an axis: its ``value`` (as the option takes it) and its words;
    on an axis of how values are carried (a reduce helper's ``tensors``), how the harness's
    tensor is handed over (``hand_over(tensor)``) and the result taken back
    (``take_back(result, given)``, raising :class:`KindError` for a result of another form)."""

    value: str
    words: str
    hand_over: Callable[[Any], Any] | None = None
    take_back: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class Axis:
    """One axis of how a kind's code is called: ``name`` is the option that pins it."""

    name: str
    choices: tuple[Choice, ...]
    # Only token data has this axis (a class loss's logits are (batch, classes) either way).
    tokens_only: bool = False

    def choice(self, value: str) -> Choice:
        for c in self.choices:
            if c.value == value:
                return c
        raise KindError(
            f"{self.name} must be one of {', '.join(c.value for c in self.choices)}, got {value!r}"
        )


# Every layout axis, each a row of data, by name; a kind names its own (Kind.layout_axes).
# The first choice of an axis breaks ties the probe cannot (both ran, both agreed): this is
# the only default of a layout.
AXES: dict[str, Axis] = {
    "logits": Axis(
        "logits",
        (
            Choice("3d", "(batch, seq, vocab) logits"),
            Choice("2d", "(positions, vocab) logits"),
        ),
        tokens_only=True,
    ),
    "labels": Axis(
        "labels",
        (
            Choice("aligned", "labels aligned"),
            Choice("unshifted", "labels unshifted (shifted by the code)"),
        ),
        tokens_only=True,
    ),
    "batches": Axis(
        "batches",
        (
            Choice("pairs", "(inputs, targets) micro-batches"),
            Choice(
                "dicts",
                "dict micro-batches (input_ids, labels, position_ids, segment_ids, "
                "cu_seq_lens), packed where the scenario packs",
            ),
        ),
        tokens_only=True,
    ),
    "tensors": Axis(
        "tensors",
        (
            Choice(
                "tensor",
                "a tensor",
                hand_over=lambda tensor: tensor,
                take_back=lambda result, given: result,
            ),
            Choice(
                "list",
                "a list of one tensor",
                hand_over=lambda tensor: [tensor],
                take_back=lambda result, given: _one_of_a_list(result, given),
            ),
        ),
    ),
}


def _one_of_a_list(result: Any, given: Any) -> Any:
    """A list of one tensor back, or one tensor of the list's values (Megatron's
    ``average_losses_across_data_parallel_group`` returns ``torch.stack(...)`` reduced)."""
    import torch

    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return result.reshape(given.shape)
    if isinstance(result, (list, tuple)) and len(result) == 1:
        return result[0]
    got = (
        f"a tensor of shape {tuple(result.shape)}"
        if isinstance(result, torch.Tensor)
        else type(result).__name__
    )
    raise KindError(
        "a reduce helper given a list of one tensor must return a list of one tensor or a "
        f"tensor of its one value, got {got}"
    )


def add_choice(axis: str, choice: Choice) -> None:
    """Make ``choice`` one more way to lay out ``axis`` (of every kind that has it): a layout
    is one row. Rank processes must have it too, so add it where they import it (a plug-in
    module), before the world starts.

    Example::

        add_choice("tensors", Choice("tuple", "a tuple of one tensor",
                   hand_over=lambda t: (t,), take_back=lambda r, given: r[0]))
    """
    if axis not in AXES:
        raise KeyError(f"no layout axis {axis!r}; the axes are {', '.join(AXES)}")
    if any(c.value == choice.value for c in AXES[axis].choices):
        raise ValueError(f"axis {axis!r} already has a choice {choice.value!r}")
    AXES[axis] = dataclasses.replace(AXES[axis], choices=(*AXES[axis].choices, choice))


def carrier(kind: Kind | str, layout: Mapping[str, str]) -> Choice | None:
    """The row of ``layout`` that says how values are handed over and taken back, if the
    kind has such an axis.

    Example::

        >>> carrier("reduce", {"tensors": "list"}).words
        'a list of one tensor'
    """
    for axis in axes(kind):
        if axis.choices and axis.choices[0].hand_over is not None:
            return axis.choice(layout.get(axis.name, axis.choices[0].value))
    return None


Layout = dict[str, str]


def axes(kind: Kind | str) -> tuple[Axis, ...]:
    """The layout axes of ``kind`` (none for most kinds).

    Example::

        >>> [a.name for a in axes("loss-fn")]
        ['logits', 'labels']
    """
    return tuple(AXES[name] for name in as_kind(kind).layout_axes)


def default_layout(kind: Kind | str, fn: Callable[..., Any] | None = None) -> Layout:
    """The layout used where nothing was probed or pinned: each axis's first choice (a
    ``reduce`` helper named for several tensors, ``losses``, a list first).

    Example::

        >>> default_layout("loss-fn")
        {'logits': '3d', 'labels': 'aligned'}
    """
    return {axis.name: _ordered(axis, fn)[0].value for axis in axes(kind)}


def _ordered(axis: Axis, fn: Callable[..., Any] | None) -> tuple[Choice, ...]:
    """The axis's choices in tie-breaking order: a name that says "several" puts the list
    first (Megatron's ``average_losses_across_data_parallel_group(losses)``)."""
    if axis.name == "tensors" and fn is not None and takes_a_list(fn):
        return tuple(reversed(axis.choices))
    return axis.choices


def parse_layout(kind: Kind | str, layout: Mapping[str, Any] | str | None, **pins: Any) -> Layout:
    """The axes the user pinned: ``layout`` (``"logits=2d,labels=unshifted"`` or a mapping)
    and keyword pins (``logits="2d"``; None pins nothing). :class:`KindError` for an axis
    the kind lacks or a value the axis lacks.

    Example::

        >>> parse_layout("loss-fn", "logits=2d", labels=None)
        {'logits': '2d'}
    """
    pinned: dict[str, str] = {}
    if isinstance(layout, str):
        for part in filter(None, (p.strip() for p in layout.split(","))):
            name, equals, value = part.partition("=")
            if not equals:
                raise KindError(
                    f"a layout is AXIS=VALUE[,AXIS=VALUE], got {part!r}: for example "
                    f"{option('layout', 'logits=2d,labels=unshifted')}"
                )
            pinned[name.strip()] = value.strip()
    elif layout is not None:
        pinned.update({str(k): str(v) for k, v in layout.items()})
    pinned.update({k: str(v) for k, v in pins.items() if v is not None})
    known = {axis.name: axis for axis in axes(kind)}
    for name, value in pinned.items():
        if name not in known:
            if name in AXES:
                raise KindError(
                    f"{option(name, value)} applies to {_kinds_with(name)} plug-ins, not to {kind}"
                )
            raise KindError(
                f"{kind} has no layout axis {name!r}"
                + (f"; its axes are {', '.join(known)}" if known else "")
            )
        known[name].choice(value)
    return pinned


def _kinds_with(axis: str) -> str:
    """The kinds that have layout axis ``axis``, in words."""
    return " and ".join(k.name for k in REGISTRY if axis in k.layout_axes)


def candidates(
    kind: Kind | str,
    pinned: Mapping[str, str],
    fn: Callable[..., Any] | None = None,
    *,
    tokens: bool,
) -> list[Layout]:
    """Every layout to probe: the product of the unpinned axes' choices, the pinned fixed
    (axes of token data only when the data has tokens), in tie-breaking order.

    Example::

        >>> candidates("loss-fn", {"labels": "aligned"}, tokens=True)
        [{'logits': '3d', 'labels': 'aligned'}, {'logits': '2d', 'labels': 'aligned'}]
    """
    names, options = [], []
    for axis in axes(kind):
        names.append(axis.name)
        if axis.name in pinned:
            options.append([pinned[axis.name]])
        elif axis.tokens_only and not tokens:
            options.append([_ordered(axis, fn)[0].value])
        else:
            options.append([c.value for c in _ordered(axis, fn)])
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*options)]


def words(kind: Kind | str, layout: Mapping[str, str]) -> str:
    """A layout in words.

    Example::

        >>> words("loss-fn", {"logits": "2d", "labels": "aligned"})
        '(positions, vocab) logits, labels aligned'
    """
    chosen = [axis.choice(layout[axis.name]) for axis in axes(kind) if axis.name in layout]
    return ", ".join(choice.words for choice in chosen)


# Axes with an option of their own (``--logits``); the others are pinned with ``--layout``.
OWN_OPTIONS = ("logits", "labels")


def pins(kind: Kind | str, layout: Mapping[str, str]) -> str:
    """The options that pin ``layout``, as the front end in use spells them.

    Example::

        >>> pins("reduce", {"tensors": "list"})
        "layout='tensors=list'"
    """
    own = [option(name, value) for name, value in layout.items() if name in OWN_OPTIONS]
    rest = ",".join(f"{name}={value}" for name, value in layout.items() if name not in OWN_OPTIONS)
    return " ".join(own + ([option("layout", rest)] if rest else []))


@dataclass(frozen=True)
class Tried:
    """What one layout did on the probe: its ``error`` (the first line, where it raised),
    else how its result compares with the reference's: ``agrees``, or ``factor`` when its
    gradient is the reference's times one factor, or neither."""

    layout: Layout
    error: str | None = None
    agrees: bool = False
    factor: float | None = None


@dataclass(frozen=True)
class Chosen:
    """The layout the code is called in, and why (``reason``, in words; empty where the kind
    has one layout or the user pinned every axis)."""

    layout: Layout
    reason: str = ""
    tried: tuple[Tried, ...] = ()
    # Whether the probe agreed with the reference in the chosen layout (up to a factor).
    settled: bool = True


@public
class LayoutPinError(KindError):
    """No layout the kind accepts runs the code: the message lists each with its error and
    the option that pins one. A :class:`~ddp_verify.usercode.kinds.KindError`: a usage error.

    Example::

        >>> import ddp_verify
        >>> issubclass(ddp_verify.LayoutPinError, ddp_verify.KindError)
        True
    """


def choose(kind: Kind | str, tried: Iterable[Tried]) -> Chosen:
    """The layout the evidence of ``tried`` (in tie-breaking order) supports, and why.

    Example::

        >>> flat = Tried({"logits": "2d"}, agrees=True)
        >>> choose("loss-fn", [Tried({"logits": "3d"}, error="RuntimeError: ..."), flat]).layout
        {'logits': '2d'}
    """
    tried = tuple(tried)
    ran = [t for t in tried if t.error is None]
    if not ran and len(tried) > 1 and len({t.error for t in tried}) == 1:
        # One error whatever the layout: the layout is not what fails. The search meets it
        # in the first layout and reports it as the code's own.
        return Chosen(tried[0].layout, "", tried, settled=False)
    if not ran:
        each = "\n".join(f"  {words(kind, t.layout)}: raised {t.error}" for t in tried)
        raise LayoutPinError(
            f"the code raised in every layout a {kind} plug-in can be called in, on the "
            f"simplest even scenario:\n{each}\nPin the layout it is written for "
            f"(such as {pins(kind, tried[0].layout)}) to see its own error on a scenario"
        )
    agreeing = [t for t in ran if t.agrees]
    scaled = [t for t in ran if t.factor is not None]
    chosen, settled = (agreeing or scaled or ran)[0], bool(agreeing or scaled)
    if len(tried) == 1:
        return Chosen(chosen.layout, "", tried, settled)
    lines: list[str] = []
    for t in tried:
        if t is chosen:
            continue
        said = words(kind, _differing(t.layout, chosen.layout))
        if t.error is not None:
            lines.append(f"{said}: raised {t.error}")
        elif t.agrees:
            lines.append(f"{said}: ran and agreed too")
        elif t.factor is not None:
            lines.append(f"{said}: ran, its gradient the reference's x{t.factor:.4g}")
        else:
            lines.append(f"{said}: ran, and agreed with the reference in nothing")
    if chosen.agrees:
        why = "it agreed with the reference on the simplest even scenario"
    elif chosen.factor is not None:
        why = (
            f"its gradient was the reference's x{chosen.factor:.4g} on the simplest even "
            "scenario (the targets are right; the weighting is diagnosed below)"
        )
    else:
        why = "it ran; no layout agreed with the reference on the simplest even scenario"
    head = f"{words(kind, chosen.layout)}, as {why} (pin it: {pins(kind, chosen.layout)})"
    return Chosen(
        chosen.layout, "\n".join([head, *(f"  {line}" for line in lines)]), tried, settled
    )


def _differing(layout: Layout, chosen: Layout) -> Layout:
    """The axes on which ``layout`` differs from ``chosen`` (all, if none does)."""
    differing = {k: v for k, v in layout.items() if chosen.get(k) != v}
    return differing or dict(layout)


# Relative agreement that counts as the same result for choosing a layout: far above any
# format's rounding of these tiny models (float32 inside the code: about 1e-7), far below
# what wrong targets or a wrong shift do (order 1).
AGREEMENT = 1e-4


def compared(layout: Layout, reference: Any, got: Any) -> Tried:
    """How ``got`` (a trace of the probe in ``layout``) compares with ``reference``: the
    step-0 gradients of every rank against the reference's, or the reported losses where the
    harness computes the gradients.

    Example::

        compared({"logits": "2d"}, reference, got).agrees
    """
    import torch

    def flat(trace: Any, rank: int) -> torch.Tensor | None:
        grads = trace.ranks[rank].grads
        if not grads:
            return None
        values = [g.double().flatten() for _, g in sorted(grads[0].items()) if g is not None]
        return torch.cat(values) if values else None

    expected = flat(reference, 0)
    got_grads = [flat(got, r) for r in range(len(got.ranks))]
    if expected is None or any(g is None or g.shape != expected.shape for g in got_grads):
        truth = torch.tensor([reference.ranks[0].losses[0]], dtype=torch.float64)
        mine = [torch.tensor([rank.losses[0]], dtype=torch.float64) for rank in got.ranks]
    else:
        truth, mine = expected, [g for g in got_grads if g is not None]
    value = torch.cat(mine)
    truth = truth.repeat(len(mine))
    norm = float(truth.norm())
    if norm == 0.0:
        return Tried(layout, agrees=float(value.norm()) == 0.0)
    factor = float(value @ truth / (truth @ truth))
    residual = float((value - factor * truth).norm()) / max(float(value.norm()), norm)
    agrees = float((value - truth).norm()) <= AGREEMENT * norm
    # A result of nothing (every target ignored in a layout that shifts them again) is
    # proportional to anything: a factor of 0 is no agreement.
    scaled = residual <= AGREEMENT and abs(factor) > AGREEMENT
    return Tried(layout, agrees=agrees, factor=factor if scaled else None)


def run_layouts(methods: list[Any], scenario: Any) -> list[Any]:
    """On each rank: each method's trace of ``scenario``, or the first line of what it raised
    (one job for every layout: a layout that raises costs no world relaunch)."""
    results: list[Any] = []
    for method in methods:
        try:
            results.append(method.train_rank(scenario))
        except Exception as exc:  # the layout's evidence, reported with the others
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            results.append(f"{type(exc).__name__}: {first}".rstrip(": "))
    return results


def equal_items_scenario(scenario: Any, *, tries: int = 512) -> Any:
    """``scenario`` with a seed whose data gives every rank as many loss items (tokens that
    count) at every step: the even case where correct code and the usual weighting mistakes
    agree. ``scenario`` itself where its loss counts samples or no seed does.

    Example::

        equal_items_scenario(probe)  # the same probe, seed 17: 2 tokens on every rank
    """
    from ..engine.models import item_counts

    if scenario.loss != "tokens":
        return scenario
    for seed in range(tries):
        candidate = dataclasses.replace(scenario, seed=seed)
        counts = item_counts(candidate)
        if all(len({sum(sizes) for sizes in per_rank}) == 1 for per_rank in counts):
            return candidate
    return scenario
