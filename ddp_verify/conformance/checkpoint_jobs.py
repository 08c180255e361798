"""Jobs of ``test_checkpoint``, run on every rank: a state of DTensors (sharded, degenerate
shards included), plain tensors and plain values saved with ``torch.distributed.checkpoint``
and loaded back, into the same placements or others."""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import IO, Any

import torch
import torch.distributed as dist

# An entry of the state: (key, "dtensor" or "tensor", shape, dtype, placement saved, placement
# loaded into); placements "shard0", "shard1", "replicate" (a DTensor's; a tensor's "-").
Entry = tuple[str, str, tuple[int, ...], str, str, str]
# Values that are not tensors, as training state has them (a step, a name, a schedule).
EXTRAS_KEYS = ("step", "name", "schedule")


@contextlib.contextmanager
def shared_directory() -> Iterator[str]:
    """A directory every rank writes its shards to: rank 0's temporary one, broadcast, and
    removed when the job ends, failed or not (a known issue's failing load would otherwise
    leave one behind at every run)."""
    made = [tempfile.mkdtemp(prefix="ddp_verify-dcp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(made, src=0)
    try:
        yield str(made[0])
        dist.barrier()  # every rank has read it before it goes
    finally:
        # No barrier on failure: a rank that did not fail would wait for one that did.
        if dist.get_rank() == 0:
            shutil.rmtree(str(made[0]), ignore_errors=True)


def value(seed: int, index: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """The full value of entry ``index``: small integers in ``dtype`` (bool: their parity)."""
    generator = torch.Generator().manual_seed(seed * 101 + index)
    drawn = torch.randint(-5, 6, shape, generator=generator)
    return drawn % 2 == 1 if dtype == "bool" else drawn.to(getattr(torch, dtype))


def extras(seed: int) -> dict[str, Any]:
    """The plain values saved beside the tensors."""
    return {"step": seed, "name": f"run-{seed}", "schedule": [seed % 7, "cosine", 0.5]}


def _byte_map(name: str, forth: Callable[[int], int], back: Callable[[int], int]) -> type:
    """A stream extension (``torch.distributed.checkpoint``'s experimental
    ``StreamTransformExtension``) mapping every byte written by ``forth`` and every byte read
    by ``back``: a stand-in for compression or encryption whose order against another such
    extension matters unless both are XORs."""
    from torch.distributed.checkpoint._extension import StreamTransformExtension

    class Writer(io.RawIOBase):
        def __init__(self, output: IO[bytes]) -> None:
            self.output = output

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            data = bytes(memoryview(b))
            self.output.write(bytes(forth(x) for x in data))
            return len(data)

        def flush(self) -> None:
            self.output.flush()

        def close(self) -> None:
            # A transform's close cascades to the stream it wraps (filesystem.py's contract).
            if not self.closed:
                self.flush()
                self.output.close()
            super().close()

    class Reader(io.RawIOBase):
        def __init__(self, source: IO[bytes]) -> None:
            self.source = source

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            data = self.source.read(len(b))
            b[: len(data)] = bytes(back(x) for x in data)
            return len(data)

    class Extension(StreamTransformExtension):
        @staticmethod
        def registry_name() -> str:
            return f"ddp_verify.{name}"

        @staticmethod
        def from_descriptor(version: str) -> Extension:
            return Extension()

        def get_descriptor(self) -> str:
            return f"{self.registry_name()}/1"

        def transform_to(self, output: IO[bytes]) -> IO[bytes]:
            return Writer(output)  # type: ignore[return-value]

        def transform_from(self, input: IO[bytes]) -> IO[bytes]:
            return io.BufferedReader(Reader(input))

    return Extension


# The stream extensions drawn: two XORs commute, a byte sum and a XOR do not.
_EXTENSIONS: dict[str, tuple[Callable[[int], int], Callable[[int], int]]] = {
    "add3": (lambda x: (x + 3) % 256, lambda x: (x - 3) % 256),
    "xor5a": (lambda x: x ^ 0x5A, lambda x: x ^ 0x5A),
    "xor33": (lambda x: x ^ 0x33, lambda x: x ^ 0x33),
}


def extensions(names: list[str]) -> tuple[list[Any], Any]:
    """The named stream extensions, in order, for a writer's ``_extensions``, and a registry
    holding them all for a reader's ``_extension_registry``."""
    from torch.distributed.checkpoint._extension import ExtensionRegistry

    kinds = {name: _byte_map(name, *maps) for name, maps in _EXTENSIONS.items()}
    registry = ExtensionRegistry()
    for kind in kinds.values():
        registry.register(kind)
    return [kinds[name]() for name in names], registry


def _placement(name: str) -> Any:
    from torch.distributed.tensor import Replicate, Shard

    return {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[name]


def _state(seed: int, entries: list[Entry], mesh: Any, zeros: bool, nested: bool,
           with_extras: bool) -> dict[str, Any]:  # fmt: skip
    """The state to save (``zeros=False``, placements saved) or to load into (zeros,
    placements loaded into)."""
    from torch.distributed.tensor import distribute_tensor

    state: dict[str, Any] = {}
    for index, (key, kind, shape, dtype, saved, loaded) in enumerate(entries):
        full = value(seed, index, shape, dtype)
        full = torch.zeros_like(full) if zeros else full
        if kind == "dtensor" and mesh is not None:
            placement = _placement(loaded if zeros else saved)
            state[key] = distribute_tensor(full, mesh, [placement])
        else:
            state[key] = full
    if with_extras:
        plain = extras(seed)
        plain = {k: None for k in plain} if zeros else plain
        state.update(plain)
    return {"model": state} if nested else state


def round_trip(case: dict[str, Any]) -> dict[str, Any]:
    """Save the case's state with ``dcp.save`` (its writer and planner options) into rank 0's
    temporary directory, load it into zeros of the placements loaded into, and into whole
    tensors without a process group; every entry's full tensor and plain value as each load
    left them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import (
        DefaultLoadPlanner,
        DefaultSavePlanner,
        FileSystemReader,
        FileSystemWriter,
    )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with shared_directory() as directory:
        seed, entries = case["seed"], [tuple(e) for e in case["entries"]]
        shape_of = {"nested": case["nested"], "with_extras": case["with_extras"]}
        planner = DefaultSavePlanner(**case["save_planner"])
        writer = dict(case["writer"])
        # Stream extensions given to the writer are found again by the reader's registry.
        streams, registry = extensions(list(case.get("extensions", [])))
        if streams:
            writer["_extensions"] = streams
        saving = {
            k: v for k, v in case["save"].items() if k in inspect.signature(dcp.save).parameters
        }
        # A planner that caches its plan is used twice, the second time on other values: a plan
        # is reused, the values must not be.
        for attempt, at in enumerate(("first", "second")[: 2 if case["twice"] else 1]):
            if case.get("saved_by_one_process"):
                # Rank 0 alone, without the group, every DTensor as the whole tensor: a checkpoint
                # a single-process run (or a conversion) wrote, resharded by the load below.
                if dist.get_rank() == 0:
                    whole = _state(seed + attempt, entries, None, zeros=False, **shape_of)
                    alone = FileSystemWriter(f"{directory}/{at}", **writer)
                    if case.get("asynchronously"):
                        done = dcp.async_save(whole, storage_writer=alone, planner=planner,
                                              no_dist=True)  # fmt: skip
                        _scribble(whole)
                        done.result()
                    else:
                        dcp.save(whole, storage_writer=alone, planner=planner, no_dist=True)
                dist.barrier()
                continue
            state = _state(seed + attempt, entries, mesh, zeros=False, **shape_of)
            storage = FileSystemWriter(f"{directory}/{at}", **writer)
            if case.get("asynchronously"):
                # In a background thread: staged first, so the state may change at once.
                done = dcp.async_save(state, storage_writer=storage, planner=planner, **saving)
                _scribble(state)
                done.result()
            else:
                dcp.save(state, storage_writer=storage, planner=planner, **saving)
        loaded_from = f"{directory}/{'second' if case['twice'] else 'first'}"
        target = _state(seed, entries, mesh, zeros=True, **shape_of)

        def reader() -> dict[str, Any]:
            if not streams:
                return {"checkpoint_id": loaded_from}
            return {"storage_reader": FileSystemReader(loaded_from, _extension_registry=registry)}

        dcp.load(target, planner=DefaultLoadPlanner(**case["load_planner"]), **reader())
        # And into one process with no group, every DTensor a whole tensor: resharded from
        # whatever the ranks held, empty shards included.
        # A checkpoint saved without collectives is each rank's own (rank-local metadata): it
        # loads back on the same layout only.
        single = (
            _state(seed, entries, None, zeros=True, **shape_of) if case["reshardable"] else None
        )
        if single is not None:
            dcp.load(single, no_dist=True, planner=DefaultLoadPlanner(**case["load_planner"]),
                     **reader())  # fmt: skip
        return {"loaded": _as_loaded(target, entries, case["nested"]),
                "single": single and _as_loaded(single, entries, case["nested"])}  # fmt: skip


def _scribble(state: dict[str, Any]) -> None:
    """Change every tensor of ``state`` in place, as training goes on after an asynchronous
    save returns: what was staged must be what is written."""
    for value in state.values():
        if isinstance(value, dict):
            _scribble(value)
        elif hasattr(value, "to_local"):
            value.to_local().fill_(7)
        elif isinstance(value, torch.Tensor) and value.numel():
            value.fill_(7)


def _as_loaded(state: dict[str, Any], entries: list[Entry], nested: bool) -> dict[str, Any]:
    flat = state["model"] if nested else state
    got: dict[str, Any] = {}
    for key, *_ in entries:
        tensor = flat[key]
        got[key] = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    got.update({k: flat[k] for k in EXTRAS_KEYS if k in flat})
    return got


def refusals() -> dict[str, Any]:
    """Each load or save ``torch.distributed.checkpoint`` documents as refused, on every rank:
    its error (the last line of the ranks' tracebacks it gathers), or None where accepted; the
    ranks a ``CheckpointException`` names where the storage fails on the last rank alone, at
    the write and at the read; and whether a partial load left the key the checkpoint lacks
    alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import (
        DefaultLoadPlanner,
        FileSystemReader,
        FileSystemWriter,
    )
    from torch.distributed.checkpoint.api import CheckpointException

    with shared_directory() as directory:
        dcp.save({"w": torch.ones(3), "step": 1}, checkpoint_id=directory)
        attempts: dict[str, Any] = {
            "a key the checkpoint lacks": lambda: dcp.load(
                {"w": torch.zeros(3), "extra": torch.zeros(2)}, checkpoint_id=directory
            ),
            "a shape other than the saved one": lambda: dcp.load(
                {"w": torch.zeros(4)}, checkpoint_id=directory
            ),
            "saving over a checkpoint without overwrite": lambda: dcp.save(
                {"w": torch.ones(3)}, storage_writer=FileSystemWriter(directory, overwrite=False)
            ),
        }
        said: dict[str, Any] = {}
        for name, attempt in attempts.items():
            try:
                attempt()
            except CheckpointException as exc:
                said[name] = str(exc).strip().splitlines()[-1]
            else:
                said[name] = None
        # A storage that fails on the last rank alone (a full disk, a lost mount): every
        # rank is told, with that rank named, at the write and at the read.
        last = dist.get_world_size() - 1

        class FailingWriter(FileSystemWriter):
            def write_data(self, plan: Any, planner: Any) -> Any:
                if dist.get_rank() == last:
                    raise OSError("no space left on the device (a stand-in)")
                return super().write_data(plan, planner)

        class FailingReader(FileSystemReader):
            def read_data(self, plan: Any, planner: Any) -> Any:
                if dist.get_rank() == last:
                    raise OSError("the mount went away (a stand-in)")
                return super().read_data(plan, planner)

        for name, attempt in {
            "a write failing on the last rank": lambda: dcp.save(
                {"w": torch.ones(3)}, storage_writer=FailingWriter(f"{directory}/failing")
            ),
            "a read failing on the last rank": lambda: dcp.load(
                {"w": torch.zeros(3)}, storage_reader=FailingReader(directory)
            ),
        }.items():
            try:
                attempt()
            except CheckpointException as exc:
                said[name] = sorted(exc.failures)
            else:
                said[name] = None
        # Saved and loaded by this rank alone (no_dist), in a directory of its own: torch
        # warns that it assumes a single process (a run that forgot its process group would
        # otherwise write one whole checkpoint per rank, silently).
        # Each rank's of its own length: a load that coordinated the ranks would plan every
        # rank's read from one rank's checkpoint.
        alone, mine = f"{directory}/alone{dist.get_rank()}", 2 + dist.get_rank()
        into = {"w": torch.zeros(mine)}
        for step, attempt in (
            ("save", lambda: dcp.save({"w": torch.ones(mine)}, checkpoint_id=alone, no_dist=True)),
            ("load", lambda: dcp.load(into, checkpoint_id=alone, no_dist=True)),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                attempt()
            said[f"{step} in one process warned"] = any(
                f"assuming the intent is to {step} in a single process" in str(w.message)
                for w in caught
            )
        said["loaded in one process"] = into["w"].tolist()
        # And by the first rank alone while the others wait: no rank is asked to take part.
        if dist.get_rank() == 0:
            dcp.load(into, checkpoint_id=alone, no_dist=True)
        dist.barrier()
        # The keys it lacks a plain tensor and a DTensor (which the planner sets up apart).
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        sevens = distribute_tensor(torch.full((2 * dist.get_world_size(),), 7.0), mesh, [Shard(0)])
        partial = {"w": torch.zeros(3), "extra": torch.full((2,), 7.0), "sharded": sevens}
        dcp.load(
            partial, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True)
        )
        said["partial load"] = (partial["w"].tolist(), partial["extra"].tolist(),
                                set(partial["sharded"].full_tensor().tolist()))  # fmt: skip
        return said


def over_subgroups(seed: int, block: int, rows: int, asynchronously: bool) -> dict[str, Any]:
    """The world cut in blocks of ``block`` consecutive ranks (a 2-D mesh, its inner
    dimension a block): each block saves (``async_save`` and waits, where ``asynchronously``),
    over its own group (``process_group``), a DTensor
    of ``rows`` x 2 sharded by rows over the block (fewer rows than ranks: some shards empty),
    a plain tensor and a step, all its own (seeded ``seed`` + the block's index); after a
    barrier of the world, each block loads its own checkpoint back into zeros of the same
    placement, and the next block's into a replicated DTensor, over its group again. What
    each rank loaded: the DTensors' full tensors, the plain tensor and the step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    size = dist.get_world_size()
    blocks = size // block
    mesh = init_device_mesh("cpu", (blocks, block), mesh_dim_names=("blocks", "inner"))
    inner = mesh["inner"]
    group = inner.get_group()
    mine, other = dist.get_rank() // block, (dist.get_rank() // block + 1) % blocks

    def state(b: int, placement: Any, zeros: bool) -> dict[str, Any]:
        full, plain = value(seed + b, 0, (rows, 2), "float64"), value(seed + b, 1, (3,), "int64")
        if zeros:
            full, plain = torch.zeros_like(full), torch.zeros_like(plain)
        return {"w": distribute_tensor(full, inner, [placement]), "plain": plain,
                "step": -1 if zeros else seed + b}  # fmt: skip

    loaded: dict[str, Any] = {}
    with shared_directory() as directory:
        saved, where = state(mine, Shard(0), zeros=False), f"{directory}/block{mine}"
        if asynchronously:
            dcp.async_save(saved, checkpoint_id=where, process_group=group).result()
        else:
            dcp.save(saved, checkpoint_id=where, process_group=group)
        dist.barrier()  # every block's checkpoint is written before any is read
        for which, b, placement in (("own", mine, Shard(0)), ("next", other, Replicate())):
            into = state(b, placement, zeros=True)
            dcp.load(into, checkpoint_id=f"{directory}/block{b}", process_group=group)
            loaded[which] = {"w": into["w"].full_tensor().tolist(),
                             "plain": into["plain"].tolist(), "step": into["step"]}  # fmt: skip
    return loaded


def _interleaved(full: torch.Tensor, group: Any) -> Any:
    """``full`` as a ShardedTensor over ``group`` (the world's first ranks) whose rank ``r``
    of ``n`` holds rows ``r, r + n, r + 2n, ...``, each row a shard of its own: a rank with
    several chunks of one tensor, as row-wise sharded embedding tables lay them out."""
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    shards = [Shard.from_tensor_and_offsets(full[row : row + 1].clone(), [row, 0], rank)
              for row in range(rank, full.shape[0], ranks)]  # fmt: skip
    return init_from_local_shards(shards, *full.shape, process_group=group)


def gathered(value: Any, group: Any = None) -> torch.Tensor:
    """The whole of ``value`` (a DTensor, or a ShardedTensor over ``group``, the world by
    default): the latter put together here from every rank's shards at the offsets each
    names, not by torch's own gathering."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor()
    pieces = [(shard.metadata.shard_offsets, shard.tensor.detach().clone())
              for shard in value.local_shards()]  # fmt: skip
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, pieces, group=group)
    whole = torch.zeros(value.size(), dtype=value.dtype)
    for offsets, tensor in (piece for rank in every for piece in rank):
        at = zip(offsets, tensor.shape, strict=True)
        whole[tuple(slice(start, start + size) for start, size in at)] = tensor
    return whole


def across_world_sizes(seed: int, saved_by: int, loaded_by: int, shape: tuple[int, ...],
                       saved: str, loaded: str) -> list[Any] | None:  # fmt: skip
    """The first ``saved_by`` ranks save a tensor of ``shape`` (a DTensor of placement
    ``saved`` over their own 1-D mesh, or, ``"interleaved"``, a ShardedTensor whose ranks hold
    every n-th row; ``process_group`` their group); after a barrier of the world, the first
    ``loaded_by`` ranks load it into zeros laid out as ``loaded`` over theirs: a checkpoint
    written by one world size read by another, its shards cut at other boundaries. What a
    loading rank loaded (the full tensor); ``None`` on the ranks that do not load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor

    rank = dist.get_rank()
    # Every rank takes part in creating every group (new_group is collective over the world).
    groups = {n: dist.new_group(list(range(n))) for n in sorted({saved_by, loaded_by})}
    full = value(seed, 0, shape, "float64")

    def laid_out(tensor: torch.Tensor, placement: str, group: Any) -> Any:
        if placement == "interleaved":
            return _interleaved(tensor, group)
        return distribute_tensor(
            tensor, DeviceMesh.from_group(group, "cpu"), [_placement(placement)]
        )

    got: list[Any] | None = None
    with shared_directory() as directory:
        if rank < saved_by:
            state = {"w": laid_out(full, saved, groups[saved_by])}
            dcp.save(state, checkpoint_id=directory, process_group=groups[saved_by])
        dist.barrier()  # written before it is read
        if rank < loaded_by:
            into = {"w": laid_out(torch.zeros_like(full), loaded, groups[loaded_by])}
            dcp.load(into, checkpoint_id=directory, process_group=groups[loaded_by])
            got = gathered(into["w"], groups[loaded_by]).tolist()
    return got


def saved_alone_without_collectives() -> bool:
    """The first rank saves with ``use_collectives=False`` (experimental: "without using
    cross-rank synchronization") while the others wait at a barrier: whether it saved."""
    import torch.distributed.checkpoint as dcp

    saved = False
    if dist.get_rank() == 0:
        # Its own directory, removed as soon as the save returns: the known issue leaves the
        # ranks out of step at the barrier below, and a rank ended there runs no cleanup.
        directory = tempfile.mkdtemp(prefix="ddp_verify-dcp-")
        try:
            dcp.save({"w": torch.ones(2)}, checkpoint_id=f"{directory}/solo",
                     use_collectives=False)  # fmt: skip
            saved = True
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    dist.barrier()
    return saved


def replicated_writers(tensors: list[tuple[int, str]], lowest: bool) -> dict[str, int]:
    """Every rank saves the same plain tensors (replicated: ``w{i}`` of ``tensors[i]``'s
    count of elements in its dtype) with a ``DefaultSavePlanner(dedup_save_to_lowest_rank=
    lowest)``; what each rank is asked to write is read from the central plan its
    ``finish_plan`` is handed (the documented planner protocol): each tensor's key, with the
    bytes of the items this rank writes of it (counted here from each item's chunk and
    dtype, not by the planner's own sizes)."""
    import math

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    written: dict[str, int] = {}

    class Recording(DefaultSavePlanner):
        def finish_plan(self, new_plan: Any) -> Any:
            for item in new_plan.items:
                data = item.tensor_data
                size = 0 if data is None else (
                    math.prod(data.chunk.sizes) * data.properties.dtype.itemsize)  # fmt: skip
                written[item.index.fqn] = written.get(item.index.fqn, 0) + size
            return super().finish_plan(new_plan)

    state = {f"w{i}": torch.ones(n, dtype=getattr(torch, dtype))
             for i, (n, dtype) in enumerate(tensors)}  # fmt: skip
    with shared_directory() as directory:
        dcp.save(state, checkpoint_id=directory,
                 planner=Recording(dedup_save_to_lowest_rank=lowest))  # fmt: skip
    return written


def cached_plan_over_another_group() -> list[float]:
    """Each rank saves with a caching planner over a group of its own, then over the world
    with a new caching planner, and loads the world's checkpoint back: the values loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    # Its own class: torch keys the plan cache by class name, and the suite's other saves
    # must not meet this one's cache.
    class SubgroupThenWorldPlanner(DefaultSavePlanner):
        pass

    rank, size = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([r]) for r in range(size)]  # every rank makes every group
    try:
        with shared_directory() as directory:
            dcp.save({"a": torch.ones(2)}, checkpoint_id=f"{directory}/rank{rank}",
                     process_group=groups[rank],
                     planner=SubgroupThenWorldPlanner(enable_plan_caching=True))  # fmt: skip
            dcp.save({"b": torch.tensor([1.0, 2.0, 3.0])}, checkpoint_id=f"{directory}/world",
                     planner=SubgroupThenWorldPlanner(enable_plan_caching=True))  # fmt: skip
            loaded = {"b": torch.zeros(3)}
            dcp.load(loaded, checkpoint_id=f"{directory}/world")
    finally:
        for group in groups:
            if group is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
    return loaded["b"].tolist()


def invalid_plans() -> dict[str, str | None]:
    """Saves whose global plan the last rank spoils (its shard of a sharded tensor left
    unwritten, written over the first rank's, placed beyond the tensor or running past its
    end), as a planner of one's own could, of a matrix and of a vector: what each save said
    (the last line of the ranks' tracebacks), or None where it saved, keyed "<how>, <n>-D";
    then saves by the same planner unspoiled."""
    import dataclasses

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    last = dist.get_world_size() - 1

    class Spoiling(DefaultSavePlanner):
        def __init__(self, how: str | None) -> None:
            super().__init__()
            self.how = how

        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            if dist.get_rank() != last or self.how is None:
                return plan
            items = []
            for item in plan.items:
                if item.tensor_data is None or item.index.fqn != "w":
                    items.append(item)
                    continue
                if self.how == "a shard left unwritten":
                    continue
                chunk = item.tensor_data.chunk
                # Beyond: starting past the end; past the end: starting inside, one row
                # further than its own, so that it ends past the tensor's last row.
                start = {
                    "a shard over another": 0,
                    "a shard beyond its tensor": chunk.offsets[0] + 10,
                }.get(self.how, chunk.offsets[0] + 1)
                offsets = [start, *chunk.offsets[1:]]
                chunk = dataclasses.replace(chunk, offsets=torch.Size(offsets))
                data = dataclasses.replace(item.tensor_data, chunk=chunk)
                items.append(dataclasses.replace(item, tensor_data=data))
            return dataclasses.replace(plan, items=items)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with shared_directory() as directory:
        said: dict[str, str | None] = {}
        hows = [
            "a shard left unwritten",
            "a shard over another",
            "a shard beyond its tensor",
            "a shard past its tensor's end",
            None,
        ]
        # A matrix and a vector: the plan of each is validated.
        shapes = {"2-D": (2 * (last + 1), 2), "1-D": (2 * (last + 1),)}
        for i, (how, (dims, shape)) in enumerate(itertools.product(hows, shapes.items())):
            state = {"w": distribute_tensor(torch.ones(shape), mesh, [Shard(0)])}
            name = f"{how or 'unspoiled'}, {dims}"
            try:
                dcp.save(state, checkpoint_id=f"{directory}/{i}", planner=Spoiling(how))
                said[name] = None
            except CheckpointException as exc:
                said[name] = str(exc).strip().splitlines()[-1]
        return said


def layouts_read(seed: int, cases: list[str]) -> dict[str, Any]:
    """Three checkpoints ``load`` must read as saved, each loaded into zeros: one laid out as
    torch 2.3 flattened a state (a mapping of no tensors kept as one value: ``extra``), saved
    here as a state given flat to a planner that does not flatten, loaded into today's nested
    state (``load``'s planner flattens it into ``extra.epoch``, ``extra.name`` and must read
    the checkpoint's ``extra`` whole, as torch keeps loading checkpoints saved before 2.4);
    one saved and loaded by a ``file://`` URL alone, no writer or reader named (``save``
    and ``load`` infer them from the id: fsspec's); and one saved and loaded with the writer
    and reader second and positional (the order before ``checkpoint_id``, still taken with
    a warning). ``cases``: those of "2.3", "url", "positional" to make (a torch that has
    dropped a compatibility path is not held to it). What each load left in its state, or
    its error (the last line), how many warnings told of the old order, and the keys the
    2.3 layout's checkpoint was saved under."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import (
        DefaultSavePlanner,
        FileSystemReader,
        FileSystemWriter,
    )
    from torch.distributed.checkpoint.api import CheckpointException

    weights = value(seed, 0, (3, 2), "float64")
    extra = {"epoch": seed % 11, "name": f"run-{seed}"}

    def loaded(state: dict[str, Any]) -> dict[str, Any]:
        return {"w": state["model"]["w"].tolist(), "extra": state["extra"]}

    said: dict[str, Any] = {}
    with shared_directory() as directory:
        if "2.3" in cases:
            older = {"model.w": weights.clone(), "extra": dict(extra)}
            dcp.save(older, checkpoint_id=f"{directory}/2.3",
                     planner=DefaultSavePlanner(flatten_state_dict=False))  # fmt: skip
            # A planner that does not flatten keys the checkpoint by the state's own keys.
            metadata = FileSystemReader(f"{directory}/2.3").read_metadata()
            said["2.3 keys"] = sorted(metadata.state_dict_metadata)
        if "url" in cases:
            by_url = {"model": {"w": weights.clone()}, "extra": dict(extra)}
            dcp.save(by_url, checkpoint_id=f"file://{directory}/url")
        ids = {"2.3": f"{directory}/2.3", "url": f"file://{directory}/url"}
        for name, checkpoint_id in [(n, i) for n, i in ids.items() if n in cases]:
            state = {"model": {"w": torch.zeros(3, 2, dtype=torch.float64)},
                     "extra": {"epoch": -1, "name": ""}}  # fmt: skip
            try:
                dcp.load(state, checkpoint_id=checkpoint_id)
                said[name] = loaded(state)
            # Every rank fails alike (a CheckpointException is a BaseException): said.
            except (Exception, CheckpointException) as exc:
                said[name] = str(exc).strip().splitlines()[-1]
        # The order before the checkpoint id came first: the writer (reader) second and
        # positional, still taken, with a warning that the order changed.
        if "positional" in cases:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                old_order = {"model": {"w": weights.clone()}, "extra": dict(extra)}
                dcp.save(old_order, FileSystemWriter(f"{directory}/positional"))
                state = {"model": {"w": torch.zeros(3, 2, dtype=torch.float64)},
                         "extra": {"epoch": -1, "name": ""}}  # fmt: skip
                dcp.load(state, FileSystemReader(f"{directory}/positional"))
            said["positional"] = loaded(state)
            said["positional warned"] = sum("argument order" in str(w.message) for w in caught)
    said["saved"] = {"w": weights.tolist(), "extra": extra}
    return said


def own_stager_and_coordinator(seed: int, stager: bool,
                               coordinator: bool) -> dict[str, Any]:  # fmt: skip
    """Two documented arguments a plain save never passes. ``async_save`` with a stager of
    one's own (``async_stager``, closed by its owner): a ``BlockingAsyncStager(type_check=
    True)`` refuses a state holding a value DCP does not save (a set: what it said, the last
    line), one with ``type_check=False`` stages it, and what that save wrote loads back; one
    with ``cache_staged_state_dict=True`` stages twice into the one copy it keeps (or what
    it said refusing, and whether an accelerator is there to pin memory);
    and the deprecated ``save_state_dict`` and ``load_state_dict`` with ``coordinator_rank``
    the last rank: the ranks whose planners were told they coordinate, and what loaded.
    ``FileSystemWriter`` with ``cache_staged_state_dict=True`` is such a stager too.
    ``stager``, ``coordinator``: which of the two this torch has to check."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import (
        DefaultLoadPlanner,
        DefaultSavePlanner,
        FileSystemReader,
        FileSystemWriter,
    )
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    weights = value(seed, 0, (4,), "float64")
    told: dict[str, bool] = {}

    # set_up_planner as the planners document it (one taking no storage_meta is called in
    # an older form, positionally); what each is told, and what the default planner keeps
    # for a subclass to read (its public attribute).
    class SaveRecording(DefaultSavePlanner):
        def set_up_planner(self, state_dict: Any, storage_meta: Any = None,
                           is_coordinator: bool = False) -> None:  # fmt: skip
            told["save"] = is_coordinator
            super().set_up_planner(state_dict, storage_meta, is_coordinator)
            told["save kept"] = self.is_coordinator

    class LoadRecording(DefaultLoadPlanner):
        def set_up_planner(self, state_dict: Any, metadata: Any = None,
                           is_coordinator: bool = False) -> None:  # fmt: skip
            told["load"] = is_coordinator
            super().set_up_planner(state_dict, metadata, is_coordinator)
            told["load kept"] = self.is_coordinator

    said: dict[str, Any] = {}
    last = dist.get_world_size() - 1
    with shared_directory() as directory:
        if stager:
            checking = BlockingAsyncStager(type_check=True)
            try:
                odd = {"w": weights.clone(), "odd": {1, 2}}
                where = f"{directory}/checked"
                dcp.async_save(odd, checkpoint_id=where, async_stager=checking).result()
                said["checked"] = None
            except ValueError as exc:
                said["checked"] = str(exc).strip().splitlines()[-1]
            finally:
                checking.close()
            dist.barrier()  # every rank past the refused save (or its write) before the next
            own = BlockingAsyncStager(type_check=False)
            state = {"w": weights.clone(), "kept": {seed % 5, 7}}
            future = dcp.async_save(state, checkpoint_id=f"{directory}/staged", async_stager=own)
            state["w"].zero_()  # staged already: the save writes what it was given
            future.result()
            own.close()
            into = {"w": torch.zeros(4, dtype=torch.float64), "kept": set()}
            dcp.load(into, checkpoint_id=f"{directory}/staged")
            said["staged"] = {"w": into["w"].tolist(), "kept": sorted(into["kept"])}
            # A caching stager stages into one pinned copy it keeps; where nothing can pin
            # memory it must say so, not fall back to a fresh copy each time unsaid.
            # FileSystemWriter is such a stager too, given the same flag.
            said["cached"] = {}
            for name, caching in (
                ("BlockingAsyncStager", BlockingAsyncStager(cache_staged_state_dict=True)),
                ("FileSystemWriter",
                 FileSystemWriter(f"{directory}/cached", cache_staged_state_dict=True)),
            ):  # fmt: skip
                try:
                    first = caching.stage({"w": weights.clone()})
                    second = caching.stage({"w": weights * 2})
                    got = {"same": second is first, "w": second["w"].tolist()}
                except RuntimeError as exc:
                    got = {"refused": str(exc).strip().splitlines()[-1]}
                finally:
                    caching.close()
                said["cached"][name] = got
            accelerator = getattr(torch, "accelerator", None)
            said["accelerator"] = bool(
                accelerator.is_available() if accelerator is not None
                else torch.cuda.is_available()
            )  # fmt: skip
        if coordinator:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # deprecated: still documented
                dcp.save_state_dict({"w": weights.clone()},
                                    FileSystemWriter(f"{directory}/old"),
                                    coordinator_rank=last, planner=SaveRecording())  # fmt: skip
                back = {"w": torch.zeros(4, dtype=torch.float64)}
                dcp.load_state_dict(back, FileSystemReader(f"{directory}/old"),
                                    coordinator_rank=last, planner=LoadRecording())  # fmt: skip
            said["coordinated"] = dict(told)
            said["old"] = back["w"].tolist()
    said["saved"] = weights.tolist()
    return said


def readers_told() -> dict[str, Any]:
    """What ``load`` tells a storage reader that takes keyword arguments (the protocol's
    ``set_up_storage_reader(metadata, is_coordinator, **kwargs)``), loading a checkpoint
    saved with collectives and one saved without (experimental: each rank's own metadata):
    the ``rank`` and ``use_collectives`` it was given, and what it loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    told: dict[str, Any] = {}

    class Recording(FileSystemReader):
        def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any,
                                  **kwargs: Any) -> None:  # fmt: skip
            told[self.name] = {k: kwargs.get(k) for k in ("rank", "use_collectives")}
            super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    rank = dist.get_rank()
    said: dict[str, Any] = {}
    with shared_directory() as directory:
        for name, collectives in (("with collectives", True), ("without", False)):
            path = f"{directory}/{'with' if collectives else 'without'}"
            dcp.save({"w": torch.full((2,), float(rank))}, checkpoint_id=path,
                     use_collectives=collectives)  # fmt: skip
            reader = Recording(path)
            reader.name = name
            into = {"w": torch.zeros(2)}
            dcp.load(into, storage_reader=reader)
            said[name] = {**told[name], "loaded": into["w"].tolist()}
    return said


def files_written(single_file_per_rank: bool) -> dict[str, Any]:
    """A state of more plain tensors than ranks (each written once, by one rank), saved by a
    ``FileSystemWriter`` with one writing thread and ``single_file_per_rank`` as given: the
    data files in the checkpoint (every name but the metadata's), and the tensors saved."""
    import os

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    tensors = 2 * dist.get_world_size() + 1
    state = {f"t{i}": torch.full((i + 1,), float(i)) for i in range(tensors)}
    with shared_directory() as directory:
        writer = FileSystemWriter(directory, single_file_per_rank=single_file_per_rank,
                                  thread_count=1)  # fmt: skip
        dcp.save(state, storage_writer=writer)
        names = sorted(name for name in os.listdir(directory) if name != ".metadata")
        dist.barrier()  # every rank listed the directory before rank 0 removes it
    return {"files": names, "tensors": tensors}
