"""Jobs of ``test_state_dict``, run on every rank: a small model trained one step as it is
wrapped for data-parallel training (not at all, DDP, FSDP2, FSDP1, activation checkpointing
inside DDP), its state taken with ``torch.distributed.checkpoint.state_dict`` and loaded into
a fresh copy; returned whole and keyed as the state dict gives it; and trees of FSDP1 units,
as ``fsdp_modules`` finds them."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ddp_verify.conformance.checkpoint_jobs import gathered

STEP_INPUT_SEED = 7


class Fused(torch.nn.Module):
    """A lookup table fused with another (torchtune's FusionEmbedding's shape): its state dict
    keeps the table's own key (``weight``, not ``table.weight``) by a state-dict hook and a
    load pre-hook, and tells the state-dict API so by a method, named ``modifiers``, that maps
    the key it shows to the level it hides (``StateDictOptions.dsd_fqn_modifiers`` names it;
    ``_fqn_modifiers`` by default)."""

    def __init__(self, modifiers: str) -> None:
        super().__init__()
        self.table = torch.nn.Linear(4, 4, bias=False, dtype=torch.float64)
        self.fusion = torch.nn.Linear(4, 4, bias=False, dtype=torch.float64)
        self._register_state_dict_hook(Fused._shown)
        self._register_load_state_dict_pre_hook(Fused._hidden, with_module=True)
        setattr(self, modifiers, lambda: {"weight": "table"})

    @staticmethod
    def _shown(module: torch.nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
        state[f"{prefix}weight"] = state.pop(f"{prefix}table.weight")

    @staticmethod
    def _hidden(module: torch.nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
        if f"{prefix}weight" in state:
            state[f"{prefix}table.weight"] = state.pop(f"{prefix}weight")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.table(h) + 0.5 * self.fusion(h)


class Net(torch.nn.Module):
    """A linear layer, a BatchNorm (buffers beside parameters), a frozen layer, a head and a
    layer tied to it; where ``shared``, a layer in two blocks under two names; where ``fused``
    names a method, a :class:`Fused` table told to the state-dict API by it."""

    def __init__(self, seed: int, shared: bool = False, fused: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(seed)
        # No bias before the BatchNorm: its gradient would be rounding noise alone, which
        # Adam's first step scales to the learning rate.
        self.embed = torch.nn.Linear(3, 4, bias=False, dtype=torch.float64)
        self.norm = torch.nn.BatchNorm1d(4, dtype=torch.float64)
        self.frozen = torch.nn.Linear(4, 4, dtype=torch.float64)
        self.frozen.requires_grad_(False)
        # One module in two blocks, under two names (as weight-shared layers are): the first
        # name ``named_parameters`` gives (``left.0``) names its parameters' optimizer state,
        # and a state dict walked in another order would name them ``right.1``.
        self.blocks = shared
        if shared:
            layer = torch.nn.Linear(4, 4, dtype=torch.float64)
            self.left = torch.nn.Sequential(layer)
            self.right = torch.nn.Sequential(torch.nn.Tanh(), layer)
        self.head = torch.nn.Linear(4, 1, dtype=torch.float64)
        # A weight tied to the head's, as language models tie their embeddings: one parameter
        # under two names, the first of which (the head's) names its optimizer state.
        self.twin = torch.nn.Linear(4, 1, bias=False, dtype=torch.float64)
        self.twin.weight = self.head.weight
        self.fused = fused is not None
        if fused is not None:
            self.lookup = Fused(fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.frozen(self.norm(self.embed(x))))
        if self.blocks:
            h = self.left(h) - 0.5 * self.right(h)
        if self.fused:
            h = torch.tanh(self.lookup(h))
        return self.head(h) + 0.5 * self.twin(h * h)


def batch() -> torch.Tensor:
    """The one step's inputs: every rank the same, so that every wrapping trains alike."""
    generator = torch.Generator().manual_seed(STEP_INPUT_SEED)
    return torch.randn(6, 3, generator=generator, dtype=torch.float64)


def optimizer_for(model: torch.nn.Module, name: str) -> Any:
    """The optimizer ``name`` names over the model's trained parameters; ``"two"``: a tuple of
    two (SGD with momentum over the first layer, Adam at another rate over the rest), as
    models trained by several optimizers hand them to the state-dict API together."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if name == "adam":
        return torch.optim.Adam([p for _, p in trainable], lr=0.05)
    if name == "two":
        # "embed" names the first layer under every wrapper's prefixes.
        first = [p for n, p in trainable if "embed" in n]
        rest = [p for n, p in trainable if "embed" not in n]
        return torch.optim.SGD(first, lr=0.1, momentum=0.9), torch.optim.Adam(rest, lr=0.02)
    return torch.optim.SGD([p for _, p in trainable], lr=0.05, momentum=0.9)


def optimizers_in(optim: Any) -> tuple[torch.optim.Optimizer, ...]:
    """The optimizers of :func:`optimizer_for`'s result, one or several."""
    return tuple(optim) if isinstance(optim, tuple) else (optim,)


def trained(seed: int, optimizer: str, shared: bool = False,
            fused: str | None = None) -> tuple[torch.nn.Module, Any]:  # fmt: skip
    """The plain model, trained one step (the oracle's side, and the ranks' before wrapping)."""
    model = Net(seed, shared, fused)
    optim = optimizer_for(model, optimizer)
    model(batch()).pow(2).mean().backward()
    for each in optimizers_in(optim):
        each.step()
    return model, optim


def _wrapped(seed: int, wrapper: str, optimizer: str, step: bool, shared: bool,
             fused: str | None = None) -> tuple[Any, Any]:  # fmt: skip
    model = Net(seed, shared, fused)
    if wrapper == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif wrapper == "checkpointed_ddp":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        model.embed = checkpoint_wrapper(model.embed)
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif wrapper == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.embed)
        fully_shard(model)
    elif wrapper == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # FSDP1, unit by unit as FSDP2 above; on the CPU it needs its device named, and a
        # unit holding frozen and trained parameters together needs the original parameters.
        cpu = torch.device("cpu")
        model.embed = FSDP(model.embed, device_id=cpu, use_orig_params=True)
        model = FSDP(model, device_id=cpu, use_orig_params=True)
    optim = optimizer_for(model, optimizer)
    if step:
        model(batch()).pow(2).mean().backward()
        for each in optimizers_in(optim):
            each.step()
    return model, optim


def _whole(value: Any) -> Any:
    if hasattr(value, "full_tensor") or hasattr(value, "local_shards"):
        # A DTensor, or FSDP1's sharded state: a ShardedTensor, put together from every
        # rank's shards at the offsets each names (not by torch's own gathering).
        return gathered(value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_whole(v) for v in value)
    return value


def state_dicts(case: dict[str, Any]) -> dict[str, Any]:
    """The case's model, wrapped and trained one step: its model and optimizer state dicts as
    ``get_state_dict`` gives them under the case's options (made whole), and, after
    ``set_state_dict`` of them into a fresh wrapped copy (another seed; from rank 0 by
    ``set_model_state_dict`` and ``set_optimizer_state_dict`` where broadcast, unless the
    case says ``together``; the model alone where ``fused``, unless the case says
    ``fused_optimizer``), that copy's own state dicts taken with full, unflattened
    options."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    options = StateDictOptions(**case["options"])
    wrapping = (case["wrapper"], case["optimizer"], True, bool(case.get("shared")),
                case.get("fused"))  # fmt: skip
    model, optim = _wrapped(case["seed"], *wrapping)
    model_state, optim_state = get_state_dict(model, optim, options=options)
    out = {"model": _whole(model_state), "optimizer": _whole(optim_state)}
    # Loading: rank 0's full state broadcast where the options say so, each rank's own else.
    fresh, fresh_optim = _wrapped(case["seed"] + 1, *wrapping)
    broadcast = bool(case["options"].get("broadcast_from_rank0"))
    if broadcast and dist.get_rank() != 0:
        model_state, optim_state = {}, {}
    if case.get("fused") and not case.get("fused_optimizer"):
        # A level hidden by its module's state dict: the optimizer's state is keyed by the
        # full name and looked for under the shown one (the known issue, checked apart).
        set_model_state_dict(fresh, model_state, options=options)
        fresh_optim = None
    elif broadcast and not case.get("together"):
        # Model and optimizer apart: set_state_dict takes a rank's empty model state for an
        # optimizer-only load and skips the broadcast rank 0 makes (the known issue).
        set_model_state_dict(fresh, model_state, options=options)
        set_optimizer_state_dict(fresh, fresh_optim, optim_state, options=options)
    else:
        set_state_dict(fresh, fresh_optim, model_state_dict=model_state,
                       optim_state_dict=optim_state, options=options)  # fmt: skip
    full = StateDictOptions(full_state_dict=True)
    if fresh_optim is None:
        loaded_model, loaded_optim = get_model_state_dict(fresh, options=full), None
    else:
        loaded_model, loaded_optim = get_state_dict(fresh, fresh_optim, options=full)
    out["loaded model"] = _whole(loaded_model)
    out["loaded optimizer"] = _whole(loaded_optim)
    return out


def plain_state_loaded(seed: int, wrapper: str, modifiers: str) -> dict[str, Any]:
    """The plain model with a :class:`Fused` table (told by the method ``modifiers``) trained
    one step, its ``state_dict()`` (as a file holds it) loaded into a fresh wrapped copy with
    ``set_model_state_dict`` (full, strict, ``dsd_fqn_modifiers`` naming the method); the
    copy's state as its own ``state_dict`` gives it, made whole, the wrapper's prefix gone."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    plain, _ = trained(seed, "adam", fused=modifiers)
    fresh, _ = _wrapped(seed + 1, wrapper, "adam", False, False, modifiers)
    options = StateDictOptions(full_state_dict=True, strict=True, dsd_fqn_modifiers=modifiers)
    set_model_state_dict(fresh, plain.state_dict(), options=options)
    inner = fresh.module if wrapper in ("ddp", "checkpointed_ddp") else fresh
    return dict(_whole(dict(inner.state_dict())))


def submodule_states(seed: int, wrapper: str) -> dict[bool, dict[str, Any]]:
    """The case's model wrapped and trained one step: the model state ``get_state_dict`` gives
    for its head alone (``submodules``, deprecated: the warning caught), keyed with the
    head's prefix and without (``keep_submodule_prefixes``), made whole."""
    import warnings

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = _wrapped(seed, wrapper, "adam", True, False)
    inner = model.module if wrapper in ("ddp", "checkpointed_ddp") else model
    got: dict[bool, dict[str, Any]] = {}
    for keep in (True, False):
        options = StateDictOptions(keep_submodule_prefixes=keep)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            state, _ = get_state_dict(model, optim, submodules={inner.head}, options=options)
        got[keep] = dict(_whole(dict(state)))
    return got


def _fsdp1_tree(tree: Any) -> torch.nn.Module:
    """A module tree from its description: ``("linear", wrap)`` or ``("seq", wrap, [...])``,
    each wrapped in FSDP1 where ``wrap`` says (on the CPU, its device named)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    kind, wrap, *children = tree
    module: torch.nn.Module
    if kind == "linear":
        module = torch.nn.Linear(3, 3, dtype=torch.float64)
    else:
        module = torch.nn.Sequential(*(_fsdp1_tree(child) for child in children[0]))
    return FSDP(module, device_id=torch.device("cpu")) if wrap else module


def fsdp1_found(tree: Any) -> dict[str, list[str]]:
    """The tree built (FSDP1 where described), and, by the names ``named_modules`` gives them:
    every module in its order and which of them are FSDP1's, what ``fsdp_modules`` finds,
    and, after a forward (which makes the outermost units roots), what it finds ``root_only``."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = _fsdp1_tree(tree)
    name_of = {id(m): name for name, m in model.named_modules()}
    found = [name_of[id(m)] for m in FSDP.fsdp_modules(model)]
    model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    return {
        "units": [name for name, m in model.named_modules() if isinstance(m, FSDP)],
        "found": found,
        "roots": [name_of[id(m)] for m in FSDP.fsdp_modules(model, root_only=True)],
    }
