"""Adapters: a user's aggregation code, of one of its kinds (usercode/kinds.py), turned into a
method.

| kind        | the user's callable                                  | called                      |
| grad-sync   | ``fn(model)`` or ``fn(model, num_samples)``          | after the local backward    |
| loss        | ``fn(local_loss, num_samples) -> tensor or float``   | with the rank's mean loss   |
| step        | ``fn(model, optimizer, micro_batches, loss_fn)``     | once per step, does it all  |
| comm-hook   | ``hook(state, bucket) -> Future``                    | registered on DDP           |
| wrapper     | ``fn(module) -> module``                             | once per scenario, like DDP |
| loss-fn     | ``fn(logits, labels[, num_items_in_batch])``         | per micro-batch, as Trainer |

Everything the user's code does not own, the harness does the correct way, so a divergence is
the user's code's own.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..engine.models import (
    LOSS_REDUCTIONS,
    VOCABULARY,
    loss_function,
    padded_width,
    sums,
)
from ..engine.packed_layout import (
    micro_batch_dict,
    packed_boundaries,
    packed_labels,
    packing_of,
    unpacked_boundaries,
    unshifted_labels,
)
from ..engine.recipes import user_loss
from ..engine.scenario import IGNORE_INDEX, Scenario
from ..engine.trace import RankTrace, Settings, optimizer_settings
from ..methods.ddp import DDP
from ..methods.loop import RankRun, train_data_parallel, train_local_then_sync
from ..methods.manual import all_reduce_weighted
from ..world.naming import option
from ..world.protocol import modules_ranks_cannot_import
from .calling import UserMethod, anywhere_values, as_loss
from .kinds import (
    KINDS,
    RESULT_KINDS,
    SIGNATURES,
    STEP_VALUES,
    Binds,
    Bound,
    Call,
    Kind,
    KindError,
    as_kind,
    check_signature,
    parse_binds,
)
from .layouts import Choice as LayoutChoice
from .layouts import carrier, default_layout, parse_layout

RESULT_ON = ("all", "rank0")

__all__ = [
    "KINDS",
    "SIGNATURES",
    "KindError",
    "adapt",
    "check_signature",
]


def adapt(
    fn: Callable[..., Any],
    kind: Kind | str,
    *,
    result_on: str = "all",
    hook_state: Callable[..., Any] | None = None,
    loss_reduction: str = "mean",
    ddp_wrapper: str | None = None,
    bind: Binds = None,
    layout: Mapping[str, Any] | str | None = None,
    logits: str | None = None,
    labels: str | None = None,
    trainer_divides: bool = False,
) -> UserMethod | CommHook:
    """The method that runs ``fn`` as a ``kind`` plug-in, after checking its signature and
    that each option applies to the kind. ``bind`` fills parameters by name
    (:func:`~ddp_verify.usercode.kinds.parse_binds`); ``layout`` (or ``logits`` and
    ``labels``) says how the code is called where its kind accepts several layouts
    (:mod:`ddp_verify.usercode.layouts`): a ``loss-fn``'s token logits ``3d``,
    ``(batch, seq, vocab)``, or ``2d``, flattened to ``(positions, vocab)``, its labels
    ``aligned`` with the logits or ``unshifted`` (the inputs' next tokens, for a loss that
    shifts them itself); a ``reduce`` helper's input a ``tensor`` or a ``list``. An axis
    not given takes its first choice: the search probes the code to choose instead.
    ``trainer_divides``: a ``loss-agg`` result is divided by the accumulation steps before
    backward, as the Hugging Face Trainer does for a loss without ``num_items_in_batch``.

    Example::

        method = adapt(average_gradients, "grad-sync")
        world.assert_equivalent(method, scenario)
    """
    spec = as_kind(kind)
    pinned = parse_layout(spec, layout, logits=logits, labels=labels)
    options = Options(
        result_on,
        hook_state,
        loss_reduction,
        ddp_wrapper,
        parse_binds(bind),
        {**default_layout(spec, fn), **pinned},
        trainer_divides,
    )
    _check_options(spec, options)
    call = check_signature(fn, spec, bind=options.bind)
    call = dataclasses.replace(call, shown=_shown(spec, options, fn))
    name = f"{spec.name} {getattr(fn, '__qualname__', repr(fn))}"
    if result_on != "all":
        name += f" (result on {result_on})"
    method = ADAPTERS[spec.adapter](fn, name, call, spec, options)
    method.call = call  # reports say how the code was called
    if call.bound and spec.bound_by_wrapper:
        method.fn = _bound_call(fn, spec, call.bound)
    return method


def _bound_call(fn: Callable[..., Any], kind: Kind, bound: tuple[Bound, ...]) -> _BoundCall:
    # anywhere_values()'s keys, and what the kind hands its code by name (a step's scheduler)
    anywhere = ("world_size", "rank", "device", "group", *kind.named_values)
    for b in bound:
        if b.source is not None and b.source not in anywhere:
            raise KindError(
                f"{b.parameter} is bound to {b.source}, which a {kind} plug-in is not given "
                f"(it sees the whole step); bind one of {', '.join(anywhere)} or a literal"
            )
    return _BoundCall(fn, bound)


class _BoundCall:
    """``fn`` with its bound parameters filled by keyword on the rank that calls it."""

    def __init__(self, fn: Callable[..., Any], bound: tuple[Bound, ...]) -> None:
        self.fn, self.bound = fn, bound
        # Values of the run the rank sets before calling (a step's scheduler), by name.
        self.given: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = {**anywhere_values(), **self.given}
        return self.fn(*args, **kwargs, **{b.parameter: b.value(values) for b in self.bound})


@dataclasses.dataclass(frozen=True)
class Options:
    """The options a user gave beside the code (see :func:`adapt`)."""

    result_on: str = "all"
    hook_state: Callable[..., Any] | None = None
    loss_reduction: str = "mean"
    ddp_wrapper: str | None = None
    bind: tuple[Bound, ...] = ()
    # The layout, every axis of the kind resolved (usercode/layouts.py); empty for a kind
    # with one layout.
    layout: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # A loss-agg result divided by the accumulation steps before backward (HF's Trainer).
    trainer_divides: bool = False


def _shown(kind: Kind, options: Options, fn: Callable[..., Any]) -> tuple[str, ...]:
    """How a report shows the arguments the harness passes first: with their shapes."""
    if "logits" in kind.layout_axes:
        flat = options.layout.get("logits") == "2d"
        unshifted = " unshifted" if options.layout.get("labels") == "unshifted" else ""
        return (
            f"logits[{'batch*seq' if flat else 'batch, seq'}, vocab] or [batch, classes]",
            f"labels[{'batch*seq' if flat else 'batch, seq'}]{unshifted} or [batch]",
        )
    carried = carrier(kind, options.layout)
    if carried is not None and carried.hand_over is not None:
        # As the layout hands a tensor over: [tensor[]] for a list of one.
        return (repr(carried.hand_over("tensor[]")).replace("'", ""),)
    return kind.shown


def _check_options(kind: Kind, options: Options) -> None:
    """A :class:`KindError` for an option the kind does not take, or a bad value."""
    if options.result_on not in RESULT_ON:
        raise KindError(
            f"result_on must be one of {', '.join(RESULT_ON)}, got {options.result_on!r}"
        )
    if options.ddp_wrapper is not None and not kind.wrapped:
        raise KindError(
            f"{option('ddp_wrapper')} applies to wrapped-step functions, not to {kind.name}"
        )
    if options.loss_reduction != "mean" and not kind.owns_micro_batches:
        raise KindError(
            f"{option('loss_reduction')} applies to step functions (step, wrapped-step), not to "
            f"{kind.name}"
        )
    if options.loss_reduction not in LOSS_REDUCTIONS:
        raise KindError(
            f"loss_reduction must be one of {', '.join(LOSS_REDUCTIONS)}, got "
            f"{options.loss_reduction!r}"
        )
    if options.hook_state is not None and not kind.hook_state:
        raise KindError(
            f"{option('hook_state')} applies to comm hooks ({option('kind', 'comm-hook')}), "
            f"not to {kind.name}"
        )
    if options.bind and not kind.takes_binds:
        raise KindError(
            "a comm hook is called by DDP as hook(state, bucket): give what it needs through "
            f"its state ({option('hook_state')}), not {option('bind')}"
        )
    if options.trainer_divides and not kind.token_losses:
        raise KindError(
            f"{option('trainer_divides', True)} applies to loss-agg plug-ins, not {kind.name}"
        )
    if options.hook_state is not None and not callable(options.hook_state):
        raise KindError(f"the hook state factory {options.hook_state!r} is not callable")
    if options.result_on != "all" and not kind.result_on_rank0:
        raise KindError(
            f"{option('result_on', options.result_on)} applies to {', '.join(RESULT_KINDS)} "
            f"helpers, not {kind.name}"
        )


class GradSync(UserMethod):
    """The harness does the local backward of each rank's mean loss; ``fn`` must leave the
    global mean gradient in every ``.grad``. Under a declared sum (``objective="sum"``) the
    harness backpropagates each rank's summed loss and ``fn`` must leave the global sum's
    gradient: what correct code is changes with the objective. It is called as ``call`` says
    (the count only where the signature asks for one)."""

    call: Call

    def __init__(self, fn: Callable[..., Any], name: str, call: Call) -> None:
        super().__init__(fn, name)
        self.call = call

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)

        def users_sync(step: int, local_sum: torch.Tensor) -> torch.Tensor:
            args, kwargs = self.call.arguments(
                (run.model,),
                run.local_samples(step),
                samples=run.local_rows(step),
                values=rank_values(run, step),
            )
            self.fn(*args, **kwargs)
            dist.all_reduce(local_sum)
            return local_sum / run.global_normaliser(step)

        return train_local_then_sync(run, users_sync)


class LossAggregation(UserMethod):
    """The harness synchronises gradients correctly; ``fn`` turns each rank's mean loss into
    the global mean loss it reports (called as ``call`` says); under a declared sum, each
    rank's summed loss into the global sum. ``form`` is how the loss is
    handed over and must come back: ``loss`` (a scalar tensor in, a number or tensor out),
    ``reduce`` (a tensor in, one of the same shape out), ``list`` (a list of one tensor in and
    out), ``reduce-dict`` (``{"loss": tensor}`` in and out). ``result_on="rank0"``: only rank
    0's result counts (a helper that reduces onto rank 0); the other ranks report rank 0's."""

    call: Call

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        call: Call,
        *,
        form: str = "loss",
        result_on: str = "all",
        carried: LayoutChoice | None = None,
    ) -> None:
        super().__init__(fn, name)
        self.call, self.form, self.result_on = call, form, result_on
        self.carried = carried

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        params = run.trainable()
        dtype = params[0].dtype if params else torch.float64

        def users_loss(step: int, local_sum: torch.Tensor) -> float:
            n = run.local_normaliser(step)
            all_reduce_weighted(params, float(n), run.global_normaliser(step))
            # A rank with no sample hands over a mean of 0 (its sum's), not 0/0.
            local = (local_sum / max(n, 1)).to(dtype).clone()
            args, kwargs = self.call.arguments(
                (_handed_over(self.form, local, self.carried),),
                run.local_samples(step),
                samples=run.local_rows(step),
                values=rank_values(run, step),
            )
            reported = _taken_back(self.form, self.fn(*args, **kwargs), local, self.carried)
            if self.result_on == "rank0":
                held = torch.tensor([reported], dtype=torch.float64, device=run.device)
                dist.broadcast(held, src=0)
                reported = float(held.item())
            return reported

        return train_local_then_sync(run, users_loss)


def rank_values(run: RankRun, step: int, classes: int | None = None) -> dict[str, Any]:
    """What a bound parameter may get on this rank at ``step`` (kinds.BINDABLE)."""
    scenario = run.scenario
    if classes is None:
        classes = VOCABULARY if scenario.loss == "tokens" else scenario.model.out_features
    return {
        **anywhere_values(),
        "count": run.local_samples(step),
        "global_count": run.global_samples(step),
        "vocab_size": classes,
    }


def _handed_over(form: str, local: torch.Tensor, carried: LayoutChoice | None = None) -> Any:
    if carried is not None and carried.hand_over is not None:
        return carried.hand_over(local)
    if form == "reduce-dict":
        return {"loss": local}
    return local


def _taken_back(
    form: str, result: Any, given: torch.Tensor, carried: LayoutChoice | None = None
) -> float:
    """The global mean loss in what ``fn`` returned; :class:`KindError` if its form is not
    the one the kind promises (``carried``: the layout row of a reduce helper's input)."""
    if form == "loss":
        return _as_float(result, "loss")
    if carried is not None and carried.take_back is not None:
        result = carried.take_back(result, given)
    elif form == "reduce-dict":
        if not isinstance(result, dict) or "loss" not in result:
            raise KindError(
                f"a reduce-dict helper must return a dict with the keys it was given "
                f"(here 'loss'), got {type(result).__name__}"
            )
        result = result["loss"]
    if not isinstance(result, torch.Tensor) or result.shape != given.shape:
        shape = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
        raise KindError(
            f"a reduce helper must return a tensor of the shape it was given "
            f"{tuple(given.shape)}, got {shape}"
        )
    return _as_float(result, "reduce")


class TrainingStep(UserMethod):
    """``fn`` does the whole step (forward, backward, synchronisation, optimizer step) and
    returns the global mean loss (the global sum under a declared sum). Its gradients are
    recorded as its optimizer sees them, at the step's first ``optimizer.step()`` (before any
    clip of the harness's), its settings at every call. ``loss_reduction`` is the
    reduction of the ``loss_fn`` it gets (``mean`` unless the user's loop wants ``sum`` or
    ``none``; ``mean`` is the declared objective on the batch it is given, so under a
    declared sum it sums). With the user's own loss, optimizer or scheduler its reference is
    its own run on one rank, the whole batch in one micro-batch. ``wrapped``: the model it
    gets is already in DDP (the ``wrapped-step`` kind), whose ``no_sync()`` it may use, or in
    ``ddp_wrapper`` (``"module:callable"``, called as DDP is)."""

    owns_step = True

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        loss_reduction: str = "mean",
        wrapped: bool = False,
        ddp_wrapper: str | None = None,
        dicts: bool = False,
    ) -> None:
        super().__init__(fn, name)
        self.loss_reduction, self.wrapped = loss_reduction, wrapped
        self.ddp_wrapper = ddp_wrapper
        self.dicts = dicts

    def _micro_batches(self, run: RankRun, step: int) -> list[Any]:
        """The step's micro-batches as the code takes them: pairs, or dicts (packed where
        the scenario packs its sequences)."""
        batches = run.micro_batches(step)
        if not self.dicts:
            return batches
        return [micro_batch_dict(run.scenario, inputs, targets) for inputs, targets in batches]

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        wrap = DDP(wrapper=self.ddp_wrapper).wrap
        model = wrap(run.model, scenario) if self.wrapped else run.model
        # Each time the code steps the optimizer, the settings it steps with (the diagnosis
        # names another count, or a rate, momentum or decay the code or its schedule set),
        # and at the step's first call the gradients it steps on: the code's gradients as its
        # optimizer sees them, before any clip of the harness's.
        calls: list[list[Settings]] = []

        def stepping(optimizer: torch.optim.Optimizer, *_: Any) -> None:
            if not calls[-1]:
                run.record_gradients()
            calls[-1].append(optimizer_settings(optimizer))

        # A step that takes the scheduler steps it; otherwise the loop does, once a step.
        bound = self.call.bound if self.call is not None else ()
        takes = [b.parameter for b in bound if b.source in STEP_VALUES]
        optimizer = run.optimizer(model.parameters(), ticks=not takes, watch=stepping)
        if takes:
            if run.scheduler is None:
                raise KindError(
                    f"{self.name} takes {takes[0]!r}, the scheduler it steps: give yours "
                    f"({option('scheduler', 'PATH.py:FACTORY')}, FACTORY(optimizer))"
                )
            assert isinstance(self.fn, _BoundCall)
            self.fn.given = dict.fromkeys(STEP_VALUES, run.scheduler)
        # The user's own loss as they wrote it (tuple and all), or the harness's: torch's,
        # whose mean over an empty micro-batch is 0/0, as the code meets it in training.
        loss_fn = (
            user_loss(scenario.recipe)
            if scenario.recipe.loss
            else loss_function(scenario, self.loss_reduction)
        )
        for step in range(scenario.steps):
            calls.append([])
            reported = self.fn(model, optimizer, self._micro_batches(run, step), loss_fn)
            if not calls[-1]:
                run.record_gradients()  # never stepped: what it left, for the step's record
            run.record_step(_as_float(reported, "step"))
        run.trace.optimizer_calls = calls
        return run.trace


class LossFunction(UserMethod):
    """``fn`` is the loss a Trainer-style loop calls on every micro-batch (Hugging Face's
    ``ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch)``, say). A token loss's
    logits come as LM code takes them, ``(batch, seq, vocab)`` with labels ``(batch, seq)``,
    or flattened to ``(positions, vocab)`` and ``(positions,)`` (``logits="2d"``, for
    ``fixed_cross_entropy``); labels aligned with the logits, or unshifted for a loss that
    shifts them itself (``labels="unshifted"``); a class loss's as the model gives them.

    Given a count, it is the loss items of the whole step (every micro-batch of every rank,
    ``num_items_in_batch`` counted across devices): the loop backpropagates what ``fn``
    returns as it is, sums the gradients over ranks and reports the sum, so ``fn`` must
    return its micro-batch's share of the global mean (its summed loss over the count).
    Without a count, the loop does what Trainers did before the count existed: each result
    divided by the number of micro-batches, gradients and loss averaged over ranks, which is
    right only when every micro-batch holds as many items. Under a declared sum
    (``objective="sum"``) the loop adds what ``fn`` returns over micro-batches and ranks, with
    a count or without, so ``fn`` must return its micro-batch's summed loss."""

    call: Call

    def __init__(
        self, fn: Callable[..., Any], name: str, call: Call, options: Options = Options()
    ) -> None:
        super().__init__(fn, name)
        self.call = call
        self.flat = options.layout.get("logits") == "2d"
        self.unshifted = options.layout.get("labels") == "unshifted"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        optimizer = run.optimizer()
        params = run.trainable()
        # A count makes the loop add what fn returns, as a declared sum does whatever fn
        # takes: the loop then neither divides by the micro-batches nor averages over ranks.
        counted = self.call.takes_count or sums(scenario)
        for step in range(scenario.steps):
            optimizer.zero_grad(set_to_none=True)
            batches = run.micro_batches(step)
            reported = run.zero()
            for inputs, targets in batches:
                logits, labels, layout = self._laid_out(
                    scenario, inputs, run.model(inputs), targets
                )
                args, kwargs = self.call.arguments(
                    (logits, labels),
                    run.global_samples(step),
                    samples=run.global_rows(step),
                    values={**rank_values(run, step, classes=logits.shape[-1]), **layout},
                )
                value = self.fn(*args, **kwargs)
                value = as_loss(value) / (1 if counted else len(batches))
                value.backward()
                reported += value.detach().double()
            divisor = 1.0 if counted else float(run.world_size)
            loss = all_reduce_weighted(params, 1.0, divisor, reported)
            run.record_gradients()
            optimizer.step()
            run.record_step(loss)
        return run.trace

    def _laid_out(
        self, scenario: Scenario, inputs: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Token logits and labels as the options say: ``(batch, seq, vocab)`` and
        ``(batch, seq)`` or flattened; labels aligned, or unshifted (the target of position
        ``i`` at ``i + 1``, as a loss that shifts them expects; the data's last position
        never counts, so nothing is lost); packed as the scenario says (:func:`packed_labels`),
        with the boundaries code may take by name."""
        if scenario.loss != "tokens":
            return logits, labels, {}
        if self.unshifted:
            labels = unshifted_labels(scenario, inputs, labels)
        logits, labels, boundaries = packed_labels(scenario, inputs, logits, labels, self.unshifted)
        if self.flat:
            return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), boundaries
        return logits, labels, boundaries


class LossAggregator(UserMethod):
    """``fn(loss_mat, loss_mask, ...)`` is RL post-training's loss aggregation (verl's
    ``agg_loss``, TRL's loss types): called on every micro-batch of every rank with the
    per-token loss matrix ``[batch, seq]`` (each micro-batch padded to its own longest
    sequence, so widths differ) and the 0/1 mask of the tokens that count. What it returns
    is backpropagated as it is; gradients are summed over ranks and divided by the world size,
    as DDP does, so ``fn`` must return its micro-batch's share of the declared objective times
    the world size (verl multiplies by ``dp_size``). The loss reported is what it returned,
    summed over micro-batches and averaged over ranks, as such a loop logs it. Counts come by
    name (``global_tokens``, ``rank_sequences``, ... :data:`~.kinds.AGGREGATION_VALUES`); the
    ``window_`` counts are every rank's over the steps of the step's window (its generation
    batch), ``window_steps`` how many steps that window holds."""

    call: Call

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        call: Call,
        *,
        divides: bool = False,
        zero_under_mask: bool = False,
    ) -> None:
        super().__init__(fn, name)
        self.call, self.divides = call, divides
        # Losses where the mask is 0 are zero (as F.cross_entropy's ignore_index leaves
        # them): the diagnosis's probe of whether the code applies the mask at all.
        self.zero_under_mask = zero_under_mask

    def under_zeroed_mask(self) -> LossAggregator:
        """The same code, handed losses that are 0 wherever the mask is.

        Example::

            probe = method.under_zeroed_mask()
        """
        return LossAggregator(
            self.fn, self.name, self.call, divides=self.divides, zero_under_mask=True
        )

    def train_rank(self, scenario: Scenario) -> RankTrace:
        from ..engine.objectives import objective

        run = RankRun(scenario)
        optimizer = run.optimizer()
        params = run.trainable()
        per_token = loss_function(scenario, "none")
        tokens, sequences = objective("token-mean"), objective("seq-mean-token-mean")
        # Masks come as bool, int or float and counts as ints or 0-d tensors, as RL code
        # gets them: which, the scenario's seed says (hypothesis draws it, and shrinks it).
        mask_dtype = (torch.bool, torch.int64, None)[scenario.seed % 3]
        as_tensor = scenario.seed % 2 == 1
        for step in range(scenario.steps):
            optimizer.zero_grad(set_to_none=True)
            batches = run.micro_batches(step)
            masks = [targets != IGNORE_INDEX for _, targets in batches]
            counts = {
                "accumulation_steps": len(batches),
                "rank_tokens": sum(tokens.units(m) for m in masks),
                "rank_sequences": sum(sequences.units(m) for m in masks),
            }
            # The window's counts are every rank's over the window's steps (a generation
            # batch's, counted once it is generated): this rank's, summed across ranks.
            window = scenario.window_of(step)
            held = [[t != IGNORE_INDEX for _, t in run.micro_batches(s)] for s in window]
            summed = torch.tensor(
                [
                    counts["rank_tokens"],
                    counts["rank_sequences"],
                    sum(tokens.units(m) for ms in held for m in ms),
                    sum(sequences.units(m) for ms in held for m in ms),
                ],
                device=run.device,
            )
            dist.all_reduce(summed)
            (
                counts["global_tokens"],
                counts["global_sequences"],
                counts["window_tokens"],
                counts["window_sequences"],
            ) = map(int, summed.tolist())
            counts["window_steps"] = len(window)
            reported = run.zero()
            for (inputs, targets), mask in zip(batches, masks, strict=True):
                # Each micro-batch at its own width: its longest sequence's last position
                # that counts, as dynamic padding leaves it.
                width = padded_width(scenario, targets)
                # Every position has a loss of its own, as a policy loss has (ratios times
                # advantages exist wherever there is a token): code that forgets the mask
                # counts them. Where the mask is 0 the loss is the model's against class 0.
                given = targets if self.zero_under_mask else unmasked_targets(targets)
                logits = run.model(inputs)
                losses = per_token(logits, given)
                mine = {
                    **counts,
                    "tokens": tokens.units(mask),
                    "sequences": sequences.units(mask),
                }
                dtype = mask_dtype or losses.dtype
                handed_terms = _term_tensors(scenario, inputs, logits, given, targets, width, dtype)
                losses, mask, layout = laid_out(scenario, inputs, losses, mask, width)
                if as_tensor:
                    mine = {k: torch.tensor(v, device=run.device) for k, v in mine.items()}
                values = {**rank_values(run, step), **mine, **layout, **handed_terms}
                handed = mask.to(dtype)
                args, kwargs = self.call.arguments((losses, handed), 0, values=values)
                value = as_loss(self.fn(*args, **kwargs))
                if self.divides:
                    value = value / len(batches)
                value.backward()
                reported += value.detach().double()
            loss = all_reduce_weighted(params, 1.0, float(run.world_size), reported)
            run.record_gradients()
            optimizer.step()
            run.record_step(loss)
        return run.trace


def _term_tensors(
    scenario: Scenario,
    inputs: torch.Tensor,
    logits: torch.Tensor,
    given: torch.Tensor,
    targets: torch.Tensor,
    width: int,
    mask_dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Under an objective of several terms (:mod:`ddp_verify.engine.terms`), each term's
    per-token values but the first's, and each subset mask, laid out as the loss matrix is,
    keyed ``term:NAME`` (what a parameter bound to ``term:NAME`` gets); none otherwise."""
    if not scenario.terms:
        return {}
    from ..engine.term_values import term_mask, term_targets
    from ..engine.terms import term_sum

    per_token = loss_function(scenario, "none")
    counted = targets != IGNORE_INDEX
    handed: dict[str, torch.Tensor] = {}
    for term in term_sum(scenario.terms).terms:
        chosen = term_mask(term, targets)
        if term.index:
            values = per_token(logits, term_targets(given, term.index, logits.shape[-1]))
            handed[f"term:{term.tensor}"] = laid_out(scenario, inputs, values, counted, width)[0]
            if term.micro:
                # Its value on this micro-batch, as a model hands a router's auxiliary loss.
                value = term.aggregation.value(values, chosen)
                handed[f"term:{term.tensor}.value"] = value
        if term.mask:
            mask = laid_out(scenario, inputs, chosen.to(torch.float64), chosen, width)[1]
            handed[f"term:{term.mask}"] = mask.to(mask_dtype)
    return handed


def laid_out(
    scenario: Scenario,
    inputs: torch.Tensor,
    losses: torch.Tensor,
    mask: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's per-token ``losses`` and ``mask`` (``[sequences, positions]``) as the
    code is handed them: padded to ``width``, a sequence a row, or packed as the scenario's
    ``packing`` says (:mod:`ddp_verify.engine.packing`); with the boundaries code may take
    (``position_ids``, ``segment_ids``, ``cu_seq_lens``), each sequence a segment.

    Example::

        losses, mask, boundaries = laid_out(scenario, inputs, losses, mask, width)
    """
    device = losses.device
    if not scenario.packing:
        boundaries = unpacked_boundaries(losses.shape[0], width, device)
        return losses[:, :width], mask[:, :width], boundaries
    # A sequence's positions are its tokens (padding excluded), all of its positions packed.
    packed = packing_of(scenario, inputs, losses.shape[1])
    boundaries = packed_boundaries(packed, device)
    # Padding's loss is 0 and counts nowhere: a packed row's tail holds no token.
    return packed.of(losses, 0.0), packed.of(mask, False), boundaries


def unmasked_targets(targets: torch.Tensor) -> torch.Tensor:
    """``targets`` with every ignored position given class 0: a per-token loss computed on it
    is non-zero, with a gradient, wherever the mask says not to count it.

    Example::

        >>> unmasked_targets(torch.tensor([[3, -100], [-100, 1]])).tolist()
        [[3, 0], [0, 1]]
    """
    return targets.clamp(min=0)


class CommHook(DDP):
    """torch's DDP with the user's communication hook registered, with ``state=None`` or the
    state ``hook_state`` makes on each rank once the process group exists (``hook_state()``
    or ``hook_state(module)``: PowerSGD's ``PowerSGDState``, a state holding a group or an
    error-feedback buffer)."""

    call: Call | None = None

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        hook_state: Callable[..., Any] | None = None,
    ) -> None:
        factory = None if hook_state is None else _StateFactory(hook_state)
        super().__init__(comm_hook=fn, hook_state=factory)
        self.fn = fn
        self.name = name
        self.by_value = tuple(
            modules_ranks_cannot_import(fn)
            + (modules_ranks_cannot_import(hook_state) if hook_state is not None else [])
        )


class _StateFactory:
    """Calls a hook-state factory with the module when it takes one argument, else with
    none."""

    def __init__(self, factory: Callable[..., Any]) -> None:
        self.factory = factory
        try:
            inspect.signature(factory).bind(None)
            self.takes_module = True
        except TypeError:
            self.takes_module = False
        except ValueError:  # no signature to read: try the documented form
            self.takes_module = True

    def __call__(self, module: torch.nn.Module) -> Any:
        return self.factory(module) if self.takes_module else self.factory()


class Wrapper(UserMethod):
    """``fn(module)`` wraps the model once, as DDP does, and must average gradients over the
    ranks during backward; trained as :func:`~ddp_verify.methods.loop.train_data_parallel`
    trains DDP (``no_sync()`` when the wrapper has it)."""

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        wrapped = self.fn(run.model)
        if not callable(wrapped):
            raise KindError(f"the wrapper returned {wrapped!r}, which cannot be called")
        params = wrapped.parameters() if hasattr(wrapped, "parameters") else None
        return train_data_parallel(run, wrapped, run.optimizer(params))


def _as_float(value: Any, what: str) -> float:
    try:
        return float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise KindError(
            f"a {what} plug-in must return the global mean loss as a number or a one-element "
            f"tensor, got {type(value).__name__}: {exc}"
        ) from None


def _coupled(fn: Callable[..., Any], name: str, call: Call) -> UserMethod:
    # Its own module: a coupled loss trains the harness's encoder, not a scenario's model.
    from .coupled import CoupledLoss, single_process_defaults

    said = single_process_defaults(fn)
    if said:
        raise KindError(said)
    return CoupledLoss(fn, name, call)


# How each kind's callable becomes a method (Kind.adapter names an entry).
Adapter = Callable[[Callable[..., Any], str, Call, Kind, Options], "UserMethod | CommHook"]
ADAPTERS: dict[str, Adapter] = {
    "grad-sync": lambda fn, name, call, kind, o: GradSync(fn, name, call),
    "loss": lambda fn, name, call, kind, o: LossAggregation(
        fn, name, call, form="loss", result_on=o.result_on
    ),
    # A tensor, a list of one tensor (as Megatron's helpers take it), or any row the
    # layout's "tensors" axis has: the layout says which.
    "reduce": lambda fn, name, call, kind, o: LossAggregation(
        fn,
        name,
        call,
        form="reduce",
        result_on=o.result_on,
        carried=carrier(kind, o.layout),
    ),
    "reduce-dict": lambda fn, name, call, kind, o: LossAggregation(
        fn, name, call, form="reduce-dict", result_on=o.result_on
    ),
    "step": lambda fn, name, call, kind, o: TrainingStep(
        fn,
        name,
        loss_reduction=o.loss_reduction,
        wrapped=kind.wrapped,
        ddp_wrapper=o.ddp_wrapper,
        dicts=o.layout.get("batches") == "dicts",
    ),
    "comm-hook": lambda fn, name, call, kind, o: CommHook(fn, name, o.hook_state),
    "loss-fn": lambda fn, name, call, kind, o: LossFunction(fn, name, call, o),
    "loss-agg": lambda fn, name, call, kind, o: LossAggregator(
        fn, name, call, divides=o.trainer_divides
    ),
    "wrapper": lambda fn, name, call, kind, o: Wrapper(fn, name),
    "coupled-loss": lambda fn, name, call, kind, o: _coupled(fn, name, call),
}
