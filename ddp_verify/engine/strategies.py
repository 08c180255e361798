"""Hypothesis strategies for models, batch splits, accumulation schedules and whole scenarios.

Every strategy shrinks toward the simplest case: an even split, one micro-batch, one step, the
smallest model, SGD, the first seed. Impossible arguments raise
``hypothesis.errors.InvalidArgument``.

Example::

    from hypothesis import given
    from ddp_verify.strategies import scenarios

    @given(scenarios(world_size=4, max_micro_batches=3, dtypes=("float64", "float32")))
    def test_ddp(world, scenario):
        world.assert_equivalent(ddp(), scenario)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .scenario import (
    ACTIVATIONS,
    ALL_LOSSES,
    ALL_MODEL_KINDS,
    BATCH_NORMS,
    BOUNDARIES,
    DTYPES,
    FEATURES,
    LABELS,
    LOSSES,
    MODEL_KINDS,
    OPTIMIZERS,
    ModelSpec,
    OptimizerSpec,
    Recipe,
    Scenario,
    Schedule,
)
from .terms import is_term_sum, term_sum
from .tolerances import BRANCHING_OPTIMIZERS

LEARNING_RATES = (0.1, 0.05, 0.01)
# Gradient norms to clip to: the toy models' gradients run from about 0.05 to 5, so both bite.
MAX_NORMS = (0.1, 0.01)
# Learning-rate decays a step (None first: no scheduler is the simpler case), one that grows.
LR_DECAYS = (None, 0.5, 1.5)


def models(
    *,
    kinds: Sequence[str] = MODEL_KINDS,
    max_hidden_layers: int = 2,
    max_width: int = 4,
    features: bool = True,
    min_out_features: int = 1,
    max_out_features: int = 2,
    required_features: Sequence[str] = (),
    excluded_features: Sequence[str] = (),
    batch_norm: str = "",
    min_width: int = 1,
    aside: bool = False,
) -> st.SearchStrategy[ModelSpec]:
    """Small models of the given ``kinds``; ``features`` adds layernorm, tied, unused, frozen
    and buffer variants; ``required_features`` names those every model has,
    ``excluded_features`` those none has. ``kinds`` may name ``transformer`` (a causal block
    over token ids, trained with the token-level loss; of the features it takes only
    ``tied``). ``min_width`` bounds the inputs and every hidden layer from below (3: no weight
    matrix has a side of 2 or less, but the head's). ``batch_norm="batch"`` gives every model
    a BatchNorm after its first hidden layer, ``"sync"`` a SyncBatchNorm on the ranks (CUDA
    worlds only). ``aside=True`` gives every model a second output that the loss leaves out
    (not a transformer). Shrinks toward ``mlp 1→[2]→1 tanh`` with no features (but the
    required ones).

    Example::

        models(required_features=("unused",))  # for find_unused_parameters=True
        models(kinds=("transformer",))         # token-level losses, padding, ignore_index
    """
    _check_choices("kinds", kinds, [k for k in ALL_MODEL_KINDS if k != "user"])
    if batch_norm not in BATCH_NORMS:
        raise InvalidArgument(f"batch_norm={batch_norm!r} must be one of {BATCH_NORMS}")
    if batch_norm and "transformer" in kinds:
        raise InvalidArgument("batch_norm applies to mlp, conv and embedding models")
    if aside and "transformer" in kinds:
        raise InvalidArgument("aside applies to mlp, conv and embedding models")
    if required_features:
        _check_choices("required_features", required_features, FEATURES)
        if not features:
            raise InvalidArgument("required_features needs features=True")
    if excluded_features:
        _check_choices("excluded_features", excluded_features, FEATURES)
    both = set(required_features) & set(excluded_features)
    if both:
        raise InvalidArgument(f"{sorted(both)} both required and excluded")
    _check_int("max_hidden_layers", max_hidden_layers, 1)
    _check_int("max_width", max_width, 2)
    _check_int("min_width", min_width, 1)
    if min_width > max_width:
        raise InvalidArgument(f"min_width={min_width} is above max_width={max_width}")
    _check_int("min_out_features", min_out_features, 1)
    _check_int("max_out_features", max_out_features, min_out_features)

    @st.composite
    def draw_model(draw: st.DrawFn) -> ModelSpec:
        flags: dict[str, Any] = {
            name: name in required_features
            or (draw(st.booleans()) if features and name not in excluded_features else False)
            for name in FEATURES
        }
        kind = draw(st.sampled_from(list(kinds)))
        hidden = tuple(
            draw(
                st.lists(
                    st.integers(max(2, min_width), max_width),
                    min_size=1,
                    max_size=max_hidden_layers,
                )
            )
        )
        if kind == "transformer":
            flags = {name: flags[name] if name == "tied" else False for name in FEATURES}
            hidden = hidden[:1]
        return ModelSpec(
            kind=kind,  # type: ignore[arg-type]
            in_features=draw(st.integers(min_width, max(3, min_width))),
            hidden=hidden,
            out_features=draw(st.integers(min_out_features, max_out_features)),
            activation=draw(st.sampled_from(ACTIVATIONS)),
            batch_norm=batch_norm,
            aside=aside,
            **flags,
        )

    return draw_model()


def batch_splits(
    *, world_size: int, min_samples: int = 1, max_samples: int = 4, even: bool = False
) -> st.SearchStrategy[tuple[int, ...]]:
    """How many samples each rank holds in one step. Shrinks toward an even split of
    ``min_samples`` each; ``even=True`` draws even splits only."""
    _check_bounds(world_size, min_samples, max_samples)
    if even:
        return st.integers(min_samples, max_samples).map(lambda n: (n,) * world_size)
    return st.tuples(*[st.integers(min_samples, max_samples)] * world_size)


def accumulation_schedules(
    *,
    world_size: int,
    min_samples: int = 1,
    max_samples: int = 4,
    max_micro_batches: int = 2,
    max_steps: int = 3,
    even: bool = False,
    same_micro_batch_counts: bool = False,
    several_steps: bool = False,
) -> st.SearchStrategy[Schedule]:
    """Per step, per rank, the sizes of the micro-batches the rank accumulates over.

    Micro-batches of one rank may differ in size, and ranks may split differently.
    ``same_micro_batch_counts=True`` gives every rank of a step as many micro-batches (as a
    training loop with a fixed number of accumulation steps does); sizes still differ.
    ``several_steps=True``, for code that may keep state from step to step (a comm hook
    with a state, a training step): about half the examples hold two steps or more from the
    first examples on, where a state first acts. Shrinks toward one step, one micro-batch
    per rank, an even split (with ``several_steps`` too: the one-step branch comes first)."""
    _check_bounds(world_size, min_samples, max_samples)
    _check_int("max_micro_batches", max_micro_batches, 1)
    _check_int("max_steps", max_steps, 1)
    # Built once: making a strategy costs more than drawing from one.
    sizes_from = functools.cache(lambda low: st.integers(low, max_samples))
    steps = st.integers(1, max_steps)
    if several_steps and max_steps > 1:
        steps = st.one_of(steps, st.integers(2, max_steps))

    @st.composite
    def draw_schedule(draw: st.DrawFn) -> Schedule:
        schedule = []
        for _ in range(draw(steps)):
            pieces = None
            low = min_samples
            if same_micro_batch_counts:
                # Every rank needs a sample per micro-batch.
                pieces = draw(st.integers(1, min(max_micro_batches, max_samples)))
                low = max(min_samples, pieces)
            sizes = sizes_from(low)
            # Each rank's count, then at once its micro-batches: a count that shrinks takes
            # only its own micro-batch choices with it.
            common = draw(sizes) if even else None
            schedule.append(
                tuple(
                    _draw_micro_batches(draw, common or draw(sizes), max_micro_batches, pieces)
                    for _ in range(world_size)
                )
            )
        return tuple(schedule)

    return draw_schedule()


def _draw_micro_batches(
    draw: st.DrawFn, samples: int, max_micro_batches: int, pieces: int | None = None
) -> tuple[int, ...]:
    """``samples`` cut into ``pieces`` (else 1 to ``max_micro_batches``) non-empty,
    consecutive pieces."""
    if pieces is None:
        pieces = draw(st.integers(1, min(samples, max_micro_batches)))
    if pieces == 1:
        return (samples,)
    cuts = draw(
        st.lists(st.integers(1, samples - 1), min_size=pieces - 1, max_size=pieces - 1, unique=True)
    )
    bounds = [0, *sorted(cuts), samples]
    return tuple(b - a for a, b in itertools.pairwise(bounds))


def optimizers(
    *,
    names: Sequence[str] = OPTIMIZERS,
    weight_decay: bool = True,
    clip: bool = False,
    schedules: bool = False,
    groups: bool = False,
) -> st.SearchStrategy[OptimizerSpec]:
    """SGD (with and without momentum), Adam, AdamW, with and without weight decay; with
    ``clip=True`` every step clips the gradients' total norm to a bound small enough to bite;
    with ``schedules=True`` the learning rate may decay after every step (a scheduler edits the
    optimizer's ``param_groups``); with ``groups=True`` biases and norms may step in a second
    param group (their own learning rate, no weight decay). Shrinks toward plain SGD at the
    largest learning rate, in one group.

    Example::

        scenarios(world_size=4, optimizers=optimizers(names=("adam",), clip=True))
    """
    _check_choices("names", names, OPTIMIZERS)

    @st.composite
    def draw_optimizer(draw: st.DrawFn) -> OptimizerSpec:
        name = draw(st.sampled_from(list(names)))
        lr = draw(st.sampled_from(LEARNING_RATES))
        # Drawn whatever the name: if only SGD drew it, Adam's shorter choice sequence would
        # count as simpler and the shrinker could never get back to SGD.
        momentum = draw(st.sampled_from((0.0, 0.9)))
        decay = draw(st.sampled_from((0.0, 0.01))) if weight_decay else 0.0
        max_norm = draw(st.sampled_from(MAX_NORMS)) if clip else None
        lr_decay = draw(st.sampled_from(LR_DECAYS)) if schedules else None
        group_count = draw(st.sampled_from((1, 2))) if groups else 1
        return OptimizerSpec(
            name=name,  # type: ignore[arg-type]
            lr=lr,
            momentum=momentum if name == "sgd" else 0.0,
            weight_decay=decay,
            max_norm=max_norm,
            lr_decay=lr_decay,
            param_groups=group_count,
        )

    return draw_optimizer()


def scenarios(
    *,
    world_size: int,
    min_samples: int = 1,
    max_samples: int = 4,
    max_micro_batches: int = 2,
    max_steps: int | None = None,
    even: bool = False,
    same_micro_batch_counts: bool = False,
    dtypes: Sequence[str] = ("float64",),
    losses: Sequence[str] = LOSSES,
    models: st.SearchStrategy[ModelSpec] | None = None,
    optimizers: st.SearchStrategy[OptimizerSpec] | None = None,
    model: str | None = None,
    labels: str = "aligned",
    several_steps: bool = False,
    objective: str = "",
    token_weights: bool = False,
    loss_fn: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    empty_ranks: bool = False,
    window_steps: int | tuple[int, int] = 1,
    packings: Sequence[str] = ("",),
    boundaries: Sequence[str] = ("dropped",),
) -> st.SearchStrategy[Scenario]:
    """Whole scenarios for a world of ``world_size`` ranks; the drawn one is ``note()``d.

    ``min_samples`` and ``max_samples`` bound the samples one rank holds in one step.
    ``even=True`` keeps every rank's count equal (to check code that is only meant for even
    batches); ``same_micro_batch_counts=True`` gives every rank of a step as many
    micro-batches. ``models`` and ``optimizers`` replace the default strategies.
    ``losses=("tokens",)`` trains a tiny transformer with the token-level loss: sequences of
    different lengths, padding and ``ignore_index`` targets, averaged over the tokens that
    count (the count a plug-in is given is then tokens, not samples).
    ``model="module:factory"`` (or ``"path.py:factory"``) trains the user's own model: the
    factory returns ``(module, make_batch)``, see :mod:`ddp_verify.engine.user_models`; it is
    checked here, and its loss follows from its targets. ``labels="unshifted"`` draws token
    data whose last position never counts, for a loss that shifts its labels itself (token
    losses only). ``several_steps=True`` draws two steps or more in about half the examples,
    for code that keeps state from step to step (see :func:`accumulation_schedules`).
    ``objective="seq-mean-token-mean"`` (token losses only; ``"sample-mean"``, the default,
    for the others; ``"sum"`` for any loss) declares what the reference trains on the whole
    global batch, and what the counts a plug-in is given count (sequences for the sequence
    means, some drawn with no counted token); see
    :mod:`ddp_verify.engine.objectives`. ``token_weights=True`` (token losses only) multiplies
    every token's loss by a signed weight, as advantages weight an RL policy loss, the same
    in the reference and on every rank (see :func:`~ddp_verify.engine.models.token_weights`;
    the weights follow from the drawn seed, and shrink with it).
    ``loss_fn``, ``optimizer`` and ``scheduler`` train with the user's own (a callable, or
    ``"module:callable"`` / ``"path.py:callable"``): ``loss_fn(outputs, targets)`` on the
    target forms of ``losses`` it runs on, ``optimizer(params)``, ``scheduler(optimizer)``
    stepped once a step (see :mod:`ddp_verify.engine.recipes`); a training step is then judged
    against its own run on one rank holding the whole batch, other code against the engine's
    loop trained with them.
    ``empty_ranks=True`` lets a rank hold no sample in a step (about half the examples with
    two ranks or more, shrinking away; losses over samples, models that can forward nothing):
    each of its micro-batches is empty, its count 0, its gradient 0, and code that divides by
    its own count divides 0 by 0 there.
    ``window_steps=(2, 4)`` (token losses only) groups the optimizer steps into windows of 2
    to 4 steps that share one generation batch (an int pins it; 1, the default, makes every
    step its own): the span of the window counts a loss-agg plug-in is given, and of an
    objective declared ``@window``. Unless ``max_steps`` is given (3 by default), enough
    steps are drawn for a window and part of the next.
    ``boundaries=("dropped", "kept")`` (packed, ``labels="unshifted"``) draws the label of
    each packed segment's first position, which the previous segment's last position would
    predict: ignore_index, as packing collators leave it, or the segment's first token, for
    code that masks the boundary from ``position_ids`` itself (see ``Scenario.boundary``).
    ``objective="token-mean(loss) + 0.1*seq-mean-token-mean(kl)"`` declares an objective of
    several terms (token losses only; see :mod:`ddp_verify.engine.terms`): the reference
    trains their weighted sum, and a loss-agg plug-in is handed each term's values.
    ``packings=("", "flat", "rows", "split")`` (token losses only) draws how each
    micro-batch's sequences are laid out for code handed the per-token losses: padded, in one
    row, packed into rows, or cut into rows across sequences (see
    :mod:`ddp_verify.engine.packing`).

    Example::

        scenarios(world_size=4, losses=("tokens",), max_micro_batches=3)
        scenarios(world_size=2, losses=("cross_entropy",), loss_fn="my_losses.py:focal")
        scenarios(world_size=2, losses=("tokens",), objective="seq-mean-token-mean")
        scenarios(world_size=2, model="my_project.models:tiny_gpt")
    """
    low, high = (window_steps, window_steps) if isinstance(window_steps, int) else window_steps
    if not 1 <= low <= high:
        raise InvalidArgument(
            f"window_steps={window_steps!r}: the steps of a window, 1 or more (an int, or "
            "(low, high) with low <= high)"
        )
    _check_choices("packings", packings, ("", "flat", "rows", "split"))
    _check_choices("boundaries", boundaries, BOUNDARIES)
    if set(boundaries) != {"dropped"} and labels != "unshifted":
        # Only a loss that shifts its labels meets a segment's first label: kept or not,
        # aligned labels are the same.
        boundaries = ("dropped",)
    if set(packings) != {""} and (model is not None or tuple(losses) != ("tokens",)):
        raise InvalidArgument(
            f"packings={tuple(packings)!r} lays out the built-in token data's sequences: use "
            "it with losses=('tokens',) and no model="
        )
    if high > 1 and (model is not None or tuple(losses) != ("tokens",)):
        raise InvalidArgument(
            f"window_steps={window_steps!r} spans the counts of token losses over several "
            "steps: use it with losses=('tokens',) and no model="
        )
    if max_steps is None and high > 1:
        # A whole window and part of the next, so that both kinds of window are met.
        max_steps, several_steps = high + 1, True
    max_steps = 3 if max_steps is None else max_steps
    schedules = accumulation_schedules(
        world_size=world_size,
        min_samples=min_samples,
        max_samples=max_samples,
        max_micro_batches=max_micro_batches,
        max_steps=max_steps,
        even=even,
        same_micro_batch_counts=same_micro_batch_counts,
        several_steps=several_steps,
    )
    _check_choices("dtypes", dtypes, DTYPES)
    _check_choices("losses", losses, ALL_LOSSES)
    _check_choices("labels", (labels,), LABELS)
    if labels != "aligned" and (model is not None or tuple(losses) != ("tokens",)):
        raise InvalidArgument(
            f"labels={labels!r} applies to the built-in token data: use it with "
            "losses=('tokens',) and no model="
        )
    from .objectives import sample_mean

    terms = ""
    if objective and is_term_sum(objective):
        declared_terms = term_sum(objective)  # InvalidArgument where it does not parse
        if model is not None or tuple(losses) != ("tokens",):
            raise InvalidArgument(
                f"objective={objective!r}: an objective of several terms aggregates the built-in "
                "token data's per-token values: use it with losses=('tokens',) and no model="
            )
        terms, objective = str(declared_terms), str(declared_terms.main.aggregation)
    objective = sample_mean(objective, model is None and "tokens" in tuple(losses))
    if objective:
        from .objectives import objective as declared

        declared(objective)  # a declaration that parses (InvalidArgument otherwise)
        if objective != "sum" and (model is not None or tuple(losses) != ("tokens",)):
            raise InvalidArgument(
                f"objective={objective!r} aggregates token losses: use it with "
                "losses=('tokens',) and no model="
            )
    if token_weights and (model is not None or tuple(losses) != ("tokens",)):
        raise InvalidArgument(
            "token_weights=True weights the built-in token data's per-token losses: use it "
            "with losses=('tokens',) and no model="
        )
    user_spec: ModelSpec | None = None
    if model is not None:
        from .importing import resolve_reference
        from .user_models import UserModelError, inspect_user_model

        if models is not None:
            raise InvalidArgument("give model= (your factory) or models= (a strategy), not both")
        reference = resolve_reference(model)
        try:
            losses = (inspect_user_model(reference),)
        except UserModelError as exc:
            raise InvalidArgument(str(exc)) from None
        user_spec = ModelSpec(kind="user", factory=reference)
    recipe = Recipe()
    if loss_fn is not None or optimizer is not None or scheduler is not None:
        from .recipes import RecipeError, losses_it_takes, recipe_of

        try:
            recipe = recipe_of(loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler)
            if recipe.loss:
                losses = losses_it_takes(recipe, tuple(losses))
        except RecipeError as exc:
            raise InvalidArgument(str(exc)) from None
        if recipe.optimizer and optimizers is not None:
            raise InvalidArgument("give optimizer= (your factory) or optimizers=, not both")
    model_strategy = models if models is not None else _default_models()
    optimizer_strategy = optimizers if optimizers is not None else _default_optimizers()
    if recipe.optimizer:
        optimizer_strategy = st.just(OptimizerSpec())  # the user's optimizer trains

    @st.composite
    def draw_scenario(draw: st.DrawFn) -> Scenario:
        loss = draw(st.sampled_from(list(losses)))
        if user_spec is not None:
            model = user_spec
        else:
            model = draw(model_strategy)
            if model.kind == "transformer":
                loss = "tokens"  # per-token logits: the token-level loss is the one that fits
            elif loss == "tokens":
                model = _as_transformer(model)
            if loss == "cross_entropy" and model.out_features < 2:
                # Cross-entropy needs classes; the smallest model has one output.
                model = dataclasses.replace(model, out_features=2)
        schedule = draw(schedules)
        window = draw(st.integers(low, high)) if high > 1 else 1
        packing = draw(st.sampled_from(list(packings)))
        boundary = draw(st.sampled_from(list(boundaries))) if packing else "dropped"
        # A rank without samples: with two ranks or more (one holds them), a model that
        # can forward nothing (no batch norm, not the user's), samples not token sequences
        # (a declared objective counts each micro-batch's sequences).
        if (
            empty_ranks
            and world_size > 1
            and loss != "tokens"
            and not model.batch_norm
            and model.kind != "user"
            and draw(st.booleans())
        ):
            schedule = _emptied(schedule, draw(st.integers(0, world_size - 1)))
        scenario = Scenario(
            world_size=world_size,
            schedule=schedule,
            model=model,
            loss=loss,  # type: ignore[arg-type]
            optimizer=draw(optimizer_strategy),
            dtype=draw(st.sampled_from(list(dtypes))),
            seed=draw(st.integers(0, 2**16)),
            labels=labels,
            objective=objective,
            token_weights=token_weights,
            recipe=recipe,
            window=window,
            packing=packing,
            boundary=boundary,
            terms=terms,
        )
        note(f"Scenario: {scenario.describe()}")
        return scenario

    return draw_scenario()


def _emptied(schedule: Schedule, rank: int) -> Schedule:
    """``schedule`` with ``rank`` holding no sample at its first step: as many micro-batches,
    each empty (a batch norm cannot normalise nothing: never drawn with one)."""
    first = tuple(
        tuple(0 for _ in sizes) if r == rank else sizes for r, sizes in enumerate(schedule[0])
    )
    if not sum(map(sum, first)):
        return schedule
    return (first, *schedule[1:])


def coupled_scenarios(
    *,
    world_size: int,
    min_samples: int = 1,
    max_samples: int = 4,
    max_micro_batches: int = 1,
    max_steps: int = 2,
    even: bool = False,
    same_micro_batch_counts: bool = True,
    several_steps: bool = False,
    dtypes: Sequence[str] = ("float64",),
    optimizers: st.SearchStrategy[OptimizerSpec] | None = None,
    towers: int = 2,
    negatives: int = 0,
    learned: Sequence[str] = (),
) -> st.SearchStrategy[Scenario]:
    """Scenarios for a loss whose samples interact across ranks (the ``coupled-loss`` kind):
    the harness's encoder (``towers`` 1 or 2, ``negatives`` hard negatives a pair, the
    ``learned`` loss parameters) on pairs. Ranks hold ``min_samples`` to ``max_samples``
    pairs, uneven unless ``even=True``, and a rank may hold none (drawn, shrinking away);
    every rank of a step holds as many micro-batches (one unless ``max_micro_batches`` says
    more: in-batch negatives then come from each micro-batch).

    Example::

        coupled_scenarios(world_size=2, towers=1, learned=("logit_scale",))
    """
    _check_bounds(world_size, min_samples, max_samples)
    _check_int("max_micro_batches", max_micro_batches, 1)
    _check_int("max_steps", max_steps, 1)
    _check_int("negatives", negatives, 0)
    if towers not in (1, 2):
        raise InvalidArgument(f"towers={towers!r}: one tower for both views (1) or one each (2)")
    if not same_micro_batch_counts:
        raise InvalidArgument(
            "a coupled loss's ranks hold as many micro-batches: its gathers pair up per call"
        )
    if not set(dtypes) <= {"float64", "float32"} or not dtypes:
        raise InvalidArgument(
            f"dtypes={tuple(dtypes)!r}: a coupled loss is checked in float64 or float32 (its "
            "bound in float32 is measured on your code's own run on one rank; a 16-bit one is "
            "not measured yet)"
        )
    optimizer_strategy = optimizers if optimizers is not None else _default_optimizers()
    steps = st.integers(1, max_steps) if several_steps else st.just(1)
    encoders = st.builds(
        ModelSpec,
        kind=st.just("towers"),
        in_features=st.integers(2, 3),
        hidden=st.just(()),
        out_features=st.integers(2, 4),
        towers=st.just(towers),
        negatives=st.just(negatives),
        learned=st.just(tuple(learned)),
    )

    @st.composite
    def draw_scenario(draw: st.DrawFn) -> Scenario:
        schedule = []
        for _ in range(draw(steps)):
            pieces = draw(st.integers(1, max_micro_batches))
            common = draw(st.integers(min_samples, max_samples)) if even else None
            per_rank = []
            for _ in range(world_size):
                sizes = tuple(
                    common or draw(st.integers(min_samples, max_samples)) for _ in range(pieces)
                )
                per_rank.append(sizes)
            if not even and world_size > 1 and draw(st.booleans()):
                # A rank that holds no pair: its collectives must still take part.
                empty = draw(st.integers(0, world_size - 1))
                per_rank[empty] = (0,) * pieces
            schedule.append(tuple(per_rank))
        dtype: Any = draw(st.sampled_from(list(dtypes)))
        chosen = optimizer_strategy
        if dtype != "float64" and optimizers is None:
            # Adam turns a gradient that is exactly zero (a bias's, under a softmax over
            # shared candidates) into a step of +-lr on rounding alone, and the code's own
            # reordered runs on one rank need not round that way: a rounded coupled loss is
            # stepped by the optimizers that follow the gradient's size.
            chosen = _steady_optimizers()
        scenario = Scenario(
            world_size=world_size,
            schedule=tuple(schedule),
            model=draw(encoders),
            loss="coupled",
            optimizer=draw(chosen),
            dtype=dtype,
            seed=draw(st.integers(0, 2**16)),
        )
        note(f"Scenario: {scenario.describe()}")
        return scenario

    return draw_scenario()


@functools.cache
def _steady_optimizers() -> st.SearchStrategy[OptimizerSpec]:
    """The optimizers whose step a rounding error moves by as little (no normalisation by
    the gradient's own size)."""
    return optimizers(names=tuple(n for n in OPTIMIZERS if n not in BRANCHING_OPTIMIZERS))


def _as_transformer(model: ModelSpec) -> ModelSpec:
    """The transformer block of the same size: what the token-level loss trains."""
    return ModelSpec(
        kind="transformer",
        in_features=model.in_features,
        hidden=model.hidden[:1],
        activation=model.activation,
        tied=model.tied,
    )


# The parameters of scenarios() shadow these two strategies' names. Built once: making a
# strategy costs far more than drawing from one.
@functools.cache
def _default_models() -> st.SearchStrategy[ModelSpec]:
    return models()


@functools.cache
def _default_optimizers() -> st.SearchStrategy[OptimizerSpec]:
    return optimizers()


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be an integer of at least {minimum}")


def _check_bounds(world_size: int, min_samples: int, max_samples: int) -> None:
    _check_int("world_size", world_size, 1)
    _check_int("min_samples", min_samples, 1)
    if not isinstance(max_samples, int) or max_samples < min_samples:
        raise InvalidArgument(
            f"max_samples={max_samples!r} must be an integer of at least "
            f"min_samples={min_samples!r}"
        )


def _check_choices(name: str, chosen: Sequence[str], allowed: Sequence[str]) -> None:
    if isinstance(chosen, str) or not chosen:
        raise InvalidArgument(f"{name} must be a non-empty sequence drawn from {allowed}")
    unknown = [c for c in chosen if c not in allowed]
    if unknown:
        raise InvalidArgument(f"{name} has {unknown}, which are not among {allowed}")
