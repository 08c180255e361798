"""Jobs run on every rank for the suite's refusal properties: each call torch's data-parallel
API refuses (SyncBatchNorm training on CPU tensors, DDP's constructions and comm hooks,
ZeroRedundancyOptimizer's, fully_shard's and the model averagers'), made alike on every rank
before any collective, its error returned as ``Type: message`` (None where accepted)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist


def refusals(
    calls: dict[str, Any],
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError, RuntimeError),
) -> dict[str, str | None]:
    """Make each call: the error it raised (of ``errors``) as ``Type: message``, or None where
    it was accepted."""
    said: dict[str, str | None] = {}
    for name, call in calls.items():
        try:
            call()
        except errors as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
    return said


def sync_batch_norm_on_cpu() -> str | None:
    """A training forward of SyncBatchNorm on CPU tensors under the process group: the
    ValueError's message, or None where it trained."""
    layer = torch.nn.SyncBatchNorm(2).train()
    try:
        layer(torch.randn(4, 2))
    except ValueError as exc:
        return str(exc)
    return None


def ddp_refusals() -> dict[str, str | None]:
    """Each DistributedDataParallel construction and comm hook its code refuses, made alike on
    every rank (each refused before DDP's first collective): ``Type: message``, or None where
    it was accepted (and the wrapped model discarded)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model() -> torch.nn.Module:
        return torch.nn.Linear(2, 2)

    frozen = model().requires_grad_(False)
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    flat = init_device_mesh("cpu", (1, dist.get_world_size()))
    made: dict[str, Any] = {
        "delay_all_reduce_named_params alone": lambda: DDP(
            model(), delay_all_reduce_named_params=list(model().named_parameters())
        ),
        "process_group and device_mesh both": lambda: DDP(
            model(), process_group=dist.group.WORLD, device_mesh=flat
        ),
        "a two-dimensional device_mesh": lambda: DDP(model(), device_mesh=flat),
        "a module with nothing to train": lambda: DDP(frozen),
        "device_ids of two devices": lambda: DDP(model(), device_ids=[0, 1]),
        "device_ids for a CPU module": lambda: DDP(model(), device_ids=[0]),
        "a module on two kinds of device": lambda: DDP(mixed),
        "a module with uninitialized parameters": lambda: DDP(torch.nn.LazyLinear(2)),
    }
    # PowerSGD's state: error feedback and warm start need two iterations of plain all-reduce
    # first (DDP rebuilds its buckets after the first), and refuse a start before that.
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    made["PowerSGD with error feedback from iteration 1"] = lambda: PowerSGDState(
        None, start_powerSGD_iter=1, warm_start=False
    )
    made["PowerSGD with warm start from iteration 1"] = lambda: PowerSGDState(
        None, start_powerSGD_iter=1, use_error_feedback=False
    )
    made["PowerSGD with neither from iteration 1"] = lambda: PowerSGDState(
        None, start_powerSGD_iter=1, use_error_feedback=False, warm_start=False
    )
    said = refusals(made)
    wrapped = DDP(model())

    def annotated(bucket: Any, returns: Any) -> Any:
        # Real annotations, not this module's postponed strings, as DDP reads them.
        def hook(state: object, bucket: object) -> object:
            raise AssertionError("never called")

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        hook.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("state", kind),
                inspect.Parameter("bucket", kind, annotation=bucket),
            ],
            return_annotation=returns,
        )
        return hook

    future = torch.futures.Future[torch.Tensor]
    bucket_annotated = annotated(int, future)
    returns_annotated = annotated(dist.GradBucket, int)
    accepted = {"a comm hook annotated as documented": annotated(dist.GradBucket, future)}

    hooks: dict[str, Any] = {
        "a comm hook that is not callable": 3,
        "a comm hook whose bucket is not a GradBucket": bucket_annotated,
        "a comm hook that returns no Future of a tensor": returns_annotated,
    }
    registered = {
        name: (lambda hook=hook: wrapped.register_comm_hook(None, hook))
        for name, hook in {**hooks, **accepted}.items()
    }
    return {**said, **refusals(registered, (ValueError, TypeError))}


class _Towers(torch.nn.Module):
    """Three layers, of which the forward runs all but ``skipped`` (None: all)."""

    def __init__(self, skipped: str | None) -> None:
        super().__init__()
        self.first, self.second, self.third = (torch.nn.Linear(2, 2) for _ in range(3))
        self.skipped = skipped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in ("first", "second", "third"):
            if name != self.skipped:
                x = getattr(self, name)(x)
        return x


def ddp_unused_parameters(skipped: str | None) -> dict[str, str | None]:
    """DDP without ``find_unused_parameters`` over a model whose forward leaves layer
    ``skipped`` unused: per debug level (``TORCH_DISTRIBUTED_DEBUG``'s OFF, INFO, DETAIL, set
    for the construction and restored), the RuntimeError's message at the second iteration,
    or None where both trained."""
    from ..world.runtime import rank_device

    device = rank_device()
    said: dict[str, str | None] = {}
    for level in (dist.DebugLevel.OFF, dist.DebugLevel.INFO, dist.DebugLevel.DETAIL):
        before = dist.get_debug_level()
        dist.set_debug_level(level)
        try:
            ddp = torch.nn.parallel.DistributedDataParallel(
                _Towers(skipped).to(device),
                device_ids=[device.index] if device.type == "cuda" else None,
            )
            for _ in range(2):
                ddp(torch.ones(1, 2, device=device)).sum().backward()
        except RuntimeError as exc:
            said[level.name] = str(exc)
        else:
            said[level.name] = None
        finally:
            dist.set_debug_level(before)
    return said


def zero_refusals() -> dict[str, str | None]:
    """Each ZeroRedundancyOptimizer construction and call its code refuses, made alike on
    every rank before any collective: ``Type: message``, or None where accepted."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO

    p = torch.nn.Parameter(torch.ones(2))
    mixed = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2).double())]
    made = ZeRO([torch.nn.Parameter(torch.ones(3))], optimizer_class=torch.optim.SGD, lr=0.1)
    calls: dict[str, Any] = {
        "a tensor for the parameters": lambda: ZeRO(p, optimizer_class=torch.optim.SGD, lr=0.1),
        "no parameters": lambda: ZeRO([], optimizer_class=torch.optim.SGD, lr=0.1),
        "a group without params": lambda: ZeRO(
            [{"lr": 0.1}], optimizer_class=torch.optim.SGD, lr=0.1
        ),
        "parameters of two dtypes": lambda: ZeRO(mixed, optimizer_class=torch.optim.SGD, lr=0.1),
        "a functional optimizer without overlap": lambda: ZeRO(
            [p], optimizer_class=_functional_sgd(), lr=0.1
        ),
        "state_dict before it was consolidated": lambda: made.state_dict(),
    }
    # overlap_with_ddp=True defers the local optimizer until DDP's buckets are rebuilt (its
    # hook's first iterations): the state methods document a RuntimeError until then.
    for method in ("consolidate_state_dict", "state_dict", "load_state_dict"):
        calls[f"{method} with overlap_with_ddp before DDP's buckets are rebuilt"] = (
            lambda method=method: _overlapped_zero(method)
        )
    return refusals(calls)


def averager_refusals() -> dict[str, str | None]:
    """Each model averager construction its code refuses or warns about, and the edge cases
    it accepts, over the world (no subgroup made, so nothing collective runs): ``Type:
    message`` for an error or a warning, None where accepted without one."""
    import warnings

    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager as Hierarchical,
    )

    world = dist.get_world_size()
    calls: dict[str, Any] = {
        "periodic, warmup_steps -1": lambda: PeriodicModelAverager(period=2, warmup_steps=-1),
        "periodic, period 0": lambda: PeriodicModelAverager(period=0),
        "periodic, period 1": lambda: PeriodicModelAverager(period=1),
        "periodic, period 2 from step 0": lambda: PeriodicModelAverager(period=2, warmup_steps=0),
        "hierarchical, no levels": lambda: Hierarchical({}),
        "hierarchical, a period 0": lambda: Hierarchical({0: world}),
        "hierarchical, a largest period of 1": lambda: Hierarchical({1: world}),
        "hierarchical, a last size not the group's": lambda: Hierarchical({2: world + 1}),
        "hierarchical, warmup_steps -1": lambda: Hierarchical({2: world}, warmup_steps=-1),
        "hierarchical, period 2 from step 0": lambda: Hierarchical({2: world}, warmup_steps=0),
    }
    said: dict[str, str | None] = {}
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            said.update(refusals({name: call}))
        if said[name] is None and caught:
            said[name] = f"{caught[0].category.__name__}: {caught[0].message}"
    return said


def _overlapped_zero(method: str) -> Any:
    from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO

    zero = ZeRO([torch.nn.Parameter(torch.ones(3))], optimizer_class=torch.optim.SGD,
                overlap_with_ddp=True, lr=0.1)  # fmt: skip
    call = getattr(zero, method)
    return call({"state": {}, "param_groups": []}) if method == "load_state_dict" else call()


def _functional_sgd() -> type:
    from torch.distributed.optim.functional_sgd import _FunctionalSGD

    return _FunctionalSGD


def fsdp_refusals() -> dict[str, str | None]:
    """Each fully_shard call and FSDPModule setting its code refuses, made alike on every
    rank (before any collective): ``Type: message``, or None where accepted."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    from torch.distributed.tensor import Shard

    size = dist.get_world_size()

    class Scalar(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

    sharded = fully_shard(torch.nn.Linear(2, 2))
    calls: dict[str, Any] = {
        "a container without forward": lambda: fully_shard(
            torch.nn.ModuleList([torch.nn.Linear(2, 2)])
        ),
        "reshard_after_forward of another type": lambda: fully_shard(
            torch.nn.Linear(2, 2), reshard_after_forward=1.5
        ),
        "reshard_after_forward that does not divide the shards": lambda: fully_shard(
            torch.nn.Linear(2, 2), reshard_after_forward=size + 1
        ),
        "a scalar parameter": lambda: fully_shard(Scalar()),
        "a three-dimensional mesh": lambda: fully_shard(
            torch.nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, 1, size))
        ),
        # HSDP's replicate and shard dimensions are found by name.
        "a two-dimensional mesh without names": lambda: fully_shard(
            torch.nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, size))
        ),
        "set_reshard_after_forward of another type": lambda: sharded.set_reshard_after_forward(1),
        "a forward method the module lacks": lambda: register_fsdp_forward_method(
            sharded, "no_such_method"
        ),
        # shard_placement_fn's placements: a dimension the parameter has, and (off dimension
        # 0, where torch pads) one the shards divide.
        # One-dimensional parameters only: a weight of a size the world does not divide
        # would be refused first, as uneven (at 4 ranks, a Linear(2, 2)'s).
        "a shard dimension the parameter lacks": lambda: fully_shard(
            torch.nn.LayerNorm(2), shard_placement_fn=lambda param: Shard(1)
        ),
    }
    # Modules sharded as one group run forward only under a root that holds them all: the
    # first forward of a group alone (its lazy init) refuses.
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    fully_shard([first, second])
    calls["a group of modules as the root"] = lambda: first(torch.ones(1, 2))
    if size > 1:  # every size divides among one rank
        calls["uneven shards on dimension 1"] = lambda: fully_shard(
            torch.nn.Linear(size + 1, 2, bias=False), shard_placement_fn=lambda param: Shard(1)
        )
    if hasattr(sharded, "set_reduce_scatter_max_input_buffers"):  # torch 2.13 on
        calls.update(_reduce_scatter_buffer_refusals())
    return refusals(
        calls, (ValueError, TypeError, NotImplementedError, AssertionError, RuntimeError)
    )


def _reduce_scatter_buffer_refusals() -> dict[str, Any]:
    """The reduce-scatter input-buffer cap's refusals (``set_reduce_scatter_max_input_buffers``:
    an int of at least 1, and 1 alone with the symmetric-memory reduce-scatter, refused at the
    first forward), and that refusal's edge: the default cap with that comm, accepted."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import SymmMemReduceScatter

    def symmetric_memory_comm() -> SymmMemReduceScatter:
        try:
            return SymmMemReduceScatter(dist.group.WORLD)
        except RuntimeError:
            # No symmetric memory here (it allocates through NCCL): an instance without its
            # allocator set up. It is never called: the check reads its type at the first
            # forward, before any reduce-scatter, and these forwards run without grad.
            comm = SymmMemReduceScatter.__new__(SymmMemReduceScatter)
            comm._group = dist.group.WORLD
            return comm

    def first_forward(cap: int | None) -> None:
        module = fully_shard(torch.nn.Linear(2, 2))
        module.set_custom_reduce_scatter(symmetric_memory_comm())
        if cap is not None:
            module.set_reduce_scatter_max_input_buffers(cap)
        with torch.no_grad():
            module(torch.ones(1, 2))

    def cap(value: Any) -> None:
        fully_shard(torch.nn.Linear(2, 2)).set_reduce_scatter_max_input_buffers(value)

    return {
        "a reduce-scatter buffer cap below 1": lambda: cap(0),
        "a reduce-scatter buffer cap given as a bool": lambda: cap(True),
        "a reduce-scatter buffer cap above 1 with the symmetric-memory reduce-scatter": (
            lambda: first_forward(2)
        ),
        "the default reduce-scatter buffer cap with the symmetric-memory reduce-scatter": (
            lambda: first_forward(None)
        ),
    }


def assert_refused(results: list[dict[str, Any]], refused: dict[str, str], who: str) -> None:
    """The check of every refusal property (in the test process): on every rank, each call
    of ``refused`` raised, with words matching its pattern (``re.match`` on ``Type:
    message``).

    Example::

        >>> assert_refused([{"x": "ValueError: no"}], {"x": r"ValueError: no"}, "f")
    """
    import re

    for rank, said in enumerate(results):
        for name, pattern in refused.items():
            got = said.get(name)
            assert got is not None, f"{name}: accepted by {who} on rank {rank}"
            assert re.match(pattern, got), (
                f"{name}: {who} on rank {rank} raised {got!r}, expected {pattern!r}"
            )
