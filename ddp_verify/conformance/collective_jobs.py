"""Jobs of ``test_collectives``, ``test_object_collectives`` and ``test_device_mesh``, run on
every rank: c10d's collectives, point-to-point sends and groups (and the device meshes laid
over them), each rank's inputs generated from the case, what each call left returned for the
test to judge against every rank's inputs combined."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from .refusal_jobs import refusals

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
    with made_group(grouping) as group:
        return _collectives(seed, group, rank, op, dtype, root, by_group_rank, async_op)


@contextlib.contextmanager
def made_group(grouping: tuple[Any, ...]) -> Iterator[Any]:
    """The group :func:`group_of` makes for this rank, its groups destroyed on leaving."""
    group, created = group_of(grouping)
    try:
        yield group
    finally:
        _destroy(created)


def group_of(grouping: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """The group this rank runs collectives over, and the groups made for it (to destroy):
    ``("default",)``, the world; ``("new_group", ranks, sort_ranks)`` (ranks in the order
    given; ``sort_ranks=False`` keeps it); ``("new_subgroups", size)``, the
    rank's block of ``size``; ``("subgroups_of", order, size)``, the rank's block of ``size``
    among a group's ranks ``order`` (made with ``sort_ranks=False``); ``("by_enumeration",
    ranks_lists)``, the rank's list (None where it is in none)."""
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
    if kind == "subgroups_of":  # ("subgroups_of", order, size)
        parent = dist.new_group(list(grouping[1]), sort_ranks=False)
        mine, every = dist.new_subgroups(group_size=grouping[2], group=parent)
        return mine, [*every, parent]
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
    return refusals(calls)


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
    """Destroy the groups this rank made, once every rank is done with them: each job calls
    this once on every rank. Without the wait, a rank that made a group it then never used
    closed its end while a peer was still connecting gloo's full mesh, and the peer's
    ``new_group`` failed ("Connection closed by peer"): a false failure of unmodified torch,
    seen once in CI on a subgroup of one rank each."""
    dist.barrier()
    for made in groups:
        if made not in (None, dist.GroupMember.NON_GROUP_MEMBER):
            dist.destroy_process_group(made)


def local_group_then_world(seconds: int) -> dict[str, Any]:
    """A group made with ``use_local_synchronization=True`` by its member alone (the last
    rank; the others never call, as the option allows), after which every rank makes and uses
    a group over the world (given ``seconds`` to form, so that ranks that disagree on it fail
    within them): the all-reduces' results."""
    import datetime

    rank, size = dist.get_rank(), dist.get_world_size()
    wait = datetime.timedelta(seconds=seconds)
    said: dict[str, Any] = {}
    local: Any = None
    if rank == size - 1:
        local = dist.new_group([rank], use_local_synchronization=True, timeout=wait)
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=local)
        said["local group"] = x.tolist()
    world = dist.new_group(list(range(size)), timeout=wait)
    y = torch.tensor([1.0])
    dist.all_reduce(y, group=world)
    said["world after a local group"] = y.tolist()
    _destroy([local, world])
    return said


def group_settings(seconds: int) -> dict[str, Any]:
    """The time-out of each group c10d makes without one (documented: 30 minutes but on NCCL,
    whose is 10) and with ``seconds`` given; groups made with a backend named and given per
    device; the refusal of a time-out that is no timedelta."""
    import datetime

    size = dist.get_world_size()
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
    # A backend named, or given per device ("cpu:gloo", the documented string): the group
    # says which, and reduces over its members.
    named = {"by name": dist.new_group(list(range(size)), backend="gloo"),
             "per device": dist.new_group(list(range(size)), backend="cpu:gloo")}  # fmt: skip
    for how, group in named.items():
        z = torch.tensor([2.0])
        dist.all_reduce(z, group=group)
        said[f"backend {how}"] = (dist.get_backend(group), z.tolist())
    said["a time-out that is not a timedelta"] = refusals(
        {"made": lambda: dist.new_group(list(range(size)), timeout=seconds)}, (TypeError,)
    )["made"]
    _destroy([*made, *every, *listed, *named.values()])
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
    with made_group(grouping) as group:
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


def objects_in_a_group(objects: tuple[object, ...], grouping: tuple[Any, ...], root: int,
                       by_group_rank: bool) -> dict[str, Any] | None:  # fmt: skip
    """The object collectives over the group ``grouping`` makes for this rank (see
    :func:`group_of`): rank r contributes ``objects[r]``; the root is group rank ``root``
    (modulo the group's size), named by its global rank or (``by_group_rank``) its group
    rank, and holds ``objects`` to broadcast and scatter (the object for group rank i is
    ``objects[i]``). None outside any group."""
    rank = dist.get_rank()
    with made_group(grouping) as group:
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


def _made_in_a_thread(mesh: Any, shape: tuple[int, ...], names: tuple[str, ...]) -> bool:
    # The same mesh made by another thread of this process (a checkpointing or data thread):
    # equal, and hashed alike, as the mesh made by the main thread (only the test-only
    # "threaded" backend, a rank a thread, tells threads apart).
    import threading

    from torch.distributed.device_mesh import init_device_mesh

    made: list[Any] = []
    worker = threading.Thread(
        target=lambda: made.append(init_device_mesh("cpu", shape, mesh_dim_names=names))
    )
    worker.start()
    worker.join(timeout=300)
    if worker.is_alive() or not made:
        raise RuntimeError("making a mesh in another thread did not finish in 300 s")
    return bool(mesh == made[0] and hash(mesh) == hash(made[0]))


def mesh_backend_overridden(shape: tuple[int, ...], dim: int, by_name: bool, form: str,
                            outright: bool) -> dict[str, Any]:  # fmt: skip
    """A mesh of ``shape`` over the world (dimensions named ``d0``, ``d1``, ...) whose
    dimension ``dim`` (keyed by its name where ``by_name``) has its own backend through
    ``backend_override``, in the documented ``form``: ``"options"`` (gloo's options with a
    123 s time-out), ``"both"`` (``("gloo", options)``) or ``"name"`` (``"gloo"``); made by
    ``init_device_mesh``, or ``DeviceMesh`` given the world's ranks where ``outright`` (a
    ``(backend, options)`` pair a dimension, ``by_name`` not applying). Each
    dimension's group: its backend, its options' time-out in seconds (None where this torch
    shows none) and the sum of its members' ranks by an all-reduce over it."""
    import datetime

    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    names = tuple(f"d{i}" for i in range(len(shape)))
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=123)
    if outright:
        # DeviceMesh takes a (backend, options) pair for every dimension, by position.
        pair = {"options": (None, options), "both": ("gloo", options), "name": ("gloo", None)}
        pairs = tuple(pair[form] if d == dim else (None, None) for d in range(len(shape)))
        ranks = torch.arange(dist.get_world_size()).reshape(shape)
        mesh = DeviceMesh("cpu", ranks, mesh_dim_names=names, backend_override=pairs)
    else:
        value = {"options": options, "both": ("gloo", options), "name": "gloo"}[form]
        override = {names[dim] if by_name else dim: value}
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names, backend_override=override)

    def timeout(group: Any) -> float | None:
        held = getattr(group._get_backend(torch.device("cpu")), "options", None)
        return None if held is None else held._timeout.total_seconds()

    groups = []
    for d in range(len(shape)):
        group = mesh.get_group(d)
        summed = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(summed, group=group)
        groups.append({"backend": str(dist.get_backend(group)), "timeout": timeout(group),
                       "sum": summed.item()})  # fmt: skip
    return {"groups": groups}


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
        "equal to one made in another thread": _made_in_a_thread(mesh, shape, names),
        # Each dimension's one-dimensional submesh, asked for its group without naming a
        # dimension (its only one, as get_group documents).
        "submesh groups": [dist.get_process_group_ranks(mesh[name].get_group()) for name in names],
        "all groups": [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()],
        "shape": list(mesh.shape),
        "rank": mesh.get_rank(),
    }
    # Submeshes of every ordered choice of dimensions, and (where this torch has them, as
    # torchtitan's layouts use them) each choice flattened into one dimension and each
    # dimension unflattened into two: what this rank's groups hold.
    ordered = [s for s in _ordered_subsets(len(names)) if len(s) > 1]
    chosen = {",".join(names[d] for d in s): mesh[tuple(names[d] for d in s)] for s in ordered}
    out["ordered submeshes"] = {k: m.mesh.tolist() for k, m in chosen.items()}
    if hasattr(mesh, "_flatten"):
        flat = {}
        for s in _ordered_subsets(len(names)):
            key = ",".join(names[d] for d in s)
            made = (mesh[names[s[0]]] if len(s) == 1 else chosen[key])._flatten("_".join(key))
            flat[key] = [made.mesh.tolist(), dist.get_process_group_ranks(made.get_group())]
        out["flattened"] = flat
    if hasattr(mesh, "_unflatten"):
        split = {}
        for d, n in enumerate(shape):
            for a in (a for a in range(1, n + 1) if n % a == 0):
                made = mesh._unflatten(d, (a, n // a), (f"u{d}a{a}", f"u{d}b{a}"))
                split[f"{d}:{a}"] = [made.mesh.tolist(), list(made.get_coordinate() or ()),
                                     [dist.get_process_group_ranks(made.get_group(e))
                                      for e in range(made.ndim)]]  # fmt: skip
        out["unflattened"] = split
    size = dist.get_world_size()
    refused: dict[str, Any] = {
        "a mesh of more ranks than the world": lambda: init_device_mesh("cpu", (size + 1,)),
        "names of another length": lambda: init_device_mesh(
            "cpu", shape, mesh_dim_names=(*names, "extra")
        ),
        "a name twice": lambda: init_device_mesh("cpu", (1, size), mesh_dim_names=("a", "a")),
        "dimensions out of order": lambda: mesh[tuple(reversed(names))],
        "a group of no dimension named": lambda: mesh.get_group(),
    }
    if len(names) < 2:
        del refused["dimensions out of order"]
        del refused["a group of no dimension named"]  # a 1-D mesh's only group: given
    wide = [name for name, n in zip(names, shape, strict=True) if n > 1]
    if len(wide) >= 2 and hasattr(mesh, "_flatten"):
        # A dimension flattened from two, sliced beside one of those two: the same ranks
        # twice over.
        joined = "_".join(wide[:2]) + "_again"
        mesh[tuple(wide[:2])]._flatten(joined)
        refused["a flattened dimension beside one of its own"] = lambda: mesh[(joined, wide[1])]
    out["refused"] = refusals(refused, (RuntimeError, ValueError, KeyError))
    return out


def _ordered_subsets(n: int) -> list[tuple[int, ...]]:
    """Every non-empty choice of ``range(n)``, each in ascending order."""
    return [tuple(d for d in range(n) if bits >> d & 1) for bits in range(1, 2**n)]


def meshes_given_outright(order: list[int]) -> dict[str, Any]:
    """``DeviceMesh("cpu", order)`` made directly from a tensor of the world's ranks in
    ``order``, and one over the first rank alone: this rank's coordinates, its group's ranks
    by ``get_group()`` without a dimension, and a row-sharded DTensor of ``arange(2 * size)``
    as ``distribute_tensor`` lays it out (this rank's shard) and as ``from_local`` assembles
    it from the shard of this rank's coordinate."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    size = dist.get_world_size()
    mesh = DeviceMesh("cpu", torch.tensor(order))
    alone = DeviceMesh("cpu", torch.tensor([0]))
    full = torch.arange(2.0 * size)
    coordinate = mesh.get_coordinate()
    assert coordinate is not None
    shard = full.chunk(size)[coordinate[0]]
    return {
        "coordinate": list(coordinate),
        "alone": None if alone.get_coordinate() is None else list(alone.get_coordinate()),
        "group": dist.get_process_group_ranks(mesh.get_group()),
        "distributed shard": distribute_tensor(full, mesh, [Shard(0)]).to_local().tolist(),
        "from_local whole": DTensor.from_local(shard, mesh, [Shard(0)]).full_tensor().tolist(),
    }
