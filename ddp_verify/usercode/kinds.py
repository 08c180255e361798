"""The plug-in kinds as data: a registry of :class:`Kind` objects (what each kind's callable
takes and returns, how the harness calls it, which adapter and which known mistakes go with it),
and the check of a callable's signature against its kind, before anything runs.

No torch here: the command line reads these to build its arguments and check a signature
before it pays for importing torch.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..world.naming import option, public


@dataclass(frozen=True)
class Kind:
    """One plug-in kind: what its callable takes and returns, how the harness calls it, and
    what the adapters and the diagnosis do with it. Read, never branched on by name: a new
    kind is a new entry of :data:`REGISTRY` (tests/usercode/test_kinds.py walks it).

    Example::

        >>> KIND["grad-sync"].arities, KIND["grad-sync"].counted_after
        ((1, 2), 'model')
    """

    name: str
    # What the callable must accept and return, for the error that says so.
    signature: str
    # How many positional arguments it may take.
    arities: tuple[int, ...]
    # The names a report gives the positional arguments the harness passes.
    parameters: tuple[str, ...]
    # The adapter that trains with it (an entry of ddp_verify.usercode.adapters.ADAPTERS).
    adapter: str
    # The family of known mistakes the diagnosis simulates for it (mistakes.FAMILIES).
    mistakes: str
    # What is passed before the count of loss items, for kinds that may take one ("model").
    counted_after: str | None = None
    # How many arguments come before the count.
    lead: int = 1
    # What its first parameter may be called when it has a default (see check_signature).
    leading_names: tuple[str, ...] = ()
    # The count, as a report says it.
    count_words: str = "<this rank's samples>"
    # Scenario bounds it is checked under unless the user says otherwise.
    default_bounds: Mapping[str, Any] = field(default_factory=dict)
    # Its result may be held by rank 0 only (result_on="rank0"): logging helpers.
    result_on_rank0: bool = False
    # A lossy format may be allowed (lossy=): compression is a comm hook's design choice.
    lossy: bool = False
    # Takes a state made per rank (hook_state=).
    hook_state: bool = False
    # Owns the micro-batch loop (loss_reduction=; collectives per micro-batch can misfire).
    owns_micro_batches: bool = False
    # Gets the model inside DDP or a wrapper (ddp_wrapper=).
    wrapped: bool = False
    # Its code may keep state from step to step (a hook's state, a step function's own): the
    # search draws several steps early (strategies' several_steps).
    keeps_state: bool = False
    # Parameters it fills by their names alone, beside NAMED_VALUES (a loss-agg plug-in's
    # counts, a coupled loss's learned parameters).
    named_values: tuple[str, ...] = ()
    # Its loss couples samples across ranks: its own scenarios (an encoder's features), its
    # own reference (the same code on a one-rank world holding every pair), its own probes.
    coupled: bool = False
    # It is handed the per-token loss matrix and its mask (RL post-training's aggregation):
    # token weights, the Trainer's division and a declared objective act on what it returns.
    token_losses: bool = False
    # Its code is handed packed rows where a scenario packs its sequences (packings=), with
    # their boundaries by name (PACKED_VALUES); "split" too where it is handed per-token
    # values already aligned with their targets (token_losses).
    packed: bool = False
    # What --bind may fill (a comm hook is called by DDP: its state carries what it needs).
    takes_binds: bool = True
    # The harness calls it with its positional arguments alone: what is bound is added by a
    # wrapper (a step function, a wrapper), not by the call.
    bound_by_wrapper: bool = False
    # The axes of the layouts it may be called in (usercode/layouts.py's AXES): how its
    # logits and labels are shaped, or whether a tensor comes alone or in a list.
    layout_axes: tuple[str, ...] = ()
    # How a report shows the arguments the harness passes first, where they are one value
    # (a rank's mean loss); what its layout shows otherwise.
    shown: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"KIND[{self.name!r}]"

    @property
    def bounds(self) -> dict[str, Any]:
        """The scenario bounds it is checked under unless the user says otherwise: its
        defaults, and several steps drawn early where its code may keep state.

        Example::

            >>> KIND["comm-hook"].bounds
            {'several_steps': True}
        """
        return {**self.default_bounds, **({"several_steps": True} if self.keeps_state else {})}


# The values a loss-agg plug-in's parameters are bound to by their names alone.
AGGREGATION_VALUES = (
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
)
# The boundaries of packed sequences, by name (a packed kind's code may take them).
PACKED_VALUES = ("position_ids", "segment_ids", "cu_seq_lens")
# The learned loss parameters a coupled-loss plug-in is given by their names alone.
LEARNED_VALUES = ("logit_scale", "logit_bias")
# What a step function may take by name: the scheduler of the user's --scheduler, to step.
STEP_VALUES = ("scheduler", "lr_scheduler")

# A step function owns its accumulation loop, and training loops give every rank the same
# number of accumulation steps; code that synchronises per micro-batch would only hang on
# other schedules.
_SAME_COUNTS = {"same_micro_batch_counts": True}

REGISTRY: tuple[Kind, ...] = (
    Kind(
        "grad-sync",
        "fn(model) or fn(model, num_samples)",
        (1, 2),
        ("model",),
        adapter="grad-sync",
        mistakes="combine",
        counted_after="model",
        leading_names=("model", "module", "net", "network", "ddp_model", "m"),
        # Its contract holds on a rank with no sample: a zero gradient and a count of 0.
        default_bounds={"empty_ranks": True},
    ),
    Kind(
        "loss",
        "fn(local_loss, num_samples) or fn(local_loss) -> tensor or float",
        (1, 2),
        ("local_loss",),
        adapter="loss",
        mistakes="report",
        counted_after="local_loss",
        shown=("local_loss[]",),
        leading_names=("loss", "local_loss", "value", "tensor"),
        result_on_rank0=True,
    ),
    Kind(
        "reduce",
        "fn(tensor) or fn(tensor, num_samples) -> tensor of the same shape (or a list of "
        "tensors in and out)",
        (1, 2),
        ("tensor",),
        adapter="reduce",
        mistakes="report",
        counted_after="tensor",
        layout_axes=("tensors",),
        shown=("tensor[]",),
        leading_names=("tensor", "t", "x", "value", "loss", "losses", "tensors", "values"),
        result_on_rank0=True,
    ),
    Kind(
        "reduce-dict",
        "fn(metrics) or fn(metrics, num_samples) -> dict of the same keys",
        (1, 2),
        ("metrics",),
        adapter="reduce-dict",
        mistakes="report",
        counted_after="metrics",
        shown=("{'loss': tensor[]}",),
        leading_names=("metrics", "input_dict", "loss_dict", "losses", "values", "d"),
        result_on_rank0=True,
    ),
    Kind(
        "step",
        "fn(model, optimizer, micro_batches, loss_fn) -> tensor or float",
        (4,),
        ("model", "optimizer", "micro_batches", "loss_fn"),
        adapter="step",
        mistakes="step",
        bound_by_wrapper=True,
        # Names do not tell a step from a wrapped step: nanoGPT's DDP model is "model".
        leading_names=("ddp_model",),
        default_bounds=_SAME_COUNTS,
        # Micro-batches as pairs, or as dicts whose sequences may be packed (probed).
        layout_axes=("batches",),
        owns_micro_batches=True,
        keeps_state=True,
        named_values=STEP_VALUES,
    ),
    Kind(
        "wrapped-step",
        "fn(ddp_model, optimizer, micro_batches, loss_fn) -> tensor or float, the model "
        "already in DistributedDataParallel",
        (4,),
        ("ddp_model", "optimizer", "micro_batches", "loss_fn"),
        adapter="step",
        mistakes="step",
        bound_by_wrapper=True,
        leading_names=("model",),
        default_bounds=_SAME_COUNTS,
        # Micro-batches as pairs, or as dicts whose sequences may be packed (probed).
        layout_axes=("batches",),
        owns_micro_batches=True,
        wrapped=True,
        keeps_state=True,
        named_values=STEP_VALUES,
    ),
    Kind(
        "comm-hook",
        "hook(state, bucket) -> torch.futures.Future",
        (2,),
        ("state", "bucket"),
        adapter="comm-hook",
        mistakes="prescaled",
        takes_binds=False,
        lossy=True,
        hook_state=True,
        keeps_state=True,
    ),
    Kind(
        "wrapper",
        "fn(module) -> module",
        (1,),
        ("module",),
        adapter="wrapper",
        mistakes="prescaled",
        bound_by_wrapper=True,
        keeps_state=True,
    ),
    Kind(
        "loss-fn",
        "fn(logits, labels) or fn(logits, labels, num_items_in_batch) -> tensor",
        (2, 3),
        ("logits", "labels"),
        adapter="loss-fn",
        mistakes="loss-fn",
        layout_axes=("logits", "labels"),
        counted_after="logits, labels",
        lead=2,
        leading_names=("logits", "source", "input", "outputs", "output", "x"),
        count_words="<the step's loss items, every micro-batch of every rank>",
        # A loss function takes logits and class labels: language-model tokens (padding and
        # ignore_index included) or one class per sample.
        default_bounds={"losses": ("tokens", "cross_entropy")},
        packed=True,
        named_values=PACKED_VALUES,
    ),
    Kind(
        "loss-agg",
        "fn(loss_mat, loss_mask, ...) -> tensor, on every micro-batch of every rank",
        (2,),
        ("loss_mat", "loss_mask"),
        adapter="loss-agg",
        mistakes="loss-fn",
        token_losses=True,
        packed=True,
        # RL post-training's loop: every rank the same number of micro-batches, each padded
        # to its own longest sequence, the token-level loss.
        # Judged against a declared objective, token-mean unless the user declares another.
        default_bounds={"losses": ("tokens",), "objective": "token-mean", **_SAME_COUNTS},
        named_values=AGGREGATION_VALUES,
    ),
    Kind(
        "coupled-loss",
        "fn(features_a, features_b, *negatives, logit_scale=..., logit_bias=...) -> tensor, "
        "on every rank with the features of its local pairs",
        (2, 3, 4, 5),
        ("features_a", "features_b", "negatives", "negatives", "negatives"),
        adapter="coupled-loss",
        mistakes="coupled",
        coupled=True,
        # One micro-batch per rank: in-batch negatives come from the micro-batch.
        default_bounds={"max_micro_batches": 1},
        named_values=LEARNED_VALUES,
    ),
)
KIND = {kind.name: kind for kind in REGISTRY}

# Views of the registry for the command line (no torch here: it reads these to build its
# arguments and check a signature before it pays for importing torch).
KINDS = tuple(KIND)
SIGNATURES = {kind.name: kind.signature for kind in REGISTRY}
RESULT_KINDS = tuple(kind.name for kind in REGISTRY if kind.result_on_rank0)


def as_kind(kind: Kind | str) -> Kind:
    """``kind`` as the object: a name is looked up (:func:`kind_named`), once, where it
    enters (a front end, a public helper); everything after passes the object.

    Example::

        >>> as_kind("grad-sync") is as_kind(KIND["grad-sync"])
        True
    """
    return kind if isinstance(kind, Kind) else kind_named(kind)


def kind_named(name: str) -> Kind:
    """The kind called ``name``; :class:`KindError` naming the kinds otherwise.

    Example::

        >>> kind_named("step").owns_micro_batches
        True
    """
    try:
        return KIND[name]
    except KeyError:
        raise KindError(f"unknown kind {name!r}; choose one of {', '.join(KINDS)}") from None


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


# Words that make a count something else than loss items: ``num_gpus``, ``n_classes``,
# ``num_replicas``, ``bucket_count``. A bare ``n`` says nothing (timm's reduce_tensor(t, n)
# takes the world size): it is bound by the user, never guessed.
NOT_LOSS_ITEMS = frozenset(
    {
        "world", "rank", "ranks", "gpu", "gpus", "replica", "replicas", "device", "devices",
        "proc", "procs", "process", "processes", "node", "nodes", "worker", "workers",
        "class", "classes", "label", "labels", "vocab", "bucket", "buckets", "element",
        "elements", "bits", "layers", "heads", "steps", "epochs", "iter", "iters",
    }
)  # fmt: skip


def is_count_name(name: str) -> bool:
    """Whether a parameter's name says it is a count of samples or tokens (loss items).

    Example::

        >>> is_count_name("num_items_in_batch"), is_count_name("reduce_after")
        (True, False)
        >>> is_count_name("n"), is_count_name("num_gpus"), is_count_name("num_classes")
        (False, False, False)
    """
    if NOT_LOSS_ITEMS.intersection(name.lower().split("_")):
        return False
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
        first = next(iter(called_signature(fn).parameters.values()))
    except (TypeError, ValueError, StopIteration):
        return False
    return first.name.endswith("s") and first.name not in ("loss", "bias", "status")


@public
class KindError(TypeError):
    """The callable cannot be used as the requested kind; the message says what was expected.
    A usage error (exit 2), raised before any rank starts.

    Example::

        >>> kind_named("grad_sync")
        Traceback (most recent call last):
        ...
        ddp_verify.KindError: unknown kind 'grad_sync'; choose one of grad-sync, loss, ...
    """


# What ``--bind NAME=VALUE`` (``bind={NAME: VALUE}``) may give a parameter, beside a Python
# literal: values the rank knows when it calls the code.
BINDABLE: dict[str, str] = {
    "world_size": "the number of ranks",
    "rank": "this rank's index",
    "count": "this rank's loss items: samples, or tokens that count",
    "global_count": "the step's loss items over every rank",
    "vocab_size": "the scenario's classes: the vocabulary of a token loss",
    "device": "the rank's device",
    "group": "the world's process group",
    # What a loss-agg plug-in (RL post-training's loss aggregation) may be given.
    "accumulation_steps": "the micro-batches each rank accumulates this step",
    "tokens": "this micro-batch's tokens that count",
    "rank_tokens": "this rank's tokens that count, this step",
    "global_tokens": "the step's tokens that count over every rank",
    "sequences": "this micro-batch's sequences with a token that counts",
    "rank_sequences": "this rank's sequences with a token that counts, this step",
    "global_sequences": "the step's sequences with a token that counts over every rank",
    "window_tokens": "the tokens that count over every rank and every step of the window",
    "window_sequences": "the sequences with a counted token over every rank and every step of "
    "the window",
    "window_steps": "the optimizer steps of the window (steps_per_generation)",
    "position_ids": "each position's index in its sequence (packed: restarting at each one)",
    "segment_ids": "each position's sequence in the micro-batch (-1 on a packed row's padding)",
    "cu_seq_lens": "where each sequence starts in the rows read end to end, and the end",
    # What a coupled-loss plug-in may be given: the loss parameters the harness's model learns.
    "logit_scale": "the logit scale the harness's encoder learns (coupled-loss)",
    "logit_bias": "the logit bias the harness's encoder learns (coupled-loss)",
    # What a step function may be given to step itself: the user's own scheduler.
    "scheduler": "the scheduler --scheduler builds on the step's optimizer (step kinds)",
    "lr_scheduler": "the scheduler --scheduler builds on the step's optimizer (step kinds)",
}
# A source that names a tensor or mask of the declared objective's terms (term:kl): what a
# loss-agg plug-in is handed of an objective of several terms (ddp_verify.engine.terms).
TERM_SOURCE = "term:"
# The form of a term computed per micro-batch that is its value there (term:aux.value): a
# 0-d tensor, as a model hands its router's auxiliary loss, not the per-token values.
TERM_VALUE = "value"


def is_term_source(source: str) -> bool:
    """Whether ``source`` names one of the objective's term tensors or masks.

    Example::

        >>> is_term_source("term:kl"), is_term_source("term:aux.value"), is_term_source("tokens")
        (True, True, False)
    """
    name, _, form = source[len(TERM_SOURCE) :].partition(".")
    return source.startswith(TERM_SOURCE) and name.isidentifier() and form in ("", TERM_VALUE)


def term_binds(fn: Callable[..., Any], kind: Kind | str, bind: Binds, declared: str) -> Binds:
    """``bind`` with each tensor and mask the ``declared`` objective's terms hand over by
    name bound to the parameter of that name, unless a binding already hands it; a
    :class:`KindError` where ``fn`` has no parameter for one. ``bind`` as it is for an
    objective of one term.

    Example::

        >>> def agg(loss_mat, loss_mask, kl): ...
        >>> [b.text() for b in term_binds(agg, "loss-agg", None, "token-mean(l) + sum(kl)")]
        ['kl=term:kl']
    """
    from ..engine.terms import is_term_sum, term_sum

    if not declared or not is_term_sum(declared):
        return bind
    spec = as_kind(kind)
    if spec.name != "loss-agg":
        raise KindError(
            f"an objective of several terms ({declared}) hands each term's values to a loss-agg "
            f"plug-in, which sums them as it likes; a {spec.name} plug-in is handed one loss: "
            "declare one objective of the table"
        )
    binds = list(parse_binds(bind))
    # A term handed in either form (its values, or its value per micro-batch) is handed.
    sources = {(b.source or "").partition(".")[0] for b in binds}
    taken = {b.parameter for b in binds}
    try:
        params = called_signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    terms = term_sum(declared).terms
    handed = {*AGGREGATION_VALUES, *BINDABLE, *spec.parameters}
    clash = sorted(set(term_sum(declared).handed()) & handed)
    if clash:
        raise KindError(
            f"the objective {declared} names {', '.join(clash)}, which the code is handed "
            "already; name the term's tensor or mask otherwise"
        )
    for b in binds:
        name, _, form = (b.source or "").partition(".")
        if not (form and is_term_source(b.source or "")):
            continue
        term = next((t for t in terms if f"{TERM_SOURCE}{t.tensor}" == name), None)
        if term is None or not term.micro:
            raise KindError(
                f"{b.parameter} is bound to {b.source}: a term's value per micro-batch is "
                f"handed for a term computed within each micro-batch (@micro), which "
                f"{name[len(TERM_SOURCE) :]} is not in {declared}; bind {name} for its values"
            )
    # A term taken as its value per micro-batch is aggregated already: its mask is not needed.
    valued = {
        t.mask
        for t in terms
        if f"{TERM_SOURCE}{t.tensor}.{TERM_VALUE}" in {b.source for b in binds}
    }
    for name in term_sum(declared).handed():
        source = f"{TERM_SOURCE}{name}"
        if source in sources:
            continue
        if (name in params or takes_any) and name not in taken:
            binds.append(Bound(name, source))
            continue
        if name in valued:
            continue
        raise KindError(
            f"{_name(fn)} takes no parameter {name!r}, which the objective {declared} hands "
            f"over by that name: name a parameter {name}, or bind the one that takes it: "
            f"{option('bind', f'PARAMETER={source}')}"
        )
    return tuple(binds)


# Parameters bound to the scenario's classes without asking: the name says what they are.
CLASS_NAMES = frozenset({"vocab_size", "num_classes", "n_classes"})


@dataclass(frozen=True)
class Bound:
    """A parameter the harness fills with a value the user named: one of :data:`BINDABLE`
    (``source``), or a literal.

    Example::

        >>> Bound("n", "world_size").describe()
        'n=<the number of ranks>'
        >>> Bound("ignore_index", literal=-1).describe()
        'ignore_index=-1'
    """

    parameter: str
    source: str | None = None
    literal: Any = None

    def describe(self) -> str:
        if self.source is None:
            return f"{self.parameter}={self.literal!r}"
        if is_term_source(self.source):
            name, _, form = self.source[len(TERM_SOURCE) :].partition(".")
            said = f"{name}'s value on the micro-batch" if form else name
            return f"{self.parameter}=<the objective's {said}>"
        return f"{self.parameter}=<{BINDABLE[self.source]}>"

    def text(self) -> str:
        """``NAME=VALUE`` as ``--bind`` takes it (what :func:`parse_binds` reads back)."""
        value = self.source if self.source is not None else repr(self.literal)
        return f"{self.parameter}={value}"

    def value(self, values: Mapping[str, Any]) -> Any:
        return self.literal if self.source is None else values[self.source]


Binds = Mapping[str, Any] | str | Iterable["str | Bound"] | None


def parse_binds(binds: Binds) -> tuple[Bound, ...]:
    """The bindings ``binds`` asks for: ``"NAME=VALUE"`` strings (the command line's
    ``--bind``; VALUE one of :data:`BINDABLE` or a Python literal), or a mapping from
    parameter names to one of :data:`BINDABLE` or to any value. :class:`KindError` for a
    value that is neither.

    Example::

        >>> parse_binds(["n=world_size", "ignore_index=-1"])
        (Bound(parameter='n', source='world_size', literal=None), Bound(parameter='ignore_index', source=None, literal=-1))
        >>> parse_binds({"n": "world_size"}) == parse_binds("n=world_size")
        True
    """  # noqa: E501
    if not binds:
        return ()
    if isinstance(binds, Mapping):
        items = [(str(k), v, False) for k, v in binds.items()]
    else:
        items = []
        for text in [binds] if isinstance(binds, str) else list(binds):
            if isinstance(text, Bound):  # already parsed
                items.append((text.parameter, text, False))
                continue
            name, equals, value = str(text).partition("=")
            if not equals or not name.strip().isidentifier():
                raise KindError(
                    f"a binding is NAME=VALUE, got {text!r}: for example n=world_size "
                    f"(VALUE: one of {', '.join(BINDABLE)}, or a Python literal)"
                )
            items.append((name.strip(), value.strip(), True))
    bound: dict[str, Bound] = {}
    for name, value, typed in items:
        if isinstance(value, Bound):
            bound[name] = value
        elif isinstance(value, str) and (value in BINDABLE or is_term_source(value)):
            bound[name] = Bound(name, value)
        elif typed:
            try:
                bound[name] = Bound(name, literal=ast.literal_eval(value))
            except (ValueError, SyntaxError):
                raise KindError(
                    f"cannot bind {name}={value}: {value!r} is neither a value the harness "
                    f"knows ({', '.join(BINDABLE)}) nor a Python literal (quote a string: "
                    f"{name}='{value}')"
                ) from None
        else:
            bound[name] = Bound(name, literal=value)
    return tuple(bound.values())


@dataclass(frozen=True)
class Call:
    """How the harness calls a plug-in: ``positional`` arguments it passes, and where the
    count goes (``count_keyword`` by name, ``count_positional`` as the next positional
    argument, or nowhere), and the parameters ``bound`` by keyword. Optional parameters are
    never filled by position.

    Example::

        call = check_signature(average_gradients, "grad-sync")
        call.describe()  # "sample_weighted(model, num_samples=<this rank's samples>)"
    """

    name: str
    kind: Kind
    positional: int
    count_keyword: str | None = None
    count_positional: bool = False
    # The parameter a positional count lands in, for describe().
    count_parameter: str | None = None
    # Where the count of samples goes when the callable takes one beside the count of loss
    # items (fn(model, num_samples, num_items)).
    samples_keyword: str | None = None
    # Parameters filled by keyword with what the user bound (or what their names say).
    bound: tuple[Bound, ...] = ()
    # How the positional arguments are shown (their shapes), where the options decide it.
    shown: tuple[str, ...] = ()
    # The most positional arguments it can take, where the kind passes a varying number (a
    # coupled loss's hard negatives): optional ones are filled only where the options say.
    most_positional: int | None = None

    @property
    def takes_count(self) -> bool:
        return self.count_keyword is not None or self.count_positional

    def arguments(
        self,
        leading: tuple[Any, ...],
        count: int,
        samples: int | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The ``(args, kwargs)`` to call the plug-in with: ``count`` loss items (samples, or
        tokens that count), ``samples`` where it takes a count of samples beside them, and
        the bound parameters from ``values`` (the rank's :data:`BINDABLE` values)."""
        args, kwargs = self._counted(leading, count, samples)
        if self.bound:
            known = {"count": count, **(values or {})}
            for bound in self.bound:
                if bound.source is not None and bound.source not in known:
                    raise KindError(
                        f"{bound.parameter} is bound to {bound.source}, which a {self.kind} "
                        f"plug-in is not given; bind one of {', '.join(sorted(known))}"
                    )
                kwargs[bound.parameter] = bound.value(known)
        return args, kwargs

    def _counted(
        self, leading: tuple[Any, ...], count: int, samples: int | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.samples_keyword is not None and self.count_keyword is not None:
            return leading, {self.count_keyword: count, self.samples_keyword: samples or count}
        if self.count_positional:
            return (*leading, count), {}
        if self.count_keyword is not None:
            return leading, {self.count_keyword: count}
        return leading, {}

    def describe(self) -> str:
        """The call the harness makes, as a report header shows it: what each argument is,
        with its shape where that depends on the options.

        Example::

            >>> check_signature(lambda tensor, n: tensor, "reduce", bind="n=world_size").describe()
            '<lambda>(tensor, n=<the number of ranks>)'
        """
        kind = self.kind
        names = list(self.shown or kind.parameters)[: self.positional]
        count = kind.count_words
        if self.count_positional:
            names.append(f"{self.count_parameter}={count}" if self.count_parameter else count)
        elif self.count_keyword is not None:
            names.append(f"{self.count_keyword}={count}")
        if self.samples_keyword is not None:
            names[-1] = f"{self.count_keyword}=<loss items: samples, or tokens that count>"
            names.append(f"{self.samples_keyword}=<samples>")
        names.extend(bound.describe() for bound in self.bound)
        return f"{self.name}({', '.join(names)})"


# Parameters whose exact name says what the harness should pass, bound without asking when
# they have no default (fairseq's all_reduce_dict(data, device, group)).
NAMED_VALUES = ("world_size", "rank", "device", "group", "global_count")


def called_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature as it will be called: a ``functools.partial``'s with what it already
    supplies, a decorator's wrapper's own, never the signature of a function it wraps, unless
    the wrapper only passes everything through (``*args, **kwargs``), where the wrapped one's
    is what it takes. Raises as :func:`inspect.signature` does.

    Example::

        >>> import functools
        >>> def sync(model, num_samples, scale): ...
        >>> @functools.wraps(sync)
        ... def scaled(model, num_samples): return sync(model, num_samples, scale=2)
        >>> str(called_signature(scaled)), str(inspect.signature(scaled))
        ('(model, num_samples)', '(model, num_samples, scale)')
    """
    own = inspect.signature(fn, follow_wrapped=False)
    through = {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    if own.parameters and {p.kind for p in own.parameters.values()} <= through:
        return inspect.signature(fn)
    return own


def _positional_names(fn: Callable[..., Any]) -> list[str] | None:
    try:
        signature = called_signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def _names_agree(spec: Kind, names: Sequence[str]) -> bool:
    """Whether the callable's leading parameters are named as ``spec`` names what it passes
    (the first may also carry one of its ``leading_names``)."""
    if len(names) < len(spec.parameters):
        return False
    return all(
        actual == expected or (i == 0 and actual in spec.leading_names)
        for i, (expected, actual) in enumerate(zip(spec.parameters, names, strict=False))
    )


def kinds_read_as(fn: Callable[..., Any], kind: Kind | str, bind: Binds = None) -> list[str]:
    """The other kinds ``fn``'s parameters read as: each one whose every argument its names
    match, that accounts for more of its names than ``kind`` does, and whose call its
    signature can take. Empty where none does (names that say nothing say no kind).

    Example::

        >>> def accumulate(model, optimizer, micro_batches, loss_fn): ...
        >>> kinds_read_as(accumulate, "grad-sync")
        ['step']
        >>> kinds_read_as(accumulate, "step")
        []
    """
    names = _positional_names(fn)
    if names is None:
        return []
    checked = as_kind(kind)
    # How many of its names the kind it is checked as accounts for: another kind must
    # account for more (a step function's first parameter, model, is grad-sync's too).
    said = len(checked.parameters) if _names_agree(checked, names) else 0
    fitting = []
    for spec in REGISTRY:
        if spec is checked or len(spec.parameters) <= said or not _names_agree(spec, names):
            continue
        try:
            _check_signature(fn, spec, bind)
        except KindError:
            continue
        fitting.append(spec)
    # Of kinds alike but for their first name (a step and a wrapped step), those whose names
    # match exactly, not through a leading name's alias.
    exact = max((_exact_names(spec, names) for spec in fitting), default=0)
    return [spec.name for spec in fitting if _exact_names(spec, names) == exact]


def _exact_names(spec: Kind, names: Sequence[str]) -> int:
    return sum(a == b for a, b in zip(spec.parameters, names, strict=False))


def read_as_words(fn: Callable[..., Any], kind: Kind | str, bind: Binds = None) -> str | None:
    """A sentence that names the kinds ``fn``'s parameters read as, with the option that
    checks it so, where they do not read as ``kind``; None otherwise."""
    checked = as_kind(kind)
    fitting = [KIND[name] for name in kinds_read_as(fn, checked, bind)]
    if not fitting:
        return None
    names = ", ".join(_positional_names(fn) or [])
    choices = " or ".join(f"{option('kind', k.name)} ({k.signature})" for k in fitting)
    return (
        f"its parameters ({names}) read as {choices}, not as a {checked} plug-in "
        f"({checked.signature}): check it with {option('kind', fitting[0].name)}"
    )


def check_signature(fn: Callable[..., Any], kind: Kind | str, bind: Binds = None) -> Call:
    """How the harness will call ``fn`` as a ``kind`` plug-in; :class:`KindError` if it
    cannot take what ``kind`` passes, or if what a parameter should get is not said.

    The count (of this rank's loss items) goes to the one parameter after the leading ones
    that has no default, if its name says it is a count (:func:`is_count_name`), or else to
    one with a default whose name says so; an optional parameter with another name is left
    to its default. ``bind`` fills parameters with what the user names (:func:`parse_binds`);
    a parameter named for the scenario's classes (``vocab_size``, ``num_classes``) or, with
    no default, for a value the rank has (``world_size``, ``rank``, ``device``, ``group``)
    is bound so without asking. Any other required parameter is a usage error that names it
    and the bindings that would fit: never guessed.

    Where ``fn``'s parameter names read as another kind, the error says which (a step
    function checked as ``grad-sync`` is not asked to bind its optimizer).

    Example::

        >>> def allreduce_params(model, reduce_after=True, fp32_allreduce=False): ...
        >>> check_signature(allreduce_params, "grad-sync").describe()
        'allreduce_params(model)'
    """
    kind = as_kind(kind)
    try:
        call = _check_signature(fn, kind, bind)
    except KindError as exc:
        hint = read_as_words(fn, kind, bind)
        if hint is None:
            raise
        # What the kind would have to be told to bind is beside the point: the kind is wrong.
        raise KindError(f"{_name(fn)}: {hint}") from exc
    # A signature that takes the kind's call but whose names say another kind (a loss
    # helper checked as a grad-sync): refused here, before any rank starts, rather than
    # reported after the ranks fail on what they were handed.
    # (A class's parameters are its constructor's, which say nothing of a kind: what a class
    # cannot be is said where it is called.)
    hint = None if inspect.isclass(fn) else read_as_words(fn, kind, bind)
    if hint is not None:
        raise KindError(f"{_name(fn)}: {hint}")
    return call


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _check_signature(fn: Callable[..., Any], spec: Kind, bind: Binds = None) -> Call:
    kind = spec.name
    binds = parse_binds(bind)
    if not callable(fn):
        raise KindError(f"{fn!r} is not callable; a {kind} plug-in is {spec.signature}")
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        signature = called_signature(fn)
    except (TypeError, ValueError):
        if binds:
            raise KindError(
                f"{name} has no signature to read, so nothing can be bound by name; pass a "
                f"function that calls it with what it needs"
            ) from None
        # Builtins and C callables: trust the user, as documented.
        arity = spec.arities[-1]
        if spec.counted_after is not None:
            return Call(name, spec, spec.lead, count_positional=arity == spec.lead + 1)
        return Call(name, spec, arity)
    bound = _bound(name, signature, spec, binds)
    unbound = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in bound]
    )
    if spec.counted_after is not None:
        call = _counted_call(name, spec, unbound, signature)
    else:
        call = _fixed_call(name, spec, unbound, signature)
    return dataclasses.replace(call, bound=tuple(bound.values()))


def _fixed_call(
    name: str, spec: Kind, unbound: inspect.Signature, signature: inspect.Signature
) -> Call:
    fitting = []
    for arity in spec.arities:
        try:
            unbound.bind(*range(arity))
        except TypeError:
            continue
        fitting.append(arity)
    if fitting:
        params = list(unbound.parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return Call(name, spec, fitting[-1])
        # A parameter with a default keeps it (a contrastive loss's temperature=0.5): the
        # harness passes the fewest arguments that fill every required one.
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        needed = sum(p.kind in positional and p.default is p.empty for p in params)
        fewest = next((a for a in fitting if a >= needed), fitting[-1])
        most = fitting[-1] if fitting[-1] > fewest else None
        return Call(name, spec, fewest, most_positional=most)
    required = _required(unbound, min(spec.arities))
    if required:
        raise KindError(_unsaid(name, signature, spec, required))
    raise KindError(f"{name}{signature} cannot be a {spec.name} plug-in: expected {spec.signature}")


def _required(signature: inspect.Signature, lead: int) -> list[inspect.Parameter]:
    params = list(signature.parameters.values())
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return []
    return [
        p
        for p in params[lead:]
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _bound(
    name: str, signature: inspect.Signature, spec: Kind, binds: tuple[Bound, ...]
) -> dict[str, Bound]:
    """The parameters bound by the user's ``binds`` and by their own names, checked."""
    params = signature.parameters
    lead = spec.lead if spec.counted_after is not None else min(spec.arities)
    passed = [p.name for p in list(params.values())[:lead]]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    bound: dict[str, Bound] = {}
    for b in binds:
        parameter = params.get(b.parameter)
        if b.parameter in passed:
            raise KindError(
                f"{name}{signature}: {b.parameter!r} is what the harness passes as the "
                f"{spec.parameters[passed.index(b.parameter)]}; it cannot be bound"
            )
        if parameter is None and not takes_any:
            raise KindError(
                f"{name}{signature} has no parameter {b.parameter!r} to bind; its parameters "
                f"are {', '.join(params)}"
            )
        if parameter is not None and parameter.kind is parameter.POSITIONAL_ONLY:
            raise KindError(
                f"{name}{signature}: {b.parameter!r} is positional-only and bindings are "
                f"passed by name; pass a function that calls it with the value in place"
            )
        bound[b.parameter] = b
    for parameter in params.values():
        if parameter.name in bound or parameter.name in passed:
            continue
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            continue
        if parameter.name in CLASS_NAMES:
            bound[parameter.name] = Bound(parameter.name, "vocab_size")
        elif _named_value(parameter, spec):
            bound[parameter.name] = Bound(parameter.name, parameter.name)
    return bound


def _named_value(parameter: inspect.Parameter, spec: Kind) -> bool:
    """Whether ``parameter``'s name alone says what to pass: a required one named as a
    value every kind has (``world_size``), or one the kind fills by name (a count a
    loss-agg plug-in gets, a coupled loss's ``logit_scale``)."""
    if parameter.name in NAMED_VALUES and parameter.default is parameter.empty:
        return True
    return parameter.name in spec.named_values


def _fits(parameter: str) -> list[str]:
    """The bindings that could be what a parameter named ``parameter`` means."""
    words = set(parameter.lower().split("_"))
    for source, hints in (
        ("device", {"device", "dev"}),
        ("group", {"group", "pg"}),
        ("rank", {"rank"}),
        ("world_size", {"world", "gpus", "replicas", "size"}),
        ("vocab_size", {"vocab", "classes"}),
    ):
        if words & hints:
            return [source] + (["count"] if source == "world_size" else [])
    return ["world_size", "count", "global_count"]


def _unsaid(
    name: str, signature: inspect.Signature, spec: Kind, required: list[inspect.Parameter]
) -> str:
    """The usage error for required parameters whose names do not say what they get."""
    which = ", ".join(repr(p.name) for p in required)
    binds = "; ".join(
        " or ".join(option("bind", f"{p.name}={fit}") for fit in _fits(p.name)) for p in required
    )
    return (
        f"{name}{signature}: the harness cannot tell what {which} should get as a "
        f"{spec.name} plug-in (its name says neither a count of loss items nor a value the "
        f"rank has), and it never guesses. Bind it: {binds} (a binding's value is one of "
        f"{', '.join(BINDABLE)}, or a Python literal)"
    )


def _counted_call(
    name: str, spec: Kind, signature: inspect.Signature, shown: inspect.Signature
) -> Call:
    # The first parameter may have a default only under a name for what the harness passes
    # first: anything else with a default (DeepSpeed's buffered_allreduce_fallback(grads=None,
    # ...)) is an optional argument the harness must not fill with the model.
    kind, lead, expected = spec.name, spec.lead, spec.signature
    leading = spec.counted_after
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
        raise KindError(f"{name}{shown} cannot be a {kind} plug-in: expected {expected}")
    first = params[0]
    if first.default is not first.empty and first.name not in spec.leading_names:
        short = name.split(".")[-1]
        raise KindError(
            f"{name}{shown}: its first parameter {first.name!r} is optional, so it is not "
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
                name, spec, lead, count_keyword=items[0].name, samples_keyword=samples[0].name
            )
    unnamed = [p for p in required if not is_count_name(p.name)]
    if unnamed:
        raise KindError(_unsaid(name, shown, spec, unnamed))
    if len(required) > 1:
        raise KindError(
            f"{name}{shown} cannot be a {kind} plug-in as it stands: besides {leading} it "
            f"needs {', '.join(p.name for p in required)}, and the harness passes one count; "
            f"bind the others, such as "
            f"{option('bind', f'{required[1].name}=count')}"
        )
    if required:
        only = required[0]
        # By name where it is keyword-only, or where a parameter bound by name comes first
        # (fn(logits, labels, position_ids, num_items_in_batch)): by position it would
        # land in that one.
        at = list(shown.parameters).index(only.name) if only.name in shown.parameters else lead
        if only.kind is inspect.Parameter.KEYWORD_ONLY or (
            at != lead and only.kind is not inspect.Parameter.POSITIONAL_ONLY
        ):
            return Call(name, spec, lead, count_keyword=only.name)
        return Call(name, spec, lead, count_positional=True, count_parameter=only.name)
    if len(counted) > 1:
        raise KindError(
            f"{name}{shown}: ambiguous for a {kind} plug-in: the count could go to any of "
            f"{', '.join(repr(p.name) for p in counted)}; pass a function that says which, "
            f"such as lambda {leading}, count: {name.split('.')[-1]}({leading}, "
            f"{counted[0].name}=count)"
        )
    if counted:
        return Call(name, spec, lead, count_keyword=counted[0].name)
    return Call(name, spec, lead)
