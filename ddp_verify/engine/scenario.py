"""The scenario: a frozen, picklable description that fully determines a training run.

Every rank and the controller rebuild the same model, data and optimizer from it (see
:mod:`ddp_verify.engine.models`), so a scenario is all that travels and all a reproducer needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

ModelKind = Literal["mlp", "conv", "embedding", "transformer", "user", "towers"]
Activation = Literal["tanh", "relu", "gelu"]
LossName = Literal["mse", "cross_entropy", "tokens", "coupled"]
BatchNorm = Literal["", "batch", "sync"]
OptimizerName = Literal["sgd", "adam", "adamw"]
DType = Literal["float64", "float32", "bfloat16"]

# The built-in kinds hypothesis draws by default; "transformer" (per-token logits, for the
# token-level loss) and "user" (a factory of the user's) are asked for by name.
MODEL_KINDS: tuple[ModelKind, ...] = ("mlp", "conv", "embedding")
ALL_MODEL_KINDS: tuple[ModelKind, ...] = (*MODEL_KINDS, "transformer", "user", "towers")
BATCH_NORMS: tuple[BatchNorm, ...] = ("", "batch", "sync")
# The structural features a ModelSpec can switch on (its boolean fields).
FEATURES = ("layernorm", "tied", "unused", "frozen", "buffer")
ACTIVATIONS: tuple[Activation, ...] = ("tanh", "relu", "gelu")
# The losses drawn by default; "tokens" (token-level cross-entropy over sequences with padding
# and ignore_index targets, averaged over the tokens that count) is asked for by name.
LOSSES: tuple[LossName, ...] = ("mse", "cross_entropy")
ALL_LOSSES: tuple[LossName, ...] = (*LOSSES, "tokens")
# A loss of the user's whose samples interact across ranks (the coupled-loss kind): it goes
# with the "towers" encoder, and its reference is the user's own loss on one rank.
COUPLED = "coupled"
# The loss parameters a towers model learns where the loss asks for them by name.
LEARNED_PARAMETERS = ("logit_scale", "logit_bias")
# The target that does not count (torch's CrossEntropyLoss default): padding, prompt tokens.
IGNORE_INDEX = -100
# The label of a packed segment's first position, for a loss that shifts its labels: see
# Scenario.boundary.
BOUNDARIES = ("dropped", "kept")
_KEPT_WORDS = "each segment's first label kept (its boundary unmasked), "
OPTIMIZERS: tuple[OptimizerName, ...] = ("sgd", "adam", "adamw")
DTYPES: tuple[DType, ...] = ("float64", "float32", "bfloat16")
# Lower precisions a float32 model's forward may run in under torch.autocast ("" for none).
AUTOCASTS = ("", "bfloat16")
# How a token batch's targets sit: aligned with the logits (a target per position), or
# "unshifted" for a loss that shifts labels itself: the last position then never counts, so
# labels handed over unshifted (the next token at each position) lose nothing.
LABELS = ("aligned", "unshifted")

# step -> rank -> micro-batch sizes
Schedule = tuple[tuple[tuple[int, ...], ...], ...]


def _pretty(obj: object, printer: Any, cycle: bool) -> None:
    # hypothesis (and IPython) pretty-print dataclasses field by field; keep ours compact.
    printer.text(repr(obj))


def _compact_repr(obj: object) -> str:
    """``Name(field=value, ...)`` with fields left at their defaults omitted; still eval-able."""
    parts = []
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        if field.default is not dataclasses.MISSING and value == field.default:
            continue
        parts.append(f"{field.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclasses.dataclass(frozen=True, repr=False)
class ModelSpec:
    """A small model: an input stage by ``kind``, hidden layers, optional structural features.

    ``kind``: ``mlp`` (dense inputs), ``conv`` (a Conv1d over a short sequence) or
    ``embedding`` (token ids through an Embedding), ``transformer`` (a tiny causal
    transformer block over token ids: attention, layernorms, an MLP, per-token logits; with
    ``tied`` its output head is the embedding), or ``user`` (``factory="module:callable"``,
    the user's own model: see :mod:`ddp_verify.engine.user_models`). The features each
    exercise one thing DDP must get right: ``layernorm``; ``tied`` (one weight shared by two
    layers); ``unused`` (a parameter forward never touches); ``frozen`` (a layer with
    ``requires_grad=False``); ``buffer`` (a registered buffer used in forward). ``aside``
    makes forward return two outputs, the prediction and one of a head of its own that the
    loss leaves out (the loss takes the first): that head gets no gradient, its ``grad``
    stays None and no optimizer moves it. ``batch_norm="batch"`` puts a BatchNorm1d after the
    first hidden layer (each forward normalises by its own batch: DDP then differs from
    full-batch training, as documented);
    ``"sync"`` makes it a SyncBatchNorm on the ranks (global statistics; CUDA only).
    ``towers`` (the coupled-loss kind's encoder, :mod:`ddp_verify.engine.coupled`): a linear
    tower per view, ``in_features`` to ``out_features``, one shared by both views where
    ``towers=1``; ``negatives`` hard-negative inputs per pair; ``learned`` the loss
    parameters it learns (``logit_scale``, ``logit_bias``).

    Example::

        >>> ModelSpec(kind="conv", hidden=(4,)).describe()
        'conv 2→[4]→1 tanh'
    """

    kind: ModelKind = "mlp"
    in_features: int = 2
    hidden: tuple[int, ...] = (2,)
    out_features: int = 1
    activation: Activation = "tanh"
    layernorm: bool = False
    tied: bool = False
    unused: bool = False
    frozen: bool = False
    buffer: bool = False
    aside: bool = False
    batch_norm: BatchNorm = ""
    factory: str = ""
    towers: int = 2
    negatives: int = 0
    learned: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ALL_MODEL_KINDS:
            raise ValueError(f"model kind must be one of {ALL_MODEL_KINDS}, got {self.kind!r}")
        if (self.kind == "user") != bool(self.factory):
            raise ValueError("a user model is kind='user' with factory='module:callable'")
        if self.batch_norm not in BATCH_NORMS:
            raise ValueError(f"batch_norm must be one of {BATCH_NORMS}, got {self.batch_norm!r}")
        if self.kind == "transformer" and (
            self.layernorm
            or self.unused
            or self.frozen
            or self.buffer
            or self.aside
            or not self.hidden
        ):
            raise ValueError(
                "the transformer block has its own layernorms and takes only tied (its output "
                "head is the embedding) and one hidden size (its MLP's)"
            )
        if self.batch_norm and (not self.hidden or self.kind in ("transformer", "user")):
            raise ValueError("batch_norm needs a hidden layer of a built-in mlp, conv or embedding")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.in_features < 1 or self.out_features < 1 or not all(h >= 1 for h in self.hidden):
            raise ValueError(f"layer sizes must be positive: {self}")
        if not self.hidden and (self.layernorm or self.tied or self.frozen):
            raise ValueError("layernorm, tied and frozen need at least one hidden layer")
        if self.kind == "towers":
            if self.towers not in (1, 2) or self.negatives < 0 or self.hidden:
                raise ValueError(
                    "a towers encoder has towers=1 or 2, negatives >= 0 and no hidden layers "
                    f"(a linear tower per view): {self}"
                )
            unknown = set(self.learned) - set(LEARNED_PARAMETERS)
            if unknown:
                raise ValueError(
                    f"a towers encoder learns {', '.join(LEARNED_PARAMETERS)}, not "
                    f"{', '.join(sorted(unknown))}"
                )
        elif self.towers != 2 or self.negatives or self.learned:
            raise ValueError("towers, negatives and learned belong to the towers encoder")

    __repr__ = _compact_repr
    _repr_pretty_ = _pretty

    def describe(self) -> str:
        """``mlp 2→[3, 2]→1 tanh +layernorm +tied``."""
        if self.kind == "user":
            return f"user model {self.factory}"
        if self.kind == "towers":
            views = "one tower for both views" if self.towers == 1 else "two towers"
            more = f", {self.negatives} hard negative(s) a pair" if self.negatives else ""
            learns = f", learns {', '.join(self.learned)}" if self.learned else ""
            return f"towers {self.in_features}→{self.out_features} ({views}{more}{learns})"
        features = [f"+{self.batch_norm}norm"] if self.batch_norm else []
        features += [
            f"+{name}"
            for name in ("layernorm", "tied", "unused", "frozen", "buffer", "aside")
            if getattr(self, name)
        ]
        if self.kind == "transformer":
            head = "tied head" if self.tied else "own head"
            return f"transformer d={self.in_features + 1} mlp {list(self.hidden)}, {head}"
        shape = f"{self.in_features}→{list(self.hidden)}→{self.out_features}"
        return " ".join([self.kind, shape, self.activation, *features])


# What accumulation means to a coupled loss, said wherever a scenario shows it.
_IN_BATCH_NEGATIVES = (
    "\nin-batch negatives come from each micro-batch, so accumulation changes the objective: "
    "the reference accumulates the same micro-batches on one rank (no equivalence across "
    "accumulation steps is claimed)"
)


# The learning rate of the second param group, relative to the first: different, so that a
# group that takes the other's settings (a state dict's groups swapped) changes training.
SECOND_GROUP_LR = 0.5


@dataclasses.dataclass(frozen=True, repr=False)
class OptimizerSpec:
    """An optimizer and its hyper-parameters: SGD (momentum, weight decay), Adam, AdamW;
    ``max_norm`` clips the gradients' total norm (``clip_grad_norm_``) before every step;
    ``lr_decay`` multiplies the learning rate by itself after every step (on the ranks a
    ``LambdaLR`` scheduler edits the optimizer's ``param_groups``, which it must follow);
    ``param_groups=2`` puts the one-dimensional parameters (biases, norms' scales) in a second
    group with ``lr * SECOND_GROUP_LR`` and no weight decay, as training scripts do.

    Example::

        >>> OptimizerSpec(name="sgd", momentum=0.9, weight_decay=0.01).describe()
        'sgd(lr=0.1, momentum=0.9, weight_decay=0.01)'
    """

    name: OptimizerName = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_norm: float | None = None
    lr_decay: float | None = None
    param_groups: int = 1

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.name!r}")
        if not self.lr > 0 or self.momentum < 0 or self.weight_decay < 0:
            raise ValueError(f"impossible optimizer settings: {self}")
        if self.momentum and self.name != "sgd":
            raise ValueError("momentum applies to sgd only (Adam has its own betas)")
        if self.max_norm is not None and not self.max_norm > 0:
            raise ValueError(f"max_norm must be positive (or None), got {self.max_norm!r}")
        if self.lr_decay is not None and not self.lr_decay > 0:
            raise ValueError(f"lr_decay must be positive (or None), got {self.lr_decay!r}")
        if self.param_groups not in (1, 2):
            raise ValueError(f"param_groups must be 1 or 2, got {self.param_groups!r}")

    __repr__ = _compact_repr
    _repr_pretty_ = _pretty

    def describe(self) -> str:
        extras = []
        if self.momentum:
            extras.append(f"momentum={self.momentum:g}")
        if self.weight_decay:
            extras.append(f"weight_decay={self.weight_decay:g}")
        clip = f", gradients clipped to norm {self.max_norm:g}" if self.max_norm else ""
        if self.lr_decay is not None:
            clip += f", learning rate x{self.lr_decay:g} after each step"
        if self.param_groups == 2:
            clip += (
                f", biases and norms in a second param group (lr x{SECOND_GROUP_LR:g}, "
                "no weight decay)"
            )
        return f"{self.name}(lr={self.lr:g}{''.join(', ' + e for e in extras)}){clip}"


@dataclasses.dataclass(frozen=True, repr=False)
class Recipe:
    """What the user trains with in place of the harness's own pieces, each a reference
    ``"module:callable"`` or ``"path/to/file.py:callable"`` (see
    :mod:`ddp_verify.engine.recipes`): ``loss(outputs, targets)``, an optimizer
    ``factory(params)``, a scheduler ``factory(optimizer)`` stepped once per optimizer step.
    The engine's oracle trains its own losses and optimizers only: a training step trained
    with any of them is judged against its own run on one rank holding the whole batch, other
    code against the engine's loop trained with them.

    Example::

        >>> Recipe(loss="my_losses.py:focal").describe()
        'loss my_losses.py:focal'
        >>> bool(Recipe())
        False
    """

    loss: str = ""
    optimizer: str = ""
    scheduler: str = ""

    __repr__ = _compact_repr
    _repr_pretty_ = _pretty

    def __bool__(self) -> bool:
        return bool(self.loss or self.optimizer or self.scheduler)

    def describe(self) -> str:
        parts = [(f"{what} {ref}") for what, ref in self.parts()]
        return ", ".join(parts)

    def parts(self) -> list[tuple[str, str]]:
        """``(part, reference)`` for each part given."""
        given = (("loss", self.loss), ("optimizer", self.optimizer), ("scheduler", self.scheduler))
        return [(what, ref) for what, ref in given if ref]


@dataclasses.dataclass(frozen=True, repr=False)
class Scenario:
    """One training run: who holds which samples at each step, and what trains on them.

    ``schedule[step][rank]`` lists that rank's micro-batch sizes for the step. The global
    batch of a step is every rank's micro-batches concatenated, rank-major, then micro-batch
    order; the reference trains on it with a mean loss and one optimizer step.

    Example::

        >>> scenario = Scenario(world_size=2, schedule=(((2,), (3,)),))  # one step: 2 and 3
        >>> scenario.samples(0)
        [2, 3]
        >>> print(scenario.describe())
        world_size=2, 1 step(s), model mlp 2→[2]→1 tanh, loss mse, sgd(lr=0.1), float64, seed 0
        micro-batch sizes per rank:
          step 0: rank 0: 2  rank 1: 3
    """

    world_size: int
    schedule: Schedule
    model: ModelSpec = ModelSpec()
    loss: LossName = "mse"
    optimizer: OptimizerSpec = OptimizerSpec()
    dtype: DType = "float64"
    seed: int = 0
    autocast: str = ""
    labels: str = "aligned"
    # A declared objective (ddp_verify.engine.objectives): what the reference trains on the
    # whole global batch, and what the counts handed to code count; "" for the loss's own mean
    # (over samples, or over the tokens that count). "sum" goes with any loss; the others
    # aggregate the built-in token data.
    objective: str = ""
    # The per-token losses multiplied by signed weights (as advantages weight them in RL
    # post-training), the same token's weight wherever it is trained: see
    # ddp_verify.engine.models.token_weights.
    token_weights: bool = False
    # The user's loss, optimizer and scheduler, where they train with their own.
    recipe: Recipe = Recipe()
    # The schedule the data was drawn for, where it is not this one (a run on one rank of
    # another scenario's whole batch: see whole()); () for this one.
    drawn_for: Schedule = ()
    # Each step's global batch in the order-th seeded order (0: as drawn): a run that differs
    # from order 0 in its sums alone, for a measured bound.
    order: int = 0
    # The optimizer steps that share one generation batch (TRL's steps_per_generation): the
    # window a count like window_tokens spans, and the one an objective declared @window
    # normalises by; the last window may hold fewer. 1: every step is its own.
    window: int = 1
    # How each micro-batch's sequences are laid out in rows for code handed the per-token
    # losses (ddp_verify.engine.packing.PACKINGS): "" padded, a sequence a row; "flat" all in
    # one row; "rows" packed into rows, never split; "split" cut into rows wherever the row
    # ends. A token's loss is the same either way.
    packing: str = ""
    # Where a loss that shifts its labels itself (labels="unshifted") meets packed rows: the
    # label of each segment's first position, which the previous segment's last position
    # would predict: "dropped" (ignore_index, as DataCollatorWithFlattening leaves it) or
    # "kept" (the segment's first token: code masks the boundary from position_ids itself).
    boundary: str = "dropped"
    # An objective of several terms (ddp_verify.engine.terms), canonical; "" for one.
    # ``objective`` is then its first term's aggregation: what the counts handed to code
    # count, and what the data is drawn for.
    terms: str = ""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be positive, got {self.world_size}")
        if not self.schedule:
            raise ValueError("a scenario needs at least one step")
        for step, per_rank in enumerate(self.schedule):
            if len(per_rank) != self.world_size:
                raise ValueError(
                    f"step {step} lists {len(per_rank)} ranks, the world has {self.world_size}"
                )
            for rank, sizes in enumerate(per_rank):
                # A rank may hold no sample in a step (its collectives must still take
                # part), but it still runs its micro-batches' loop: at least one.
                if not sizes or any(m < 0 for m in sizes):
                    raise ValueError(
                        f"step {step}, rank {rank}: every rank needs at least one micro-batch "
                        f"of zero samples or more, got {sizes}"
                    )
            if self.loss != COUPLED and not sum(map(sum, per_rank)):
                raise ValueError(f"step {step}: some rank must hold a sample, got {per_rank}")
            if self.loss == COUPLED and (
                len({len(sizes) for sizes in per_rank}) > 1 or not sum(map(sum, per_rank))
            ):
                raise ValueError(
                    f"step {step}: a coupled loss's ranks hold as many micro-batches, and some "
                    f"pair in all, got {per_rank}"
                )
        if self.loss not in (*ALL_LOSSES, COUPLED):
            raise ValueError(f"loss must be one of {(*ALL_LOSSES, COUPLED)}, got {self.loss!r}")
        if (self.loss == COUPLED) != (self.model.kind == "towers"):
            raise ValueError(
                "a coupled loss goes with the towers encoder, and the towers with it: got model "
                f"{self.model.kind!r} and loss {self.loss!r}"
            )
        if (self.loss == "tokens") != (self.model.kind == "transformer") and (
            self.model.kind not in ("user", "towers")
        ):
            raise ValueError(
                "the token-level loss goes with the transformer model (per-token logits), and "
                f"the transformer with it: got model {self.model.kind!r} and loss {self.loss!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.autocast not in AUTOCASTS:
            raise ValueError(f"autocast must be one of {AUTOCASTS}, got {self.autocast!r}")
        if self.autocast and self.dtype != "float32":
            raise ValueError(
                f"autocast lowers a float32 model's forward; this scenario's model is "
                f"{self.dtype}: use dtype='float32' with autocast={self.autocast!r}"
            )
        user = self.model.kind == "user"
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")
        if self.labels != "aligned" and (self.loss != "tokens" or user):
            raise ValueError(
                "labels='unshifted' applies to the built-in token data (loss 'tokens' with the "
                f"transformer), got loss {self.loss!r} and model {self.model.kind!r}"
            )
        if self.loss == "cross_entropy" and not user and self.model.out_features < 2:
            raise ValueError("cross_entropy needs a model with at least 2 outputs (classes)")
        if self.objective:
            from .objectives import objective, sample_mean

            try:  # sample-mean, the default of losses over samples, is kept as ""
                object.__setattr__(
                    self, "objective", sample_mean(self.objective, self.loss == "tokens")
                )
            except Exception as exc:
                # Imported only where one was raised: a reproducer builds its scenario
                # without importing hypothesis (half a second of its start).
                from hypothesis.errors import InvalidArgument

                if not isinstance(exc, InvalidArgument):
                    raise
                raise ValueError(str(exc)) from None
        if self.objective:
            objective(self.objective)  # a declaration that parses
            # A sum adds any loss's items; the other objectives aggregate token sequences.
            if self.objective != "sum" and (self.loss != "tokens" or user):
                raise ValueError(
                    f"objective={self.objective!r} aggregates token losses: it goes with the "
                    f"built-in token data (loss 'tokens'), got loss {self.loss!r} and model "
                    f"{self.model.kind!r}"
                )
        if self.packing not in ("", "flat", "rows", "split"):
            raise ValueError(f"packing must be '', 'flat', 'rows' or 'split', got {self.packing!r}")
        if self.packing and (self.loss != "tokens" or user):
            raise ValueError(
                "packing lays out the built-in token data's sequences: use it with loss "
                f"'tokens', got loss {self.loss!r} and model {self.model.kind!r}"
            )
        if self.terms:
            self._check_terms(user)
        if self.boundary not in BOUNDARIES:
            raise ValueError(
                f"boundary must be one of {', '.join(BOUNDARIES)}, got {self.boundary!r}"
            )
        if self.window < 1:
            raise ValueError(f"window counts the steps of one window: 1 or more, got {self.window}")
        if self.token_weights and (self.loss != "tokens" or user):
            raise ValueError(
                "token_weights weight the built-in token data's per-token losses: use them "
                f"with loss 'tokens', got loss {self.loss!r} and model {self.model.kind!r}"
            )

    def _check_terms(self, user: bool) -> None:
        from .terms import term_sum

        try:
            declared = term_sum(self.terms)
        except Exception as exc:
            from hypothesis.errors import InvalidArgument

            if not isinstance(exc, InvalidArgument):
                raise
            raise ValueError(str(exc)) from None
        if self.loss != "tokens" or user:
            raise ValueError(
                "an objective of several terms aggregates the built-in token data's per-token "
                f"values: use it with loss 'tokens', got loss {self.loss!r} and model "
                f"{self.model.kind!r}"
            )
        if self.objective != str(declared.main.aggregation):
            raise ValueError(
                f"objective={self.objective!r} must be the first term's aggregation "
                f"({declared.main.aggregation}) where terms={self.terms!r}"
            )

    __repr__ = _compact_repr
    _repr_pretty_ = _pretty

    @property
    def steps(self) -> int:
        return len(self.schedule)

    def _loss_words(self) -> str:
        if not self.recipe.loss:
            return self.loss
        return f"yours ({self.recipe.loss}) on {self.loss} targets"

    def _optimizer_words(self) -> str:
        words = (
            f"your optimizer ({self.recipe.optimizer})"
            if self.recipe.optimizer
            else self.optimizer.describe()
        )
        if self.recipe.scheduler:
            words += f", your scheduler ({self.recipe.scheduler}) stepped once a step"
        return words

    def whole(self, order: int = 0) -> Scenario:
        """This scenario on one rank holding each step's whole global batch in one
        micro-batch, on the same data (samples rank-major, then micro-batch order; in their
        ``order``-th seeded order where ``order`` is given): what one process training on
        everything computes, the reference of code that is its own.

        Example::

            >>> s = Scenario(world_size=2, schedule=(((1, 2), (3,)),))
            >>> s.whole().schedule, s.whole().world_size
            ((((6,),),), 1)
        """
        schedule = tuple(((self.global_batch(s),),) for s in range(self.steps))
        return dataclasses.replace(
            self,
            world_size=1,
            schedule=schedule,
            drawn_for=self.drawn_for or self.schedule,
            order=order,
        )

    def window_of(self, step: int) -> range:
        """The steps of ``step``'s window, in order.

        Example::

            >>> Scenario(world_size=1, schedule=(((1,),),) * 5, window=2).window_of(4)
            range(4, 5)
        """
        first = step - step % self.window
        return range(first, min(first + self.window, self.steps))

    def samples(self, step: int) -> list[int]:
        """Samples each rank holds at ``step``."""
        return [sum(sizes) for sizes in self.schedule[step]]

    def global_batch(self, step: int) -> int:
        return sum(self.samples(step))

    def offset(self, step: int, rank: int) -> int:
        """Where ``rank``'s samples start in the step's global batch."""
        return sum(self.samples(step)[:rank])

    @property
    def even(self) -> bool:
        """Every rank holds the same number of samples at every step."""
        return all(len(set(self.samples(s))) == 1 for s in range(self.steps))

    @property
    def accumulates(self) -> bool:
        """Some rank splits some step into more than one micro-batch."""
        return any(len(sizes) > 1 for per_rank in self.schedule for sizes in per_rank)

    def describe(self) -> str:
        """A few readable lines: what a person needs to picture the run."""
        steps = "\n".join(
            f"  step {s}: "
            + "  ".join(
                f"rank {r}: {'+'.join(map(str, sizes))}" for r, sizes in enumerate(per_rank)
            )
            for s, per_rank in enumerate(self.schedule)
        )
        return (
            f"world_size={self.world_size}, {self.steps} step(s), model {self.model.describe()}, "
            f"loss {self._loss_words()}, {self._optimizer_words()}, {self.dtype}"
            f"{f' (forward under autocast to {self.autocast})' if self.autocast else ''}, "
            f"{'labels handed over unshifted, ' if self.labels == 'unshifted' else ''}"
            f"{f'objective {self.terms or self.objective}, ' if self.objective else ''}"
            f"{f'windows of {self.window} steps, ' if self.window > 1 else ''}"
            f"{f'sequences packed ({self.packing}), ' if self.packing else ''}"
            f"{_KEPT_WORDS if self.boundary == 'kept' else ''}"
            f"{'per-token losses weighted (signed), ' if self.token_weights else ''}"
            f"seed {self.seed}\n"
            f"micro-batch sizes per rank{' (pairs)' if self.loss == COUPLED else ''}:\n{steps}"
            + (_IN_BATCH_NEGATIVES if self.loss == COUPLED and self.accumulates else "")
        )
