"""torch's DistributedDataParallel (or a DDP-like wrapper), with sample-weighted losses for
uneven batches."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ..engine.models import clipping, optimizer_settings, scheduling, torch_param_groups
from ..engine.scenario import Scenario
from ..engine.trace import RankTrace
from ..world.naming import option
from .base import DistributedMethod
from .loop import RankRun, fresh_model, train_data_parallel

DDP_TARGET = "torch.nn.parallel:DistributedDataParallel"


class DDP(DistributedMethod):
    """DDP with ``no_sync()`` on all but each rank's last micro-batch of a step.

    DDP averages gradients over the world size, which is the global mean only when every rank
    holds as many samples as the others. Scaling each micro-batch's mean loss by
    ``world_size * m / N`` (m samples in the micro-batch, N in the global batch) makes the
    average sample-weighted, so uneven batches and accumulation give the global mean gradient.

    ``wrapper`` (``"module:callable"``) replaces DDP by a team's own class or factory, called
    as DDP is: ``wrapper(module, **ddp_kwargs)``. ``comm_hook`` is registered with the state
    ``hook_state(module)`` returns for the unwrapped module (``None`` without it).
    ``zero=True`` steps with ``ZeroRedundancyOptimizer`` around the scenario's optimizer;
    a dict (``zero={"parameters_as_bucket_view": True}``) also gives it those keywords, and
    ``zero={"add_param_group": True}`` builds it with the first param group and adds the
    others with ``add_param_group``.
    ``set_to_none=False`` zeroes gradients in place between steps (``zero_grad``'s other
    mode; with ``gradient_as_bucket_view`` the gradients are DDP's bucket views).
    ``checkpoint="reentrant"`` or ``"non_reentrant"`` runs the model's forward under
    activation checkpointing (``torch.utils.checkpoint``), recomputed during backward.
    ``resume_at=k`` saves the model's and optimizer's state dicts before step k (ZeRO's
    consolidated on rank 0, as a training script saves it, and loaded on every rank), builds
    a fresh model (perturbed, so that only the load can make it right), loads them, and
    trains on. ``compile_backend`` compiles the wrapped model with ``torch.compile`` (dynamo's
    DDP optimizer splits the graph at bucket boundaries). ``delay_all_reduce=True`` gives DDP
    the parameters of every module but the first as ``delay_all_reduce_named_params``,
    all-reduced when the first module's first parameter's gradient is ready
    (``param_to_hook_all_reduce``).
    """

    def __init__(
        self,
        *,
        wrapper: str | None = None,
        comm_hook: Callable[..., Any] | None = None,
        hook_state: Callable[[torch.nn.Module], Any] | None = None,
        zero: bool | dict[str, Any] = False,
        set_to_none: bool = True,
        checkpoint: str = "",
        resume_at: int = 0,
        compile_backend: str = "",
        delay_all_reduce: bool = False,
        **ddp_kwargs: Any,
    ) -> None:
        if checkpoint not in CHECKPOINTING:
            raise ValueError(f"checkpoint must be one of {CHECKPOINTING}, got {checkpoint!r}")
        self.wrapper = wrapper
        self.comm_hook = comm_hook
        self.hook_state = hook_state
        self.zero = zero
        self.set_to_none = set_to_none
        self.checkpoint = checkpoint
        self.resume_at = resume_at
        self.compile_backend = compile_backend
        self.delay_all_reduce = delay_all_reduce
        self.ddp_kwargs = ddp_kwargs
        args = [f"{k}={v!r}" for k, v in sorted(ddp_kwargs.items())]
        if not set_to_none:
            args.append("zero_grad(set_to_none=False)")
        if checkpoint:
            args.append(f"checkpoint={checkpoint}")
        if resume_at:
            args.append(f"resumed from a checkpoint before step {resume_at}")
        if compile_backend:
            args.append(f"torch.compile(backend={compile_backend!r})")
        if delay_all_reduce:
            args.append("delay_all_reduce_named_params=<all but the first module's>")
        if comm_hook is not None:
            args.append(f"comm_hook={getattr(comm_hook, '__name__', comm_hook)}")
        if zero:
            args.append(f"zero={zero!r}")
        self.name = f"{'ddp' if wrapper is None else wrapper}({', '.join(args)})"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        wrapped = self.wrap(run.model, scenario)
        optimizer = self._optimizer(run, wrapped)

        def restart(old: Any, old_optimizer: torch.optim.Optimizer) -> Any:
            model_state, optimizer_state = self._save(run, old_optimizer)
            run.model = fresh_model(run)
            run.model.load_state_dict(model_state)
            wrapped = self.wrap(run.model, scenario)
            optimizer = self._optimizer(run, wrapped)
            optimizer.load_state_dict(optimizer_state)
            return wrapped, optimizer

        resume = (self.resume_at, restart) if self.resume_at else None
        return train_data_parallel(
            run, wrapped, optimizer, set_to_none=self.set_to_none, resume=resume
        )

    def _optimizer(self, run: RankRun, wrapped: torch.nn.Module) -> torch.optim.Optimizer:
        params = list(wrapped.parameters())
        if self.zero:
            options = self.zero if isinstance(self.zero, dict) else {}
            return zero_redundancy(run.scenario, params, **options)
        return run.optimizer(params)

    def _save(self, run: RankRun, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """The model's and optimizer's state, through the bytes a checkpoint file holds; ZeRO's
        optimizer state consolidated on rank 0 and sent to every rank, as if read from disk."""
        import torch.distributed as dist

        if self.zero:
            optimizer.consolidate_state_dict(to=0)
            whole = [optimizer.state_dict() if run.rank == 0 else None]
            dist.broadcast_object_list(whole, src=0)
            optimizer_state = whole[0]
        else:
            optimizer_state = optimizer.state_dict()
        return round_trip(run.model.state_dict()), round_trip(optimizer_state)

    def wrap(self, model: torch.nn.Module, scenario: Scenario) -> torch.nn.Module:
        """``model`` in DDP (or the wrapper) with this method's options and hook (on a rank)."""
        kwargs = dict(self.ddp_kwargs)
        factory = load_wrapper(self.wrapper) if self.wrapper else DistributedDataParallel
        if (scenario.model.unused or scenario.model.aside) and accepts(
            factory, "find_unused_parameters"
        ):
            # A parameter forward never uses, or that only an output the loss leaves out
            # reaches, is an error for DDP unless it is told to look; a wrapper without the
            # option must cope by itself.
            kwargs.setdefault("find_unused_parameters", True)
        named = list(model.named_parameters())
        first = named[0][0].rpartition(".")[0] if named else ""
        later = [(n, p) for n, p in named if n.rpartition(".")[0] != first and p.requires_grad]
        if self.delay_all_reduce and not accepts(factory, "delay_all_reduce_named_params"):
            raise NotApplicable(f"{self.label} takes no delay_all_reduce_named_params")
        if self.delay_all_reduce and later:
            # The parameters of every module but the first (the input layer, whose gradients
            # autograd computes after theirs) all-reduced when its first parameter's gradient
            # is ready: the documented use, a hook parameter whose gradient comes last.
            kwargs["param_to_hook_all_reduce"] = named[0][1]
            kwargs["delay_all_reduce_named_params"] = later
        wrapped = factory(
            Checkpointed(model, self.checkpoint) if self.checkpoint else model, **kwargs
        )
        if self.checkpoint == "reentrant" and getattr(wrapped, "find_unused_parameters", False):
            # Decided by what the wrapper asked DDP for, never by the error it would raise: a
            # regression raising that error with the option off still fails.
            raise DocumentedLimitation(self.label, REENTRANT_FIND_UNUSED)
        if self.comm_hook is not None:
            own = [getattr(h, "__name__", repr(h)) for h, _ in getattr(wrapped, "_comm_hooks", ())]
            if own:
                raise CommHookInUse(self.label, self.comm_hook, own)
            state = self.hook_state(model) if self.hook_state is not None else None
            try:
                wrapped.register_comm_hook(state, self.comm_hook)
            except RuntimeError as exc:
                if "register_comm_hook" not in str(exc) or "once" not in str(exc):
                    raise
                raise CommHookInUse(self.label, self.comm_hook, []) from None
        if self.compile_backend:
            return torch.compile(wrapped, backend=self.compile_backend, dynamic=True)
        return wrapped

    @property
    def label(self) -> str:
        return self.wrapper or "DistributedDataParallel"


# The method's own keywords (how it trains around the model), not the DDP constructor's.
METHOD_OPTIONS = frozenset(
    name
    for name, parameter in inspect.signature(DDP.__init__).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY and name != "wrapper"
)
CHECKPOINTING = ("", "reentrant", "non_reentrant")


def round_trip(state: Any) -> Any:
    """``state`` saved with ``torch.save`` and loaded back, as from a checkpoint file."""
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


class Checkpointed(torch.nn.Module):
    """``inner`` whose forward runs under activation checkpointing: nothing but the inputs is
    kept, and the forward is recomputed during backward. The reentrant form needs an input
    that requires grad (torch documents it), so floating inputs are made to."""

    def __init__(self, inner: torch.nn.Module, how: str) -> None:
        super().__init__()
        self.inner = inner
        self.reentrant = how == "reentrant"

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self.reentrant and inputs.is_floating_point():
            inputs = inputs.detach().requires_grad_()
        return checkpoint(self.inner, inputs, use_reentrant=self.reentrant)


class NotApplicable(RuntimeError):
    """What the test checks cannot be checked on this wrapper, for a reason the conformance
    suite skips with (raised on the ranks, where the wrapper is built)."""


# DDP's own words (its class docstring): reentrant checkpointing works "when there are no
# unused parameters in the model ... (make sure you are not passing find_unused_parameters=True
# to DDP)".
REENTRANT_FIND_UNUSED = (
    "reentrant activation checkpointing (use_reentrant=True) with "
    "find_unused_parameters=True: DDP documents this as unsupported ('make sure you are not "
    "passing find_unused_parameters=True to DDP'); checkpoint with use_reentrant=False"
)


class DocumentedLimitation(NotApplicable):
    """The wrapper's options meet a combination DDP documents as unsupported."""

    def __init__(self, wrapper: str, limitation: str) -> None:
        self.wrapper, self.limitation = wrapper, limitation
        super().__init__(f"{wrapper}: {limitation}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.wrapper, self.limitation))


class CommHookInUse(NotApplicable):
    """The wrapper registered a communication hook of its own: DDP takes one per model, so
    a hook under test cannot be registered beside it."""

    def __init__(self, wrapper: str, hook: Callable[..., Any] | str, own: list[str]) -> None:
        self.wrapper = wrapper
        self.hook = hook if isinstance(hook, str) else getattr(hook, "__name__", repr(hook))
        self.own = own
        theirs = f" ({', '.join(own)})" if own else ""
        super().__init__(
            f"{wrapper} registers its own communication hook{theirs}; DDP takes one per model, "
            f"so {self.hook} cannot be checked on it (check the wrapper's own hook as "
            f"{option('kind', 'comm-hook')})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.wrapper, self.hook, self.own))


def zero_redundancy(
    scenario: Scenario,
    params: list[torch.nn.Parameter],
    *,
    add_param_group: bool = False,
    **zero_kwargs: Any,
) -> torch.optim.Optimizer:
    """``ZeroRedundancyOptimizer`` sharding the scenario's optimizer (same class and settings)
    over the ranks; ``zero_kwargs`` are its own (``parameters_as_bucket_view``). With
    ``add_param_group``, built with the first param group, the others added after."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    optimizer, kwargs = optimizer_settings(scenario.optimizer)
    groups = torch_param_groups(scenario.optimizer, params)
    first = groups[:1] if add_param_group else groups
    zero = ZeroRedundancyOptimizer(first, optimizer_class=optimizer, **zero_kwargs, **kwargs)
    for group in groups[len(first) :]:
        zero.add_param_group(group)
    return scheduling(scenario.optimizer, clipping(scenario.optimizer, zero))


def accepts(factory: Callable[..., Any], keyword: str) -> bool:
    """Whether ``factory`` takes ``keyword`` (True when its signature cannot be read).

    Example::

        accepts(DistributedDataParallel, "static_graph")  # True
    """
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in parameters)


def load_wrapper(target: str) -> Callable[..., Any]:
    """``"module:callable"`` → the callable (a DDP-like class or factory).

    Example::

        wrapper = load_wrapper("torch.nn.parallel:DistributedDataParallel")
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"expected a DDP wrapper as module:callable, got {target!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import {module_name!r} for the DDP wrapper {target!r}: {exc}; make it "
            "importable (install it, or run from the directory that holds it)"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{module_name!r} has no {attribute!r} (DDP wrapper {target!r})")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"the DDP wrapper {target!r} is not callable")
    return found


def ddp(**ddp_kwargs: Any) -> DDP:
    """torch's DistributedDataParallel; ``ddp_kwargs`` go to its constructor, except
    ``wrapper``, ``comm_hook``, ``hook_state`` and ``zero`` (see :class:`DDP`).

    Example::

        world.assert_equivalent(ddp(bucket_cap_mb=1), scenario)
        world.assert_equivalent(ddp(comm_hook=default.allreduce_hook), scenario)
    """
    return DDP(**ddp_kwargs)
