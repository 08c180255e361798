"""The plug-in kinds: what each kind's callable must accept, checked before anything runs.

No torch here: the command line reads these to build its arguments and check a signature
before it pays for importing torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = (
    "grad-sync",
    "loss",
    "reduce",
    "reduce-dict",
    "step",
    "wrapped-step",
    "comm-hook",
    "wrapper",
    "loss-fn",
)

# What each kind's callable must accept, for the error that says so.
SIGNATURES = {
    "grad-sync": "fn(model) or fn(model, num_samples)",
    "loss": "fn(local_loss, num_samples) or fn(local_loss) -> tensor or float",
    "reduce": "fn(tensor) or fn(tensor, num_samples) -> tensor of the same shape (or a list of "
    "tensors in and out)",
    "reduce-dict": "fn(metrics) or fn(metrics, num_samples) -> dict of the same keys",
    "step": "fn(model, optimizer, micro_batches, loss_fn) -> tensor or float",
    "wrapped-step": "fn(ddp_model, optimizer, micro_batches, loss_fn) -> tensor or float, "
    "the model already in DistributedDataParallel",
    "comm-hook": "hook(state, bucket) -> torch.futures.Future",
    "wrapper": "fn(module) -> module",
    "loss-fn": "fn(logits, labels) or fn(logits, labels, num_items_in_batch) -> tensor",
}
# Scenario bounds a kind checks under unless the user says otherwise. A step function owns its
# accumulation loop, and training loops give every rank the same number of accumulation steps;
# code that synchronises per micro-batch would only hang on other schedules.
DEFAULT_BOUNDS: dict[str, dict[str, Any]] = {
    "step": {"same_micro_batch_counts": True},
    "wrapped-step": {"same_micro_batch_counts": True},
    # A loss function takes logits and class labels: language-model tokens (padding and
    # ignore_index included) or one class per sample.
    "loss-fn": {"losses": ("tokens", "cross_entropy")},
}

_ARITIES = {
    "grad-sync": (1, 2),
    "loss": (1, 2),
    "reduce": (1, 2),
    "reduce-dict": (1, 2),
    "step": (4,),
    "wrapped-step": (4,),
    "comm-hook": (2,),
    "wrapper": (1,),
    "loss-fn": (2, 3),
}
# Kinds whose result may be held by rank 0 only (--result-on rank0): logging helpers that
# reduce onto one rank.
RESULT_KINDS = ("loss", "reduce", "reduce-dict")

# Kinds whose callable may be given the count of loss items (samples) on this rank, and what
# the harness passes before it.
COUNTED = {
    "grad-sync": "model",
    "loss": "local_loss",
    "reduce": "tensor",
    "reduce-dict": "metrics",
    "loss-fn": "logits, labels",
}
# How many arguments a counted kind passes before the count.
LEADING = {"loss-fn": 2}
# Names that say a parameter is a count: the count is passed to such a parameter, or to one
# without a default, and never to another optional parameter (Megatron's
# allreduce_params(reduce_after=True, ...) must not get reduce_after=num_samples).
COUNT_NAMES = frozenset(
    {
        "num_samples",
        "num_items",
        "num_items_in_batch",
        "num_tokens",
        "num_examples",
        "batch_size",
        "local_batch_size",
        "bsz",
        "count",
        "n",
        "n_samples",
        "n_items",
        "n_tokens",
        "ntokens",
        "nsamples",
        "sample_size",
        "samples",
        "tokens",
    }
)


# Names for a count of samples (rows of the batch), and words that name a count of loss items
# (tokens that count): a callable that takes one of each gets both.
SAMPLE_NAMES = frozenset(
    {"num_samples", "n_samples", "nsamples", "num_examples", "samples", "batch_size", "bsz"}
)


def is_items_name(name: str) -> bool:
    """Whether a count parameter's name says it counts loss items or tokens, not samples.

    Example::

        >>> is_items_name("num_items_in_batch"), is_items_name("num_samples")
        (True, False)
    """
    return is_count_name(name) and ("item" in name or "token" in name)


def is_count_name(name: str) -> bool:
    """Whether a parameter's name says it is a count of samples or tokens.

    Example::

        >>> is_count_name("num_items_in_batch"), is_count_name("reduce_after")
        (True, False)
    """
    return name in COUNT_NAMES or name.startswith(("num_", "n_")) or name.endswith("_count")


def takes_a_list(fn: Callable[..., Any]) -> bool:
    """Whether a ``reduce`` helper's first parameter is named for several tensors
    (``losses``, ``tensors``): it is then given a list of one tensor, as Megatron's
    ``average_losses_across_data_parallel_group([loss])`` expects.

    Example::

        >>> takes_a_list(lambda losses: losses), takes_a_list(lambda tensor: tensor)
        (True, False)
    """
    try:
        first = next(iter(inspect.signature(fn).parameters.values()))
    except (TypeError, ValueError, StopIteration):
        return False
    return first.name.endswith("s") and first.name not in ("loss", "bias", "status")


class KindError(TypeError):
    """The callable cannot be used as the requested kind; the message says what was expected."""


@dataclass(frozen=True)
class Call:
    """How the harness calls a plug-in: ``positional`` arguments it passes, and where the
    count goes (``count_keyword`` by name, ``count_positional`` as the next positional
    argument, or nowhere). Optional parameters are never filled by position.

    Example::

        call = check_signature(average_gradients, "grad-sync")
        call.describe()  # "sample_weighted(model, num_samples=<this rank's samples>)"
    """

    name: str
    kind: str
    positional: int
    count_keyword: str | None = None
    count_positional: bool = False
    # The parameter a positional count lands in, for describe().
    count_parameter: str | None = None
    # Where the count of samples goes when the callable takes one beside the count of loss
    # items (fn(model, num_samples, num_items)).
    samples_keyword: str | None = None

    @property
    def takes_count(self) -> bool:
        return self.count_keyword is not None or self.count_positional

    def arguments(
        self, leading: tuple[Any, ...], count: int, samples: int | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The ``(args, kwargs)`` to call the plug-in with: ``count`` loss items (samples, or
        tokens that count), and ``samples`` where it takes a count of samples beside them."""
        if self.samples_keyword is not None and self.count_keyword is not None:
            return leading, {self.count_keyword: count, self.samples_keyword: samples or count}
        if self.count_positional:
            return (*leading, count), {}
        if self.count_keyword is not None:
            return leading, {self.count_keyword: count}
        return leading, {}

    def describe(self) -> str:
        """The call the harness makes, as a report header shows it."""
        names = {
            "grad-sync": ["model"],
            "loss": ["local_loss"],
            "reduce": ["tensor"],
            "reduce-dict": ["metrics"],
            "step": ["model", "optimizer", "micro_batches", "loss_fn"],
            "wrapped-step": ["ddp_model", "optimizer", "micro_batches", "loss_fn"],
            "comm-hook": ["state", "bucket"],
            "wrapper": ["module"],
            "loss-fn": ["logits", "labels"],
        }[self.kind][: self.positional]
        count = "<this rank's samples>"
        if self.kind == "loss-fn":
            count = "<the step's loss items, every micro-batch of every rank>"
        if self.count_positional:
            names.append(f"{self.count_parameter}={count}" if self.count_parameter else count)
        elif self.count_keyword is not None:
            names.append(f"{self.count_keyword}={count}")
        if self.samples_keyword is not None:
            names[-1] = f"{self.count_keyword}=<loss items: samples, or tokens that count>"
            names.append(f"{self.samples_keyword}=<samples>")
        return f"{self.name}({', '.join(names)})"


def check_signature(fn: Callable[..., Any], kind: str) -> Call:
    """How the harness will call ``fn`` as a ``kind`` plug-in; :class:`KindError` if it
    cannot take what ``kind`` passes, or if where the count goes is ambiguous.

    The count (of this rank's samples) goes to the one parameter after the leading ones that
    has no default, or else to one whose name says it is a count (:func:`is_count_name`);
    an optional parameter with another name is left to its default.

    Example::

        >>> def allreduce_params(model, reduce_after=True, fp32_allreduce=False): ...
        >>> check_signature(allreduce_params, "grad-sync").describe()
        'allreduce_params(model)'
    """
    if kind not in KINDS:
        raise KindError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not callable(fn):
        raise KindError(f"{fn!r} is not callable; a {kind} plug-in is {SIGNATURES[kind]}")
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        # Builtins and C callables: trust the user, as documented.
        arity = _ARITIES[kind][-1]
        if kind in COUNTED:
            lead = LEADING.get(kind, 1)
            return Call(name, kind, lead, count_positional=arity == lead + 1)
        return Call(name, kind, arity)
    if kind in COUNTED:
        return _counted_call(name, kind, signature)
    for arity in reversed(_ARITIES[kind]):
        try:
            signature.bind(*range(arity))
        except TypeError:
            continue
        return Call(name, kind, arity)
    raise KindError(f"{name}{signature} cannot be a {kind} plug-in: expected {SIGNATURES[kind]}")


# What the first parameter of a counted kind may be called when it has a default: anything
# else with a default (DeepSpeed's buffered_allreduce_fallback(grads=None, ...)) is an optional
# argument the harness must not fill with the model.
LEADING_NAMES = {
    "grad-sync": ("model", "module", "net", "network", "ddp_model", "m"),
    "loss": ("loss", "local_loss", "value", "tensor"),
    "reduce": ("tensor", "t", "x", "value", "loss", "losses", "tensors", "values"),
    "reduce-dict": ("metrics", "input_dict", "loss_dict", "losses", "values", "d"),
    "loss-fn": ("logits", "source", "input", "outputs", "output", "x"),
}


def _counted_call(name: str, kind: str, signature: inspect.Signature) -> Call:
    leading = COUNTED[kind]
    lead = LEADING.get(kind, 1)
    expected = SIGNATURES[kind]
    params = list(signature.parameters.values())
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        takes_leading = True
    else:
        takes_leading = len(params) >= lead and all(
            p.kind in positional_kinds or p.kind is inspect.Parameter.VAR_POSITIONAL
            for p in params[:lead]
        )
    if not takes_leading:
        raise KindError(f"{name}{signature} cannot be a {kind} plug-in: expected {expected}")
    first = params[0]
    if first.default is not first.empty and first.name not in LEADING_NAMES[kind]:
        short = name.split(".")[-1]
        raise KindError(
            f"{name}{signature}: its first parameter {first.name!r} is optional, so it is not "
            f"the {leading} the harness passes first, and it is never filled by position; pass "
            f"a function that takes the {leading} and calls it, such as lambda {leading}: "
            f"{short}({first.name}=<from {leading}>)"
        )
    rest = [p for p in params[lead:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        rest = []
    required = [p for p in rest if p.default is p.empty]
    counted = [p for p in rest if p.default is not p.empty and is_count_name(p.name)]
    named = [p for p in rest if is_count_name(p.name)]
    items = [p for p in named if is_items_name(p.name)]
    samples = [p for p in named if p.name in SAMPLE_NAMES]
    if len(items) == 1 and len(samples) == 1 and all(p in items + samples for p in required):
        # Both counts, each where its name says: passed by keyword.
        positional_only = [p for p in items + samples if p.kind is p.POSITIONAL_ONLY]
        if not positional_only:
            return Call(
                name, kind, lead, count_keyword=items[0].name, samples_keyword=samples[0].name
            )
    if len(required) > 1:
        raise KindError(
            f"{name}{signature} cannot be a {kind} plug-in: besides {leading} it needs "
            f"{', '.join(p.name for p in required)}, and the harness passes one count at most "
            f"(expected {expected})"
        )
    if required and counted and not is_count_name(required[0].name):
        raise KindError(
            f"{name}{signature}: ambiguous for a {kind} plug-in: the count of this rank's "
            f"samples could go to {required[0].name!r} (it has no default) or to "
            f"{counted[0].name!r} (its name says it is a count). Resolve it either way: give "
            f"{required[0].name!r} a default so the count goes to {counted[0].name!r}, or pass "
            f"a function that says which, such as lambda {leading}, n: "
            f"{name.split('.')[-1]}({leading}, {counted[0].name}=n)"
        )
    if required:
        only = required[0]
        if only.kind is inspect.Parameter.KEYWORD_ONLY:
            return Call(name, kind, lead, count_keyword=only.name)
        return Call(name, kind, lead, count_positional=True, count_parameter=only.name)
    if len(counted) > 1:
        raise KindError(
            f"{name}{signature}: ambiguous for a {kind} plug-in: the count could go to any of "
            f"{', '.join(repr(p.name) for p in counted)}; pass a function that says which, "
            f"such as lambda {leading}, n: {name.split('.')[-1]}({leading}, "
            f"{counted[0].name}=n)"
        )
    if counted:
        return Call(name, kind, lead, count_keyword=counted[0].name)
    return Call(name, kind, lead)
