"""Deterministic builders: the model, data, loss and optimizer a scenario describes.

Every builder depends on the scenario alone, so the controller and every rank build
bit-identical objects. Initial weights and data are drawn in float32 and only then cast, so a
float32 and a float64 run of one scenario start from exactly the same numbers (which lets
:mod:`ddp_verify.engine.tolerances` measure float32's own rounding error against float64).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .objectives import objective
from .objectives import window_factor as objectives_window_factor
from .optimizers import param_groups
from .scenario import IGNORE_INDEX, ModelSpec, OptimizerSpec, Scenario

# A slice of a batch: inputs and their targets.
MicroBatch = tuple[torch.Tensor, torch.Tensor]

# Shapes of the non-dense inputs: a short sequence of channels, or of token ids.
CONV_CHANNELS, SEQUENCE = 2, 3
VOCABULARY = 7
# The transformer's sequences: up to TOKENS long, padded at the end.
TOKENS = 4
PAD_ID = 0

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


class SpecModel(nn.Module):
    """The model a :class:`ModelSpec` describes."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        act = _ACTIVATIONS[spec.activation]
        width = spec.in_features
        if spec.kind == "conv":
            self.conv = nn.Conv1d(CONV_CHANNELS, spec.in_features, kernel_size=2, padding=1)
            width = spec.in_features * (SEQUENCE + 1)
        elif spec.kind == "embedding":
            self.embedding = nn.Embedding(VOCABULARY, spec.in_features)
        if spec.buffer:
            # A fixed per-feature scale: DDP broadcasts buffers from rank 0 at every forward.
            self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        layers: list[nn.Module] = []
        for i, size in enumerate(spec.hidden):
            layers.append(nn.Linear(width, size))
            if spec.batch_norm and i == 0:
                # "sync" is converted to SyncBatchNorm on the ranks (methods.ddp), where a
                # process group exists; here, and in the reference, it is the full batch's.
                layers.append(nn.BatchNorm1d(size))
            if spec.layernorm and i == 0:
                layers.append(nn.LayerNorm(size))
            layers.append(act())
            width = size
        self.body = nn.Sequential(*layers)
        if spec.tied:
            # One weight used by two layers: its gradient is the sum of both uses.
            self.tied_a = nn.Linear(width, width)
            self.tied_b = nn.Linear(width, width)
            self.tied_b.weight = self.tied_a.weight
            self.tied_act = act()
        if spec.frozen:
            self.frozen = nn.Linear(width, width)
            self.frozen.requires_grad_(False)
        if spec.unused:
            self.unused = nn.Linear(width, 1)  # never called in forward
        self.head = nn.Linear(width, spec.out_features)
        if spec.aside:
            self.aside = nn.Linear(width, 1)  # an output the loss leaves out

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.spec.kind == "conv":
            x = torch.tanh(self.conv(x)).flatten(1)
        elif self.spec.kind == "embedding":
            x = self.embedding(x).mean(dim=1)
        if self.spec.buffer:
            x = x * self.scale
        x = self.body(x)
        if self.spec.tied:
            x = self.tied_b(self.tied_act(self.tied_a(x)))
        if self.spec.frozen:
            x = self.frozen(x)
        if self.spec.aside:
            return self.head(x), self.aside(x)
        return self.head(x)


class TinyTransformer(nn.Module):
    """One pre-norm causal transformer block over token ids: embedding plus learned positions,
    single-head self-attention, an MLP, a final LayerNorm and per-token logits over the
    vocabulary (from the embedding itself when ``spec.tied``). Padding sits at the end of a
    sequence, so causal attention never lets a counted token see it.

    Given ``position_ids`` (packed rows, as Hugging Face models take them), each position's
    learned position is its own, and attention stays within its segment: a segment starts
    where the position id is 0, as padding-free models find the boundaries. A sequence
    packed with others then gets the logits it gets alone."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.in_features + 1
        self.embedding = nn.Embedding(VOCABULARY, d)
        self.position = nn.Parameter(torch.randn(TOKENS, d) * 0.1)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        act = _ACTIVATIONS[spec.activation]
        self.mlp = nn.Sequential(nn.Linear(d, spec.hidden[0]), act(), nn.Linear(spec.hidden[0], d))
        self.head = None if spec.tied else nn.Linear(d, VOCABULARY, bias=False)

    def forward(
        self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        length = tokens.shape[1]
        future = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
        if position_ids is None:
            # A packed row longer than any sequence (code that forgot its position_ids)
            # runs, its late positions sharing the last learned one, as a wrong result.
            at = torch.arange(length, device=tokens.device).clamp(max=TOKENS - 1)
            h = self.embedding(tokens) + self.position[at]
            hidden = future
        else:
            h = self.embedding(tokens) + self.position[position_ids.clamp(0, TOKENS - 1)]
            segment = (position_ids == 0).cumsum(dim=1)
            # Another segment's positions are hidden as the future is (per row: [rows, l, l]).
            hidden = future | (segment.unsqueeze(2) != segment.unsqueeze(1))
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        attention = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
        h = h + self.proj(attention @ v)
        h = self.ln_f(h + self.mlp(self.ln2(h)))
        return h @ self.embedding.weight.T if self.head is None else self.head(h)


_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _module(spec: ModelSpec) -> nn.Module:
    if spec.kind == "user":
        from .user_models import user_model

        return user_model(spec.factory).module()
    if spec.kind == "transformer":
        return TinyTransformer(spec)
    return SpecModel(spec)


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def build_model(
    scenario: Scenario, dtype: str | None = None, device: torch.device | str | None = None
) -> nn.Module:
    """The scenario's model with its seeded initial weights, in ``dtype`` (default: the
    scenario's), on ``device`` (default: the CPU). The weights are drawn on the CPU and then
    moved, so every device starts from the same numbers.

    Example::

        model = build_model(scenario, device="cuda:0")
    """
    with torch.random.fork_rng(devices=[]):
        # The CPU generator alone: torch.manual_seed also queues a lazy seeding call for every
        # accelerator API, each recording a stack trace, on every model built.
        torch.default_generator.manual_seed(scenario.seed)
        model = _module(scenario.model)
    model = model.to(device=device, dtype=torch_dtype(dtype or scenario.dtype))
    if scenario.autocast:
        _forward_under_autocast(model, scenario.autocast, torch.device(device or "cpu").type)
    return model


def normalises_by_batch(scenario: Scenario) -> bool:
    """Whether the scenario's model normalises each forward by its own batch's statistics:
    a BatchNorm in training mode that is not SyncBatchNorm, in a drawn model or the user's.
    Data-parallel training then normalises each rank's micro-batch by its own statistics,
    however right the code that combines the gradients is.

    Example::

        >>> from ddp_verify.engine.scenario import ModelSpec
        >>> s = Scenario(world_size=2, schedule=(((2,), (2,)),))
        >>> normalises_by_batch(s)
        False
        >>> spec = ModelSpec(hidden=(4,), batch_norm="batch")
        >>> normalises_by_batch(Scenario(world_size=2, schedule=(((2,), (2,)),), model=spec))
        True
    """
    if scenario.model.kind != "user":
        return scenario.model.batch_norm == "batch"
    module = build_model(scenario)
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm)
        and not isinstance(m, nn.SyncBatchNorm)
        and m.training
        for m in module.modules()
    )


def _forward_under_autocast(model: nn.Module, dtype: str, device_type: str) -> None:
    """Run ``model``'s forward (not the loss, not backward) under ``torch.autocast``, as a
    training loop's ``with autocast(...): output = model(x)`` does; the hooks keep the model's
    parameter names and run inside any wrapper that calls it. On a float64 model (the exact
    reference) autocast changes nothing: it lowers float32 operations only."""
    active: list[torch.autocast] = []

    def enter(module: nn.Module, args: object) -> None:
        context = torch.autocast(device_type, dtype=torch_dtype(dtype))
        context.__enter__()
        active.append(context)

    def leave(module: nn.Module, args: object, output: object) -> None:
        active.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)  # left even if forward raises


def build_data(
    scenario: Scenario, dtype: str | None = None, device: torch.device | str | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's global batch ``(inputs, targets)``, the same on every rank and here: drawn
    on the CPU, then moved to ``device``."""
    generator = torch.Generator().manual_seed(scenario.seed + 1)
    spec, float_type = scenario.model, torch_dtype(dtype or scenario.dtype)
    batches = []
    for step in range(scenario.steps):
        n = scenario.global_batch(step)
        if spec.kind == "user":
            from .user_models import user_model

            inputs, targets = user_model(spec.factory).batch(n, generator)
        elif spec.kind == "transformer":
            inputs, targets = _token_batch(
                n,
                generator,
                unshifted=scenario.labels == "unshifted",
                # Under any declared objective, so that every objective trains the same data
                # (the diagnosis compares the code with the others on it).
                empty=_first_of_each_micro_batch(scenario, step) if scenario.objective else None,
            )
        elif spec.kind == "conv":
            inputs = torch.randn(n, CONV_CHANNELS, SEQUENCE, generator=generator)
        elif spec.kind == "embedding":
            inputs = torch.randint(0, VOCABULARY, (n, SEQUENCE), generator=generator)
        else:
            inputs = torch.randn(n, spec.in_features, generator=generator)
        if spec.kind in ("user", "transformer"):
            pass
        elif scenario.loss == "cross_entropy":
            targets = torch.randint(0, spec.out_features, (n,), generator=generator)
        else:
            targets = torch.randn(n, spec.out_features, generator=generator)
        if targets.is_floating_point():
            targets = targets.to(float_type)
        if inputs.is_floating_point():
            inputs = inputs.to(float_type)
        if scenario.order:
            # Another order of the same samples: drawn after the data, so the data is the same.
            shuffle = torch.Generator().manual_seed(scenario.seed * 7919 + scenario.order)
            order = torch.randperm(n, generator=shuffle)
            inputs, targets = inputs[order], targets[order]
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def _first_of_each_micro_batch(scenario: Scenario, step: int) -> list[int]:
    """Where each micro-batch of ``step`` starts in its global batch."""
    starts, at = [], 0
    # The schedule the data is drawn for: another scenario's, for a run of its whole batch.
    for sizes in (scenario.drawn_for or scenario.schedule)[step]:
        for size in sizes:
            starts.append(at)
            at += size
    return starts


def _token_batch(
    n: int,
    generator: torch.Generator,
    *,
    unshifted: bool = False,
    empty: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of 1 to TOKENS tokens, padded at the end; a target per position, with
    ``IGNORE_INDEX`` where it must not count: the padding, and some earlier positions (a
    prompt's tokens, say). The last real token of every sequence always counts, so no sample
    is empty. ``unshifted``: at most TOKENS - 1 tokens, so that the last position is always
    padding and labels handed over unshifted lose no target that counts. ``empty``: some
    sequences have no target that counts at all (a prompt with no response), which a sequence
    mean must leave out and a token mean never sees; those at the positions ``empty`` lists
    (each micro-batch's first) always count, so that no micro-batch is without a sequence."""
    lengths = torch.randint(1, TOKENS + (0 if unshifted else 1), (n,), generator=generator)
    inputs = torch.randint(1, VOCABULARY, (n, TOKENS), generator=generator)
    targets = torch.randint(0, VOCABULARY, (n, TOKENS), generator=generator)
    ignored = torch.rand(n, TOKENS, generator=generator) < 0.25
    positions = torch.arange(TOKENS).expand(n, TOKENS)
    padding = positions >= lengths.unsqueeze(1)
    last = positions == (lengths - 1).unsqueeze(1)
    inputs[padding] = PAD_ID
    targets[padding | (ignored & ~last)] = IGNORE_INDEX
    if empty is not None:
        # Drawn after the rest, so the other sequences are those of the same seed without.
        blank = torch.rand(n, generator=generator) < 0.3
        blank[empty] = False
        targets[blank] = IGNORE_INDEX
    return inputs, targets


def count_items(scenario: Scenario, targets: torch.Tensor) -> int:
    """How many loss items ``targets`` hold: samples, or with the token-level loss the tokens
    that count (not ``IGNORE_INDEX``). The mean loss is a mean over these.

    Example::

        count_items(scenario, targets)  # 5 of a (2, 4) batch whose other 3 are padding
    """
    if scenario.loss == "tokens":
        declared = objective(scenario.objective) if scenario.objective else None
        if declared is not None and declared.unit:
            return declared.units(targets != IGNORE_INDEX)
        # The tokens that count: a token mean's items, and a sum's (whose pieces add).
        return int((targets != IGNORE_INDEX).sum())
    return len(targets)


def sums(scenario: Scenario) -> bool:
    """Whether ``scenario`` declares the ``sum`` objective: the loss items' losses added, not
    averaged.

    Example::

        sums(scenario)  # False for the default, a mean over the loss items
    """
    return scenario.objective == "sum"


def normaliser(scenario: Scenario, items: int) -> int:
    """What the summed loss of ``items`` loss items is divided by to give their objective:
    their number under a mean, 1 under a declared sum (whose pieces add unweighted).

    Example::

        normaliser(scenario, 12)  # 12, or 1 under objective="sum"
    """
    return 1 if sums(scenario) else items


@functools.lru_cache(maxsize=32)
def item_counts(scenario: Scenario) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per step, per rank, the loss items of each micro-batch (as ``schedule`` lays out
    samples): the schedule itself unless the loss counts tokens.

    Example::

        item_counts(scenario)[0][1]  # rank 1's micro-batches at step 0: (5, 2) tokens
    """
    if scenario.loss != "tokens":
        return scenario.schedule
    data = build_data(scenario, "float64")
    return tuple(
        tuple(
            tuple(count_items(scenario, y) for _, y in micro_batches(scenario, step, rank, batch))
            for rank in range(scenario.world_size)
        )
        for step, batch in enumerate(data)
    )


def padded_width(scenario: Scenario, targets: torch.Tensor) -> int:
    """The width a batch of sequences is padded to where it is padded to its own longest
    sequence (dynamic padding): the last position any of its targets counts at, plus one; 0
    for data that is no token sequences.

    Example::

        >>> scenario = Scenario(world_size=1, schedule=(((1,),),), loss="tokens",
        ...                     model=ModelSpec(kind="transformer"))
        >>> padded_width(scenario, torch.tensor([[5, -100, 2, -100], [1, -100, -100, -100]]))
        3
    """
    if scenario.loss != "tokens":
        return 0
    counts = (targets != IGNORE_INDEX).any(dim=0)
    return int(counts.nonzero().max()) + 1 if counts.any() else 1


def blank_sequences(scenario: Scenario) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per step, per rank, the sequences of each micro-batch with no token that counts (a
    prompt with no response): drawn under a declared objective, left out of its sequence
    means; none otherwise.

    Example::

        blank_sequences(scenario)[0][1]  # rank 1's micro-batches at step 0: (0, 1) blank
    """
    if scenario.loss != "tokens":
        return tuple(tuple((0,) * len(s) for s in per_rank) for per_rank in scenario.schedule)
    data = build_data(scenario, "float64")
    return tuple(
        tuple(
            tuple(
                int((~(y != IGNORE_INDEX).any(dim=1)).sum())
                for _, y in micro_batches(scenario, step, rank, batch)
            )
            for rank in range(scenario.world_size)
        )
        for step, batch in enumerate(data)
    )


def rank_items(scenario: Scenario, step: int) -> list[int]:
    """The loss items each rank holds at ``step``."""
    return [sum(sizes) for sizes in item_counts(scenario)[step]]


def global_items(scenario: Scenario, step: int) -> int:
    """The loss items of ``step``'s global batch: what its mean loss divides by."""
    return sum(rank_items(scenario, step))


def window_factor(scenario: Scenario, step: int) -> float:
    """How many times ``step``'s objective counts where the declared objective normalises
    by its window (``token-mean@window``): 1 otherwise (see
    :func:`ddp_verify.engine.objectives.window_factor`).

    Example::

        window_factor(scenario, 0)  # 1.5: 30 of a two-step window's 40 tokens
    """
    if not scenario.objective or scenario.window == 1:
        return 1.0
    declared = objective(scenario.objective)
    window = scenario.window_of(step)
    units = [global_items(scenario, s) for s in window]
    return objectives_window_factor(declared, units, step - window.start)


def micro_batches(scenario: Scenario, step: int, rank: int, batch: MicroBatch) -> list[MicroBatch]:
    """``rank``'s micro-batches of ``step``, in order, cut from the step's global ``batch``
    (rank-major, then micro-batch order, as :class:`~ddp_verify.engine.scenario.Scenario`
    lays it out).

    Example::

        inputs, targets = build_data(scenario)[0]
        first = micro_batches(scenario, 0, 1, (inputs, targets))[0]  # rank 1's first
    """
    inputs, targets = batch
    start = scenario.offset(step, rank)
    pieces = []
    for size in scenario.schedule[step][rank]:
        pieces.append((inputs[start : start + size], targets[start : start + size]))
        start += size
    return pieces


LOSS_REDUCTIONS = ("mean", "sum", "none")


def loss_function(scenario: Scenario, reduction: str = "mean") -> nn.Module:
    """The scenario's loss, with mean reduction unless asked otherwise (``sum``: the sum of
    the per-sample losses, so that dividing it by the number of samples gives the mean;
    ``none``: one loss per sample, the form a training loop that weights samples itself asks
    for). A sample's MSE is the mean over its outputs, as the mean reduction counts it.

    Example::

        loss_fn = loss_function(scenario, reduction="sum")
    """
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"reduction must be one of {LOSS_REDUCTIONS}, got {reduction!r}")
    if reduction == "mean" and sums(scenario):
        # The loss of a batch is the declared objective on it: under a sum, the sum.
        reduction = "sum"
    if scenario.recipe.loss:
        return _users_loss(scenario, reduction)
    if scenario.model.aside:
        return _FirstOutput(_loss(scenario, reduction))
    return _loss(scenario, reduction)


def nothing_counts_as_zero(scenario: Scenario, loss: nn.Module) -> nn.Module:
    """``loss``, 0 (joined to the outputs' graph, so that backward leaves zero gradients) on
    a batch with no loss item: the mean over nothing, which a rank that holds no sample in a
    step contributes to every sum; torch's own mean there is 0/0.

    Example::

        >>> s = Scenario(world_size=2, schedule=(((0,), (2,)),))
        >>> loss = nothing_counts_as_zero(s, loss_function(s))
        >>> float(loss(torch.zeros(0, 1, requires_grad=True), torch.zeros(0, 1)))
        0.0
    """
    return _NothingCounts(scenario, loss)


class _NothingCounts(nn.Module):
    def __init__(self, scenario: Scenario, loss: nn.Module) -> None:
        super().__init__()
        self.scenario, self.loss = scenario, loss

    def forward(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        if count_items(self.scenario, targets) == 0:
            first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
            return first.sum() * 0.0
        return self.loss(outputs, targets)


def _users_loss(scenario: Scenario, reduction: str) -> nn.Module:
    """The recipe's loss (:func:`~ddp_verify.engine.recipes.mean_loss`) as the harness's
    loops take it: the mean over a batch's loss items, or ``sum``: that mean times them."""
    from .recipes import mean_loss

    def count(targets: torch.Tensor) -> int:
        return count_items(scenario, targets)

    if reduction == "none":
        raise ValueError(
            "your own loss is called as you wrote it; the harness cannot ask it for one loss "
            "per item (reduction='none'): leave --loss-fn out for this kind"
        )
    loss: nn.Module = mean_loss(scenario.recipe, count)
    if reduction == "sum":
        loss = _Summed(loss, count)
    return _FirstOutput(loss) if scenario.model.aside else loss


class _Summed(nn.Module):
    """A mean loss times its batch's loss items: their summed loss."""

    def __init__(self, loss: nn.Module, count: Callable[[torch.Tensor], int]) -> None:
        super().__init__()
        self.loss, self.count = loss, count

    def forward(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(outputs, targets) * self.count(targets)


class _FirstOutput(nn.Module):
    """``loss`` of a model's first output: the others are left out of the loss."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, outputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
        return self.loss(outputs[0], target)


def _loss(scenario: Scenario, reduction: str) -> nn.Module:
    if scenario.loss == "tokens":
        weights = scenario.seed if scenario.token_weights else None
        if scenario.objective and reduction == "mean":
            return DeclaredObjective(scenario.objective, weights=weights)
        return TokenCrossEntropy(reduction, weights=weights)
    if scenario.loss == "cross_entropy":
        return nn.CrossEntropyLoss(reduction=reduction)
    if reduction == "mean":
        return nn.MSELoss()
    return _PerSampleMSE(summed=reduction == "sum")


class _PerSampleMSE(nn.Module):
    """MSE per sample (the mean over its outputs), as ``CrossEntropyLoss(reduction="none")``
    gives one loss per sample, or their sum: ``nn.MSELoss(reduction="sum")`` would sum over
    outputs too, and its sum over samples would not be samples times the mean."""

    def __init__(self, *, summed: bool) -> None:
        super().__init__()
        self.summed = summed

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per_sample = ((output - target) ** 2).flatten(1).mean(dim=1)
        return per_sample.sum() if self.summed else per_sample


class TokenCrossEntropy(nn.Module):
    """Cross-entropy over every position of a batch of sequences, ``IGNORE_INDEX`` targets
    not counted: ``mean`` divides by the tokens that count, ``sum`` adds them, ``none`` gives
    a loss per position (0 where ignored), as ``F.cross_entropy`` does for logits
    ``(n, length, classes)`` flattened. ``weights``: each position's loss multiplied by its
    :func:`token_weights` of that seed first."""

    def __init__(self, reduction: str = "mean", *, weights: int | None = None) -> None:
        super().__init__()
        self.reduction, self.weights = reduction, weights

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="none" if self.weights is not None else self.reduction,
        )
        if self.weights is None:
            return losses.view(targets.shape) if self.reduction == "none" else losses
        weights = token_weights(self.weights, targets).to(losses.dtype)
        weighted = losses.view(targets.shape) * weights
        if self.reduction == "none":
            return weighted
        total = weighted.sum()
        return total if self.reduction == "sum" else total / (targets != IGNORE_INDEX).sum()


def token_weights(seed: int, targets: torch.Tensor) -> torch.Tensor:
    """Signed weights for each position of ``targets`` (``[batch, seq]``), as advantages
    weight an RL policy loss: a token's weight follows from the seed, its target and its
    position alone, so it is the same wherever the token is trained (the whole global batch
    or a micro-batch padded to its own width). Magnitudes from 0.25 to 1.25, about half of
    them negative.

    Example::

        >>> targets = torch.tensor([[3, 1, -100], [2, -100, -100]])
        >>> narrower = targets[1:, :1]  # the second sequence alone, at its own width
        >>> bool(token_weights(5, targets)[1, 0] == token_weights(5, narrower)[0, 0])
        True
    """
    table = _weight_table(seed).to(targets.device)
    positions = torch.arange(targets.shape[1], device=targets.device).expand_as(targets)
    return table[targets.clamp(min=0) % VOCABULARY, positions % TOKENS]


@functools.cache
def _weight_table(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed ^ 0x7E16)
    magnitudes = 0.25 + torch.rand(VOCABULARY, TOKENS, generator=generator, dtype=torch.float64)
    signs = torch.where(torch.rand(VOCABULARY, TOKENS, generator=generator) < 0.5, -1.0, 1.0)
    return magnitudes * signs


class DeclaredObjective(nn.Module):
    """The token-level loss aggregated as a declared objective (``seq-mean-token-mean``,
    ...) over the batch it is given: each micro-batch's own objective, whose share-weighted
    sum over micro-batches and ranks is the global batch's (see
    :mod:`ddp_verify.engine.objectives`)."""

    def __init__(self, declared: str, *, weights: int | None = None) -> None:
        super().__init__()
        self.objective = objective(declared)
        self.per_token = TokenCrossEntropy("none", weights=weights)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.objective.value(self.per_token(logits, targets), targets != IGNORE_INDEX)


def optimizer_settings(spec: OptimizerSpec) -> tuple[type[torch.optim.Optimizer], dict[str, float]]:
    """The optimizer class and the keyword arguments ``spec`` describes.

    Example::

        cls, kwargs = optimizer_settings(OptimizerSpec("adam", lr=0.01))
        optimizer = cls(model.parameters(), **kwargs)
    """
    if spec.name == "sgd":
        kwargs = {"lr": spec.lr, "momentum": spec.momentum, "weight_decay": spec.weight_decay}
        return torch.optim.SGD, kwargs
    optimizer = torch.optim.Adam if spec.name == "adam" else torch.optim.AdamW
    return optimizer, {"lr": spec.lr, "weight_decay": spec.weight_decay}


def training_optimizer(
    scenario: Scenario,
    params: object,
    *,
    ticks: bool = True,
    watch: Callable[..., None] | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer a run of ``scenario`` trains ``params`` with, and the scheduler the
    user's recipe puts on it (None without one): the user's own where the recipe names them,
    else the scenario's (:func:`build_optimizer`). ``ticks``: the scheduler steps after
    every optimizer step, as a training loop's does; otherwise the code it is handed steps
    it. ``watch``: a step pre-hook that sees the gradients before any clip of the harness's.

    Example::

        optimizer, scheduler = training_optimizer(scenario, model.parameters())
    """
    if not scenario.recipe.optimizer:
        optimizer = build_optimizer(scenario.optimizer, params, watch=watch)
    else:
        from .recipes import user_optimizer

        optimizer = user_optimizer(scenario.recipe, params)
        if watch is not None:
            optimizer.register_step_pre_hook(watch)
    from .recipes import ticked

    return ticked(scenario.recipe, optimizer, by_loop=ticks)


def build_optimizer(
    spec: OptimizerSpec, params: object, *, watch: Callable[..., None] | None = None
) -> torch.optim.Optimizer:
    """The optimizer ``spec`` describes on ``params`` (torch's), clipping and scheduled as it
    says. ``watch``: a step pre-hook that runs before the clip, so that it sees the
    gradients the code under check left (what it records is the code's, not the harness's).
    """
    optimizer, kwargs = optimizer_settings(spec)
    made = optimizer(torch_param_groups(spec, params), **kwargs)
    if watch is not None:
        made.register_step_pre_hook(watch)
    return scheduling(spec, clipping(spec, made))


def torch_param_groups(spec: OptimizerSpec, params: object) -> list[dict[str, object]]:
    """The spec's param groups (:func:`~ddp_verify.engine.optimizers.param_groups`) as
    ``torch.optim`` takes them: one dict per group with its own ``lr`` and ``weight_decay``.

    Example::

        torch.optim.SGD(torch_param_groups(OptimizerSpec(param_groups=2), model.parameters()))
    """
    return [
        {"params": g.params, "lr": g.lr, "weight_decay": g.weight_decay}
        for g in param_groups(spec, params)  # type: ignore[arg-type]
    ]


def scheduling(spec: OptimizerSpec, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` with a ``LambdaLR`` scheduler stepped after each of its steps where the
    spec has an ``lr_decay``: the learning rate of step t is ``lr * lr_decay**t``, set in its
    ``param_groups`` as a training loop's scheduler sets it.

    Example::

        optimizer = scheduling(OptimizerSpec(lr_decay=0.5), torch.optim.SGD(params, lr=0.1))
    """
    if spec.lr_decay is None:
        return optimizer
    decay = spec.lr_decay
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: decay**t)

    def advance(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        scheduler.step()

    optimizer.register_step_post_hook(advance)
    return optimizer


def clipping(spec: OptimizerSpec, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer``, clipping the total gradient norm of its parameters to ``spec.max_norm``
    before every step (``clip_grad_norm_``, as a training loop calls it), if the spec says so.
    Sharded parameters (FSDP2's DTensors) are clipped by the norm of the whole model.

    Example::

        optimizer = clipping(OptimizerSpec(max_norm=1.0), torch.optim.SGD(params, lr=0.1))
    """
    if spec.max_norm is None:
        return optimizer
    max_norm = spec.max_norm

    def clip(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        params = [p for group in opt.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    optimizer.register_step_pre_hook(clip)
    return optimizer


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread for a while (the controller's reference and simulations).

    Tiny models gain nothing from more, and the controller shares the machine with its ranks:
    a second intra-op thread spinning beside them slows every collective.

    Example::

        with one_thread():
            trace = train_reference(scenario)
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
