"""Jobs of ``test_dtensor``, run on every rank: DTensors laid out on a device mesh
(sharded unevenly, replicated, or partial sums), redistributed and put through the
operations training runs, forward and backward, returned whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# Upsampling's modes, by the dimensions upsampled ("aa": antialiased).
_MODES_1D = ("nearest", "nearest-exact", "linear")
_MODES_2D = ("nearest", "nearest-exact", "bilinear", "bicubic", "bilinear aa", "bicubic aa",
             "lanczos aa")  # fmt: skip
_MODES_3D = ("nearest", "nearest-exact", "trilinear")

# Operations on a (rows, columns) tensor ``a`` and a (columns, k) tensor ``b``, as training
# meets them: elementwise, reductions, a matrix product, layout changes.
OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + a * 2,
    "neg": lambda a, b: -a,
    "relu": lambda a, b: torch.relu(a - 1),
    "exp": lambda a, b: torch.exp(a / 8),
    "where": lambda a, b: torch.where(a > 0, a, -a),
    "sum": lambda a, b: a.sum(),
    "sum_rows": lambda a, b: a.sum(0),
    "sum_columns": lambda a, b: a.sum(1),
    "mean": lambda a, b: a.mean(),
    "mean_rows": lambda a, b: a.mean(0),
    "amax_rows": lambda a, b: a.amax(0),
    "norm": lambda a, b: a.norm(),
    "softmax": lambda a, b: torch.softmax(a / 4, -1),
    "matmul": lambda a, b: a @ b,
    # A linear layer: a @ b plus a bias broadcast over the rows (b's first row).
    "linear": lambda a, b: torch.nn.functional.linear(a, b.t(), b[0]),
    "transpose": lambda a, b: a.t(),
    "cat": lambda a, b: torch.cat([a, a], 0),
    # Lists of one tensor (a concatenation of one, a foreach step of a single parameter).
    "list_of_one": lambda a, b: (
        torch.cat([a]) + torch.stack([a])[0] + torch._foreach_mul([a], 2.0)[0]
    ),
    "flatten": lambda a, b: a.reshape(-1),
    # Another view of the same tensor by the same operation, its sizes the only difference.
    "reshaped": lambda a, b: a.reshape(1, -1),
    "slice_columns": lambda a, b: a[:, 1:] * 2,
    "select_row": lambda a, b: a[0] * 2,
    "select_column": lambda a, b: a[:, 0] * 2,
    # Two results at once (as a norm computes its statistics), summed to one.
    "var_mean_columns": lambda a, b: _summed(torch.var_mean(a, 1, correction=0)),
    # Tensors made from another (its dtype, device and layout), of a shape given whole.
    "new_tensors": lambda a, b: _new_tensors(a),
    "expand": lambda a, b: a.sum(0, keepdim=True).expand(3, -1),
    # Views given the whole tensor's sizes (each rank's own are what it holds): a view, a
    # batched matrix product (its result viewed back to the batch's shape), and the
    # copying forms of a view and an expansion.
    "view_sizes": lambda a, b: a.view(a.shape[0], 1, a.shape[1]) * 2,
    "matmul_batched": lambda a, b: a[:, None, :] @ b,
    "view_copy": lambda a, b: torch.view_copy(a, (a.shape[0], 1, a.shape[1])),
    "expand_copy": lambda a, b: torch.expand_copy(a[None], (3, a.shape[0], a.shape[1])),
    # Upsampling (an image model's decoder), each row a sample of one channel: every mode
    # of a dimensionality, summed.
    "upsample_1d": lambda a, b: _upsampled(a[:, None, :], _MODES_1D),
    "upsample_2d": lambda a, b: _upsampled(a[:, None, :, None], _MODES_2D),
    "upsample_3d": lambda a, b: _upsampled(a[:, None, :, None, None], _MODES_3D),
    # Linear algebra on a matrix made invertible (a whitening step, a second-order
    # optimizer's preconditioner): the factorizations that check their input for errors.
    "linear_algebra": lambda a, b: _solved(a, b),
}


def _new_tensors(a: Any) -> Any:
    # An empty one is written over whole (copy_), as autograd does with it: DTensor lays it
    # out as ``a``, a partial sum included (torch#180511), so what is written is ``a``'s kind.
    made = (a.new_full(a.shape, 2.5), a.new_ones(a.shape) * a, a.new_zeros(a.shape),
            a.new_empty(a.shape).copy_(a * 3),
            a.new_empty_strided(a.shape, a.stride()).copy_(a * -2))  # fmt: skip
    return _summed(made)


def _solved(a: Any, b: Any) -> Any:
    gram = a.t() @ a
    ones = torch.ones_like(gram)
    # Integers plus four times the identity (made of the upper triangle of ones less its
    # part above the diagonal): positive definite and exact, so each rank's factorization is
    # the whole matrix's.
    spd = gram + 4 * (ones.triu() - ones.triu(1))
    made = (torch.linalg.inv(spd) @ b, torch.linalg.solve(spd, b),
            torch.linalg.cholesky(spd) @ b, torch.linalg.lu_factor(spd)[0] @ b,
            torch.linalg.ldl_factor(spd)[0] @ b)  # fmt: skip
    return _summed(made)


def _upsampled(images: Any, modes: tuple[str, ...]) -> Any:
    results = []
    for mode in modes:
        name, _, antialias = mode.partition(" ")
        smooth = {} if name.startswith("nearest") else {"align_corners": False}
        interpolate = torch.nn.functional.interpolate
        results.append(interpolate(images, scale_factor=2, mode=name,
                                   antialias=bool(antialias), **smooth))  # fmt: skip
    return _summed(tuple(results))


def _summed(results: tuple[Any, ...]) -> Any:
    first, *rest = results
    for result in rest:
        first = first + result
    return first


# Operations first held here on torch 2.13 (tensors made from a DTensor, views given whole
# sizes, upsampling, linear algebra): drawn from that release on, older ones' DTensor not
# checked for them.
FROM_2_13 = ("new_tensors", "expand", "view_sizes", "matmul_batched", "view_copy",
             "expand_copy", "select_column", "upsample_1d", "upsample_2d",
             "upsample_3d", "linear_algebra", "linear", "list_of_one")  # fmt: skip


def operations_held() -> list[str]:
    """The names of :data:`OPERATIONS` held against the installed torch."""
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) >= "2.13":
        return sorted(OPERATIONS)
    return sorted(set(OPERATIONS) - set(FROM_2_13))


# Operations autograd goes through in training (the rest are taken forward only).
DIFFERENTIABLE = ("add", "neg", "relu", "exp", "sum", "sum_rows", "sum_columns", "mean",
                  "mean_rows", "norm", "softmax", "matmul", "transpose", "cat", "slice_columns",
                  "select_row", "select_column", "new_tensors", "expand", "view_sizes",
                  "matmul_batched", "view_copy", "expand_copy", "upsample_1d",
                  "upsample_2d", "upsample_3d", "linear", "list_of_one")  # fmt: skip


def full_value(seed: int, which: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Tensor ``which`` of a case, whole: small integers in float64 (sums exact)."""
    generator = torch.Generator().manual_seed(seed * 31 + which)
    return torch.randint(-4, 5, shape, generator=generator).to(torch.float64)


def _placement(name: str) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if name.startswith("shard"):
        return Shard(int(name[len("shard") :]))
    return {"replicate": Replicate(), "partial": Partial()}[name]


def laid_out(full: torch.Tensor, mesh: Any, placements: tuple[str, ...]) -> Any:
    """``full`` as a DTensor with ``placements`` (one a mesh dimension): sharded through
    ``distribute_tensor``; a partial sum by the first rank along that mesh dimension holding
    the value and the others zeros, through ``DTensor.from_local``."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    plain = [_placement("replicate" if p == "partial" else p) for p in placements]
    local = distribute_tensor(full, mesh, plain).to_local()
    if "partial" not in placements:
        return distribute_tensor(full, mesh, plain)
    for dim, p in enumerate(placements):
        if p == "partial" and mesh.get_local_rank(dim) != 0:
            local = torch.zeros_like(local)
    return DTensor.from_local(local, mesh, [_placement(p) for p in placements],
                              shape=full.shape, stride=full.stride())  # fmt: skip


def operations(case: dict[str, Any]) -> dict[str, Any]:
    """Lay the case's two tensors out on a mesh of its shape, redistribute the first to the
    case's target placements, run each operation of the case on them and, for the
    differentiable ones, backward through the sum of the result (weighted by a fixed
    tensor); everything returned whole, or the error an operation raised."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    a_full = full_value(case["seed"], 0, tuple(case["a_shape"]))
    b_full = full_value(case["seed"], 1, tuple(case["b_shape"]))
    out: dict[str, Any] = {}
    a = laid_out(a_full, mesh, tuple(case["a_placements"]))
    b = laid_out(b_full, mesh, tuple(case["b_placements"]))
    out["laid out"] = a.full_tensor()
    target = [_placement(p) for p in case["target"]]
    out["redistributed"] = a.redistribute(mesh, target).full_tensor()
    if "partial" not in case["a_placements"]:
        # A user's redistribution to a partial sum: refused, or (where the release documents
        # Shard -> Partial("sum")) the whole tensor it stands for.
        try:
            summed = a.redistribute(mesh, [_placement("partial")] * mesh.ndim)
            out["to partial"] = summed.full_tensor()
        except RuntimeError as exc:
            out["to partial"] = str(exc)
    for name in case["operations"]:
        try:
            out[name] = OPERATIONS[name](a, b).full_tensor()
        except (RuntimeError, NotImplementedError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if name in DIFFERENTIABLE and "partial" not in case["a_placements"]:
            leaf = laid_out(a_full, mesh, tuple(case["a_placements"])).detach()
            leaf.requires_grad_()
            result = OPERATIONS[name](leaf, b)
            weights = full_value(case["seed"], 2, tuple(result.shape))
            # The weights replicated, or laid out as the result (its gradient then arrives
            # cut as the result is, as from a loss over sharded outputs).
            laid = _replicated(result) if case.get("weights") != "as result" else _kept(result)
            (result * laid_out(weights, mesh, laid)).sum().backward()
            out[f"{name} gradient"] = leaf.grad.full_tensor()
    dist.barrier()
    return out


def _replicated(result: Any) -> tuple[str, ...]:
    return ("replicate",) * result.device_mesh.ndim


def _kept(result: Any) -> tuple[str, ...]:
    # The result's layout, a partial sum's replicated (weights are never a partial sum).
    return tuple("replicate" if p.is_partial() else _name(p) for p in result.placements)


def api_forms(seed: int, shape: tuple[int, int]) -> dict[str, Any]:
    """DTensor's documented keyword forms on a 1-D mesh over the world, rank r holding its
    own tensor ``T_r`` (tensor 0 of the case plus r) where the form says whose data counts:
    ``distribute_tensor`` with ``src_data_rank`` 0, the last rank and None, and with no
    placements; ``from_local`` with ``run_check`` on replicas that differ, and with the whole
    ``shape`` and ``stride`` of an uneven sharding; ``redistribute`` with ``forward_dtype``,
    ``backward_dtype`` and ``async_op``; ``to_local``, ``full_tensor`` and ``from_local``
    with ``grad_placements`` hinting a partial gradient. What this rank holds of each (local
    tensors, dtypes, gradients)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    size, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (size,))
    own = full_value(seed, 0, shape) + rank
    out: dict[str, Any] = {}
    # Each from a copy: a replica is broadcast into the tensor given (it is the DTensor's
    # storage, as a parameter's is), which would leave every later form rank 0's data.
    for source in (0, size - 1, None):
        for name, placement in (("shard0", Shard(0)), ("replicate", Replicate())):
            made = distribute_tensor(own.clone(), mesh, [placement], src_data_rank=source)
            out[f"distributed {name} from {source}"] = made.to_local()
    out["distributed, no placements"] = distribute_tensor(own.clone(), mesh).to_local()
    for check in (False, True):
        made = DTensor.from_local(own.clone(), mesh, [Replicate()], run_check=check)
        out[f"from_local replicas, run_check={check}"] = made.to_local()
    whole = full_value(seed, 1, shape)
    mine = whole.chunk(size)[rank] if rank < len(whole.chunk(size)) else whole[:0]
    uneven = DTensor.from_local(mine, mesh, [Shard(0)], shape=whole.shape, stride=whole.stride())
    out["from_local uneven, whole"] = uneven.full_tensor()
    out["from_local uneven, shape"] = list(uneven.shape)
    # forward_dtype: the result in that dtype; backward_dtype: the gradient's collective in
    # that dtype (its rounding visible), the gradient cast back to the input's dtype.
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    cast = sharded.redistribute(mesh, [Replicate()], forward_dtype=torch.float32)
    out["forward_dtype"] = [str(cast.dtype), cast.to_local()]
    grad = full_value(seed, 2, shape) * (1 + 2.0**-12)  # not a bfloat16
    for backward in (None, torch.bfloat16):
        leaf = distribute_tensor(whole, mesh, [Replicate()]).requires_grad_()
        moved = leaf.redistribute(mesh, [Shard(0)], backward_dtype=backward)
        weights = distribute_tensor(grad, mesh, [Shard(0)]).to_local()
        (moved.to_local() * weights).sum().backward()
        out[f"backward_dtype={backward}"] = [str(leaf.grad.dtype), leaf.grad.to_local()]
    waited = sharded.redistribute(mesh, [Replicate()], async_op=True).to_local()
    out["async_op"] = waited.wait() if hasattr(waited, "wait") else waited
    # A gradient hinted partial: the ranks' own contributions, summed in the whole gradient;
    # unhinted, each rank's own taken as the replica (or its shard of it) it is said to be.
    mine_grad = grad + rank
    for hint in (None, [Partial()]):
        leaf = distribute_tensor(whole, mesh, [Replicate()]).requires_grad_()
        (leaf.to_local(grad_placements=hint) * mine_grad).sum().backward()
        out[f"to_local grad_placements={hint is not None}"] = leaf.grad.full_tensor()
        leaf = distribute_tensor(whole, mesh, [Shard(0)]).requires_grad_()
        (leaf.full_tensor(grad_placements=hint) * mine_grad).sum().backward()
        out[f"full_tensor grad_placements={hint is not None}"] = leaf.grad.full_tensor()
        # from_local's hint: the layout the local tensor's gradient is given in. Each rank's
        # own contribution (a partial gradient, said so to to_local) left partial, or
        # unhinted made the replicated whole its placements say.
        local = whole.clone().requires_grad_()
        made = DTensor.from_local(local, mesh, [Replicate()], grad_placements=hint)
        (made.to_local(grad_placements=[Partial()]) * mine_grad).sum().backward()
        out[f"from_local grad_placements={hint is not None}"] = local.grad
    dist.barrier()
    return out


def communication(case: dict[str, Any]) -> dict[str, Any]:
    """Run one operation of :data:`OPERATIONS` on the case's two tensors, laid out (outside
    the count) as its placements say, under ``CommDebugMode``: the collectives the operation
    itself issued, the placements of its result, and the result whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    a = laid_out(full_value(case["seed"], 0, tuple(case["a_shape"])), mesh,
                 tuple(case["a_placements"]))  # fmt: skip
    b = laid_out(full_value(case["seed"], 1, tuple(case["b_shape"])), mesh,
                 tuple(case["b_placements"]))  # fmt: skip
    counting = CommDebugMode()
    with counting:
        result = OPERATIONS[case["operation"]](a, b)
    out = {
        "collectives": {str(op): n for op, n in counting.get_comm_counts().items()},
        "placements": [_name(p) for p in result.placements],
        "whole": result.full_tensor(),
    }
    dist.barrier()
    return out


def _name(placement: Any) -> str:
    if placement.is_shard():
        return f"shard{placement.dim}"
    return "partial" if placement.is_partial() else "replicate"


def _out(op: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = torch.empty_like(args[0])
        op(*args, **kwargs, out=out)
        return out

    return call


def _max_out(x: Any) -> Any:
    # The largest of each row into out tensors (values and indices); the values held (which
    # of two equal entries an index names is the implementation's).
    values = torch.empty_like(x[:, 0])
    indices = torch.empty_like(x[:, 0], dtype=torch.long)
    torch.max(x, 1, out=(values, indices))
    return values


def _statistics(x: Any) -> list[Any]:
    """A batch norm's weight, bias, running mean and running variance for ``x``'s columns
    (its channels), fixed values, replicated over ``x``'s mesh where ``x`` is a DTensor (every
    rank holds them already: nothing is sent)."""
    from torch.distributed.tensor import DTensor, Replicate

    channels = x.shape[1]
    stats = [torch.linspace(low, high, channels, dtype=x.dtype)
             for low, high in ((0.5, 1.5), (-1.0, 1.0), (-0.5, 0.5), (0.5, 2.0))]  # fmt: skip
    if not isinstance(x, DTensor):
        return stats
    every = [Replicate()] * x.device_mesh.ndim
    return [DTensor.from_local(t, x.device_mesh, every, run_check=False) for t in stats]


def _functionalized(name: str, *args: Any, returned: int = 0) -> Any:
    # aten's ``*_functional`` operation: what functionalization (``torch.compile``, export)
    # makes of an operation that writes an input: the written inputs come back as new
    # tensors after its own results; ``returned`` picks one.
    return getattr(torch.ops.aten, f"{name}_functional")(*args)[returned]


def _inplace(method: str) -> Callable[..., Any]:
    def call(x: Any, *args: Any, **kwargs: Any) -> Any:
        held = x.clone()
        getattr(held, method)(*args, **kwargs)
        return held

    return call


def _foreach(name: str, *, inplace: bool = False) -> Callable[..., Any]:
    def call(x: Any, *args: Any, **kwargs: Any) -> Any:
        # Two tensors in the list: the second is what is checked, so a form that reads the
        # wrong list entry shows.
        held = [x.clone() * 0 + 1, x.clone()]
        listed = [[a, a] if isinstance(a, torch.Tensor) else a for a in args]
        result = getattr(torch, name)(held, *listed, **kwargs)
        return (held if inplace else result)[1]

    return call


# The forms optimizers and training steps write an update in (functional, in place, into an
# ``out`` tensor, over a list at once), of ``x`` with ``y`` and ``z`` (z never zero); each is
# what the same form does on the whole tensors.
FORMS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda x, y, z: torch.add(x, y, alpha=2),
    "add out": lambda x, y, z: _out(torch.add)(x, y, alpha=2),
    "add_": lambda x, y, z: _inplace("add_")(x, y, alpha=2),
    "_foreach_add": lambda x, y, z: _foreach("_foreach_add")(x, y, alpha=2),
    "_foreach_add_": lambda x, y, z: _foreach("_foreach_add_", inplace=True)(x, y, alpha=2),
    "mul out": lambda x, y, z: _out(torch.mul)(x, y),
    "mul_": lambda x, y, z: _inplace("mul_")(x, y),
    "_foreach_mul_ scalar": lambda x, y, z: _foreach("_foreach_mul_", inplace=True)(x, 3.0),
    # In place, the dimensions renumbered (the shard's dimension with them).
    "squeeze_": lambda x, y, z: _inplace("squeeze_")(x.unsqueeze(0), 0),
    "div out": lambda x, y, z: _out(torch.div)(x, z),
    "_foreach_div": lambda x, y, z: _foreach("_foreach_div")(x, z),
    "lerp_": lambda x, y, z: _inplace("lerp_")(x, y, 0.25),
    "_foreach_lerp_": lambda x, y, z: _foreach("_foreach_lerp_", inplace=True)(x, y, 0.25),
    "addcmul_": lambda x, y, z: _inplace("addcmul_")(x, y, y, value=0.5),
    "_foreach_addcmul_": lambda x, y, z: _foreach("_foreach_addcmul_", inplace=True)(
        x, y, y, value=0.5
    ),
    "addcdiv out": lambda x, y, z: _out(torch.addcdiv)(x, y, z, value=-0.5),
    "_foreach_addcdiv_": lambda x, y, z: _foreach("_foreach_addcdiv_", inplace=True)(
        x, y, z, value=-0.5
    ),
    "sqrt out": lambda x, y, z: _out(torch.sqrt)(z),
    "_foreach_sqrt": lambda x, y, z: _foreach("_foreach_sqrt")(z),
    "maximum out": lambda x, y, z: _out(torch.maximum)(x, y),
    # Forms a release derives from the operation's own rule (DERIVED) rather than lists.
    "_foreach_add_ scalar tensor": lambda x, y, z: _foreach("_foreach_add_", inplace=True)(
        x, torch.tensor(2.5, dtype=x.dtype)
    ),
    "_foreach_add scalars": lambda x, y, z: _foreach("_foreach_add")(x, [1.5, -2.0]),
    "_foreach_clamp_max_": lambda x, y, z: _foreach("_foreach_clamp_max_", inplace=True)(x, y),
    "_foreach_clamp_min scalars": lambda x, y, z: _foreach("_foreach_clamp_min")(x, [0.5, -1.0]),
    "max out": lambda x, y, z: _max_out(x),
    "_foreach_expm1": lambda x, y, z: _foreach("_foreach_expm1")(x / 8),
    "_foreach_erf_": lambda x, y, z: _foreach("_foreach_erf_", inplace=True)(x / 4),
    "gt_": lambda x, y, z: _inplace("gt_")(x, y),
    "ge_ scalar": lambda x, y, z: _inplace("ge_")(x, 0.5),
    "threshold out": lambda x, y, z: _out(torch.threshold)(x, 0.25, -1.0),
    # The functional forms of operations that write an input (a running statistic, a noise
    # buffer, a tensor filled at random: here with no spread, so its value is known).
    "normal_functional": lambda x, y, z: torch.ops.aten.normal_functional(x, 2.0, 0.0),
    "rrelu_with_noise_functional": lambda x, y, z: _functionalized(
        "rrelu_with_noise", x, z, 0.125, 0.375, False
    ),
    "rrelu_with_noise_functional noise": lambda x, y, z: _functionalized(
        "rrelu_with_noise", x, z, 0.125, 0.375, False, returned=1
    ),
    "_native_batch_norm_legit_functional eval": lambda x, y, z: _functionalized(
        "_native_batch_norm_legit", x, *_statistics(x), False, 0.1, 1e-5
    ),
    "_batch_norm_with_update_functional": lambda x, y, z: _functionalized(
        "_batch_norm_with_update", x, *_statistics(x), 0.1, 1e-5
    ),
    "_batch_norm_with_update_functional running var": lambda x, y, z: _functionalized(
        "_batch_norm_with_update", x, *_statistics(x), 0.1, 1e-5, returned=4
    ),
}


# The out forms and the rest past the optimizers' own: those a release that derives its
# variants of an operation from the operation (``_ops.autogen``) has, and older ones may not.
DERIVED = ("add out", "mul out", "div out", "addcdiv out", "sqrt out", "maximum out",
           "_foreach_add_ scalar tensor", "_foreach_add scalars", "_foreach_clamp_max_",
           "_foreach_clamp_min scalars", "gt_", "ge_ scalar", "_foreach_expm1",
           "_foreach_erf_", "max out", "threshold out", "normal_functional",
           "rrelu_with_noise_functional", "rrelu_with_noise_functional noise",
           "_native_batch_norm_legit_functional eval", "_batch_norm_with_update_functional",
           "_batch_norm_with_update_functional running var")  # fmt: skip
# Forms whose result is laid out otherwise than their input (a reduction, a batch norm's
# statistics over the batch and per channel), communicating where the input is cut along
# what they reduce.
REDUCING = ("max out", "_native_batch_norm_legit_functional eval",
            "_batch_norm_with_update_functional",
            "_batch_norm_with_update_functional running var")  # fmt: skip
# Forms that take statistics over a batch, which needs more than one sample (``batch_norm``
# refuses one in training: "Expected more than 1 value per channel").
BATCHED = ("_batch_norm_with_update_functional",
           "_batch_norm_with_update_functional running var")  # fmt: skip


def derives_forms() -> bool:
    """Whether the installed release derives an operation's in-place, out and list forms
    from the operation's own rule (so every form of :data:`FORMS` is one it has)."""
    import importlib.util

    return importlib.util.find_spec("torch.distributed.tensor._ops.autogen") is not None


def form_values(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """``x``, ``y`` and ``z`` of :data:`FORMS`, whole (``z`` positive: a divisor, a root)."""
    x, y = full_value(seed, 0, shape), full_value(seed, 1, shape)
    return x, y, full_value(seed, 2, shape).abs() + 1


def forms(case: dict[str, Any]) -> dict[str, Any]:
    """Each of :data:`FORMS` on the case's three tensors, all laid out with its placements:
    per form, the collectives it issued, its result's placements and the result whole (or
    the error it raised)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    laid = [laid_out(t, mesh, tuple(case["placements"]))
            for t in form_values(case["seed"], tuple(case["shape"]))]  # fmt: skip
    out: dict[str, Any] = {}
    for name in case["forms"]:
        counting = CommDebugMode()
        try:
            with counting:
                result = FORMS[name](*laid)
        except (RuntimeError, NotImplementedError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            continue
        out[name] = {
            "collectives": {str(op): n for op, n in counting.get_comm_counts().items()},
            "placements": [_name(p) for p in result.placements],
            "whole": result.full_tensor(),
        }
    dist.barrier()
    return out


# Operations written into an ``out`` tensor laid out otherwise than their inputs: ``x``,
# ``y``, ``z`` as in :data:`FORMS`, then the out tensor.
INTO: dict[str, Callable[..., Any]] = {
    "add": lambda x, y, z, out: torch.add(x, y, alpha=2, out=out),
    "mul": lambda x, y, z, out: torch.mul(x, y, out=out),
    "sqrt": lambda x, y, z, out: torch.sqrt(z, out=out),
    "threshold": lambda x, y, z, out: torch.threshold(x, 0.25, -1.0, out=out),
}


def written_into(case: dict[str, Any]) -> list[Any]:
    """The case's three tensors laid out with its placements, then each of its writes (an
    :data:`INTO` operation into a new out tensor laid out as the write names), one after
    another in one process: per write, whether the operation returned its out tensor, the
    out tensor's placements after it and its value whole (or the error it raised)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    shape = tuple(case["shape"])
    laid = [laid_out(t, mesh, tuple(case["placements"]))
            for t in form_values(case["seed"], shape)]  # fmt: skip
    out: list[Any] = []
    for name, placements in case["writes"]:
        target = laid_out(torch.zeros(shape, dtype=torch.float64), mesh, tuple(placements))
        try:
            returned = INTO[name](*laid, target)
        except (RuntimeError, NotImplementedError) as exc:
            out.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
            continue
        out.append({"returned out": returned is target,
                    "placements": [_name(p) for p in target.placements],
                    "whole": target.full_tensor()})  # fmt: skip
    dist.barrier()
    return out


def pieces(case: dict[str, Any]) -> dict[str, Any]:
    """The case's tensor laid out by ``distribute_tensor`` with its placements on a mesh of
    its shape: this rank's coordinate on the mesh, the piece it holds (``to_local``) and the
    chunk a checkpoint records it as (``__create_chunk_list__``: its offsets and sizes)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", tuple(case["mesh"]))
    full = full_value(case["seed"], 0, tuple(case["shape"]))
    laid = distribute_tensor(full, mesh, [_placement(p) for p in case["placements"]])
    out: dict[str, Any] = {"coordinate": mesh.get_coordinate(), "piece": laid.to_local().clone()}
    if hasattr(laid, "__create_chunk_list__"):
        # Where a checkpoint says the piece lies in the whole (its chunk: offsets, sizes).
        out["chunks"] = [(list(c.offsets), list(c.sizes)) for c in laid.__create_chunk_list__()]
    dist.barrier()
    return out
