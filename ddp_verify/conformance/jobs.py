"""Jobs the conformance suite runs on every rank (importable there by name)."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any

import torch
import torch.distributed as dist

from ..engine.scenario import Scenario
from ..methods.ddp import DDP
from ..methods.loop import RankRun
from ..world.runtime import rank_device


def buffers_after_forward(
    method: DDP, scenario: Scenario, reassigned: bool = False
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each rank shifts its buffer by its rank *after* wrapping (so only the broadcast before
    each forward can make them agree again), runs one forward through the wrapped model and
    returns the buffer it then holds. ``reassigned``: the shifted buffer is a new tensor
    assigned to the module (``module.scale = module.scale + rank``), not the old one edited
    in place, as modules that recompute a buffer do; DDP must broadcast the new one. Returns
    the buffer before the forward (shifted) and after it."""
    run = RankRun(scenario)
    wrapped = method.wrap(run.model, scenario)
    with torch.no_grad():
        if reassigned:
            run.model.scale = run.model.scale + run.rank
        else:
            run.model.scale.add_(run.rank)
    before = tuple(float(v) for v in run.model.scale)
    inputs, _ = run.micro_batches(0)[0]
    wrapped(inputs)
    return before, tuple(float(v) for v in run.model.scale)


def state_after_wrapping(method: DDP, scenario: Scenario) -> tuple[float, ...]:
    """Each rank shifts every parameter and buffer by its rank, wraps the model, and returns
    its state then (DDP's constructor must have given every rank rank 0's)."""
    run = RankRun(scenario)
    with torch.no_grad():
        for tensor in [*run.model.parameters(), *run.model.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(run.rank)
    method.wrap(run.model, scenario)
    state = [t.detach().reshape(-1) for t in [*run.model.parameters(), *run.model.buffers()]]
    return tuple(float(v) for v in torch.cat(state))


class _GivenGradient(torch.nn.Module):
    """A parameter whose gradient is exactly the input: ``loss = (weight * x).sum()``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(size, device=rank_device()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x).sum()


def gradient_through(
    method: DDP, scenario: Scenario, gradients: tuple[tuple[float, ...], ...]
) -> tuple[float, ...]:
    """Rank r's gradient is ``gradients[r]`` (float32); returns what the wrapped model's
    backward (its communication hook included) leaves as the gradient."""
    rank = dist.get_rank()
    module = _GivenGradient(len(gradients[rank]))
    wrapped = method.wrap(module, scenario)
    given = torch.tensor(gradients[rank], dtype=torch.float32, device=rank_device())
    wrapped(given).backward()
    return tuple(float(v) for v in module.weight.grad)


def objects_gathered(objects: tuple[object, ...], dst: int) -> tuple[object, object]:
    """Rank r contributes ``objects[r]``: what ``all_gather_object`` gives it, and what
    ``gather_object`` gives it (the list on ``dst``, None elsewhere). A collective that raises
    (an object that does not unpickle) is a wrong answer, returned as its message: the other
    ranks have already finished the collective, so nothing is left waiting."""
    rank, size = dist.get_rank(), dist.get_world_size()

    def attempt(collect: Any) -> object:
        try:
            return collect()
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"

    def all_gather() -> list[object]:
        received: list[object] = [None] * size
        dist.all_gather_object(received, objects[rank])
        return received

    def gather() -> list[object] | None:
        received: list[object] | None = [None] * size if rank == dst else None
        dist.gather_object(objects[rank], received, dst=dst)
        return received

    return attempt(all_gather), attempt(gather)


def objects_sent(objects: tuple[object, ...], src: int) -> tuple[object, object]:
    """Rank ``src`` holds ``objects`` (one per rank), the others a list of as many Nones: what
    ``broadcast_object_list`` leaves in each rank's list, and what ``scatter_object_list``
    gives each rank (``objects[rank]``, sent by ``src``). A collective that raises is a wrong
    answer, returned as its message (see :func:`objects_gathered`)."""
    rank, size = dist.get_rank(), dist.get_world_size()

    def attempt(collect: Any) -> object:
        try:
            return collect()
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"

    def broadcast() -> list[object]:
        held: list[object] = list(objects) if rank == src else [None] * size
        dist.broadcast_object_list(held, src=src)
        return held

    def scatter() -> object:
        received: list[object] = [None]
        dist.scatter_object_list(received, list(objects) if rank == src else None, src=src)
        return received[0]

    return attempt(broadcast), attempt(scatter)


def gradients_inside_and_after_no_sync(method: DDP, scenario: Scenario) -> tuple[bool, bool]:
    """(whether ranks' gradients differ after a backward inside ``no_sync()``, whether they
    agree after the next backward outside it), from one all-gather each."""
    run = RankRun(scenario)
    wrapped = method.wrap(run.model, scenario)
    inputs = torch.cat([x for x, _ in run.micro_batches(0)])
    targets = torch.cat([y for _, y in run.micro_batches(0)])
    with wrapped.no_sync():
        run.loss_fn(wrapped(inputs[:1]), targets[:1]).backward()
    differ = not _same_on_every_rank(run.model)
    run.loss_fn(wrapped(inputs[1:]), targets[1:]).backward()
    return differ, _same_on_every_rank(run.model)


def _same_on_every_rank(model: torch.nn.Module) -> bool:
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    flat = torch.cat(grads) if grads else torch.zeros(0, device=rank_device())
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def powersgd_state(rank: int, module: torch.nn.Module, **options: object) -> object:
    """A PowerSGD hook state, built on each rank (it holds the process group)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    return PowerSGDState(process_group=None, matrix_approximation_rank=rank, **options)


def batched_powersgd_full_rank_state(module: torch.nn.Module, **options: object) -> object:
    """A state for ``batched_powerSGD_hook`` whose rank is the side of the square matrix the
    hook folds a bucket into (every trainable parameter fits the first bucket of these tiny
    models): a full-rank approximation, hence exact. A larger rank fails an assertion."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return powersgd_state(math.ceil(math.sqrt(trainable)), module, **options)


class RecordedPowerSGD:
    """A ``PowerSGDState`` (torch's defaults but ``matrix_approximation_rank`` and
    ``start_powerSGD_iter``) and, per call of the hook, what it was given and what it did.
    ``PowerSGDState`` has ``__slots__``: the records live beside it, not on it."""

    def __init__(self, rank: int, start: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        self.state = PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start
        )
        self.records: list[dict[str, Any]] = []


# The states built on this rank, newest last: the wrapper registers the hook with the state
# and keeps it to itself.
_RECORDED: list[RecordedPowerSGD] = []


def recorded_powersgd_state(rank: int, start: int, module: torch.nn.Module) -> RecordedPowerSGD:
    """The hook state :func:`recording_powersgd_hook` takes, built on each rank."""
    _RECORDED.append(RecordedPowerSGD(rank, start))
    return _RECORDED[-1]


# No annotations: DDP refuses a hook whose bucket is annotated as anything but dist.GradBucket,
# and under ``from __future__ import annotations`` an annotation is a string.
def recording_powersgd_hook(recorded, bucket):  # type: ignore[no-untyped-def]
    """torch's ``powerSGD_hook`` (looked up on its module at every call), recording what it
    was given (the bucket's local gradients and the residual it carried in), what it returned
    (the gradient DDP applies) and the residual it kept."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as module

    state, index = recorded.state, bucket.index()
    carried = state.error_dict.get(index)
    record: dict[str, Any] = {
        "iteration": state.iter,
        "bucket": index,
        "local": bucket.buffer().detach().to("cpu", torch.float64, copy=True),
        "carried": None if carried is None else carried.to("cpu", torch.float64, copy=True),
        "shapes": [tuple(g.shape) for g in bucket.gradients()],
    }

    def keep(fut: Any) -> Any:
        value = fut.value()
        applied = value[0] if isinstance(value, list) else value
        kept = state.error_dict.get(index)
        record["applied"] = applied.detach().to("cpu", torch.float64, copy=True)
        record["kept"] = None if kept is None else kept.to("cpu", torch.float64, copy=True)
        recorded.records.append(record)
        return applied

    return module.powerSGD_hook(state, bucket).then(keep)


def powersgd_records(method: DDP, scenario: Scenario, iterations: int) -> list[dict[str, Any]]:
    """``iterations`` optimizer steps through the wrapped model (the scenario's steps over
    again, each rank's micro-batches in one backward); the hook's records on this rank."""
    _RECORDED.clear()
    run = RankRun(scenario)
    wrapped = method.wrap(run.model, scenario)
    (recorded,) = _RECORDED
    optimizer = run.optimizer(wrapped.parameters())
    for iteration in range(iterations):
        inputs, targets = (
            torch.cat(part)
            for part in zip(*run.micro_batches(iteration % scenario.steps), strict=True)
        )
        optimizer.zero_grad()
        run.loss_fn(wrapped(inputs), targets).backward()
        optimizer.step()
    _RECORDED.clear()
    return recorded.records


class _Dropping(torch.nn.Module):
    """A layer, dropout, a non-linearity and a head: dropout's mask is drawn from the RNG."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.Dropout(0.5), torch.nn.Tanh()
        )
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def dropout_gradients(
    method: DDP, width: int, seed: int, draws: tuple[int, int]
) -> tuple[tuple[float, ...], ...]:
    """The gradients, flattened, of one backward through the wrapped dropout model (the
    ``method``'s checkpointing, if any) for RNG seeds ``draws`` set before the forward; the
    model and inputs are the same on every call for ``seed``, the data this rank's own."""
    from ddp_verify.engine.scenario import Scenario

    device = rank_device()
    results = []
    for draw in draws:
        torch.manual_seed(seed)
        model = _Dropping(width).to(device, torch.float64)
        x = torch.randn(4, width, dtype=torch.float64, device=device) + dist.get_rank()
        world = dist.get_world_size()
        wrapped = method.wrap(model, Scenario(world, schedule=(((4,),) * world,)))
        torch.manual_seed(draw)  # the mask: the forward's draw, and the recompute's
        if device.type == "cuda":
            torch.cuda.manual_seed(draw)
        wrapped(x).pow(2).mean().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        results.append(tuple(float(v) for v in flat))
    return tuple(results)


# Collectives whose subgroups the suite takes only as the first ranks (see below).
ROOTED = ("gather", "scatter", "reduce", "all_to_all")


def differentiable_collective(
    kind: str,
    inputs: list[list[float]],
    weights: list[list[list[float]]],
    src: int,
    group_size: int | None = None,
    splits: list[list[int]] | None = None,
    op: str = "sum",
) -> tuple[list[list[float]], list[float]]:
    """Rank r sends ``inputs[r]`` through ``torch.distributed.nn.functional``'s ``kind``
    (``all_gather``, ``all_reduce``, ``broadcast`` from the group's ``src``-th rank,
    ``reduce_scatter`` of ``inputs[r]`` cut in one equal chunk per rank of the group,
    ``all_to_all_single`` sending ``splits[r][j]`` values to the group's j-th rank; ``gather``
    to, ``scatter`` of ``inputs[r]`` cut in one chunk per rank from, ``reduce`` to the group's
    ``src``-th rank; ``all_to_all`` of one chunk per rank), over the world or (``group_size``)
    the subgroup of consecutive ranks ``new_subgroups`` puts it in (for :data:`ROOTED` kinds,
    the first ``group_size`` ranks only; the others return nothing); ``op`` ("sum", "avg")
    is the reducing collectives' ``ReduceOp``;
    backpropagates the loss ``sum_i <weights[r][i], output_i>``; returns its outputs and its
    input's gradient."""
    from torch.distributed.nn import functional as differentiable

    rank, device = dist.get_rank(), rank_device()
    if group_size is None:
        group, size, first = dist.group.WORLD, dist.get_world_size(), 0
    elif kind in ROOTED:
        # The subgroup of the first ranks only (group ranks = global ranks): the others sit
        # out. Elsewhere these mix group and global ranks, as broadcast does (pytorch#130515).
        group, size, first = dist.new_group(list(range(group_size))), group_size, 0
        if rank >= group_size:
            return [], []
    else:
        group, _ = dist.new_subgroups(group_size=group_size)  # every rank calls it
        size, first = group_size, rank - rank % group_size
    x = torch.tensor(inputs[rank], dtype=torch.float64, device=device, requires_grad=True)
    reduce_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}[op]
    if kind == "all_gather":
        outputs = list(differentiable.all_gather(x, group=group))
    elif kind == "all_reduce":
        outputs = [differentiable.all_reduce(x, op=reduce_op, group=group)]
    elif kind == "broadcast":
        outputs = [differentiable.broadcast(x, first + src, group=group)]
    elif kind == "reduce_scatter":
        out = torch.empty(x.numel() // size, dtype=torch.float64, device=device)
        outputs = [
            differentiable.reduce_scatter(out, list(x.chunk(size)), op=reduce_op, group=group)
        ]
        # chunk() of a tensor with fewer elements than chunks would give fewer: never drawn
    elif kind == "all_to_all_single":
        assert splits is not None
        mine = rank - first
        received = [splits[first + j][mine] for j in range(size)]
        out = torch.empty(sum(received), dtype=torch.float64, device=device)
        outputs = [differentiable.all_to_all_single(out, x, received, splits[rank], group=group)]
    elif kind == "gather":
        outputs = list(differentiable.gather(x, first + src, group=group))
    elif kind == "scatter":
        outputs = [differentiable.scatter(list(x.chunk(size)), first + src, group=group)]
    elif kind == "reduce":
        outputs = [differentiable.reduce(x, first + src, op=reduce_op, group=group)]
    elif kind == "all_to_all":
        chunks = list(x.chunk(size))
        received = [torch.empty_like(c) for c in chunks]
        outputs = list(differentiable.all_to_all(received, chunks, group=group))
    else:
        raise ValueError(f"no differentiable collective {kind!r}")
    loss = sum(
        (torch.tensor(w, dtype=torch.float64, device=device) * y).sum()
        for w, y in zip(weights[rank], outputs, strict=True)
    )
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    assert x.grad is not None
    return [y.tolist() for y in outputs], x.grad.tolist()


def periodic_averaging(
    values: list[list[float]],
    deltas: list[list[list[float]]],
    period: int,
    warmup: int,
    members: list[int] | None,
    via: str,
    resume_at: int = 0,
    add_group: bool = False,
) -> list[list[float]]:
    """Rank r's parameters start at ``values[r]`` (split in two tensors) and move by
    ``deltas[t][r]`` at step t, then a ``PeriodicModelAverager(period, warmup)`` over
    ``members`` (a subgroup; None: the world) averages them, called directly (``via
    "averager"``, the parameters as one optimizer's parameter groups for ``"groups"``) or by
    ``PostLocalSGDOptimizer`` stepping SGD (``"optimizer"``; with ``add_group`` the second
    tensor joins it through ``add_param_group``; with ``resume_at=k`` its ``state_dict()``
    after step k - 1 is loaded into a fresh optimizer and averager that train on). The
    parameters after each step."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    rank, device = dist.get_rank(), rank_device()
    group = dist.new_group(members) if members is not None else None  # every rank calls it
    start = torch.tensor(values[rank], dtype=torch.float64, device=device)
    half = max(1, start.numel() // 2)
    params = [torch.nn.Parameter(start[:half].clone()), torch.nn.Parameter(start[half:].clone())]

    def post_local(params: list[torch.nn.Parameter]) -> tuple[Any, Any]:
        averager = PeriodicModelAverager(period=period, warmup_steps=warmup, process_group=group)
        first = params[:1] if add_group else params
        optimizer = PostLocalSGDOptimizer(torch.optim.SGD(first, lr=1.0), averager)
        if add_group:
            optimizer.add_param_group({"params": params[1:]})
        return averager, optimizer

    averager, optimizer = post_local(params)
    after = []
    for step, delta in enumerate(deltas):
        if via == "optimizer" and resume_at and step == resume_at:
            saved = optimizer.state_dict()
            params = [torch.nn.Parameter(p.detach().clone()) for p in params]
            averager, optimizer = post_local(params)
            optimizer.load_state_dict(saved)
        move = torch.tensor(delta[rank], dtype=torch.float64, device=device)
        if via == "optimizer":
            optimizer.zero_grad()
        # As in training, each parameter has a gradient: the averager averages only those
        # (its documented get_params_to_average). SGD at lr 1 on -delta moves it by delta.
        params[0].grad, params[1].grad = -move[:half], -move[half:]
        if via == "optimizer":
            optimizer.step()
        else:
            with torch.no_grad():
                params[0].add_(move[:half])
                params[1].add_(move[half:])
            averager.average_parameters([{"params": params}] if via == "groups" else iter(params))
        after.append(torch.cat([p.detach().reshape(-1) for p in params]).tolist())
    return after


def hierarchical_averaging(
    values: list[list[float]],
    deltas: list[list[list[float]]],
    levels: list[tuple[int, int]],
    warmup: int,
) -> list[list[float]]:
    """Rank r's parameters start at ``values[r]`` and move by ``deltas[t][r]`` at step t; a
    ``HierarchicalModelAverager`` with ``period_group_size_dict`` ``levels`` (period, group
    size; ordered) and ``warmup_steps`` averages them after each step, its ``process_group``
    the subgroup of consecutive ranks the top level's size makes where that is smaller than
    the world. The parameters after each step."""
    from collections import OrderedDict

    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager,
    )

    rank, device = dist.get_rank(), rank_device()
    params = [torch.nn.Parameter(torch.tensor(values[rank], dtype=torch.float64, device=device))]
    top = levels[-1][1]
    group = None if top == dist.get_world_size() else dist.new_subgroups(group_size=top)[0]
    averager = HierarchicalModelAverager(
        OrderedDict(levels), warmup_steps=warmup, process_group=group
    )
    after = []
    for delta in deltas:
        params[0].grad = torch.zeros_like(params[0])  # only parameters with gradients average
        with torch.no_grad():
            params[0].add_(torch.tensor(delta[rank], dtype=torch.float64, device=device))
        averager.average_parameters(iter(params))
        after.append(params[0].detach().tolist())
    return after


def fused_optimizer_steps(
    lr: float, momentum: float, inputs: list[list[list[float]]]
) -> list[list[float]]:
    """DDP with ``_register_fused_optim(SGD, lr, momentum)`` (the optimizer runs inside the
    backward, on the averaged gradient): rank r trains on ``inputs[step][r]`` (rows of 3), no
    ``optimizer.step()`` of its own. The parameters after each step."""
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double().to(device)
    wrapped = DistributedDataParallel(model)
    wrapped._register_fused_optim(torch.optim.SGD, lr=lr, momentum=momentum)
    after = []
    for step in inputs:
        wrapped.zero_grad()
        x = torch.tensor(step[rank], dtype=torch.float64, device=device)
        wrapped(x).pow(2).sum().backward()
        after.append([float(v) for p in model.parameters() for v in p.detach().reshape(-1)])
    return after


class _Casting(torch.nn.Linear):
    """A bias-free ``Linear`` that casts its input to its weight's dtype and records the
    dtype the input arrived in."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out, bias=False)
        self.received = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.received = str(x.dtype)
        return super().forward(x.to(self.weight.dtype))


def fully_shard_linear_gradients(
    inputs: list[list[float]],
    weights: list[list[float]],
    dtype: str,
    param_dtype: str | None = None,
    output_dtype: str | None = None,
    factor: float | None = None,
    force_sum: bool = False,
    deprecated_name: bool = False,
    group_size: int | None = None,
    cast_forward_inputs: bool = True,
) -> tuple[str, str, list[list[float]]]:
    """A bias-free ``Linear`` in ``dtype``, ``fully_shard``-ed over the world: rank r's loss
    is ``(model(inputs[r]) * weights[r]).sum()`` for one sample, so its weight's gradient is
    ``outer(weights[r], inputs[r])``. With ``param_dtype``, the standard mixed-precision recipe
    (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32, output_dtype)``); ``factor`` is
    given to ``set_gradient_divide_factor`` (its deprecated name
    ``set_reduce_scatter_divide_factor`` with ``deprecated_name``), ``force_sum`` to
    ``set_force_sum_reduction_for_comms``; ``group_size`` shards over the 1-D mesh of that
    many consecutive ranks sliced from a 2-D one (the whole world by default);
    ``cast_forward_inputs`` goes to the policy (the module casts its input to its weight's
    dtype itself, as a module fed uncast inputs must). Returns the forward's output dtype
    (with, for ``param_dtype``, the dtype the module's forward received its input in), the
    sharded gradient's dtype and the full reduced gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(0)
    real = getattr(torch, dtype)
    model = _Casting(len(inputs[0]), len(weights[0])).to(device, real)
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, param_dtype) if param_dtype else None,
        reduce_dtype=torch.float32 if param_dtype else None,
        output_dtype=getattr(torch, output_dtype) if output_dtype else None,
        cast_forward_inputs=cast_forward_inputs,
    )
    size = dist.get_world_size()
    if group_size is None:
        mesh = init_device_mesh(device.type, (size,))
    else:
        shape, names = (size // group_size, group_size), ("outer", "shard")
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)["shard"]
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if factor is not None:
        if deprecated_name:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.set_reduce_scatter_divide_factor(factor)
        else:
            model.set_gradient_divide_factor(factor)
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    x = torch.tensor([inputs[rank]], dtype=real, device=device)
    c = torch.tensor([weights[rank]], dtype=real, device=device)
    y = model(x)
    (y * c).sum().backward()
    grad = model.weight.grad
    assert grad is not None
    seen = f" from {model.received}" if param_dtype else ""
    return str(y.dtype) + seen, str(grad.dtype), grad.full_tensor().double().tolist()


def ddp_mixed_precision_gradients(
    inputs: list[list[float]],
    weights: list[list[float]],
    param_dtype: str,
    steps: int,
) -> tuple[str, list[str], list[list[list[float]]], list[list[float]]]:
    """A bias-free float32 ``Linear`` under ``DistributedDataParallel(mixed_precision=
    _MixedPrecision(param_dtype, reduce_dtype=float32))``: rank r's loss is
    ``(model(inputs[r]) * weights[r]).sum()`` for one sample, ``steps`` times with SGD(lr=1/64)
    between. Returns the dtype its module received its input in and computed in, each step's
    gradient dtype and gradient, and the parameters after training (what DDP keeps in full
    precision)."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.parallel.distributed import _MixedPrecision

    rank, device = dist.get_rank(), rank_device()
    model = _Casting(len(inputs[0]), len(weights[0])).to(device, torch.float32)
    with torch.no_grad():  # the same small integers on every rank: exact in any dtype
        model.weight.copy_(torch.arange(model.weight.numel()).reshape(model.weight.shape) % 5)
    policy = _MixedPrecision(param_dtype=getattr(torch, param_dtype), reduce_dtype=torch.float32)
    wrapped = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        mixed_precision=policy,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1 / 64)
    x = torch.tensor([inputs[rank]], dtype=torch.float32, device=device)
    c = torch.tensor([weights[rank]], dtype=torch.float32, device=device)
    dtypes, grads = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        y = wrapped(x)
        (y * c.to(y.dtype)).sum().backward()
        grad = model.weight.grad
        assert grad is not None
        dtypes.append(str(grad.dtype))
        grads.append(grad.double().tolist())
        optimizer.step()
    received = f"{model.received} computing in {y.dtype}"
    return received, dtypes, grads, model.weight.detach().double().tolist()


def post_local_sgd_gradients(
    gradients: list[list[list[float]]],
    start: int,
    subgroup_size: int,
    post_local_gradient_allreduce: bool,
    global_size: int | None = None,
) -> list[list[float]]:
    """DDP with ``post_localSGD_hook`` (``PostLocalSGDState(process_group, subgroup, start,
    post_local_gradient_allreduce)``, ``subgroup`` the subgroups of ``subgroup_size``
    consecutive ranks that ``new_subgroups`` makes, ``process_group`` the world or, with
    ``global_size``, those of that size): rank r's gradient at step t is
    ``gradients[t][r]``. What DDP leaves as the gradient after each step's backward."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    subgroup, _ = dist.new_subgroups(group_size=subgroup_size)
    process_group = None if global_size is None else dist.new_subgroups(group_size=global_size)[0]
    module = _GivenGradient(len(gradients[0][0])).double()
    wrapped = DistributedDataParallel(module)
    state = PostLocalSGDState(process_group, subgroup, start, post_local_gradient_allreduce)
    wrapped.register_comm_hook(state, post_localSGD_hook)
    after = []
    for step in gradients:
        module.zero_grad()
        wrapped(torch.tensor(step[rank], dtype=torch.float64, device=device)).backward()
        assert module.weight.grad is not None
        after.append(module.weight.grad.tolist())
    return after


def ddp_in_a_group(
    starts: list[list[float]],
    gradients: list[list[float]],
    group_size: int,
    via: str,
    init_sync: bool,
) -> tuple[list[float], list[float]]:
    """Rank r's parameter starts at ``starts[r]`` and its gradient is ``gradients[r]``, under
    DDP over the subgroup of ``group_size`` consecutive ranks holding it, given as
    ``process_group`` (``via="process_group"``) or as a 1-D ``device_mesh``
    (``"device_mesh"``), with ``init_sync``. Returns the parameter after wrapping and the
    gradient after the backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    rank, device, size = dist.get_rank(), rank_device(), dist.get_world_size()
    module = _GivenGradient(len(starts[rank])).double()
    with torch.no_grad():
        module.weight.copy_(torch.tensor(starts[rank], dtype=torch.float64))
    if via == "device_mesh":
        shape, names = (size // group_size, group_size), ("outer", "dp")
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)["dp"]
        wrapped = DistributedDataParallel(module, device_mesh=mesh, init_sync=init_sync)
    else:
        group, _ = dist.new_subgroups(group_size=group_size)
        wrapped = DistributedDataParallel(module, process_group=group, init_sync=init_sync)
    after_wrapping = module.weight.detach().tolist()
    wrapped(torch.tensor(gradients[rank], dtype=torch.float64, device=device)).backward()
    assert module.weight.grad is not None
    return after_wrapping, module.weight.grad.tolist()


def zero_in_a_group(
    starts: list[list[list[float]]],
    gradients: list[list[list[list[float]]]],
    group_size: int,
    momentum: float,
    bucket_view: bool,
) -> list[list[float]]:
    """``ZeroRedundancyOptimizer`` around ``SGD(lr=0.5, momentum)`` over the subgroup of
    ``group_size`` consecutive ranks holding rank r (``process_group``): its parameters
    (one tensor per entry) start at ``starts[g]``, g its group's index, and step t gives them
    the gradients ``gradients[t][g]``. The parameters after each step, flattened."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    rank, device = dist.get_rank(), rank_device()
    group_index = rank // group_size
    group = dist.new_subgroups(group_size=group_size)[0]
    params = [
        torch.nn.Parameter(torch.tensor(values, dtype=torch.float64, device=device))
        for values in starts[group_index]
    ]
    optimizer = ZeroRedundancyOptimizer(
        params,
        optimizer_class=torch.optim.SGD,
        process_group=group,
        parameters_as_bucket_view=bucket_view,
        lr=0.5,
        momentum=momentum,
    )
    after = []
    for step in gradients:
        for param, grad in zip(params, step[group_index], strict=True):
            param.grad = torch.tensor(grad, dtype=torch.float64, device=device)
        optimizer.step()
        after.append(torch.cat([p.detach().reshape(-1) for p in params]).tolist())
    return after


class _GivenGradients(torch.nn.Module):
    """Parameters whose gradients are exactly the inputs: ``loss = sum_i (w_i * x_i).sum()``."""

    def __init__(self, starts: list[list[float]]) -> None:
        super().__init__()
        device = rank_device()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.tensor(v, dtype=torch.float32, device=device)) for v in starts
        )

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return sum((w * x).sum() for w, x in zip(self.weights, xs, strict=True))


def zero_overlapped_with_ddp(
    starts: list[list[float]],
    gradients: list[list[list[list[float]]]],
    interleaved: bool,
    shard_buckets: bool,
    bucket_cap_mb: float,
) -> list[list[float]]:
    """DDP (``bucket_cap_mb``) over parameters starting at ``starts``, with
    ``ZeroRedundancyOptimizer(SGD, lr=0.5, overlap_with_ddp=True)`` stepping inside its
    communication hook (``hook_with_zero_step`` or ``..._interleaved`` around
    ``allreduce_hook``, ``shard_buckets``); rank r's gradients at step t are
    ``gradients[t][r]``. No ``step()`` in the loop, as documented. The parameters after each
    step's backward, flattened (float32)."""
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import (
        hook_with_zero_step,
        hook_with_zero_step_interleaved,
    )
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    module = _GivenGradients(starts)
    ddp = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
    )
    zero = ZeroRedundancyOptimizer(
        module.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, lr=0.5
    )
    hook = hook_with_zero_step_interleaved if interleaved else hook_with_zero_step
    ddp.register_comm_hook(None, hook(allreduce_hook, ddp, zero, shard_buckets=shard_buckets))
    after = []
    for step in gradients:
        zero.zero_grad()  # the step is the hook's; zeroing the gradients is still the loop's
        xs = [torch.tensor(g, dtype=torch.float32, device=device) for g in step[rank]]
        ddp(*xs).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        after.append(torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist())
    return after


def fully_shard_ignored_bias(
    inputs: list[list[float]], weights: list[list[float]]
) -> tuple[list[list[float]], list[float], bool]:
    """A ``Linear`` ``fully_shard``-ed over the world with its bias in ``ignored_params``:
    rank r's loss is ``(model(inputs[r]) * weights[r]).sum()`` for one sample. Returns the
    full reduced weight gradient, the bias gradient as the rank holds it, and whether the bias
    is still a plain tensor (not sharded)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, device = dist.get_rank(), rank_device()
    model = torch.nn.Linear(len(inputs[0]), len(weights[0])).to(device, torch.float64)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    fully_shard(model, mesh=mesh, ignored_params={model.bias})
    x = torch.tensor([inputs[rank]], dtype=torch.float64, device=device)
    c = torch.tensor([weights[rank]], dtype=torch.float64, device=device)
    (model(x) * c).sum().backward()
    assert model.weight.grad is not None and model.bias.grad is not None
    plain = not hasattr(model.bias, "full_tensor")
    bias = model.bias.grad if plain else model.bias.grad.full_tensor()  # a sharded one, read
    return model.weight.grad.full_tensor().tolist(), bias.tolist(), plain


class _Branches(torch.nn.Module):
    """Two bias-free linear branches; the loss sums the branches a rank uses."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(
            [torch.nn.Linear(n_in, n_out, bias=False) for _ in range(2)]
        )

    def forward(self, x: torch.Tensor, c: torch.Tensor, uses: list[bool]) -> torch.Tensor:
        used = [b for b, on in zip(self.branches, uses, strict=True) if on]
        return torch.stack([(branch(x) * c).sum() for branch in used]).sum()


def fully_shard_branch_gradients(
    inputs: list[list[float]],
    weights: list[list[float]],
    uses: list[list[bool]],
    manual_replicas: bool = False,
) -> list[list[list[float]]]:
    """Two bias-free ``Linear`` branches ``fully_shard``-ed together (one param group) with
    ``set_reduce_scatter_unused_params(True)``: rank r's loss sums
    ``(branch(inputs[r]) * weights[r]).sum()`` over the branches ``uses[r]`` marks, so a
    branch it skips gets no gradient there. With ``manual_replicas`` the world is a 2 x W/2
    mesh: the model is sharded over its second dimension only, and ``set_all_reduce_hook``
    all-reduces each reduce-scattered gradient over the first and halves it (HSDP by hand).
    Returns each branch's full reduced gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, device, size = dist.get_rank(), rank_device(), dist.get_world_size()
    model = _Branches(len(inputs[0]), len(weights[0])).to(device, torch.float64)
    if manual_replicas:
        mesh = init_device_mesh(device.type, (2, size // 2), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh["shard"])
        replicas = mesh.get_group("replicate")

        def across_replicas(reduced: torch.Tensor) -> None:
            dist.all_reduce(reduced, group=replicas)
            reduced.div_(2)

        model.set_all_reduce_hook(across_replicas)
    else:
        fully_shard(model, mesh=init_device_mesh(device.type, (size,)))
    model.set_reduce_scatter_unused_params(True)
    x = torch.tensor([inputs[rank]], dtype=torch.float64, device=device)
    c = torch.tensor([weights[rank]], dtype=torch.float64, device=device)
    model(x, c, uses[rank]).backward()
    grads = []
    for branch in model.branches:
        grad = branch.weight.grad
        grads.append(grad.full_tensor().tolist() if grad is not None else [])
    return grads


def frozen_params_in_state_dicts(ignore_frozen_params: bool) -> tuple[list[str], bool, bool]:
    """A ``fully_shard``-ed model with a frozen first layer: the keys of its model state dict
    under ``StateDictOptions(ignore_frozen_params=...)``, and, after loading that state dict
    (``strict=False``) into a fresh model whose every parameter is shifted by 1, whether the
    trainable parameters came back and whether the frozen ones did."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        model.to(device, torch.float64)
        for p in model[0].parameters():
            p.requires_grad_(False)
        return fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))

    options = StateDictOptions(ignore_frozen_params=ignore_frozen_params, strict=False)
    model = build()
    state = get_model_state_dict(model, options=options)
    keys = sorted(state)
    fresh = build()
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    set_model_state_dict(fresh, state, options=options)

    def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
        return all(
            torch.equal(x.full_tensor(), y.full_tensor())
            for x, y in zip(a.parameters(), b.parameters(), strict=True)
        )

    return keys, same(model[1], fresh[1]), same(model[0], fresh[0])


def fp16_wrapped_allreduce_hook(state: Any, bucket: Any) -> Any:
    """``fp16_compress_wrapper(allreduce_hook)``, at module level so that a rank can be sent
    it by name (the wrapper's closure cannot be pickled)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)(state, bucket)


def bf16_wrapped_allreduce_hook(state: Any, bucket: Any) -> Any:
    """``bf16_compress_wrapper(allreduce_hook)`` (see :func:`fp16_wrapped_allreduce_hook`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_wrapper(default_hooks.allreduce_hook)(state, bucket)


# DDP checks a hook's annotations as objects; this module's are strings (postponed evaluation).
for _hook in (fp16_wrapped_allreduce_hook, bf16_wrapped_allreduce_hook):
    _hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }


def sync_batch_norm_on_cpu() -> str | None:
    """A training forward of SyncBatchNorm on CPU tensors under the process group: the
    ValueError's message, or None where it trained."""
    layer = torch.nn.SyncBatchNorm(2).train()
    try:
        layer(torch.randn(4, 2))
    except ValueError as exc:
        return str(exc)
    return None


# Each name torch has for the collective (torch 2.13 renamed them, the old names deprecated).
GATHERS_INTO_A_TENSOR = tuple(
    n for n in ("all_gather_into_tensor", "all_gather_single") if hasattr(dist, n)
)
REDUCE_SCATTERS_OF_A_TENSOR = tuple(
    n for n in ("reduce_scatter_tensor", "reduce_scatter_single") if hasattr(dist, n)
)


def collective_inputs(seed: int, rank: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """Rank ``rank``'s input to a collective: small integers (every sum, product and average
    exact in float64), different for every rank and seed."""
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-3, 4, shape, generator=generator).to(getattr(torch, dtype))


def uneven_split(seed: int, sender: int, receiver: int) -> int:
    """How many values the group's rank ``sender`` sends ``receiver`` in an uneven
    ``all_to_all_single``: 0 to 2."""
    return (seed + 3 * sender + 5 * receiver) % 3


def tensor_collectives(
    seed: int,
    grouping: tuple[Any, ...],
    op: str,
    dtype: str,
    root: int,
    by_group_rank: bool,
    async_op: bool,
) -> dict[str, Any] | None:
    """Every tensor collective of c10d over the group ``grouping`` makes for this rank (see
    :func:`group_of`), each rank's inputs from :func:`collective_inputs`; ``root`` is the
    group rank (modulo the group's size) a rooted collective (broadcast, reduce, gather,
    scatter) starts from or ends at, named by its global rank or (``by_group_rank``) its
    group rank. Returns what each collective left, with the group's view of itself; for a
    rank outside the group, what the calls returned and whether they left its tensors
    alone."""
    rank = dist.get_rank()
    group, created = group_of(grouping)
    try:
        return _collectives(seed, group, rank, op, dtype, root, by_group_rank, async_op)
    finally:
        for made in created:
            if made not in (None, dist.GroupMember.NON_GROUP_MEMBER):
                dist.destroy_process_group(made)


def group_of(grouping: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """The group this rank runs collectives over, and the groups made for it (to destroy):
    ``("default",)``, the world; ``("new_group", ranks, sort_ranks)`` (ranks in the order
    given; ``sort_ranks=False`` keeps it); ``("new_subgroups", size)``, the
    rank's block of ``size``; ``("by_enumeration", ranks_lists)``, the rank's list (None
    where it is in none)."""
    kind = grouping[0]
    if kind == "default":
        return None, []
    if kind == "new_group":  # ("new_group", ranks, sort_ranks)
        sorting = {} if grouping[2] else {"sort_ranks": False}
        group = dist.new_group(list(grouping[1]), **sorting)
        return group, [group]
    if kind == "new_subgroups":
        mine, every = dist.new_subgroups(group_size=grouping[1])
        return mine, list(every)
    if kind == "by_enumeration":
        mine, every = dist.new_subgroups_by_enumeration([list(r) for r in grouping[1]])
        # None for a rank in no subgroup: it is outside, not in the default group.
        return mine or dist.GroupMember.NON_GROUP_MEMBER, list(every)
    raise ValueError(f"no grouping {kind!r}")


def _collectives(seed: int, group: Any, rank: int, op: str, dtype: str, root: int,
                 by_group_rank: bool, async_op: bool) -> dict[str, Any]:  # fmt: skip
    member = group is None or group is not dist.GroupMember.NON_GROUP_MEMBER
    size = dist.get_world_size(group) if member else 0
    reduce_op = getattr(dist.ReduceOp, op)
    out: dict[str, Any] = {
        "rank": dist.get_rank(group) if group is not None else dist.get_rank(),
        "size": size,
        "ranks": dist.get_process_group_ranks(group or dist.group.WORLD) if member else None,
    }
    if member:
        ranks, root = out["ranks"], root % size  # a root beyond a small group wraps round
        out["global_of_root"] = dist.get_global_rank(group or dist.group.WORLD, root)
        out["group_rank_of_self"] = dist.get_group_rank(group or dist.group.WORLD, rank)
        where = {"group_src": root} if by_group_rank else {"src": ranks[root]}
        to = {"group_dst": root} if by_group_rank else {"dst": ranks[root]}
    else:  # outside the group: no global rank maps into it, so the root by group rank
        where, to = {"group_src": 0}, {"group_dst": 0}
    n = max(size, 1)

    def mine(shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        return collective_inputs(seed + offset, rank, shape, dtype)

    returned: dict[str, Any] = {}

    def done(name: str, result: Any) -> None:
        returned[name] = result is None
        if async_op and result is not None:
            result.wait()

    x = mine((3,))
    done("all_reduce", dist.all_reduce(x, op=reduce_op, group=group, async_op=async_op))
    out["all_reduce"] = x.tolist()

    x = mine((3,), 1)
    done("broadcast", dist.broadcast(x, group=group, async_op=async_op, **where))
    out["broadcast"] = x.tolist()

    x = mine((3,), 2)
    done("reduce", dist.reduce(x, op=reduce_op, group=group, async_op=async_op, **to))
    out["reduce"] = x.tolist()

    x = mine((2,), 3)
    gathered = [torch.zeros_like(x) for _ in range(n)]
    done("all_gather", dist.all_gather(gathered, x, group=group, async_op=async_op))
    out["all_gather"] = [t.tolist() for t in gathered]

    for name in GATHERS_INTO_A_TENSOR:
        flat = torch.zeros(2 * n, dtype=x.dtype)
        with warnings.catch_warnings():  # the older name is deprecated, not gone
            warnings.simplefilter("ignore", FutureWarning)
            done(name, getattr(dist, name)(flat, x, group=group, async_op=async_op))
        out[name] = flat.tolist()

    is_root = member and out["rank"] == root
    into = [torch.zeros_like(x) for _ in range(n)] if is_root else None
    done("gather", dist.gather(x, into, group=group, async_op=async_op, **to))
    out["gather"] = None if into is None else [t.tolist() for t in into]

    pieces = [mine((2,), 10 + j) for j in range(n)] if is_root else None
    received = torch.zeros(2, dtype=x.dtype)
    done("scatter", dist.scatter(received, pieces, group=group, async_op=async_op, **where))
    out["scatter"] = received.tolist()

    x = mine((2 * n,), 4)
    for name in REDUCE_SCATTERS_OF_A_TENSOR:
        part = torch.zeros(2, dtype=x.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            done(name, getattr(dist, name)(part, x, op=reduce_op, group=group, async_op=async_op))
        out[name] = part.tolist()

    x = mine((2 * n,), 5)
    exchanged = torch.zeros(2 * n, dtype=x.dtype)
    done("all_to_all_single",
         dist.all_to_all_single(exchanged, x, group=group, async_op=async_op))  # fmt: skip
    out["all_to_all_single"] = exchanged.tolist()

    if member:  # uneven splits, empty ones among them, as a group-rank matrix of the seed
        me = out["rank"]
        sent = [uneven_split(seed, me, j) for j in range(n)]
        received_sizes = [uneven_split(seed, j, me) for j in range(n)]
    else:
        sent = received_sizes = [0]
    x = mine((sum(sent),), 6)
    exchanged = torch.zeros(sum(received_sizes), dtype=x.dtype)
    done("all_to_all_single_uneven",
         dist.all_to_all_single(exchanged, x, received_sizes, sent, group=group,
                                async_op=async_op))  # fmt: skip
    out["all_to_all_single_uneven"] = exchanged.tolist()
    out["returned_none"] = returned
    return out


def collective_refusals() -> dict[str, str | None]:
    """Each call c10d documents as invalid, made the same way on every rank (so that no rank
    goes on into a collective the others refused): its error as ``Type: message``, or None
    where it was accepted."""
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.ones(2)
    others = [torch.ones(2) for _ in range(size)]
    calls: dict[str, Any] = {
        "broadcast with src and group_src": lambda: dist.broadcast(t, src=0, group_src=0),
        "broadcast without a source": lambda: dist.broadcast(t),
        "reduce with dst and group_dst": lambda: dist.reduce(t, dst=0, group_dst=0),
        "gather_list on the wrong ranks": lambda: dist.gather(
            t, None if rank == 0 else others, dst=0
        ),
        "scatter_list on the wrong ranks": lambda: dist.scatter(
            t, None if rank == 0 else others, src=0
        ),
        "all_gather into tensors of mixed dtypes": lambda: dist.all_gather(
            [t.double() if i == 0 else t for i in range(size)], t
        ),
        "all_reduce of a list": lambda: dist.all_reduce([t]),
        "new_group with a rank beyond the world": lambda: dist.new_group([size]),
        "new_group bound to the CPU": lambda: dist.new_group(
            list(range(size)), device_id=torch.device("cpu")
        ),
        "new_group bound to an indexed CPU": lambda: dist.new_group(
            list(range(size)), device_id=torch.device("cpu", 0)
        ),
        "new_subgroups larger than the world": lambda: dist.new_subgroups(group_size=size + 1),
        "new_subgroups of size 0": lambda: dist.new_subgroups(group_size=0),
        "new_subgroups_by_enumeration of nothing": lambda: dist.new_subgroups_by_enumeration([]),
        "new_subgroups_by_enumeration with a rank twice": (
            lambda: dist.new_subgroups_by_enumeration([[0], list(range(size))])
        ),
    }
    said: dict[str, str | None] = {}
    for name, call in calls.items():
        try:
            call()
        except (ValueError, TypeError, RuntimeError) as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
    return said


def functional_collectives(
    seed: int, form: tuple[Any, ...], op: str, root: int
) -> dict[str, Any] | None:
    """``torch.distributed._functional_collectives`` (what DTensor and compiled code call)
    over a group given in each form its docstrings list: ``("group", grouping)`` the
    ProcessGroup of :func:`group_of`, ``("ranks", grouping)`` its list of ranks, ``("name",
    grouping)`` its name, ``("mesh", shape, dim)`` a DeviceMesh of ``shape`` over the world
    (one-dimensional: the mesh itself; else ``(mesh, dim)``). Each rank's inputs from
    :func:`collective_inputs` (float64); ``root`` the broadcast's group rank (modulo the
    group's size; broadcast only where it is also the source's global rank). Returns what
    each collective gave, or None where the rank is in no group."""
    import torch.distributed._functional_collectives as funcol

    rank = dist.get_rank()
    created: list[Any] = []
    if form[0] == "mesh":
        from torch.distributed.device_mesh import init_device_mesh

        shape, dim = tuple(form[1]), form[2]
        mesh = init_device_mesh("cpu", shape)
        group: Any = mesh if len(shape) == 1 else (mesh, dim)
        size = shape[0] if len(shape) == 1 else shape[dim]
        me = mesh.get_local_rank(0 if len(shape) == 1 else dim)
        ranks = dist.get_process_group_ranks(mesh.get_group(0 if len(shape) == 1 else dim))
    else:
        made, created = group_of(form[1])
        if made is dist.GroupMember.NON_GROUP_MEMBER:
            _destroy(created)
            return None
        made = made or dist.group.WORLD
        group = {"group": made, "ranks": dist.get_process_group_ranks(made),
                 "name": made.group_name}[form[0]]  # fmt: skip
        size, me = dist.get_world_size(made), dist.get_rank(made)
        ranks = dist.get_process_group_ranks(made)
    try:
        x = collective_inputs(seed, rank, (3,), "float64")
        out: dict[str, Any] = {"rank": me, "size": size}
        out["all_reduce"] = funcol.wait_tensor(funcol.all_reduce(x, op, group)).tolist()
        y = collective_inputs(seed + 3, rank, (2,), "float64")
        out["all_gather_tensor"] = funcol.wait_tensor(
            funcol.all_gather_tensor(y, 0, group)
        ).tolist()
        z = collective_inputs(seed + 4, rank, (2 * size,), "float64")
        out["reduce_scatter_tensor"] = funcol.wait_tensor(
            funcol.reduce_scatter_tensor(z, op, 0, group)
        ).tolist()
        sent = [uneven_split(seed, me, j) for j in range(size)]
        received = [uneven_split(seed, j, me) for j in range(size)]
        w = collective_inputs(seed + 6, rank, (sum(sent),), "float64")
        out["all_to_all_single"] = funcol.wait_tensor(
            funcol.all_to_all_single(w, received, sent, group)
        ).tolist()
        # Its docstring says "source rank" without saying of what; torch takes the group's
        # rank. Broadcast only where the two agree, so that either reading is held to.
        v = collective_inputs(seed + 1, rank, (3,), "float64")
        unambiguous = ranks[root % size] == root % size
        out["broadcast"] = (
            funcol.wait_tensor(funcol.broadcast(v, root % size, group)).tolist()
            if unambiguous
            else None
        )
        return out
    finally:
        _destroy(created)


def _destroy(groups: list[Any]) -> None:
    for made in groups:
        if made not in (None, dist.GroupMember.NON_GROUP_MEMBER):
            dist.destroy_process_group(made)


def group_settings(seconds: int) -> dict[str, Any]:
    """The time-out of each group c10d makes without one (documented: 30 minutes but on NCCL,
    whose is 10) and with ``seconds`` given; and a group made with
    ``use_local_synchronization=True`` by its member alone (the last rank), after which every
    rank makes and uses a group over the world: their all-reduces' results."""
    import datetime

    rank, size = dist.get_rank(), dist.get_world_size()
    given = datetime.timedelta(seconds=seconds)

    def timeout_of(group: Any) -> float:
        # The backend's options hold the time-out the group was made with.
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    made = [dist.new_group(list(range(size))), dist.new_group(list(range(size)), timeout=given)]
    subgroup, every = dist.new_subgroups(group_size=1, timeout=given)
    enumerated, listed = dist.new_subgroups_by_enumeration([[r] for r in range(size)],
                                                           timeout=given)  # fmt: skip
    said: dict[str, Any] = {
        "new_group": timeout_of(made[0]),
        "new_group with a time-out": timeout_of(made[1]),
        "new_subgroups with a time-out": timeout_of(subgroup),
        "new_subgroups_by_enumeration with a time-out": timeout_of(enumerated),
    }
    local = None
    if rank == size - 1:  # the others never call it, as the option allows
        local = dist.new_group([rank], use_local_synchronization=True)
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=local)
        said["local group"] = x.tolist()
    world = dist.new_group(list(range(size)))
    y = torch.tensor([1.0])
    dist.all_reduce(y, group=world)
    said["world after a local group"] = y.tolist()
    _destroy([*made, *every, *listed, local, world])
    return said


def point_to_point(seed: int, grouping: tuple[Any, ...], how: str,
                   by_group_rank: bool) -> dict[str, Any] | None:  # fmt: skip
    """Pass each rank's tensor (and an object) one step round a ring of its group: group rank
    i sends to i + 1 and receives from i - 1, ``how`` being ``"blocking"`` (send/recv, group
    rank 0 sending first, the others receiving first), ``"async"`` (isend/irecv) or
    ``"batched"`` (batch_isend_irecv of P2POps); peers named by global rank or
    (``by_group_rank``) by group rank. Returns what the rank received (and, for blocking
    receives, the sender recv reported); None outside any group or in a group of one."""
    rank = dist.get_rank()
    group, created = group_of(grouping)
    try:
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        n = len(ranks)
        if n < 2:
            return None
        me = ranks.index(rank)
        after, before = (me + 1) % n, (me - 1) % n
        x = collective_inputs(seed, rank, (3,), "float64")
        got = torch.zeros(3, dtype=torch.float64)
        out: dict[str, Any] = {}

        def to(peer: int, kind: str) -> dict[str, int]:
            return {f"group_{kind}": peer} if by_group_rank else {kind: ranks[peer]}

        if how == "blocking":
            if me == 0:
                dist.send(x, group=group, **to(after, "dst"))
                out["sender"] = dist.recv(got, group=group, **to(before, "src"))
            else:
                out["sender"] = dist.recv(got, group=group, **to(before, "src"))
                dist.send(x, group=group, **to(after, "dst"))
            sent: list[Any] = [{"from": rank, "values": x.tolist()}]
            received: list[Any] = [None]
            if me == 0:
                dist.send_object_list(sent, group=group, **to(after, "dst"))
                dist.recv_object_list(received, group=group, **to(before, "src"))
            else:
                dist.recv_object_list(received, group=group, **to(before, "src"))
                dist.send_object_list(sent, group=group, **to(after, "dst"))
            out["object"] = received[0]
        elif how == "async":
            works = [dist.isend(x, group=group, **to(after, "dst")),
                     dist.irecv(got, group=group, **to(before, "src"))]  # fmt: skip
            for work in works:
                assert work is not None
                work.wait()
        else:
            peer = "group_peer" if by_group_rank else "peer"
            ops = [dist.P2POp(dist.isend, x, group=group, **{peer: after if by_group_rank
                                                               else ranks[after]}),
                   dist.P2POp(dist.irecv, got, group=group, **{peer: before if by_group_rank
                                                                 else ranks[before]})]  # fmt: skip
            # Each op names its peer both ways, whichever it was given by.
            out["peers"] = [[op.peer, op.group_peer] for op in ops]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        out["received"] = got.tolist()
        return out
    finally:
        _destroy(created)


def objects_in_a_group(objects: tuple[object, ...], grouping: tuple[Any, ...], root: int,
                       by_group_rank: bool) -> dict[str, Any] | None:  # fmt: skip
    """The object collectives over the group ``grouping`` makes for this rank (see
    :func:`group_of`): rank r contributes ``objects[r]``; the root is group rank ``root``
    (modulo the group's size), named by its global rank or (``by_group_rank``) its group
    rank, and holds ``objects`` to broadcast and scatter (the object for group rank i is
    ``objects[i]``). None outside any group."""
    rank = dist.get_rank()
    group, created = group_of(grouping)
    try:
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        n, me = len(ranks), ranks.index(rank)
        root %= n
        src = {"group_src": root} if by_group_rank else {"src": ranks[root]}
        dst = {"group_dst": root} if by_group_rank else {"dst": ranks[root]}
        out: dict[str, Any] = {}
        gathered: list[object] = [None] * n
        dist.all_gather_object(gathered, objects[rank], group=group)
        out["all_gather_object"] = gathered
        into: list[object] | None = [None] * n if me == root else None
        dist.gather_object(objects[rank], into, group=group, **dst)
        out["gather_object"] = into
        held: list[object] = list(objects[:n]) if me == root else [None] * n
        dist.broadcast_object_list(held, group=group, **src)
        out["broadcast_object_list"] = held
        received: list[object] = [None]
        dist.scatter_object_list(received, list(objects[:n]) if me == root else None,
                                 group=group, **src)  # fmt: skip
        out["scatter_object_list"] = received[0]
        return out
    finally:
        _destroy(created)


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
    said: dict[str, str | None] = {}
    for name, make in made.items():
        try:
            make()
        except (ValueError, RuntimeError, TypeError) as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
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
    for name, hook in {**hooks, **accepted}.items():
        try:
            wrapped.register_comm_hook(None, hook)
        except (ValueError, TypeError) as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
    return said


def device_mesh_views(shape: tuple[int, ...], names: tuple[str, ...]) -> dict[str, Any]:
    """A DeviceMesh of ``shape`` (named ``names``) over the world, as this rank sees it: its
    layout, coordinate, sizes, each dimension's local rank, group and one-dimensional
    submesh; a submesh of every dimension in order; and what it says for the meshes it
    documents as invalid (each refused alike on every rank, before any group is made)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out: dict[str, Any] = {
        "mesh": mesh.mesh.tolist(),
        "coordinate": list(mesh.get_coordinate() or ()),
        "size": [mesh.size(), *[mesh.size(d) for d in range(len(shape))]],
        "ndim": mesh.ndim,
        "names": list(mesh.mesh_dim_names or ()),
        "local ranks": [mesh.get_local_rank(name) for name in names],
        "groups": [dist.get_process_group_ranks(mesh.get_group(d)) for d in range(len(shape))],
        "groups by name": [dist.get_process_group_ranks(mesh.get_group(n)) for n in names],
        "submeshes": [mesh[name].mesh.tolist() for name in names],
        "all dimensions": mesh[names].mesh.tolist() if len(names) > 1 else None,
        "equal to another of the same shape": mesh
        == init_device_mesh("cpu", shape, mesh_dim_names=names),
    }
    size = dist.get_world_size()
    refused: dict[str, Any] = {
        "a mesh of more ranks than the world": lambda: init_device_mesh("cpu", (size + 1,)),
        "names of another length": lambda: init_device_mesh(
            "cpu", shape, mesh_dim_names=(*names, "extra")
        ),
        "a name twice": lambda: init_device_mesh("cpu", (1, size), mesh_dim_names=("a", "a")),
        "dimensions out of order": lambda: mesh[tuple(reversed(names))],
    }
    said: dict[str, str | None] = {}
    for what, make in refused.items():
        if what == "dimensions out of order" and len(names) < 2:
            continue
        try:
            make()
        except (RuntimeError, ValueError, KeyError) as exc:
            said[what] = f"{type(exc).__name__}: {exc}"
        else:
            said[what] = None
    out["refused"] = said
    return out


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
    said: dict[str, str | None] = {}
    for name, call in calls.items():
        try:
            call()
        except (ValueError, TypeError, RuntimeError) as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
    return said


def _functional_sgd() -> type:
    from torch.distributed.optim.functional_sgd import _FunctionalSGD

    return _FunctionalSGD


def fsdp_refusals() -> dict[str, str | None]:
    """Each fully_shard call and FSDPModule setting its code refuses, made alike on every
    rank (before any collective): ``Type: message``, or None where accepted."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

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
        "set_reshard_after_forward of another type": lambda: sharded.set_reshard_after_forward(1),
        "a forward method the module lacks": lambda: register_fsdp_forward_method(
            sharded, "no_such_method"
        ),
    }
    said: dict[str, str | None] = {}
    for name, call in calls.items():
        try:
            call()
        except (ValueError, TypeError, NotImplementedError) as exc:
            said[name] = f"{type(exc).__name__}: {exc}"
        else:
            said[name] = None
    return said
