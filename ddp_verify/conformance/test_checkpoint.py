"""``torch.distributed.checkpoint`` against what a checkpoint is for: a state saved by every
rank loads back as it was saved. The state mixes DTensors sharded along either dimension or
replicated (tensors with fewer rows than ranks and empty ones, so some ranks hold no shard),
plain tensors every rank holds alike (saved once, deduplicated), 0-d tensors, five dtypes
and the plain values training keeps beside them, flat or nested; the writer's and planners'
documented options are drawn (one file per rank or per thread, several writing threads,
deduplication to the lowest rank, a checkpoint written by one process without a group or
saved asynchronously while the state changes, a cached plan reused on new values, saving
without collectives (experimental: loaded on its own layout only), partial loads,
flattening). Each state loads back into other placements than it was saved in, and into
whole tensors in one process without a group; what it must hold is the saved value,
generated independently of the code under test.

The loads and saves torch refuses are refused: a key the checkpoint lacks (unless a partial
load is asked for, which leaves it alone), a shape other than the saved one, a save over an
existing checkpoint with ``overwrite=False``. A checkpoint that resumes training from other
values than it saved is the most expensive way to train something else."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import checkpoint_jobs
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.world import RankError

DTYPES = ("float64", "float32", "bfloat16", "int64", "bool")
COMMUTING: tuple[list[str], ...] = ([], [], ["add3"], ["xor5a"], ["xor5a", "xor33"])


def _skip_across_nodes(world: Any) -> None:
    launched = getattr(getattr(world, "member", None), "launched", None)
    if getattr(launched, "nodes", 1) > 1:
        pytest.skip(
            "the checkpoint directory is rank 0's temporary one: across nodes every rank would "
            "need a shared filesystem to read the files the others wrote"
        )


def _has(function: Any, argument: str) -> bool:
    return argument in inspect.signature(function).parameters


def _async_no_dist() -> bool:
    """Whether this torch's ``async_save`` saves from one process (``no_dist``)."""
    import torch.distributed.checkpoint as dcp

    return _has(dcp.async_save, "no_dist")


def _streams() -> bool:
    """Whether this torch's checkpoint files take stream extensions (experimental)."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    return _has(FileSystemWriter.__init__, "_extensions") and _has(
        FileSystemReader.__init__, "_extension_registry"
    )


@st.composite
def cases(draw: st.DrawFn, world_size: int, flatten: bool | None = None,
          sharded_flattened: bool | None = None) -> dict[str, Any]:  # fmt: skip
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    # Saving without collectives (experimental: each rank's own metadata) loads back on the
    # layout it was saved from only.
    collectives = not _has(dcp.save, "use_collectives") or draw(st.booleans())
    entries = []
    for index in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["dtensor", "tensor"]))
        dims = draw(st.integers(1 if kind == "dtensor" else 0, 2))
        # Up to one more row than ranks, none at all too: some ranks hold empty shards.
        shape = tuple(draw(st.integers(0, world_size + 1)) for _ in range(dims))
        placements = ["shard0", "replicate"] + (["shard1"] if dims == 2 else [])
        saved = draw(st.sampled_from(placements)) if kind == "dtensor" else "-"
        loaded = draw(st.sampled_from(placements)) if kind == "dtensor" and collectives else saved
        entries.append((f"w{index}", kind, shape, draw(st.sampled_from(DTYPES)), saved, loaded))
    flat = draw(st.booleans()) if flatten is None else flatten
    sharded = draw(st.booleans()) if sharded_flattened is None else sharded_flattened
    # Plain values are not loaded where the planner flattens sharded tensors and not the
    # state: the known issue below, checked apart.
    values_load = flat or not sharded or flatten is not None
    # A cached plan is kept per planner class, not per group: one cached by a save without
    # collectives breaks the next save over the world (the known issue below), so caching is
    # drawn with collectives only.
    caching = (
        collectives and _has(DefaultSavePlanner, "enable_plan_caching") and draw(st.booleans())
    )
    save_planner = {"flatten_state_dict": flat,
                    "dedup_save_to_lowest_rank": draw(st.booleans()),
                    **({"enable_plan_caching": True} if caching else {})}  # fmt: skip
    return {
        "seed": draw(st.integers(0, 2**16)),
        "entries": entries,
        # A nested state needs flattening to be saved entry by entry.
        "nested": flat and draw(st.booleans()),
        "with_extras": values_load and draw(st.booleans()),
        "writer": {
            "single_file_per_rank": draw(st.booleans()),
            "thread_count": draw(st.integers(1, 3)),
            "sync_files": draw(st.booleans()),
            # How far each writing thread copies ahead: a byte, or the default.
            **draw(st.sampled_from([{}, {"per_thread_copy_ahead": 1}])),
        },
        # Written by one process without a group (no collectives, no cached plans there).
        "saved_by_one_process": (one := collectives and not caching and draw(st.booleans())),
        # In a background thread (async_save), the state changed as soon as it returns; by
        # one process too (async_save's no_dist) where torch has it.
        "asynchronously": (not one or _async_no_dist()) and draw(st.booleans()),
        "save": {} if collectives else {"use_collectives": False},
        "reshardable": collectives,
        "save_planner": save_planner,
        "load_planner": {
            "flatten_state_dict": flat,
            "flatten_sharded_tensors": sharded,
            "allow_partial_load": draw(st.booleans()),
        },
        "twice": caching or draw(st.booleans()),
        # Stream extensions (experimental), whose order does not matter: none, one, or two
        # that commute (two that do not are the known issue below, checked apart).
        "extensions": draw(st.sampled_from(COMMUTING)) if _streams() else [],
    }


def _check(world: Any, case: dict[str, Any]) -> None:
    seed = case["seed"] + (1 if case["twice"] else 0)  # the second save's values are loaded
    for rank, result in enumerate(world.run(checkpoint_jobs.round_trip, case)):
        loads = [("in place", result["loaded"]), ("in one process", result["single"])]
        for where, loaded in [(where, got) for where, got in loads if got is not None]:
            for index, (key, kind, shape, dtype, saved, into) in enumerate(case["entries"]):
                want = checkpoint_jobs.value(seed, index, tuple(shape), dtype)
                said = (f"{key} ({kind} {dtype} {tuple(shape)}, saved {saved}, loaded {into}) "
                        f"on rank {rank}, {where}")  # fmt: skip
                got = loaded[key]
                assert got.dtype == want.dtype and got.shape == want.shape, (
                    f"{said}: {got.dtype} {tuple(got.shape)}, saved {want.dtype} {tuple(shape)}"
                )
                assert torch.equal(got, want), f"{said}: {got.tolist()}, saved {want.tolist()}"
            if case["with_extras"]:
                for key, value in checkpoint_jobs.extras(seed).items():
                    assert loaded.get(key) == value, (
                        f"{key} on rank {rank}, {where}: {loaded.get(key)!r}, saved {value!r}"
                    )


def test_a_checkpoint_loads_back_what_every_rank_saved(world, prove):
    _skip_across_nodes(world)
    # Never left to chance: several items in one file per rank read back through a stream
    # extension, which reads each item's view of the file to its end (a view that let it
    # read on would hand it the next item's bytes).
    entries = [("w0", "dtensor", (world.size + 1, 2), "float64", "shard0", "replicate"),
               ("w1", "tensor", (3,), "int64", "-", "-")]  # fmt: skip
    streamed = _one_file_per_rank(5, entries, ["xor5a"] if _streams() else [])
    # Nor one process saving in the background (async_save's no_dist), loaded resharded.
    alone = {**_one_file_per_rank(6, entries, []), "saved_by_one_process": True,
             "asynchronously": _async_no_dist()}  # fmt: skip
    prove(cases(world.size), lambda case: _check(world, case), examples=[streamed, alone])


def _one_file_per_rank(seed: int, entries: list[Any], extensions: list[str]) -> dict[str, Any]:
    """A round-trip case with plain values beside ``entries``, one file per rank (every item
    of a rank in it), through the stream ``extensions``, with the planners' defaults."""
    return {"seed": seed, "entries": entries, "nested": False, "with_extras": True,
            "writer": {"single_file_per_rank": True, "thread_count": 1, "sync_files": False},
            "saved_by_one_process": False, "asynchronously": False, "save": {},
            "reshardable": True, "twice": False,
            "save_planner": {"flatten_state_dict": True, "dedup_save_to_lowest_rank": False},
            "load_planner": {"flatten_state_dict": True, "flatten_sharded_tensors": True,
                             "allow_partial_load": False},
            "extensions": extensions}  # fmt: skip


@known_torch_issue(
    "DefaultLoadPlanner(flatten_state_dict=False) with flatten_sharded_tensors=True (its "
    "default) loads a checkpoint's plain values into a copy of the state dict it flattened "
    "the sharded tensors of, not into the caller's: a saved step or schedule stays as it was "
    "before the load, silently; tensors load",
    raises=AssertionError,
    match=r"saved",
    repro="findings/dcp_unflattened_load_drops_plain_values.py",
)
def test_a_checkpoint_loaded_without_flattening_loads_its_plain_values(world, prove):
    _skip_across_nodes(world)
    prove(
        cases(world.size, flatten=False, sharded_flattened=True).filter(
            lambda case: case["with_extras"]
        ),
        lambda case: _check(world, case),
    )


@known_torch_issue(
    "DefaultSavePlanner(enable_plan_caching=True) keeps its cached plans under its class's "
    "name, not per group: after a save over a subgroup (or without collectives), the next "
    "caching save over the world scatters the cached plan list of the smaller group and "
    "fails (gloo: 'Incorrect input list size')",
    raises=RankError,
    match=r"Incorrect input list size",
    url="https://github.com/pytorch/pytorch/pull/158767 (a cache key per planner, unmerged)",
    repro="findings/dcp_plan_cache_across_groups.py",
)
def test_a_cached_save_plan_is_not_reused_over_another_group(world):
    _skip_across_nodes(world)
    if world.size < 2:
        pytest.skip("a subgroup smaller than the world needs two ranks")
    for rank, loaded in enumerate(world.run(checkpoint_jobs.cached_plan_over_another_group)):
        assert loaded == [1.0, 2.0, 3.0], f"rank {rank} loaded {loaded}, saved [1.0, 2.0, 3.0]"


def test_a_checkpoint_saved_and_loaded_over_a_subgroup_is_that_subgroups(world, prove):
    # dcp.save (and async_save) and dcp.load over a process_group that is not the world (as
    # each replica of a hybrid layout checkpoints its own): each block of ranks writes its own
    # checkpoint, with its own coordinator, and reads back its own and another's, resharded.
    _skip_across_nodes(world)
    divisors = [d for d in range(1, world.size + 1) if world.size % d == 0]

    def check(case):
        seed, block, rows, asynchronously = case
        results = world.run(checkpoint_jobs.over_subgroups, seed, block, rows, asynchronously)
        blocks = world.size // block
        for rank, loaded in enumerate(results):
            mine = rank // block
            for which, b in (("own", mine), ("next", (mine + 1) % blocks)):
                got, want_seed = loaded[which], seed + b
                said = (f"rank {rank} (block {mine} of {blocks}, {block} ranks each, {rows} "
                        f"rows), loading block {b}'s checkpoint ({which})")  # fmt: skip
                want = {
                    "w": checkpoint_jobs.value(want_seed, 0, (rows, 2), "float64").tolist(),
                    "plain": checkpoint_jobs.value(want_seed, 1, (3,), "int64").tolist(),
                    "step": want_seed,
                }
                assert got == want, f"{said}: loaded {got}, block {b} saved {want}"

    # Blocks smaller than the world first (the world's own group is the round trip's).
    prove(
        st.tuples(
            st.integers(0, 2**16), st.sampled_from(divisors), st.integers(1, 5), st.booleans()
        ),
        check,
        examples=[(0, divisors[-2] if len(divisors) > 1 else 1, 1, a) for a in (False, True)],
    )


def test_a_checkpoint_saved_by_one_world_size_loads_at_another(world, prove):
    # What resuming on more or fewer ranks does: a checkpoint written by the first k ranks
    # read by the first m, its shards cut at other boundaries (a loaded shard starting inside
    # a saved one that does not start at 0 takes a slice of it: three ranks or more).
    _skip_across_nodes(world)
    sizes = st.integers(1, world.size)
    # "interleaved": a ShardedTensor whose ranks each hold several rows apart (every n-th),
    # where a saved chunk that spans two of a rank's chunks is read into both.
    placements = st.sampled_from(["shard0", "shard1", "replicate", "interleaved"])
    shapes = st.tuples(st.integers(0, 2 * world.size + 1), st.integers(1, 3))

    def check(case):
        seed, saved_by, loaded_by, shape, saved, loaded = case
        results = world.run(checkpoint_jobs.across_world_sizes, *case)
        want = checkpoint_jobs.value(seed, 0, shape, "float64").tolist()
        said = (f"a float64 tensor of {shape} saved {saved} by {saved_by} ranks, loaded "
                f"{loaded} by {loaded_by}")  # fmt: skip
        for rank, got in enumerate(results[:loaded_by]):
            assert got == want, f"{said}: rank {rank} loaded {got}, saved {want}"

    more = min(3, world.size)
    # A ShardedTensor of no rows has no shards anywhere, which torch refuses to build.
    cases = st.tuples(st.integers(0, 2**16), sizes, sizes, shapes, placements, placements)
    prove(cases.filter(lambda c: c[3][0] > 0 or "interleaved" not in c[4:]), check,
          examples=[(0, max(more - 1, 1), more, (2 * more, 2), "shard0", "shard0"),
                    (0, more, max(more - 1, 1), (2 * more, 2), "shard0", "shard0"),
                    (0, more, more, (2 * more, 2), "replicate", "interleaved")])  # fmt: skip


def test_a_replicated_tensor_is_written_once_by_the_rank_the_planner_names(world, prove):
    # Every rank holds the same plain tensors: the planner writes each once. With
    # dedup_save_to_lowest_rank, rank 0 (the lowest holding them all) writes them; without,
    # each goes to the rank with the fewest bytes planned so far, so that no rank writes more
    # than the least-loaded one plus the largest tensor (what that greedy rule guarantees),
    # in bytes whatever the dtypes (a tensor of int8 weighs an eighth of one of float64).
    _skip_across_nodes(world)
    itemsize = {"float64": 8, "float32": 4, "bfloat16": 2, "int8": 1}

    def check(case):
        tensors, lowest = case
        results = world.run(checkpoint_jobs.replicated_writers, tensors, lowest)
        said = f"{len(tensors)} replicated tensors of (elements, dtype) {tensors}, lowest={lowest}"
        keys = [f"w{i}" for i in range(len(tensors))]
        writers = {key: [r for r, w in enumerate(results) if key in w] for key in keys}
        assert sorted(k for r in results for k in r) == sorted(keys), (
            f"{said}: written by {[sorted(r) for r in results]}: each must be written once"
        )
        if lowest:
            assert all(w == [0] for w in writers.values()), f"{said}: written by {writers}"
        else:
            load = [sum(r.values()) for r in results]
            largest = max(n * itemsize[dtype] for n, dtype in tensors)
            assert max(load) - min(load) <= largest, (
                f"{said}: the ranks write {load} bytes: more apart than the largest tensor "
                f"({largest} bytes)"
            )

    tensors = st.lists(st.tuples(st.integers(1, 64), st.sampled_from(sorted(itemsize))),
                       min_size=1, max_size=8)  # fmt: skip
    float64s = [(8, "float64")] * 4
    # Bytes, not elements: by elements the int8 tensor would weigh the most, and the two of
    # float64 go to one rank.
    mixed = [(64, "int8"), (64, "float64"), (64, "float64")]
    prove(st.tuples(tensors, st.booleans()), check,
          examples=[(float64s, True), (float64s, False), (mixed, False)])  # fmt: skip


@known_torch_issue(
    "FileSystemWriter(_extensions=[a, b]) (experimental) wraps the stream in each extension in "
    "turn, so b's transform is applied first and a's last, but records the descriptors "
    "reversed ([b, a]), and FileSystemReader undoes them in that order, b's first: two "
    "extensions that do not commute (here a byte sum and a XOR) write a checkpoint that "
    "does not load back (one extension, or two that commute, do)",
    raises=RankError,
    match=r"UnpicklingError|Unsupported operand|invalid load key",
    repro="findings/dcp_stream_extensions_order.py",
)
def test_a_checkpoint_written_through_two_stream_extensions_loads_back(world):
    _skip_across_nodes(world)
    if not _streams():
        pytest.skip(f"torch {torch.__version__}'s checkpoint files take no stream extensions")
    entry = ("w0", "dtensor", (world.size + 1, 2), "float64", "shard0", "replicate")
    _check(world, _one_file_per_rank(11, [entry], ["add3", "xor5a"]))


# torch's words for each refusal (the last line of the ranks' tracebacks it gathers).
REFUSED = {
    "a key the checkpoint lacks": "RuntimeError: Missing key in checkpoint state_dict: extra.",
    "a shape other than the saved one": "ValueError: Size mismatch between saved",
    "saving over a checkpoint without overwrite": "RuntimeError: Checkpoint already exists",
}


def test_the_loads_and_saves_torch_refuses_are_refused_on_every_rank(world):
    _skip_across_nodes(world)
    for rank, said in enumerate(world.run(checkpoint_jobs.refusals)):
        for name, start in REFUSED.items():
            assert said[name] is not None, f"{name}: accepted on rank {rank}"
            assert said[name].startswith(start), (
                f"{name}: rank {rank} said {said[name]!r}, expected {start!r}"
            )
        for step in ("write", "read"):
            name = f"a {step} failing on the last rank"
            assert said[name] == [world.size - 1], (
                f"{name} (its storage raising there alone): rank {rank} "
                + ("returned as if the checkpoint were whole" if said[name] is None
                   else f"was told of ranks {said[name]}, not rank {world.size - 1}")
            )  # fmt: skip
        for step in ("save", "load"):
            assert said[f"{step} in one process warned"], (
                f"a {step} with no_dist=True on rank {rank}: no warning that it assumes a "
                "single process"
            )
        assert said["loaded in one process"] == [1.0] * (2 + rank), (
            f"rank {rank}'s own checkpoint (no_dist=True) loaded as {said['loaded in one process']}"
        )
        assert said["partial load"] == ([1.0, 1.0, 1.0], [7.0, 7.0], {7.0}), (
            f"a partial load on rank {rank} left {said['partial load']}: the saved key "
            "loaded, the ones the checkpoint lacks (a tensor of 7s, a DTensor of 7s) as they were"
        )


@known_torch_issue(
    "dcp.save(use_collectives=False) (experimental), documented to save 'without using "
    "cross-rank synchronization', ends with a barrier over its group: a rank that saves "
    "alone waits for the others, or its barrier completes against a collective they make "
    "next, leaving the program's collectives out of step",
    raises=RankError,
    match=r"waited in a collective|can never complete|Connection closed",
    repro="findings/dcp_save_without_collectives_barrier.py",
)
def test_a_rank_saves_alone_without_collectives(world):
    _skip_across_nodes(world)
    import torch.distributed.checkpoint as dcp

    if world.size < 2:
        pytest.skip("a rank saving alone needs others that do not")
    if not _has(dcp.save, "use_collectives"):
        pytest.skip(f"torch {torch.__version__}'s dcp.save has no use_collectives")
    saved = world.run(checkpoint_jobs.saved_alone_without_collectives)
    assert saved == [True] + [False] * (world.size - 1), saved


def test_a_checkpoint_as_older_torch_laid_it_out_and_one_named_by_url_load_back(world):
    # torch flattens a state's mappings of no tensors into their keys since 2.4 and keeps
    # loading checkpoints that hold such a mapping whole (the layout 2.3 wrote); a checkpoint
    # id that is a URL picks fsspec's writer and reader, each of its own kind; and the older
    # argument order (writer, reader second and positional) is still taken, with a warning.
    # The values do not choose the path: one case.
    _skip_across_nodes(world)
    import torch.distributed.checkpoint._traverse as traverse
    import torch.distributed.checkpoint.utils as utils

    # A torch that has dropped a compatibility path is not held to it.
    cases = ["url"]
    cases += ["2.3"] if hasattr(traverse, "traverse_state_dict_v_2_3") else []
    cases += ["positional"] if hasattr(utils, "_api_bc_check") else []
    whats = {"2.3": "laid out as torch 2.3 flattened it", "url": "named by a file:// URL alone",
             "positional": "saved and loaded with the writer and reader positional (the "
             "older order)"}  # fmt: skip
    for rank, said in enumerate(world.run(checkpoint_jobs.layouts_read, 3, cases)):
        for name in cases:
            assert said[name] == said["saved"], (
                f"a checkpoint {whats[name]}, loaded on rank {rank}: {said[name]!r}, "
                f"saved {said['saved']!r}"
            )
        assert "2.3" not in cases or said["2.3 keys"] == ["extra", "model.w"], (
            f"a state saved by DefaultSavePlanner(flatten_state_dict=False) on rank {rank} "
            f"keyed {said['2.3 keys']}, given as ['extra', 'model.w']"
        )
        assert "positional" not in cases or said["positional warned"] == 2, (
            f"save and load in the older argument order on rank {rank}: "
            f"{said['positional warned']} warnings of it, expected one each"
        )


def test_a_stager_of_ones_own_and_a_coordinator_other_than_rank_0_do_what_they_say(world):
    # async_save's own stager: type_check refuses what DCP does not save, and without it a
    # set is staged, saved and loaded back (staged before async_save returns: the state
    # zeroed after it is not what loads); one that caches keeps one copy, or says why it
    # cannot (no accelerator to pin memory). The deprecated save_state_dict / load_state_dict
    # name their coordinator: the planner of that rank alone is told so, on both sides.
    _skip_across_nodes(world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    stager = _has(dcp.async_save, "async_stager") and _has(BlockingAsyncStager, "type_check")
    coordinator = hasattr(dcp, "save_state_dict") and hasattr(dcp, "load_state_dict")
    if not (stager or coordinator):
        pytest.skip(f"torch {torch.__version__} has neither a stager's type_check nor the "
                    "deprecated save_state_dict / load_state_dict")  # fmt: skip
    last = world.size - 1
    run = world.run(checkpoint_jobs.own_stager_and_coordinator, 4, stager, coordinator)
    for rank, said in enumerate(run):
        if stager:
            assert said["checked"] is not None and "Unexpected value type" in said["checked"], (
                f"async_save with BlockingAsyncStager(type_check=True) on rank {rank}, a set "
                f"in the state: {said['checked']!r}, expected the value type refused"
            )
            assert said["staged"] == {"w": said["saved"], "kept": [4, 7]}, (
                f"async_save with a stager of its own (type_check=False) on rank {rank} "
                f"loaded back as {said['staged']!r}, saved {said['saved']} and [4, 7]"
            )
            twice = [2 * w for w in said["saved"]]
            for name, cached in said["cached"].items():
                if "refused" in cached:
                    # Pinned memory needs an accelerator: refusing without one says so.
                    assert not said["accelerator"], (
                        f"{name}(cache_staged_state_dict=True) on rank {rank}, an "
                        f"accelerator available, refused to stage: {cached['refused']!r}"
                    )
                    continue
                assert cached == {"same": True, "w": twice}, (
                    f"{name}(cache_staged_state_dict=True) on rank {rank} staged twice: the "
                    f"same copy {cached['same']}, holding {cached['w']}, expected the one "
                    f"cached copy holding the second state {twice}"
                )
        if not coordinator:
            continue
        want = {told: rank == last for told in ("save", "save kept", "load", "load kept")}
        assert said["coordinated"] == want, (
            f"save_state_dict / load_state_dict with coordinator_rank={last}: rank {rank}'s "
            f"planners were told is_coordinator={said['coordinated']!r}, expected {want}"
        )
        assert said["old"] == said["saved"], (
            f"coordinated by rank {last}, rank {rank} loaded {said['old']}, saved {said['saved']}"
        )


def test_a_storage_reader_is_told_its_rank_and_whether_the_load_is_collective(world):
    # The storage protocol: a reader whose set_up_storage_reader takes keyword arguments is
    # given its rank and whether the load coordinates (a checkpoint saved without
    # collectives holds each rank's own metadata, read without). Each rank saved its own
    # value; without collectives each loads its own back.
    _skip_across_nodes(world)
    import torch.distributed.checkpoint as dcp

    if not _has(dcp.save, "use_collectives"):
        pytest.skip(f"torch {torch.__version__}'s dcp.save has no use_collectives")
    for rank, said in enumerate(world.run(checkpoint_jobs.readers_told)):
        for name, collectives in (("with collectives", True), ("without", False)):
            got = said[name]
            assert (got["rank"], got["use_collectives"]) == (rank, collectives), (
                f"loading a checkpoint saved {name}, rank {rank}'s reader was told rank="
                f"{got['rank']}, use_collectives={got['use_collectives']}"
            )
        assert said["without"]["loaded"] == [float(rank)] * 2, (
            f"rank {rank} loaded {said['without']['loaded']} from its own checkpoint saved "
            f"without collectives, saved {[float(rank)] * 2}"
        )


def test_a_writer_writes_one_file_a_rank_or_one_a_tensor_as_asked(world):
    # FileSystemWriter's single_file_per_rank: "Produce one file per rank instead of one file
    # per tensor/blob" (one writing thread). More tensors than ranks tell the two apart.
    _skip_across_nodes(world)
    for single in (True, False):
        for rank, got in enumerate(world.run(checkpoint_jobs.files_written, single)):
            said = f"FileSystemWriter(single_file_per_rank={single}) on rank {rank}"
            files = len(got["files"])
            if single:
                assert 1 <= files <= world.size, (
                    f"{said}: {files} data files for {world.size} ranks: {got['files']}"
                )
            else:
                assert files == got["tensors"], (
                    f"{said}: {files} data files for {got['tensors']} tensors: {got['files']}"
                )


def test_a_save_plan_that_spoils_a_tensor_is_refused(world):
    # A planner of one's own (or a regression in the default one) that leaves part of a
    # sharded tensor unwritten, writes two shards over each other or one beyond the tensor
    # must be refused before anything is written: the checkpoint would load other values.
    _skip_across_nodes(world)
    if world.size < 2:
        pytest.skip("a spoiled shard needs a second rank to hold it")
    spoiled = {
        "a shard left unwritten": "invalid fill",
        "a shard over another": "overlapping chunks",
        "a shard beyond its tensor": "out of bounds chunk",
        "a shard past its tensor's end": "out of bounds chunk",
    }
    for rank, said in enumerate(world.run(checkpoint_jobs.invalid_plans)):
        for (how, words), dims in itertools.product(spoiled.items(), ("2-D", "1-D")):
            got = said[f"{how}, {dims}"]
            assert got is not None and "Failed to validate global plan" in got, (
                f"a save plan of a {dims} tensor with {how} on rank {rank}: {got!r}"
            )
            assert words in got, f"{how}, {dims}, on rank {rank}: {got!r}, not {words!r}"
        for dims in ("2-D", "1-D"):
            assert said[f"unspoiled, {dims}"] is None, (
                f"the same planner unspoiled refused a {dims} tensor: {said}"
            )
