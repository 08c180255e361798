"""torch's ``fully_shard`` (FSDP2), trained by the data-parallel loop that trains DDP."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace
from .base import DistributedMethod
from .loop import RankRun, fresh_model, train_data_parallel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import DataParallelMeshDims

# How accumulating micro-batches turn communication off (FullyShard's ``accumulation``).
ACCUMULATIONS = ("gradient_sync", "all_reduce", "micro_batching")


class FullyShard(DistributedMethod):
    """``fully_shard`` on the model: each rank keeps a shard of every parameter; gradients are
    reduce-scattered (averaged over the world), so each micro-batch's loss is scaled by
    ``world_size * m / N`` as for DDP, and accumulation turns gradient synchronisation off for
    all but a step's last micro-batch. The trace records full tensors (gathered from the
    shards).

    ``replicas=R`` shards over a 2-D mesh instead (HSDP): R groups of world size / R ranks,
    each sharding the model, gradients reduce-scattered in a group and all-reduced across the
    groups. ``accumulation`` says how micro-batches before a step's last skip communication:
    ``"gradient_sync"`` (``set_requires_gradient_sync(False)``: no reduction at all, the
    unsharded gradients accumulate) or, for HSDP, ``"all_reduce"``
    (``set_requires_all_reduce(False)``: reduce-scattered in the group every micro-batch, the
    partial results accumulate, all-reduced across the groups with the last one), or
    ``"micro_batching"`` (no reduction, and the parameters kept unsharded between
    micro-batches: ``set_reshard_after_backward(False)``, ``set_is_last_backward(False)``).
    ``reduce_dtype`` (a ``MixedPrecisionPolicy``) reduces gradients in that dtype.
    ``resume_at=k`` checkpoints model and optimizer with ``torch.distributed.checkpoint``
    before step k (each rank writes its shards), shards a fresh (perturbed) model, loads the
    checkpoint into it and trains on; ``checkpoint_options`` are the ``StateDictOptions``
    (``full_state_dict``, ``cpu_offload``, ``flatten_optimizer_state_dict``, ``strict``,
    ``broadcast_from_rank0``) both state-dict calls get. ``shard_options`` change where and when,
    never what: ``reshard_after_forward`` (``fully_shard``'s), ``set_reshard_after_forward`` (the
    method, after sharding), ``offload`` (``CPUOffloadPolicy``), ``shard_dim`` (a
    ``shard_placement_fn`` returning ``Shard(shard_dim)`` for every parameter whose dimension it
    names is 0, padded to any size, or divides evenly, None, dimension 0, elsewhere; a negative one
    counts from the last dimension, as torch's do), ``spmd`` (the mesh as a full SPMD mesh: every
    parameter first a DTensor replicated on it, as a model parallelised over the whole mesh has
    them, and ``dp_mesh_dims`` naming the dimensions FSDP shards and replicates on; inputs enter as
    DTensors replicated on the mesh and outputs leave as local tensors, as each rank's batch is its
    own), ``per_module`` (``fully_shard`` on every module that holds parameters of its own first,
    then on the root, as models are sharded layer by layer; a parameter two modules share stays with
    the root), ``grouped`` (those modules given to one ``fully_shard`` call as a list, one group for
    them all, before the root; it takes the place of ``per_module``), ``meta`` (deferred
    initialisation: the model is sharded on the meta device, where it holds shapes only, then
    materialised with ``to_empty`` on the world's device and given its initial values shard by
    shard, as a model too large for one device is built), ``checkpoint`` (activation checkpointing
    of each of those modules by torch's composable ``checkpoint``, applied before sharding as
    training recipes do: its activations are recomputed in backward, where the forward hooks run
    again under FSDP's pre-backward state and the module must be unsharded for the recomputation,
    not resharded after it)."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        reduce_dtype: str | None = None,
        resume_at: int = 0,
        accumulation: str = "gradient_sync",
        checkpoint_options: dict[str, bool] | None = None,
        shard_options: dict[str, object] | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        if accumulation not in ACCUMULATIONS:
            raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
        if accumulation == "all_reduce" and replicas == 1:
            raise ValueError(
                "accumulation='all_reduce' skips the all-reduce across replica groups: it needs "
                "replicas > 1 (HSDP)"
            )
        self.replicas = replicas
        self.reduce_dtype = reduce_dtype
        self.accumulation = accumulation
        options = [f"replicas={replicas}"] if replicas > 1 else []
        if accumulation == "all_reduce":
            options.append("accumulating with set_requires_all_reduce(False)")
        elif accumulation == "micro_batching":
            options.append(
                "micro-batching with set_reshard_after_backward(False), set_is_last_backward(False)"
            )
        if reduce_dtype:
            options.append(f"reduce_dtype={reduce_dtype}")
        self.resume_at = resume_at
        self.checkpoint_options = dict(checkpoint_options or {})
        self.shard_options = dict(shard_options or {})
        unknown = set(self.shard_options) - {
            "reshard_after_forward", "set_reshard_after_forward", "offload", "shard_dim", "spmd",
            "per_module", "meta", "grouped", "checkpoint",
        }  # fmt: skip
        if unknown:
            raise ValueError(f"unknown shard_options {sorted(unknown)}")
        options += [f"{k}={v}" for k, v in self.shard_options.items()]
        if resume_at:
            said = ", ".join(f"{k}={v}" for k, v in self.checkpoint_options.items())
            options.append(
                f"resumed from a distributed checkpoint before step {resume_at}"
                + (f" (StateDictOptions({said}))" if said else "")
            )
        self.name = f"fully_shard({', '.join(options)})"

    def train_rank(self, scenario: Scenario) -> RankTrace:
        run = RankRun(scenario)
        self._shard(run)
        optimizer = run.optimizer(run.model.parameters())

        def restart(
            old: Callable[..., torch.Tensor], old_optimizer: torch.optim.Optimizer
        ) -> tuple[Callable[..., torch.Tensor], torch.optim.Optimizer]:
            model = run.model
            with _checkpoint_directory(run) as directory:
                _save(model, old_optimizer, directory, self.checkpoint_options)
                run.model = fresh_model(run)
                self._shard(run)
                optimizer = run.optimizer(run.model.parameters())
                _load(run.model, optimizer, directory, self.checkpoint_options)
            return run.model, optimizer

        return train_data_parallel(
            run,
            run.model,
            optimizer,
            no_sync=lambda: _without_gradient_sync(run.model, self.accumulation),
            resume=(self.resume_at, restart) if self.resume_at else None,
        )

    def _shard(self, run: RankRun) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.distributed.fsdp import fully_shard as shard

        if run.world_size % self.replicas:
            raise ValueError(
                f"replicas={self.replicas} does not divide the world size {run.world_size}"
            )
        # The world's device, said outright: by default FSDP2 takes a CUDA mesh wherever CUDA
        # is available, and would move a CPU world's model to a GPU.
        chosen = self.shard_options
        if chosen.get("spmd"):
            mesh = _spmd_mesh(run.device.type, run.world_size, self.replicas)
        elif self.replicas > 1:
            shape = (self.replicas, run.world_size // self.replicas)
            mesh = init_device_mesh(run.device.type, shape, mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(run.device.type, (run.world_size,))
        policy = MixedPrecisionPolicy(
            reduce_dtype=getattr(torch, self.reduce_dtype) if self.reduce_dtype else None
        )
        extra: dict[str, object] = {}
        if "reshard_after_forward" in chosen:
            extra["reshard_after_forward"] = chosen["reshard_after_forward"]
        if chosen.get("offload"):
            from torch.distributed.fsdp import CPUOffloadPolicy

            extra["offload_policy"] = CPUOffloadPolicy()
        if "shard_dim" in chosen:
            from torch.distributed.tensor import Shard

            dim, size = int(str(chosen["shard_dim"])), mesh.size(-1)

            def placement(param: torch.nn.Parameter) -> Shard | None:
                # Given as drawn (Shard(0), Shard(-1) too): fully_shard normalises a
                # negative dimension itself.
                at = dim + param.dim() if dim < 0 else dim
                fits = at == 0 or (param.dim() > at and param.size(at) % size == 0)
                return Shard(dim) if fits else None

            extra["shard_placement_fn"] = placement
        if chosen.get("spmd"):
            extra["dp_mesh_dims"] = _on_the_full_mesh(run.model, mesh)
        initial = None
        if chosen.get("meta"):
            # Sharded where it has no values: fully_shard must leave meta tensors where they
            # are (moving them to the device would need values they do not have).
            initial = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            _to_meta(run.model)
        layers = _layers(run.model)
        if chosen.get("checkpoint"):
            from torch.distributed._composable import checkpoint

            for module in layers:
                checkpoint(module)
        if chosen.get("grouped") and layers:
            # One call on a list of modules: one group, one all-gather for them all.
            shard(layers, mesh=mesh, mp_policy=policy, **extra)
        elif chosen.get("per_module"):
            for module in layers:
                shard(module, mesh=mesh, mp_policy=policy, **extra)
        shard(run.model, mesh=mesh, mp_policy=policy, **extra)
        if initial is not None:
            _materialise(run.model, initial, run.device)
        if "set_reshard_after_forward" in chosen:
            run.model.set_reshard_after_forward(bool(chosen["set_reshard_after_forward"]))


def _to_meta(model: torch.nn.Module) -> None:
    """Move ``model``'s parameters and buffers to the meta device in place, as a model built
    under ``torch.device("meta")`` holds them: each parameter object kept (swapped, not
    replaced, where ``Module.to`` would make a new one), so tied weights stay tied."""
    seen: set[int] = set()
    with torch.no_grad():
        for param in model.parameters():  # each shared parameter once
            if id(param) not in seen:
                seen.add(id(param))
                meta = torch.nn.Parameter(torch.empty_like(param, device="meta"),
                                          requires_grad=param.requires_grad)  # fmt: skip
                torch.utils.swap_tensors(param, meta)
        for module in model.modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    module._buffers[name] = torch.empty_like(buffer, device="meta")


def _materialise(
    model: torch.nn.Module, initial: dict[str, torch.Tensor], device: torch.device
) -> None:
    """Give a model sharded on the meta device storage on ``device`` and its ``initial``
    values: each sharded parameter its own shard of the full value (``distribute_tensor`` onto
    its mesh and placements), each buffer its value."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if isinstance(param, DTensor):
                full = initial[name].to(device=device, dtype=param.dtype)
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
            else:
                param.copy_(initial[name])
        for name, buffer in model.named_buffers():
            if name in initial:
                buffer.copy_(initial[name])


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules below the root that hold parameters of their own, none shared with another
    module (FSDP2 gives a shared parameter to one group only: it stays with the root)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    return [
        module
        for module in model.modules()
        if module is not model
        and any(True for _ in module.parameters(recurse=False))
        and all(owners[id(p)] == 1 for p in module.parameters(recurse=False))
    ]


# One SPMD mesh per rank process and layout, as a training process has: DTensor hands out an
# earlier mesh equal to a new one, which fully_shard's SPMD path then refuses as "different mesh
# objects" (a torch issue: findings/fsdp_spmd_mesh_identity.py).
_SPMD_MESHES: dict[tuple[object, ...], DeviceMesh] = {}


def _spmd_mesh(device_type: str, world_size: int, replicas: int) -> DeviceMesh:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.distributed_c10d._get_default_group()), device_type, world_size, replicas)
    if key not in _SPMD_MESHES:
        shape = (replicas, world_size // replicas) if replicas > 1 else (world_size,)
        names = ("dp_replicate", "dp_shard") if replicas > 1 else ("dp_shard",)
        _SPMD_MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _SPMD_MESHES[key]


def _on_the_full_mesh(model: torch.nn.Module, mesh: DeviceMesh) -> DataParallelMeshDims:
    """Make ``model`` a model of the full SPMD ``mesh`` (parameters DTensors replicated on
    every dimension, inputs in as replicated DTensors, outputs out as local tensors) and
    return the ``DataParallelMeshDims`` that say which dimensions are data parallel."""
    from torch.distributed.fsdp import DataParallelMeshDims
    from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor

    names = tuple(mesh.mesh_dim_names or ())
    everywhere = [Replicate()] * len(names)

    def inputs(
        module: torch.nn.Module, args: tuple[Any, ...], device_mesh: DeviceMesh
    ) -> tuple[Any, ...]:
        # Each rank's batch is its own: "replicated" only in that no rank's rows are
        # gathered, as data parallelism wants (FSDP reduces the gradients it makes).
        return tuple(
            DTensor.from_local(a, device_mesh, everywhere, run_check=False)
            if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
            else a
            for a in args
        )

    def outputs(module: torch.nn.Module, out: object, device_mesh: DeviceMesh) -> object:
        return out.to_local() if isinstance(out, DTensor) else out

    made: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}  # id: (old, new)

    def replicated(name: str, module: torch.nn.Module, device_mesh: DeviceMesh) -> None:
        # Module by module, as distribute_module goes, but one DTensor per parameter: a
        # parameter two modules share (tied weights) stays shared.
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in made:
                data = distribute_tensor(param.data, device_mesh, everywhere)
                made[id(param)] = (param, torch.nn.Parameter(data, param.requires_grad))
            setattr(module, key, made[id(param)][1])

    distribute_module(model, mesh, replicated, inputs, outputs)
    return DataParallelMeshDims(
        shard="dp_shard", replicate="dp_replicate" if "dp_replicate" in names else None
    )


@contextlib.contextmanager
def _checkpoint_directory(run: RankRun) -> Iterator[str]:
    """A directory every rank writes its shards to: rank 0's temporary one, removed after."""
    import shutil
    import tempfile

    import torch.distributed as dist

    made = [tempfile.mkdtemp(prefix="ddp_verify-dcp-") if run.rank == 0 else None]
    dist.broadcast_object_list(made, src=0)
    try:
        yield str(made[0])
    finally:
        dist.barrier()
        if run.rank == 0:
            shutil.rmtree(str(made[0]), ignore_errors=True)


def _save(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    directory: str,
    options: dict[str, bool],
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(**options)
    )
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)


def _load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    directory: str,
    options: dict[str, bool],
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    chosen = StateDictOptions(**options)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=chosen)
    state = {"model": model_state, "optimizer": optimizer_state}
    # get_state_dict gives a fresh optimizer state for every parameter, the ones that never
    # had a gradient included; the checkpoint has none for those (nothing ever stepped them):
    # they keep their fresh, unused state.
    dcp.load(state, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=chosen,
    )


@contextlib.contextmanager
def _without_gradient_sync(model: torch.nn.Module, accumulation: str) -> Iterator[None]:
    """FSDP2's counterpart of DDP's ``no_sync()``: no reduction at all, or (HSDP) no
    all-reduce across the replica groups; ``"micro_batching"`` also keeps the parameters
    unsharded after backward and says the backward is not the last
    (``set_reshard_after_backward(False)``, ``set_is_last_backward(False)``), as a
    micro-batching loop does to skip the all-gathers between micro-batches."""
    turns = [
        model.set_requires_all_reduce
        if accumulation == "all_reduce"
        else model.set_requires_gradient_sync
    ]
    if accumulation == "micro_batching":
        turns += [model.set_reshard_after_backward, model.set_is_last_backward]
    for turn in turns:
        turn(False)
    try:
        yield
    finally:
        for turn in turns:
            turn(True)


def fully_shard(
    *,
    replicas: int = 1,
    reduce_dtype: str | None = None,
    resume_at: int = 0,
    accumulation: str = "gradient_sync",
    checkpoint_options: dict[str, bool] | None = None,
    shard_options: dict[str, object] | None = None,
) -> FullyShard:
    """FSDP2's ``fully_shard`` (HSDP with ``replicas`` > 1; gradients reduced in
    ``reduce_dtype``; resumed from a ``torch.distributed.checkpoint`` before step
    ``resume_at``, with ``checkpoint_options``). Every forward all-gathers parameters, so
    scenarios need equal micro-batch counts per rank (``scenarios(same_micro_batch_counts=True)``).

    Example::

        world.assert_equivalent(fully_shard(), scenario)
        world.assert_equivalent(fully_shard(replicas=2), scenario)  # a 2 x 2 mesh at size 4
        world.assert_equivalent(fully_shard(replicas=2, accumulation="all_reduce"), scenario)
    """
    return FullyShard(
        replicas=replicas,
        reduce_dtype=reduce_dtype,
        resume_at=resume_at,
        accumulation=accumulation,
        checkpoint_options=checkpoint_options,
        shard_options=shard_options,
    )
