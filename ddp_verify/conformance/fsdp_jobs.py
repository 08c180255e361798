"""Rank jobs for the FSDP2 properties beyond plain training: what ``fully_shard`` calls back
into (a parameter's post-accumulate-grad hooks) and what it lets a tensor subclass decide (the
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` extension). Each job runs on every rank
of a world and returns plain values the test judges against a closed form."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..world.runtime import rank_device


def _sharded_linear(n_in: int, n_out: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = torch.nn.Linear(n_in, n_out, bias=False).to(device, torch.float64)
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    return model


def fully_shard_post_accumulate_hooks(
    inputs: list[list[float]], weights: list[list[float]], hooks: list[tuple[float, float]]
) -> tuple[list[int], list[list[float]]]:
    """A bias-free ``Linear`` ``fully_shard``-ed over the world, rank r's loss
    ``(model(inputs[r]) * weights[r]).sum()``, with one post-accumulate-grad hook on its weight
    per ``(a, b)`` of ``hooks``, registered in that order, each making the gradient
    ``grad * a + b`` in place. Returns the order the hooks ran in (their indices) and the full
    weight gradient after them."""
    rank, device = dist.get_rank(), rank_device()
    model = _sharded_linear(len(inputs[0]), len(weights[0]))
    ran: list[int] = []

    def hook(index: int, a: float, b: float) -> Any:
        def run(param: torch.Tensor) -> None:
            ran.append(index)
            assert param.grad is not None
            param.grad.mul_(a).add_(b)

        return run

    for index, (a, b) in enumerate(hooks):
        model.weight.register_post_accumulate_grad_hook(hook(index, a, b))
    x = torch.tensor([inputs[rank]], dtype=torch.float64, device=device)
    c = torch.tensor([weights[rank]], dtype=torch.float64, device=device)
    (model(x) * c).sum().backward()
    assert model.weight.grad is not None
    return ran, model.weight.grad.full_tensor().tolist()


def fully_shard_frozen_between_steps(
    inputs: list[list[float]], frozen: list[bool]
) -> list[tuple[list[list[float]] | None, list[list[float]]]]:
    """Two bias-free ``Linear`` layers (2 -> 2 -> 1, each weight 0.5, 1.5, ... row by row) in one
    ``fully_shard`` group, rank r's loss ``model(inputs[r]).sum()`` (one sample each); before
    step k the first weight's ``requires_grad`` is set to ``not frozen[k]`` on the sharded
    parameter, as gradual unfreezing does after sharding. Returns, per step, the first and
    second weights' full gradients (None where there is none); no optimizer step is taken."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, device = dist.get_rank(), rank_device()
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 1, bias=False)
    ).to(device, torch.float64)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.arange(param.numel(), dtype=torch.float64).view_as(param) + 0.5)
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    x = torch.tensor([inputs[rank]], dtype=torch.float64, device=device)
    out: list[tuple[list[list[float]] | None, list[list[float]]]] = []
    first, second = model[0].weight, model[1].weight
    for step_frozen in frozen:
        first.requires_grad_(not step_frozen)
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        assert second.grad is not None
        got = None if first.grad is None else first.grad.full_tensor().tolist()
        out.append((got, second.grad.full_tensor().tolist()))
    return out


class SplitFloat64(torch.Tensor):
    """A float64 tensor whose FSDP2 all-gather sends two inputs of two dtypes: its float32
    rounding and the float64 rest (``fsdp_pre_all_gather``), which
    ``fsdp_post_all_gather`` adds back exactly, as quantised-training subclasses send their
    data and their scales. Every other operation runs on the float64 values it wraps."""

    data_: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> SplitFloat64:
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=data.device,
            requires_grad=data.requires_grad,
        )  # fmt: skip

    def __init__(self, data: torch.Tensor) -> None:
        self.data_ = data

    def __repr__(self) -> str:
        return f"SplitFloat64({self.data_})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], *_: Any) -> SplitFloat64:
        return SplitFloat64(inner["data_"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.utils._pytree import tree_map_only

        unwrap = lambda t: t.data_  # noqa: E731
        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))
        # An in-place or out= operation changed the wrapped values: the wrapper it wrote
        # (``out``, else the first argument) is its result.
        if func._schema.is_mutable:
            written = (kwargs or {}).get("out", args[0] if args else None)
            if isinstance(written, cls):
                return written
        return tree_map_only(torch.Tensor, cls, out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):  # type: ignore[no-untyped-def]
        high = self.data_.to(torch.float32)
        return (high, self.data_ - high.double()), None

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):  # type: ignore[no-untyped-def]
        high, rest = outputs
        if out is not None:  # the unsharded parameter made by the first all-gather, again
            with torch.no_grad():
                out.copy_(high.double() + rest)
            return None
        return high.double() + rest, (high, rest)


def fully_shard_split_parameter(
    inputs: list[list[float]], weights: list[list[float]], start: list[list[float]], steps: int
) -> list[tuple[list[float], list[list[float]]]]:
    """A bias-free ``Linear`` whose weight, ``start``, is a :class:`SplitFloat64`,
    ``fully_shard``-ed over the world and trained ``steps`` steps of SGD (lr 0.5) on rank r's
    loss ``(model(inputs[r]) * weights[r]).sum()``. Returns, each step, the rank's forward
    output and the full weight after the step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, device = dist.get_rank(), rank_device()
    model = torch.nn.Linear(len(inputs[0]), len(weights[0]), bias=False).to(device)
    values = torch.tensor(start, dtype=torch.float64, device=device)
    model.weight = torch.nn.Parameter(SplitFloat64(values))
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.tensor([inputs[rank]], dtype=torch.float64, device=device)
    c = torch.tensor([weights[rank]], dtype=torch.float64, device=device)
    seen = []
    for _ in range(steps):
        output = model(x)
        (output * c).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        whole = model.weight.full_tensor()
        whole = whole.data_ if isinstance(whole, SplitFloat64) else whole
        seen.append((output.detach()[0].tolist(), whole.tolist()))
    return seen


def _numbered_linear(n_in: int, n_out: int, first: float) -> torch.nn.Linear:
    """A float64 ``Linear(n_in, n_out)`` on the rank's device, weight ``first``,
    ``first + 1``, ... row by row, bias 0, 1, ..."""
    layer = torch.nn.Linear(n_in, n_out).to(rank_device(), torch.float64)
    with torch.no_grad():
        layer.weight.copy_(
            torch.arange(n_out * n_in, dtype=torch.float64).view(n_out, n_in) + first
        )
        layer.bias.copy_(torch.arange(n_out, dtype=torch.float64))
    return layer


def fully_shard_unshard_then_reshard(rows: int, cols: int) -> dict[str, Any]:
    """A ``Linear(cols, rows)`` (weight 0.5, 1.5, ... row by row, bias 0, 1, ...) in a
    ``Sequential`` ``fully_shard``-ed over the world, then ``unshard()`` and ``reshard()``
    called by hand, as a training that gathers its parameters itself does (generation, an
    export): the parameters the unshard registers (their values, and the sizes of their
    storages), those storages' sizes after the reshard, whether the module holds DTensors
    again, and its output on a row of ones after."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = torch.nn.Sequential(_numbered_linear(cols, rows, 0.5))
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    model.unshard()
    held = list(model.parameters())
    gathered = {
        "values": [p.detach().cpu().tolist() for p in held],
        "dtensors": [hasattr(p, "full_tensor") for p in held],
        "storage": [p.untyped_storage().size() for p in held],
    }
    model.reshard()
    freed = [p.untyped_storage().size() for p in held]
    # Read before the forward: the forward gathers into the same storages again.
    dtensors_after = [hasattr(p, "full_tensor") for p in model.parameters()]
    out = model(torch.ones(1, cols, dtype=torch.float64, device=device))
    return {
        "gathered": gathered,
        "freed": freed,
        "dtensors after": dtensors_after,
        "output": out.detach().cpu().tolist(),
    }


def fully_shard_state_dict_while_unsharded(rows: int, cols: int) -> dict[str, Any]:
    """A ``Linear(cols, rows)`` (weight 0.5, 1.5, ... row by row, bias 0, 1, ...) in a
    ``Sequential`` ``fully_shard``-ed over the world, unsharded (by ``unshard()``, as the root
    is after a forward: it does not reshard after forward), then ``state_dict()`` taken: whether
    each value is a DTensor, the full values, and whether the module holds its shards after."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = torch.nn.Sequential(_numbered_linear(cols, rows, 0.5))
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    model.unshard()
    state = model.state_dict()
    return {
        "keys": list(state),
        "dtensors": [hasattr(v, "full_tensor") for v in state.values()],
        "values": [
            (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().tolist()
            for v in state.values()
        ],
        "dtensors after": [hasattr(p, "full_tensor") for p in model.parameters()],
    }


def fully_shard_reduces_each_module_as_its_backward_ends(width: int) -> dict[str, Any]:
    """Two float64 ``Linear(width, width)`` layers (weights from 0.5 and from 1.5, row by
    row; biases 0, 1, ...) each ``fully_shard``-ed, then their ``Sequential``; every rank's
    loss the sum of the output on a row of ones. Read by a gradient hook on the first layer's
    output, which runs after the second layer's backward and before the first's: whether the
    second layer holds its shards again, and its full reduced gradients, at that moment; and
    both layers' full gradients after the backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = torch.nn.Sequential(
        _numbered_linear(width, width, 0.5), _numbered_linear(width, width, 1.5)
    )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    seen: dict[str, Any] = {}

    def when_the_second_layer_is_done(grad: torch.Tensor) -> None:
        # Every rank reaches this hook at the same point of its backward, so the
        # all-gathers of full_tensor() below are matched across ranks.
        second = list(model[1].parameters())
        seen["sharded"] = [hasattr(p, "full_tensor") for p in second]
        seen["grads"] = [
            None if p.grad is None else p.grad.full_tensor().cpu().tolist()
            for p in second
            if hasattr(p, "full_tensor")
        ]

    def watch(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        output.register_hook(when_the_second_layer_is_done)  # returning None keeps the output

    model[0].register_forward_hook(watch)
    model(torch.ones(1, width, dtype=torch.float64, device=device)).sum().backward()
    seen["after"] = [p.grad.full_tensor().cpu().tolist() for p in model.parameters()]
    return seen


class _WithAnEmptyParameter(torch.nn.Module):
    """A numbered ``Linear(2, 3)`` and a frozen ``(rows, 0)`` parameter (no elements: a
    dimension of size 0, as a zero-width adapter has) that the forward touches."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.lin = _numbered_linear(2, 3, 0.5)
        self.empty = torch.nn.Parameter(
            torch.zeros(rows, 0, dtype=torch.float64, device=rank_device()), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sum() + self.empty.sum()


def fully_shard_with_an_empty_parameter(rows: int) -> dict[str, Any]:
    """:class:`_WithAnEmptyParameter` ``fully_shard``-ed over the world, one SGD step (lr 0.5)
    on a row of ones, then a distributed-checkpoint round trip into a fresh sharded copy: the
    empty parameter's full shape, the state dict's full shapes, the weight and bias after the
    step, and whether the copy loaded them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from .checkpoint_jobs import shared_directory

    device = rank_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    model = fully_shard(_WithAnEmptyParameter(rows), mesh=mesh)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(torch.ones(1, 2, dtype=torch.float64, device=device)).backward()
    optimizer.step()
    state = model.state_dict()
    trained = [
        model.lin.weight.full_tensor().cpu().tolist(),
        model.lin.bias.full_tensor().cpu().tolist(),
    ]
    copy = fully_shard(_WithAnEmptyParameter(rows), mesh=mesh)
    with shared_directory() as directory:
        dcp.save(state, checkpoint_id=directory)
        loaded = copy.state_dict()
        dcp.load(loaded, checkpoint_id=directory)
    copy.load_state_dict(loaded)
    return {
        # DTensor.shape is the global shape (full_tensor() of an empty DTensor fails in torch's
        # redistribute: "Expected cond to be True").
        "empty": list(model.empty.shape),
        "shapes": {k: list(v.shape) for k, v in state.items()},
        "trained": trained,
        "loaded": [
            copy.lin.weight.full_tensor().cpu().tolist(),
            copy.lin.bias.full_tensor().cpu().tolist(),
        ],
        "empty loaded": list(copy.empty.shape),
    }


def fully_shard_empty_parameter_full_tensor(rows: int) -> list[int]:
    """A ``Linear(1, 1)`` holding a frozen ``(rows, 0)`` parameter too, ``fully_shard``-ed over
    the world: the shape ``full_tensor()`` of that parameter gives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = torch.nn.Linear(1, 1).to(device)
    model.empty = torch.nn.Parameter(torch.zeros(rows, 0, device=device), requires_grad=False)
    fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    return list(model.empty.full_tensor().shape)


class _Block(torch.nn.Module):
    """Two numbered ``Linear(width, width)`` layers of which the forward runs only the first
    (a member of a ``fully_shard`` group that this forward skips)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.x = _numbered_linear(width, width, 0.5)
        self.y = _numbered_linear(width, width, 1.5)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.x(inp)


class _SkipsItsHead(torch.nn.Module):
    """A :class:`_Block` and a head the forward never runs (the loss computed outside, in
    chunks, as a chunked cross-entropy does), the head registered first where
    ``head_first`` (which decides the order ``named_modules()`` meets them in)."""

    def __init__(self, width: int, head_first: bool) -> None:
        super().__init__()
        if head_first:
            self.head = _numbered_linear(width, width, 2.5)
        self.block = _Block(width)
        if not head_first:
            self.head = _numbered_linear(width, width, 2.5)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.block(inp)


def fully_shard_groups_a_forward_skips(
    inputs: list[list[float]], inner: str, outer: str, head_first: bool
) -> dict[str, Any]:
    """:class:`_SkipsItsHead` over float64 parameters with two nested ``fully_shard`` groups
    whose forward skips a member: ``[block.x, block.y]`` with
    ``MixedPrecisionPolicy(output_dtype=inner)`` inside ``[block, head]`` with
    ``output_dtype=outer``, then the root; rank r's loss the float64 sum of
    ``model(inputs[r])``. Returns rank r's output (dtype and values) and the full gradient of
    ``block.x``'s weight and bias."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = rank_device()
    model = _SkipsItsHead(len(inputs[0]), head_first)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    def cast(name: str) -> MixedPrecisionPolicy:
        return MixedPrecisionPolicy(output_dtype=getattr(torch, name))

    fully_shard([model.block.x, model.block.y], mesh=mesh, mp_policy=cast(inner))
    fully_shard([model.block, model.head], mesh=mesh, mp_policy=cast(outer))
    fully_shard(model, mesh=mesh)
    x = torch.tensor([inputs[dist.get_rank()]], dtype=torch.float64, device=device)
    out = model(x)
    out.double().sum().backward()
    weight, bias = model.block.x.weight.grad, model.block.x.bias.grad
    return {
        "dtype": str(out.dtype),
        "output": out.detach().double().cpu()[0].tolist(),
        "grads": [None if g is None else g.full_tensor().cpu().tolist() for g in (weight, bias)],
    }


# The containers a module's grad-requiring inputs arrive in (FSDP2 finds them there to hook
# its post-backward, and must hand each back where it was).
CONTAINERS = ("dict", "list", "tuple", "namedtuple", "dataclass")


class _Pair(NamedTuple):
    b: torch.Tensor
    c: torch.Tensor


@dataclasses.dataclass
class _Held:
    b: torch.Tensor
    c: torch.Tensor


def _pack(kind: str, b: torch.Tensor, c: torch.Tensor) -> Any:
    if kind == "dict":
        return {"c": [c], "b": b}
    if kind == "list":
        return [b, [c]]
    if kind == "tuple":
        return (b, (c,))
    return _Pair(b, c) if kind == "namedtuple" else _Held(b, c)


def _unpack(kind: str, rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "dict":
        return rest["b"], rest["c"][0]
    if kind in ("list", "tuple"):
        return rest[0], rest[1][0]
    return rest.b, rest.c


class _TakesNested(torch.nn.Module):
    """``forward(a, rest, *, d)``, ``rest`` holding ``b`` and ``c`` in a container of
    ``kind``: ``inner(a) + 2 inner(b) + 3 c + 4 d``, each input weighted apart (two handed
    back in each other's place give another output and other gradients)."""

    def __init__(self, width: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.inner = _numbered_linear(width, width, 0.5)

    def forward(self, a: torch.Tensor, rest: Any, *, d: torch.Tensor) -> torch.Tensor:
        b, c = _unpack(self.kind, rest)
        return self.inner(a) + 2 * self.inner(b) + 3 * c + 4 * d


class NestedInputs(torch.nn.Module):
    """Four numbered projections of the input (a stem the root holds), handed to a
    :class:`_TakesNested` block as ``block(a, <b and c in a container>, d=d)``: every input
    of the block requires grad. Float64, on the rank's device (the CPU outside a world)."""

    def __init__(self, width: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.stem = torch.nn.ModuleList(
            [_numbered_linear(width, width, first) for first in (1.5, -2.5, 3.5, -4.5)]
        )
        self.block = _TakesNested(width, kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = (layer(x) for layer in self.stem)
        return self.block(a, _pack(self.kind, b, c), d=d)


def fully_shard_nested_inputs(inputs: list[list[float]], kind: str) -> dict[str, Any]:
    """:class:`NestedInputs` with its block ``fully_shard``-ed, then the root, over the world;
    rank r's loss the sum of ``model(inputs[r])``. Rank r's output, and every parameter's
    full gradient by name."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = NestedInputs(len(inputs[0]), kind)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    fully_shard(model.block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.tensor([inputs[dist.get_rank()]], dtype=torch.float64, device=device)
    out = model(x)
    out.sum().backward()
    return {
        "output": out.detach().cpu()[0].tolist(),
        "grads": {n: p.grad.full_tensor().cpu().tolist() for n, p in model.named_parameters()},
    }


class _TakesDeep(torch.nn.Module):
    """``forward(a, rest)``: ``inner(a) + 2 b``, ``b`` the first tensor of the nested lists
    ``rest`` (each list's first element the next)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = _numbered_linear(width, width, 0.5)

    def forward(self, a: torch.Tensor, rest: Any) -> torch.Tensor:
        while isinstance(rest, list):
            rest = rest[0]
        return self.inner(a) + 2 * rest


def fully_shard_deep_inputs(levels: int) -> dict[str, str | None]:
    """A ``fully_shard``-ed :class:`_TakesDeep` handed a grad-requiring tensor inside
    ``levels`` nested lists, and one inside a list that holds itself: what each raised
    (``None`` where it ran, with its gradient the closed form's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    block = _TakesDeep(2)
    fully_shard(block, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    said: dict[str, str | None] = {}
    for name in ("nested", "circular"):
        a = torch.ones(1, 2, dtype=torch.float64, device=device, requires_grad=True)
        b = torch.ones(1, 2, dtype=torch.float64, device=device, requires_grad=True)
        rest: Any = b
        if name == "nested":
            for _ in range(levels):
                rest = [rest]
        else:
            rest = [b]
            rest.append(rest)
        try:
            block(a, rest).sum().backward()
        except RuntimeError as exc:
            said[name] = str(exc).splitlines()[0]
        else:
            said[name] = (
                None
                if b.grad is not None and b.grad.tolist() == [[2.0, 2.0]]
                else (f"b's gradient {None if b.grad is None else b.grad.tolist()}, not 2s")
            )
    return said


def numbered_mlp(width: int) -> torch.nn.Sequential:
    """Two numbered float64 ``Linear(width, width)`` layers with a tanh between (the rank's
    device; the CPU outside a world)."""
    return torch.nn.Sequential(
        _numbered_linear(width, width, 0.25), torch.nn.Tanh(), _numbered_linear(width, width, -0.5)
    )


def optimizer_kwargs(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer ``name`` ("sgd" with momentum, "adam", "adamw") and its settings, on
    neither path (the caller adds ``foreach``). Adam's ``eps`` is 1e-3: its first step moves a
    parameter by ``lr * g / (|g| + eps)``, whose slope at a gradient that cancels to rounding
    (a bias over rows that sum to nothing) is ``lr / eps``; at the default 1e-8 that is 1e6,
    and the shards' and the whole model's orders of summation, both right, differ by more
    than the comparison's 1e-12 (a drawn case did: 2.9e-12). At 1e-3 it is 10."""
    return {
        "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
        "adam": (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.01, "eps": 1e-3}),
        "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "eps": 1e-3}),
    }[name]


def fully_shard_foreach_steps(inputs: list[list[list[list[float]]]], name: str) -> list[Any]:
    """:func:`numbered_mlp` ``fully_shard``-ed per layer and as the root over the world, its
    optimizer ``name`` on the foreach path (``foreach=True``: the multi-tensor kernels over
    DTensor shards, the path GPUs default to), one step per batch of ``inputs[step][rank]``
    rows (the loss their mean squared output). Every parameter's full value after the
    steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    model = numbered_mlp(len(inputs[0][0][0]))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cls, kwargs = optimizer_kwargs(name)
    optimizer = cls(model.parameters(), foreach=True, **kwargs)
    for batch in inputs:
        x = torch.tensor(batch[dist.get_rank()], dtype=torch.float64, device=device)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.full_tensor().cpu().tolist() for p in model.parameters()]
