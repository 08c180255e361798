"""Jobs the conformance suite runs on every rank (importable there by name)."""

from __future__ import annotations

import contextlib
import math
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
    """A ``PowerSGDState`` (torch's defaults but ``matrix_approximation_rank``,
    ``start_powerSGD_iter`` and any ``options``) and, per call of the hook, what it was given
    and what it did; ``default_device``: the device made the default while the hook runs
    (``with torch.device(...)``), None for none. ``PowerSGDState`` has ``__slots__``: the
    records live beside it, not on it."""

    def __init__(
        self, rank: int, start: int, default_device: str | None = None, **options: Any
    ) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        # The device a factory call without one would use while the hook runs.
        self.default_device = default_device

        self.state = PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start,
            **options,
        )
        self.records: list[dict[str, Any]] = []


# The states built on this rank, newest last: the wrapper registers the hook with the state
# and keeps it to itself.
_RECORDED: list[RecordedPowerSGD] = []
# The optimizer step under way, counted by the training loop itself (not by the state).
_STEP = [0]


def recorded_powersgd_state(
    rank: int, start: int, module: torch.nn.Module, **options: Any
) -> RecordedPowerSGD:
    """The hook state :func:`recording_powersgd_hook` takes, built on each rank (``options``
    the rest of ``PowerSGDState``'s)."""
    _RECORDED.append(RecordedPowerSGD(rank, start, **options))
    return _RECORDED[-1]


# No annotations: DDP refuses a hook whose bucket is annotated as anything but dist.GradBucket,
# and under ``from __future__ import annotations`` an annotation is a string.
def recording_powersgd_hook(recorded, bucket):  # type: ignore[no-untyped-def]
    """torch's ``powerSGD_hook`` (looked up on its module at every call), recording the
    optimizer step (counted by the loop) and the state's iteration, what it was given (the
    bucket's local gradients and the residual it carried in), what it returned
    (the gradient DDP applies) and the residual it kept; and the element counts the call added
    to the state's compression statistics (before and after compression, counted before the
    hook's first collective) with ``compression_stats()`` read then."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as module

    state, index = recorded.state, bucket.index()
    carried = state.error_dict.get(index)
    record: dict[str, Any] = {
        "step": _STEP[0],
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

    before, after = state.total_numel_before_compression, state.total_numel_after_compression
    # Where another device is the default, every buffer must still be made on the bucket's.
    with (
        torch.device(recorded.default_device)
        if recorded.default_device
        else contextlib.nullcontext()
    ):
        future = module.powerSGD_hook(state, bucket)
    record["counted"] = (
        state.total_numel_before_compression - before,
        state.total_numel_after_compression - after,
    )
    record["stats"] = tuple(state.compression_stats())
    return future.then(keep)


def powersgd_records(method: DDP, scenario: Scenario, iterations: int) -> list[dict[str, Any]]:
    """``iterations`` optimizer steps through the wrapped model (the scenario's steps over
    again, each rank's micro-batches in one backward); the hook's records on this rank."""
    _RECORDED.clear()
    run = RankRun(scenario)
    wrapped = method.wrap(run.model, scenario)
    (recorded,) = _RECORDED
    optimizer = run.optimizer(wrapped.parameters())
    for iteration in range(iterations):
        _STEP[0] = iteration
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


def differentiable_all_gather_used_transposed(
    inputs: list[list[list[float]]], weights: list[list[list[float]]]
) -> list[list[float]]:
    """Rank r's matrix ``inputs[r]`` all-gathered over the world by
    ``torch.distributed.nn.functional.all_gather``, the pieces stacked by rows and used
    transposed, as attention uses keys (``sum(stacked.T * weights[r])``), so that the
    gradient reaching the gather is strided; returns the matrix's gradient."""
    from torch.distributed.nn import functional as differentiable

    rank, device = dist.get_rank(), rank_device()
    x = torch.tensor(inputs[rank], dtype=torch.float64, device=device, requires_grad=True)
    stacked = torch.cat(list(differentiable.all_gather(x)), dim=0)
    w = torch.tensor(weights[rank], dtype=torch.float64, device=device)
    (stacked.t() * w).sum().backward()
    assert x.grad is not None
    return x.grad.tolist()


def python_reducer_gradients(hook: str | None, compiled: bool) -> list[list[float]]:
    """DDP with dynamo's Python reducer (``optimize_ddp="python_reducer"``): a ``Linear(3, 1)``
    (its comm ``hook`` from ``default_hooks``, None for none), forward and backward on two
    rows of ``rank + 1``, compiled (``compiled``: ``torch.compile`` with compiled autograd,
    the ``aot_eager`` backend, eager's kernels) or eager; the gradients as ``backward()``
    leaves them. The configuration is patched for this job only, and what DDP changes
    process-wide restored and dynamo reset after it, as the rank process runs others."""
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo import trace_rules
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    device = rank_device()
    model = torch.nn.Linear(3, 1).to(device)
    x = torch.full((2, 3), float(dist.get_rank() + 1), device=device)
    # Constructing DDP with the Python reducer also changes process-wide state that no config
    # patch restores (dynamo inlines DDP's module from then on; inductor fuses its
    # collectives): restored after, or every later compiled DDP in this process is traced
    # another way.
    inlined = set(getattr(trace_rules, "LEGACY_MOD_INLINELIST", ()))
    fusion = {k: getattr(torch._inductor.config, k)
              for k in ("_fuse_ddp_communication", "_fuse_ddp_bucket_size")
              if hasattr(torch._inductor.config, k)}  # fmt: skip
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(optimize_ddp="python_reducer", compiled_autograd=compiled):
            wrapped = DistributedDataParallel(model)
            if hook is not None:
                wrapped.register_comm_hook(None, getattr(default_hooks, hook))

            def step(x: torch.Tensor) -> None:
                wrapped(x).sum().backward()

            (torch.compile(step, backend="aot_eager") if compiled else step)(x)
            said = [p.grad.reshape(-1).tolist() for p in model.parameters() if p.grad is not None]
        dist.barrier()  # no rank's hooks outlive the job
    finally:
        if hasattr(trace_rules, "LEGACY_MOD_INLINELIST"):  # not in every torch
            trace_rules.LEGACY_MOD_INLINELIST.clear()
            trace_rules.LEGACY_MOD_INLINELIST.update(inlined)
            trace_rules.get_legacy_mod_inlinelist.cache_clear()
        for key, value in fusion.items():
            setattr(torch._inductor.config, key, value)
        torch._dynamo.reset()
    return said


def _caller(function: Any, *args: Any) -> Any:
    return function(*args)  # the line a deprecation of ``function`` is to be attributed to


def differentiable_deprecations() -> dict[str, Any]:
    """Each of ``torch.distributed.nn.functional``'s collectives called once over the world
    (one element a rank) from one line of :func:`_caller`, with the warnings each raised
    recorded: ``(category, message, file, line)`` for each, by collective, and the caller's
    ``(file, line)`` under ``"caller"``: the frame a deprecation's ``stacklevel`` should name."""
    import warnings

    from torch.distributed.nn import functional as differentiable

    size, device = dist.get_world_size(), rank_device()

    def x() -> torch.Tensor:
        return torch.ones(size, dtype=torch.float64, device=device, requires_grad=True)

    def out(n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.float64, device=device)

    calls: dict[str, tuple[Any, ...]] = {
        "all_reduce": (differentiable.all_reduce, x()),
        "broadcast": (differentiable.broadcast, x(), 0),
        "all_gather": (differentiable.all_gather, x()),
        "reduce_scatter": (differentiable.reduce_scatter, out(1), list(x().chunk(size))),
        "all_to_all_single": (differentiable.all_to_all_single, out(size), x()),
    }
    code = _caller.__code__
    said: dict[str, Any] = {"caller": (code.co_filename, code.co_firstlineno + 1)}
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _caller(*call)
        said[name] = [(w.category.__name__, str(w.message), w.filename, w.lineno) for w in caught]
    return said


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
    trainable: list[list[bool]] | None = None,
    default_device: str | None = None,
    to: int = 0,
) -> dict[str, Any]:
    """``ZeroRedundancyOptimizer`` around ``SGD(lr=0.5, momentum)`` over the subgroup of
    ``group_size`` consecutive ranks holding rank r (``process_group``): its parameters
    (one tensor per entry) start at ``starts[g]``, g its group's index, and step t gives them
    the gradients ``gradients[t][g]``. The parameters after each step, flattened; then the
    state consolidated (``consolidate_state_dict(to=to)``, ``to`` a rank of the group) on
    that rank of each group: its momentum buffers by parameter index and its lr, None
    elsewhere.
    ``trainable[t][i]``: whether tensor i requires a gradient (and is given one) at step t,
    as it is when ZeRO is built at step 0's; all of them where None. ``default_device``: the
    device a factory call without one would use (``with torch.device(...)``) while the state
    is consolidated: the shards are sent and received on the parameters' device whatever it
    is."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    rank, device = dist.get_rank(), rank_device()
    group_index = rank // group_size
    group = dist.new_subgroups(group_size=group_size)[0]
    params = [
        torch.nn.Parameter(torch.tensor(values, dtype=torch.float64, device=device))
        for values in starts[group_index]
    ]
    masks = trainable or [[True] * len(params)] * len(gradients)
    for param, wanted in zip(params, masks[0], strict=True):
        param.requires_grad_(wanted)
    optimizer = ZeroRedundancyOptimizer(
        params,
        optimizer_class=torch.optim.SGD,
        process_group=group,
        parameters_as_bucket_view=bucket_view,
        lr=0.5,
        momentum=momentum,
    )
    after = []
    for step, mask in zip(gradients, masks, strict=True):
        for param, grad, wanted in zip(params, step[group_index], mask, strict=True):
            # A frozen parameter has no gradient, as backward leaves it.
            param.requires_grad_(wanted)
            param.grad = torch.tensor(grad, dtype=torch.float64, device=device) if wanted else None
        optimizer.step()
        after.append(torch.cat([p.detach().reshape(-1) for p in params]).tolist())
    with torch.device(default_device) if default_device else contextlib.nullcontext():
        optimizer.consolidate_state_dict(to=to)
    consolidated: dict[str, Any] | str | None = None
    if dist.get_rank(group) == to:
        try:
            state = optimizer.state_dict()
        except RuntimeError as exc:
            # Not consolidated where the group's rank `to` is (a ZeRO that shards over
            # another group, or consolidates elsewhere): what the test reports, not a crash.
            consolidated = f"RuntimeError: {exc}"
        else:
            consolidated = {
                "buffers": {
                    int(index): values["momentum_buffer"].tolist()
                    for index, values in state["state"].items()
                    if values.get("momentum_buffer") is not None
                },
                "lr": [g["lr"] for g in state["param_groups"]],
            }
    return {"after": after, "consolidated": consolidated}


def zero_partition(sizes: list[int]) -> list[int]:
    """``ZeroRedundancyOptimizer`` around SGD over one parameter of each of ``sizes``
    elements (the same on every rank): the indices of the parameters this rank's local
    optimizer holds, the shard it steps."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    params = [torch.nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in sizes]
    optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.1)
    index = {id(p): i for i, p in enumerate(params)}
    return sorted(index[id(p)] for g in optimizer.optim.param_groups for p in g["params"])


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


def gradient_storages(gradient_as_bucket_view: bool) -> tuple[int, int]:
    """After one backward through DDP over a small model (every parameter in one bucket): how
    many distinct storages its gradients live in, and how many gradients there are."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    wrapped = DistributedDataParallel(model, gradient_as_bucket_view=gradient_as_bucket_view)
    wrapped(torch.ones(4, 2)).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return len({g.untyped_storage().data_ptr() for g in grads}), len(grads)


def bucket_layout(bucket_cap_mb: float | None, iterations: int = 3) -> list[list[list[int]]]:
    """DDP (``bucket_cap_mb``; None: left out) over three Linear layers, an all-reduce comm
    hook recording the buckets it is handed: per iteration, each bucket (by index) as the byte
    sizes of its parameters' gradients, in the bucket's order."""
    from torch.nn.parallel import DistributedDataParallel

    device = rank_device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)
    ).to(device)
    options: dict[str, Any] = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    wrapped = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, **options
    )
    seen: list[dict[int, list[int]]] = []

    # Unannotated: DDP refuses annotations other than its own (this module's are strings).
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        seen[-1][bucket.index()] = [p.numel() * p.element_size() for p in bucket.parameters()]
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        assert work is not None
        return work.get_future().then(lambda f: f.value()[0])

    wrapped.register_comm_hook(None, hook)
    for _ in range(iterations):
        seen.append({})
        wrapped(torch.ones(2, 64, device=device)).sum().backward()
    return [[buckets[i] for i in sorted(buckets)] for buckets in seen]


def join_disabled(steps: int, enable: bool) -> dict[str, Any]:
    """DDP over ``Linear(2, 1)`` (weights and bias from 0) under ``Join([model],
    enable=enable)``, every rank ``steps`` SGD steps (lr 0.5) on rank r's inputs all ``r + 1``
    (3 rows; loss the output's sum): whether ``Join.notify_join_context`` gave the model a
    work handle at each step (the all-reduce that tells the context this rank still trains:
    none where disabled), and the parameters after."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    layer = torch.nn.Linear(2, 1, dtype=torch.float64).to(device)
    with torch.no_grad():
        for param in layer.parameters():
            param.zero_()
    wrapped = DistributedDataParallel(
        layer, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    handles = []
    with Join([wrapped], enable=enable):
        for _ in range(steps):
            optimizer.zero_grad()
            notified = Join.notify_join_context(wrapped)
            handles.append(notified is not None)
            if notified is not None:
                notified.wait()
            x = torch.full((3, 2), float(rank + 1), dtype=torch.float64, device=device)
            wrapped(x).sum().backward()
            optimizer.step()
    return {
        "handles": handles,
        "params": [p.detach().cpu().reshape(-1).tolist() for p in layer.parameters()],
    }


def join_buffer_sources(batches: list[int]) -> tuple[list[list[float]], list[list[float]]]:
    """DDP (``broadcast_buffers``, the default) over ``Linear`` then ``BatchNorm1d`` in training
    mode under ``Join``, rank r training ``batches[r]`` iterations on data of its own: the
    norm's running mean as each of its forwards starts (after DDP's buffer broadcast) and
    after each of its iterations."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(device)
    wrapped = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    starts: list[list[float]] = []
    model[1].register_forward_pre_hook(lambda norm, _: starts.append(norm.running_mean.tolist()))
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1000 + rank)
    after = []
    with Join([wrapped]):
        for _ in range(batches[rank]):
            optimizer.zero_grad()
            x = (torch.randn(5, 3, generator=generator) + rank).to(device)
            wrapped(x).pow(2).sum().backward()
            optimizer.step()
            after.append(model[1].running_mean.tolist())
    return starts, after


def join_throwing(batches: list[int]) -> dict[str, Any]:
    """DDP over a ``Linear(2, 1)`` under ``Join([model], throw_on_early_termination=True)``,
    rank r stepping through ``batches[r]`` batches: how many steps it finished and what it
    raised (its type and first line), or None."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(0)
    wrapped = DistributedDataParallel(
        torch.nn.Linear(2, 1).to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
    )
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    done, raised = 0, None
    try:
        with Join([wrapped], throw_on_early_termination=True):
            for _ in range(batches[rank]):
                optimizer.zero_grad()
                wrapped(torch.ones(3, 2, device=device)).sum().backward()
                optimizer.step()
                done += 1
    except RuntimeError as exc:
        raised = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return {"done": done, "raised": raised}


class _GradientIsInput(torch.nn.Module):
    """A ``rows x cols`` weight whose gradient is the input: ``loss = (weight * g).sum()``."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.zeros(rows, cols, dtype=torch.float64, device=rank_device())
        )

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return (self.weight * g).sum()


def powersgd_on_a_fixed_gradient(
    gradients: list[list[list[float]]], warm_start: bool, steps: int, epsilon: float = 0.0
) -> list[list[list[float]]]:
    """DDP over one ``rows x cols`` weight whose gradient on rank r is ``gradients[r]`` at
    every step, with ``powerSGD_hook`` at rank 1 (every matrix compressed, no error feedback,
    ``warm_start`` as given, ``orthogonalization_epsilon=epsilon``, from iteration 2): the
    gradient DDP applies at each step."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
        PowerSGDState,
        powerSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows, cols = len(gradients[0]), len(gradients[0][0])
    model = DDP(_GradientIsInput(rows, cols))
    state = PowerSGDState(
        None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=2,
        min_compression_rate=0,
        use_error_feedback=False,
        warm_start=warm_start,
        orthogonalization_epsilon=epsilon,
    )
    model.register_comm_hook(state, powerSGD_hook)
    g = torch.tensor(gradients[dist.get_rank()], dtype=torch.float64, device=rank_device())
    applied = []
    for _ in range(steps):
        model.zero_grad()
        model(g).backward()
        applied.append(model.module.weight.grad.detach().cpu().tolist())
    return applied
