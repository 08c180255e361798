"""The surface the gate stands for, as data: torch's data-parallel API as users call it, one
entry per constructor argument, function argument and public method, each with the
conformance tests that exercise it, or why it is out of scope, or that it is a gap the gate
does not yet cover.

``test_surface`` reads the public signatures of every object named here on the installed torch
and fails where an argument or method has no entry (a release that adds one), where an entry
names one torch no longer has, or where it names a test the suite does not hold: the table can
neither fall behind torch nor claim a test that is not there. ``python -m
ddp_verify.conformance.surface [--write docs/conformance-surface.md]`` prints (or writes) it as
the documentation's page.

Example::

    >>> entry = find("torch.utils.data.DistributedSampler", "drop_last")
    >>> entry.status, entry.tests[0]
    ('covered', 'test_data::test_sampler_with_drop_last_shards_are_disjoint_and_equal')
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import Any

import torch.distributed as _dist

from .known import version_tuple

__all__ = ["APIS", "ENTRIES", "Entry", "find", "members", "table"]

COVERED, GAP, OUT = "covered", "gap", "out of scope"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One member of the surface: ``api`` (the object's import path), ``member`` (an argument's
    name, or a method's as ``name()``), ``status`` (``covered``, ``gap``, ``out of scope``),
    ``tests`` (``module::test`` in this package, for ``covered``), ``why`` (what the tests
    exercise of it, or why it is out of scope, or what the gap leaves open), ``since`` (the
    torch release that added the member, where a release the suite runs on lacks it)."""

    api: str
    member: str
    status: str
    tests: tuple[str, ...] = ()
    why: str = ""
    since: str | None = None

    def offered_by(self, version: str) -> bool:
        """Whether torch ``version`` has the member (every release has, without ``since``).

        Example::

            >>> Entry("api", "m", "covered", since="2.13").offered_by("2.12.1+cu130")
            False
        """
        return self.since is None or version_tuple(version) >= version_tuple(self.since)


# The objects whose signatures are the surface: import path -> what to read ("init": the
# constructor's arguments and public methods; "call": the function's arguments; "methods": the
# public methods only, for an abstract class users reach through a factory).
# c10d's tensor collectives, and the calls that make and read groups (torch 2.13 renamed two
# collectives, the old names deprecated: each row is listed where torch has the name).
_TENSOR_COLLECTIVES = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "all_gather_single", "gather", "scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "all_to_all_single",
)  # fmt: skip
_GROUP_CALLS = (
    "new_group", "new_subgroups", "new_subgroups_by_enumeration", "get_rank", "get_world_size",
    "get_group_rank", "get_global_rank", "get_process_group_ranks",
)  # fmt: skip

APIS: dict[str, str] = {
    "torch.nn.parallel.DistributedDataParallel": "init",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_wrapper": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_wrapper": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState": "init",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.batched_powerSGD_hook": "call",
    "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook.PostLocalSGDState": "init",
    "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook.post_localSGD_hook": "call",
    "torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager": "init",
    "torch.distributed.algorithms.model_averaging.hierarchical_model_averager."
    "HierarchicalModelAverager": "init",
    "torch.distributed.algorithms.model_averaging.utils.average_parameters": "call",
    "torch.distributed.algorithms.model_averaging.utils."
    "average_parameters_or_parameter_groups": "call",
    "torch.distributed.optim.ZeroRedundancyOptimizer": "init",
    "torch.optim.Optimizer": "init",
    "torch.optim.SGD": "init",
    "torch.optim.Adam": "init",
    "torch.optim.AdamW": "init",
    "torch.optim.lr_scheduler.StepLR": "init",
    "torch.distributed.optim.PostLocalSGDOptimizer": "init",
    "torch.distributed.nn.functional.all_gather": "call",
    "torch.distributed.nn.functional.all_reduce": "call",
    "torch.distributed.nn.functional.reduce_scatter": "call",
    "torch.distributed.nn.functional.all_to_all_single": "call",
    "torch.distributed.nn.functional.broadcast": "call",
    "torch.distributed.nn.functional.gather": "call",
    "torch.distributed.nn.functional.scatter": "call",
    "torch.distributed.nn.functional.reduce": "call",
    "torch.distributed.nn.functional.all_to_all": "call",
    "torch.distributed.fsdp.fully_shard": "call",
    "torch.distributed.fsdp.MixedPrecisionPolicy": "init",
    "torch.distributed.fsdp.FSDPModule": "methods",
    "torch.distributed.fsdp.FullyShardedDataParallel.fsdp_modules": "call",
    "torch.utils.data.DistributedSampler": "init",
    "torch.utils.data.BatchSampler": "init",
    "torch.nn.utils.clip_grad_norm_": "call",
    "torch.distributed.checkpoint.state_dict.get_state_dict": "call",
    "torch.distributed.checkpoint.state_dict.set_state_dict": "call",
    "torch.distributed.checkpoint.state_dict.StateDictOptions": "init",
    "torch.distributed.checkpoint.save": "call",
    "torch.distributed.checkpoint.load": "call",
    "torch.distributed.checkpoint.async_save": "call",
    "torch.distributed.checkpoint.FileSystemWriter": "init",
    "torch.distributed.checkpoint.FileSystemReader": "init",
    "torch.distributed.checkpoint.DefaultSavePlanner": "init",
    "torch.distributed.checkpoint.DefaultLoadPlanner": "init",
    "torch.nn.BatchNorm1d": "init",
    "torch.nn.BatchNorm2d": "init",
    "torch.nn.BatchNorm3d": "init",
    "torch.nn.SyncBatchNorm": "init",
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm": "call",
    "torch.amp.GradScaler": "init",
    "torch.distributed.device_mesh.init_device_mesh": "call",
    "torch.distributed.device_mesh.DeviceMesh": "init",
    "torch.distributed.algorithms.Join": "init",
    "torch.distributed.tensor.distribute_tensor": "call",
    "torch.distributed.tensor.DTensor.from_local": "call",
    "torch.distributed.tensor.DTensor.redistribute": "call",
    "torch.distributed.tensor.DTensor.full_tensor": "call",
    "torch.distributed.tensor.DTensor.to_local": "call",
    "torch.distributed.pipelining.PipelineStage": "init",
    "torch.distributed.pipelining.ScheduleGPipe": "init",
    "torch.distributed.pipelining.Schedule1F1B": "init",
    "torch.distributed.pipelining.ScheduleLoopedBFS": "init",
    "torch.distributed.pipelining.ScheduleInterleaved1F1B": "init",
    "torch.distributed.pipelining.ScheduleInterleavedZeroBubble": "init",
    "torch.distributed.pipelining.ScheduleZBVZeroBubble": "init",
    "torch.distributed.tensor.parallel.parallelize_module": "call",
    "torch.distributed.tensor.parallel.ColwiseParallel": "init",
    "torch.distributed.tensor.parallel.RowwiseParallel": "init",
    "torch.distributed.tensor.parallel.SequenceParallel": "init",
    "torch.distributed.tensor.parallel.PrepareModuleInput": "init",
    **{
        f"torch.distributed.{name}": "call"
        for name in (*_TENSOR_COLLECTIVES, *_GROUP_CALLS)
        if hasattr(_dist, name)
    },  # torch 2.13 renamed two (the old names deprecated)
}

_OPTIONS = "test_ddp_options::test_ddp_option_keeps_training_equivalent"
_PP = "torch.distributed.pipelining."
_PP_TEST = "test_pipelining::test_a_pipeline_schedule_trains_what_one_process_trains"
_TP = "torch.distributed.tensor.parallel."
_TP_TEST = "test_tensor_parallel::test_a_tensor_parallel_plan_computes_what_one_process_computes"
_SCHEDULES = (
    "ScheduleGPipe",
    "Schedule1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
)
# The schedules of several stages a rank, looped over the ranks.
_LOOPED = (
    "ScheduleLoopedBFS",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
)
_DT = "torch.distributed.tensor."
_DT_WHOLE = "test_dtensor::test_dtensor_is_the_whole_tensor_it_stands_for"
_DT_FORMS = "test_dtensor::test_dtensor_keyword_forms_do_what_they_document"
_INIT_MESH = "torch.distributed.device_mesh.init_device_mesh"
_DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"
_MESH = "test_device_mesh::test_a_device_mesh_is_the_layout_it_stands_for"
_MESH_OUTRIGHT = "test_device_mesh::test_a_mesh_given_outright_is_the_layout_its_tensor_says"
_HOOK_SCALE = "test_comm_hooks::test_compression_hook_averages_large_gradients"
_HOOK_FORMAT = "test_comm_hooks::test_compression_hook_is_within_its_formats_precision"
_POWERSGD = "test_comm_hooks::test_powersgd_at_full_rank_is_exact"
_POWERSGD_WIDE = "test_comm_hooks::test_powersgd_at_full_rank_is_exact_on_matrices_wider_than_two"
_POWERSGD_DEFAULTS = "test_comm_hooks::test_powersgd_with_its_defaults_keeps_what_it_does_not_apply"
_ZERO = "test_zero::test_zero_redundancy_optimizer_matches_the_reference"
_RULE = "test_optimizer_options::test_every_documented_option_follows_its_published_rule"
_REFUSE = "test_optimizer_options::test_every_documented_refusal_is_made"
_EDGE = "test_optimizer_options::test_the_edge_of_every_refusal_is_accepted_and_followed"
_PUBLISHED = "test_optimizers::test_torch_optimizers_follow_the_published_rules"


def _optimizer(api: str, covered: dict[str, str], gaps: dict[str, str]) -> list[Entry]:
    """An optimizer's rows: each argument held to its documented rule (and its refusals),
    or a gap with what it leaves open."""
    rows = [Entry(api, member, COVERED, (_RULE, _REFUSE, _EDGE), why)
            for member, why in covered.items()]  # fmt: skip
    rows += [Entry(api, member, GAP, (), why) for member, why in gaps.items()]
    return rows


_CUDA_GRAPHS = (
    "CUDA graph capture: on the CPU its refusal (parameters on an unsupported device) is "
    "checked, its rule only by the GPU check"
)
_DIFFERENTIABLE_RULE = (
    "the derivative by a learning rate that requires grad, against the rule's; SGD's momentum "
    "and Adam's AMSGrad with its decay in the gradient fail backward (known torch issues, "
    "marked)"
)
_FSDP = "test_fsdp::test_fully_shard_matches_the_reference"
_HSDP = "test_fsdp::test_hybrid_sharding_on_a_2d_mesh_matches_the_reference"
_SAMPLER = "test_data::test_sampler_with_drop_last_shards_are_disjoint_and_equal"
_SAMPLER_PAD = (
    "test_data::test_sampler_without_drop_last_covers_the_dataset_and_pads_with_duplicates"
)
_CLIP = "test_optimizers::test_clip_grad_norm_follows_its_definition"
_AVERAGING = (
    "test_model_averaging::test_periodic_model_averager_averages_its_group_at_the_steps_it_names"
)
_CLIP_NORMS = "test_optimizers::test_clip_grad_norm_follows_its_definition_in_every_norm"
_DIFFERENTIABLE = (
    "test_differentiable_collectives::"
    "test_differentiable_collectives_give_the_gradient_of_every_ranks_loss"
)
_DCP = "test_fsdp::test_fully_shard_resumes_from_a_distributed_checkpoint"
_RECIPE = (
    "test_fsdp::test_standard_mixed_precision_recipe_computes_in_param_dtype_and_reduces_in_float32"
)
_POST_LOCAL = (
    "test_model_averaging::test_post_local_sgd_hook_averages_over_the_world_then_over_the_subgroup"
)
_DDP_GROUP = "test_ddp_options::test_ddp_over_a_subgroup_starts_from_and_averages_over_that_group"
_WHERE = "test_fsdp::test_where_and_when_fully_shard_keeps_parameters_changes_nothing"
_ZERO_ADDED = (
    "test_zero::test_zero_with_a_param_group_added_after_construction_matches_the_reference"
)
_UNUSED = "test_fsdp::test_unused_parameters_reduce_as_zeros_and_an_all_reduce_hook_replicates"
_DELAYED = tuple(
    f"test_ddp_options::test_delayed_all_reduce_{name}"
    for name in ("keeps_training_equivalent", "with_accumulation", "in_float64")
)
_MICRO = "test_fsdp::test_micro_batching_without_resharding_matches_the_reference"
_DIVIDE = "test_fsdp::test_gradient_divide_factor_replaces_the_world_size"

_NORM = "test_batch_norm::test_batch_norm_normalises_and_tracks_as_documented"
_CONVERT = "test_batch_norm::test_convert_sync_batchnorm_carries_every_setting_parameter_and_buffer"
_SYNC_CPU = (
    "test_batch_norm::test_sync_batch_norm_refuses_to_train_on_cpu_tensors_under_a_process_group"
)
_SCALER = "test_grad_scaler::test_the_scaler_steps_skips_and_schedules_as_documented"
_AVERAGER_REFUSALS = (
    "test_model_averaging::test_the_averagers_refuse_and_warn_of_what_their_documentation_does"
)
_SHARED_SCALER = (
    "test_grad_scaler::test_one_scaler_shared_by_two_optimizers_skips_each_on_its_own_gradients"
)
_COLLECTIVES = "test_collectives::test_tensor_collectives_leave_what_is_documented_on_every_rank"
_OPS = "every ReduceOp gloo takes (SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR on int64)"
_GROUPS = "None, new_group, new_subgroups, new_subgroups_by_enumeration; non-members"
_ASYNC = "False, and True with wait()"
_ROOTS = "every group rank, named by global rank"
_GROUP_ROOTS = "every group rank, named by group rank"
_COLLECTIVE_ROWS = (
    *((name, "group", _GROUPS) for name in (*_TENSOR_COLLECTIVES, *_GROUP_CALLS[3:])),
    *((name, "async_op", _ASYNC) for name in _TENSOR_COLLECTIVES),
    *(
        (name, "op", _OPS)
        for name in ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter_single")
    ),
    ("all_reduce", "tensor", "3 values, float64 and int64"),
    ("broadcast", "tensor", "3 values"),
    ("broadcast", "src", _ROOTS),
    ("broadcast", "group_src", _GROUP_ROOTS),
    ("reduce", "tensor", "the destination's tensor"),
    ("reduce", "dst", _ROOTS),
    ("reduce", "group_dst", _GROUP_ROOTS),
    ("all_gather", "tensor_list", "one tensor a rank"),
    ("all_gather", "tensor", "2 values"),
    *(
        (name, arg, "the group's concatenation")
        for name in ("all_gather_into_tensor", "all_gather_single")
        for arg in ("output_tensor", "input_tensor")
    ),
    ("gather", "tensor", "2 values"),
    ("gather", "gather_list", "on the destination only"),
    ("gather", "dst", _ROOTS),
    ("gather", "group_dst", _GROUP_ROOTS),
    ("scatter", "tensor", "2 values received"),
    ("scatter", "scatter_list", "on the source"),
    ("scatter", "src", _ROOTS),
    ("scatter", "group_src", _GROUP_ROOTS),
    *(
        (name, arg, "a chunk a rank")
        for name in ("reduce_scatter_tensor", "reduce_scatter_single")
        for arg in ("output", "input")
    ),
    ("all_to_all_single", "output", "even and uneven"),
    ("all_to_all_single", "input", "even and uneven"),
    ("all_to_all_single", "output_split_sizes", "0 to 2 values a pair of ranks"),
    ("all_to_all_single", "input_split_sizes", "0 to 2 values a pair of ranks"),
    ("new_group", "ranks", "any nonempty subset, in any order"),
    ("new_group", "sort_ranks", "True and False (the order given kept)"),
    ("new_subgroups", "group_size", "every divisor of the world size"),
    (
        "new_subgroups_by_enumeration",
        "ranks_per_subgroup_list",
        "partitions of some ranks, the rest in no subgroup",
    ),
    ("get_group_rank", "global_rank", "each member"),
    ("get_global_rank", "group_rank", "the root"),
)
_COLLECTIVE_OUT = (
    *(
        (
            name,
            arg,
            "the backend and its options: gloo here, NCCL by the GPU check; no "
            "arithmetic of the group's own",
        )
        for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration")
        for arg in ("backend", "pg_options")
    ),
    *(
        (name, "timeout", "how long a collective may wait: the world's time-outs, no arithmetic")
        for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration")
    ),
    *(
        (name, "group_desc", "a description for logs")
        for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration")
    ),
    (
        "new_group",
        "use_local_synchronization",
        "when group creation synchronises, not what the group computes",
    ),
    ("new_group", "device_id", "eager NCCL communicator creation (GPU)"),
)
_DCP_API = "torch.distributed.checkpoint."
_ROUND_TRIP = ("test_checkpoint::test_a_checkpoint_loads_back_what_every_rank_saved",)
_REPLICATED = (
    "test_checkpoint::test_a_replicated_tensor_is_written_once_by_the_rank_the_planner_names"
)
_SUBGROUP_DCP = (
    "test_checkpoint::test_a_checkpoint_saved_and_loaded_over_a_subgroup_is_that_subgroups",
)
_ACROSS_SIZES = ("test_checkpoint::test_a_checkpoint_saved_by_one_world_size_loads_at_another",)
_STREAMS = ("test_checkpoint::test_a_checkpoint_written_through_two_stream_extensions_loads_back",)
_DCP_REFUSED = (
    "test_checkpoint::test_the_loads_and_saves_torch_refuses_are_refused_on_every_rank",
)
_PROTOCOL = "the storage protocol dcp.save and dcp.load drive"
_CHECKPOINT_ROWS = (
    (
        "save",
        "state_dict",
        _ROUND_TRIP,
        "DTensors (empty shards too), plain tensors, 0-d, five dtypes, plain values, nested",
    ),
    ("save", "checkpoint_id", _DCP_REFUSED, ""),
    ("save", "storage_writer", _ROUND_TRIP, "FileSystemWriter"),
    ("save", "planner", _ROUND_TRIP, "DefaultSavePlanner"),
    ("save", "use_collectives", _ROUND_TRIP, "True, and False (loaded on its own layout)"),
    ("save", "no_dist", _ROUND_TRIP, "rank 0 alone writing whole tensors, loaded sharded"),
    ("async_save", "state_dict", _ROUND_TRIP, "changed as soon as async_save returns"),
    ("async_save", "storage_writer", _ROUND_TRIP, "FileSystemWriter"),
    ("async_save", "planner", _ROUND_TRIP, "DefaultSavePlanner"),
    ("async_save", "async_checkpointer_type", _ROUND_TRIP, "the default, a thread"),
    ("async_save", "use_collectives", _ROUND_TRIP, "True and False"),
    (
        "async_save",
        "no_dist",
        _ROUND_TRIP,
        "rank 0 alone in the background, the state changed at once; loaded resharded",
    ),
    (
        "async_save",
        "async_stager",
        (
            "test_checkpoint::test_a_stager_of_ones_own_and_a_coordinator_other_than_rank_0_do_what_they_say",
        ),
        "BlockingAsyncStager: type_check refusing a set, and staging it without",
    ),
    *(
        (
            api,
            "cache_staged_state_dict",
            (
                "test_checkpoint::test_a_stager_of_ones_own_and_a_coordinator_other_than_rank_0_do_what_they_say",
            ),
            "one pinned copy kept and staged into again; without an accelerator, refused",
        )
        for api in ("staging.BlockingAsyncStager", "FileSystemWriter")
    ),
    (
        "load",
        "state_dict",
        _ROUND_TRIP + _ACROSS_SIZES,
        "the placements saved, others, whole tensors, at another world size",
    ),
    ("load", "checkpoint_id", _ROUND_TRIP + _DCP_REFUSED, ""),
    ("load", "planner", _ROUND_TRIP, "DefaultLoadPlanner"),
    ("load", "no_dist", _ROUND_TRIP, "into whole tensors in one process"),
    *(
        (
            fn,
            "process_group",
            _SUBGROUP_DCP + (_ACROSS_SIZES if fn != "async_save" else ()),
            "blocks of consecutive ranks (the world too), "
            "each its own checkpoint; its own and another block's loaded back, resharded"
            + ("; saved by k ranks, loaded by m" if fn != "async_save" else ""),
        )
        for fn in ("save", "async_save", "load")
    ),
    ("async_save", "checkpoint_id", _SUBGROUP_DCP, "a path alone (the round trip passes a writer)"),
    ("FileSystemWriter", "path", _ROUND_TRIP, ""),
    (
        "FileSystemWriter",
        "single_file_per_rank",
        (
            *_ROUND_TRIP,
            "test_checkpoint::test_a_writer_writes_one_file_a_rank_or_one_a_tensor_as_asked",
        ),
        "on and off: loaded back, and one file a rank or one a tensor as documented",
    ),
    ("FileSystemWriter", "sync_files", _ROUND_TRIP, "on and off"),
    ("FileSystemWriter", "thread_count", _ROUND_TRIP, "1 to 3"),
    ("FileSystemWriter", "per_thread_copy_ahead", _ROUND_TRIP, "1 byte and the default"),
    ("FileSystemWriter", "overwrite", _DCP_REFUSED, "False over an existing checkpoint"),
    *(
        ("FileSystemWriter", m, _ROUND_TRIP, _PROTOCOL)
        for m in (
            "close()",
            "finish()",
            "prepare_global_plan()",
            "prepare_local_plan()",
            "reset()",
            "set_up_storage_writer()",
            "stage()",
            "storage_meta()",
            "synchronize_staging()",
            "write_data()",
        )
    ),
    ("FileSystemReader", "path", _ROUND_TRIP, "made by load from checkpoint_id"),
    *(
        ("FileSystemReader", m, _ROUND_TRIP, _PROTOCOL)
        for m in (
            "prepare_global_plan()",
            "prepare_local_plan()",
            "read_data()",
            "read_metadata()",
            "reset()",
            "set_up_storage_reader()",
        )
    ),
    ("DefaultSavePlanner", "flatten_state_dict", _ROUND_TRIP, "on and off"),
    (
        "DefaultSavePlanner",
        "dedup_save_to_lowest_rank",
        (*_ROUND_TRIP, _REPLICATED),
        "on and off; a replicated tensor written once, by rank 0 or by the least-loaded rank",
    ),
    (
        "DefaultSavePlanner",
        "enable_plan_caching",
        _ROUND_TRIP,
        "a planner saving twice, the second time other values",
    ),
    *(
        ("DefaultSavePlanner", m, _ROUND_TRIP, _PROTOCOL)
        for m in (
            "create_global_plan()",
            "create_local_plan()",
            "finish_plan()",
            "lookup_object()",
            "resolve_data()",
            "set_up_planner()",
            "transform_object()",
        )
    ),
    ("DefaultLoadPlanner", "flatten_state_dict", _ROUND_TRIP, "on and off"),
    ("DefaultLoadPlanner", "flatten_sharded_tensors", _ROUND_TRIP, "on and off"),
    (
        "DefaultLoadPlanner",
        "allow_partial_load",
        _ROUND_TRIP + _DCP_REFUSED,
        "on and off; a key the checkpoint lacks left alone",
    ),
    *(
        ("DefaultLoadPlanner", m, _ROUND_TRIP, _PROTOCOL)
        for m in (
            "commit_tensor()",
            "create_global_plan()",
            "create_local_plan()",
            "finish_plan()",
            "load_bytes()",
            "lookup_tensor()",
            "resolve_bytes()",
            "resolve_tensor()",
            "set_up_planner()",
            "transform_tensor()",
        )
    ),
    (
        "load",
        "storage_reader",
        _ROUND_TRIP,
        "a FileSystemReader with an extension registry, where the writer had extensions",
    ),
    (
        "FileSystemWriter",
        "_extensions",
        _ROUND_TRIP + _STREAMS,
        "none, one, two that commute; two that do not: the known issue",
    ),
    (
        "FileSystemReader",
        "_extension_registry",
        _ROUND_TRIP + _STREAMS,
        "a registry of the writer's extensions",
    ),
)
_CHECKPOINT_OTHERS = (
    (
        "FileSystemWriter",
        "serialization_format",
        OUT,
        "undocumented (FileSystemWriter's docstring lists no such argument): SAFETENSORS is "
        "the HuggingFace storage's format, written through its own writer; neither "
        "FileSystemReader nor HuggingFaceStorageReader reads it back from this writer's "
        "files (checked)",
    ),
    (
        "DefaultSavePlanner",
        "flatten_sharded_tensors",
        OUT,
        "ShardedTensor's, the deprecated "
        "sharding of FSDP1's state dicts; DTensors are saved as they are",
    ),
    (
        "DefaultSavePlanner",
        "dedup_replicated_tensors",
        OUT,
        "deprecated: torch warns that it has no effect",
    ),
)
_DDP = "torch.nn.parallel.DistributedDataParallel"
_DEFAULT_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
_POWER = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook."
_LOCAL = "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook."
_AVG = "torch.distributed.algorithms.model_averaging."
_NN = "torch.distributed.nn.functional."
_STATE = "torch.distributed.checkpoint.state_dict."
_DSD = "test_state_dict::test_state_dicts_are_the_plain_models_whatever_the_wrapping"
_SUBMODULES = (
    "test_state_dict::test_a_state_dict_of_submodules_holds_theirs_alone_prefixed_as_asked"
)


def _offers(api: str, member: str) -> bool:
    """Whether the installed torch has ``member`` of ``api`` (rows for members a release
    added are listed where it has them)."""
    module, _, name = api.rpartition(".")
    target = getattr(importlib.import_module(module), name)
    if member.endswith("()"):
        return hasattr(target, member[:-2])
    function = target.__init__ if inspect.isclass(target) else target
    return member in inspect.signature(function).parameters


def _e(
    api: str, member: str, status: str, *tests: str, why: str = "", since: str | None = None
) -> Entry:
    return Entry(api, member, status, tuple(tests), why, since)


def _gap(api: str, member: str, why: str) -> Entry:
    return Entry(api, member, GAP, (), why)


ENTRIES: tuple[Entry, ...] = (
    # -- DistributedDataParallel -----------------------------------------------------------
    _e(_DDP, "module", COVERED, _OPTIONS, why="every DDP property wraps the drawn model"),
    _e(_DDP, "device_ids", OUT, why="placement: which device the module lives on, set by "
       "the suite's method on GPUs; no arithmetic of its own"),
    _e(_DDP, "output_device", OUT, why="placement of the outputs; no arithmetic of its own"),
    _e(_DDP, "dim", OUT, why="the dimension inputs are scattered along for a module spanning "
       "several devices, which DDP no longer supports"),
    _e(_DDP, "broadcast_buffers", COVERED,
       "test_ddp_options::test_broadcast_buffers_with_models_that_have_buffers",
       "test_ddp_options::test_broadcast_buffers_means_every_rank_uses_rank_0s_buffers"),
    _e(_DDP, "init_sync", COVERED, _DDP_GROUP,
       "test_ddp_options::test_ddp_starts_every_rank_from_rank_0s_state", why="True and False"),
    _e(_DDP, "process_group", COVERED, _DDP_GROUP, why="subgroups of consecutive ranks"),
    _e(_DDP, "bucket_cap_mb", COVERED, _OPTIONS,
       "test_ddp_options::test_bucket_cap_mb_sets_the_size_of_the_buckets_a_comm_hook_is_handed",
       why="1e-6 (a bucket per parameter) to 25 and None; the buckets a hook is handed"),
    _e(_DDP, "find_unused_parameters", COVERED,
       "test_ddp_options::test_find_unused_parameters_with_unused_parameters",
       "test_ddp_options::test_find_unused_parameters_when_every_parameter_is_used"),
    _e(_DDP, "check_reduction", OUT, why="deprecated: DDP ignores it"),
    _e(_DDP, "gradient_as_bucket_view", COVERED, _OPTIONS,
       "test_ddp_options::test_gradient_as_bucket_view_makes_gradients_views_of_the_bucket",
       why="training unchanged, and the gradients views of one bucket (or not)"),
    _e(_DDP, "static_graph", COVERED, "test_ddp_options::test_static_graph_without_accumulation",
       "test_ddp_options::test_static_graph_with_no_sync_accumulation"),
    *(
        _e(_DDP, arg, COVERED, *_DELAYED,
           why="the parameters after the input layer, hooked to its weight; three known torch "
           "issues (never waited, no_sync ignored, default-dtype buffer): on torch 2.13 the "
           "race leaves nothing these tests can gate")
        for arg in ("delay_all_reduce_named_params", "param_to_hook_all_reduce")
    ),
    _e(_DDP, "mixed_precision", COVERED,
       "test_ddp_options::"
       "test_ddp_mixed_precision_computes_in_param_dtype_reduces_in_float32_keeps_float32",
       "test_ddp_options::test_ddp_mixed_precision_first_backward_gives_the_gradient",
       why="_MixedPrecision(param_dtype=bfloat16/float16, reduce_dtype=float32), on CUDA "
       "only (it waits on events a CPU lacks); the first backward's zero gradients a known "
       "torch issue (findings/ddp_mixed_precision_gradient.py)"),
    _e(_DDP, "device_mesh", COVERED, _DDP_GROUP, why="a 1-D mesh sliced out of a 2-D one"),
    _e(_DDP, "skip_all_reduce_unused_params", COVERED,
       "test_ddp_options::test_find_unused_parameters_with_unused_parameters"),
    _e(_DDP, "bucket_cap_mb_list", COVERED, _OPTIONS, why="one-byte buckets first"),
    _e(_DDP, "batched_grad_copy", COVERED, _OPTIONS, why="with default and one-byte buckets"),
    _e(_DDP, "forward_sync_buffers", COVERED, _OPTIONS,
       why="True, said outright (False is broadcast_buffers=False's, covered)", since="2.13"),
    _e(_DDP, "forward()", COVERED, _OPTIONS),
    _e(_DDP, "no_sync()", COVERED,
       "test_ddp_options::test_no_sync_leaves_gradients_local_until_the_syncing_backward",
       why="and in every DDP property with accumulation"),
    _e(_DDP, "join()", COVERED,
       "test_join::test_join_with_uneven_batch_counts_follows_the_documented_semantics",
       why="as Join([model], ...) and as model.join(...), divide_by_initial_world_size "
       "drawn both ways; enable and throw_on_early_termination at their defaults"),
    _e(_DDP, "join_hook()", COVERED,
       "test_join::test_join_with_uneven_batch_counts_follows_the_documented_semantics",
       "test_join::test_join_starts_each_forward_from_the_buffers_of_a_rank_still_training"),
    _e(_DDP, "register_comm_hook()", COVERED, "test_comm_hooks::test_allreduce_hook_is_exact"),
    _e(_DDP, "_register_fused_optim()", COVERED,
       "test_fused_optimizer::test_ddp_fused_sgd_follows_the_published_rule_on_the_averaged_gradient",
       why="SGD with and without momentum"),
    _e(_DDP, "gather()", OUT, why="moves outputs between a module's devices; no arithmetic"),
    _e(_DDP, "scatter()", OUT, why="moves inputs to a module's devices; no arithmetic"),
    _e(_DDP, "to_kwargs()", OUT, why="moves inputs to a module's devices; no arithmetic"),
    _e(_DDP, "will_sync_module_buffers()", OUT, why="a query of broadcast_buffers' state"),
    _e(_DDP, "train()", OUT, why="nn.Module.train, passed on to the module"),
    # -- comm hooks --------------------------------------------------------------------------
    _e(_DEFAULT_HOOKS + "allreduce_hook", "process_group", COVERED,
       "test_comm_hooks::test_allreduce_hook_is_exact", why="the default group only"),
    _e(_DEFAULT_HOOKS + "allreduce_hook", "bucket", COVERED,
       "test_comm_hooks::test_allreduce_hook_is_exact"),
    *(
        _e(_DEFAULT_HOOKS + hook, arg, COVERED, _HOOK_FORMAT, _HOOK_SCALE,
           *(("test_comm_hooks::test_ddp_with_the_python_reducer_averages_with_the_hooks_it_takes",)
             if (hook, arg) == ("fp16_compress_hook", "bucket") else ()),
           why="a GradBucket; and the Python reducer's (gradient, parameter) tuple"
           if (hook, arg) == ("fp16_compress_hook", "bucket") else "")
        for hook in ("fp16_compress_hook", "bf16_compress_hook")
        for arg in ("process_group", "bucket")
    ),
    *(
        _e(_DEFAULT_HOOKS + hook, arg, COVERED, _HOOK_FORMAT,
           why=f"[{hook}]: around allreduce_hook; bfloat16 on NCCL only (gloo raises TypeError)")
        for hook in ("fp16_compress_wrapper", "bf16_compress_wrapper")
        for arg in ("hook",)
    ),
    _e(_POWER + "PowerSGDState", "process_group", COVERED, _POWERSGD, why="the default group"),
    _e(_POWER + "PowerSGDState", "matrix_approximation_rank", COVERED, _POWERSGD,
       "test_comm_hooks::test_powersgd_at_rank_1_is_lossy_and_the_error_is_reported"),
    _e(_POWER + "PowerSGDState", "start_powerSGD_iter", COVERED, _POWERSGD_DEFAULTS,
       "test_ddp_options::test_every_construction_and_comm_hook_ddp_refuses_is_refused",
       why="2 with torch's defaults; 1 refused with error feedback or warm start, accepted "
           "without either"),
    _e(_POWER + "PowerSGDState", "min_compression_rate", COVERED, _POWERSGD),
    *(
        _e(_POWER + "PowerSGDState", name, COVERED, _POWERSGD, _POWERSGD_DEFAULTS,
           "test_comm_hooks::test_powersgd_without_error_feedback_keeps_nothing",
           *(["test_comm_hooks::test_powersgd_with_warm_start_converges_to_the_best_rank_1_"
              "approximation"] if name == "warm_start" else []),
           why="on (the residual kept and carried; warm start converging to the best rank-1 "
               "approximation of a fixed gradient) and off (none kept, a start at iteration 1 "
               "accepted; a new random start each step)")
        for name in ("use_error_feedback", "warm_start")
    ),
    _e(_POWER + "PowerSGDState", "orthogonalization_epsilon", COVERED, _POWERSGD,
       "test_comm_hooks::test_powersgd_orthogonalization_epsilon_keeps_a_zero_gradient_zero",
       why="1e-30 (exact at full rank), and 1e-8 to 2 keeping a zero-mean gradient zero"),
    _e(_POWER + "PowerSGDState", "random_seed", COVERED, _POWERSGD_WIDE, why="the default and 7"),
    _e(_POWER + "PowerSGDState", "compression_stats_logging_frequency", OUT,
       why="how often statistics are logged; no arithmetic"),
    _e(_POWER + "PowerSGDState", "batch_tensors_with_same_shape", COVERED, _POWERSGD_WIDE),
    _e(_POWER + "PowerSGDState", "maybe_increase_iter()", COVERED, _POWERSGD_DEFAULTS,
       why="called by the hook each step"),
    _e(_POWER + "PowerSGDState", "compression_stats()", COVERED, _POWERSGD_DEFAULTS,
       why="the elements each compressed call counts before and after compression, their "
           "totals and rate; (0, 0, 0) before any compression"),
    *(
        _e(_POWER + hook, arg, COVERED, _POWERSGD,
           "test_comm_hooks::test_batched_powersgd_at_full_rank_is_exact")
        for hook in ("powerSGD_hook", "batched_powerSGD_hook")
        for arg in ("state", "bucket")
    ),
    _e(_LOCAL + "PostLocalSGDState", "process_group", COVERED, _POST_LOCAL,
       why="the world and subgroups of consecutive ranks"),
    *(
        _e(_LOCAL + "PostLocalSGDState", arg, COVERED, _POST_LOCAL,
           why="subgroups of every size dividing the world")
        for arg in ("subgroup", "start_localSGD_iter", "post_local_gradient_allreduce",
                    "maybe_increase_iter()")
    ),
    *(_e(_LOCAL + "post_localSGD_hook", arg, COVERED, _POST_LOCAL) for arg in ("state", "bucket")),
    # -- model averaging ---------------------------------------------------------------------
    *(
        _e(_AVG + "averagers.PeriodicModelAverager", arg, COVERED, _AVERAGING,
           *((_AVERAGER_REFUSALS,) if arg in ("period", "warmup_steps") else ()),
           why="1 warned of, below 1 refused" if arg == "period" else
           "negative refused" if arg == "warmup_steps" else "")
        for arg in ("period", "warmup_steps", "process_group", "average_parameters()")
    ),
    *(
        _e(_AVG + "hierarchical_model_averager.HierarchicalModelAverager", arg, COVERED,
           "test_model_averaging::"
           "test_hierarchical_model_averager_averages_the_largest_dividing_periods_groups",
           *((_AVERAGER_REFUSALS,) if arg != "average_parameters()" else ()),
           why="empty, a period 0, a last size not the group's refused; a largest period of 1 "
           "warned of" if arg == "period_group_size_dict" else
           "negative refused" if arg == "warmup_steps" else "")
        for arg in ("period_group_size_dict", "warmup_steps", "average_parameters()")
    ),
    _e(_AVG + "hierarchical_model_averager.HierarchicalModelAverager", "process_group",
       COVERED,
       "test_model_averaging::"
       "test_hierarchical_model_averager_averages_the_largest_dividing_periods_groups",
       why="the world and subgroups of consecutive ranks; below a subgroup, levels of one rank "
       "only (larger ones wait forever: findings/hierarchical_averager_subgroup_hang.py)"),
    *(
        _e(_AVG + "utils." + fn, arg, COVERED, _AVERAGING,
           why="through the averager: parameters and parameter groups, the world and subgroups")
        for fn, args in (("average_parameters", ("params", "process_group")),
                         ("average_parameters_or_parameter_groups", ("params", "process_group")))
        for arg in args
    ),
    # -- torch.optim -------------------------------------------------------------------------
    *(
        _e("torch.optim.Optimizer", member, COVERED, *(f"test_optimizer_base::{t}" for t in tests),
           why=why)
        for member, tests, why in (
            ("params", ("test_the_state_dict_is_packed_by_index_in_group_order",
                        "test_named_parameters_are_kept_by_name_in_the_state_dict",
                        "test_every_documented_refusal_of_parameters_is_made",
                        "test_a_group_holding_a_parameter_twice_is_warned_of_and_no_other"),
             "tensors, groups and named parameters; every documented refusal; the warning of "
             "a parameter twice in a group"),
            ("defaults", ("test_an_added_group_takes_the_defaults_and_trains_by_its_own",),
             "what an added group takes"),
            ("add_param_group()", ("test_an_added_group_takes_the_defaults_and_trains_by_its_own",),
             ""),
            ("state_dict()", ("test_the_state_dict_is_packed_by_index_in_group_order",
                              "test_a_loaded_state_continues_as_the_uninterrupted_optimizer"),
             ""),
            ("load_state_dict()", ("test_a_loaded_state_continues_as_the_uninterrupted_optimizer",
                                   "test_a_loaded_state_takes_the_parameters_dtype",
                                   "test_a_state_of_other_groups_is_refused"), ""),
            ("zero_grad()", ("test_zero_grad_drops_or_zeroes_as_asked",), ""),
            ("step()", ("test_a_loaded_state_continues_as_the_uninterrupted_optimizer",),
             "defined by each optimizer (SGD, Adam, AdamW), through the base's hooks"),
            *(
                (f"register_{kind}_hook()",
                 ("test_hooks_fire_in_the_documented_order_and_hand_on_what_they_return",),
                 "prepend on and off, handles removed, returns handed on"
                 if "state_dict" in kind else "in registration order, new (args, kwargs) handed on")
                for kind in ("step_pre", "step_post", "state_dict_pre", "state_dict_post",
                             "load_state_dict_pre", "load_state_dict_post")
            ),
        )
    ),
    *_optimizer(
        "torch.optim.SGD",
        {"params": "three shapes, one without a gradient every other step",
         "lr": "a float, a scalar tensor and a tensor of shape (1,); negative refused; 0 "
               "accepted",
         "momentum": "0, 0.5, 0.9; negative refused", "dampening": "0 and 0.3",
         "weight_decay": "0, 0.01, 0.1; negative refused",
         "nesterov": "on with momentum and no dampening; refused otherwise",
         "maximize": "on and off", "foreach": "the for-loop and foreach paths",
         "fused": "where this build has the path", "step()": "4 steps"},
        {},
    ),
    *(
        _e(api, "differentiable", COVERED,
           "test_optimizer_options::test_a_differentiable_optimizer_gives_the_derivative_by_its"
           "_learning_rate", why=_DIFFERENTIABLE_RULE)
        for api in ("torch.optim.SGD", "torch.optim.Adam", "torch.optim.AdamW")
    ),
    *(
        row
        for api in ("torch.optim.Adam", "torch.optim.AdamW")
        for row in _optimizer(
            api,
            {"params": "three shapes, one without a gradient every other step",
             "lr": "a float, a scalar tensor and a tensor of shape (1,) (refused on foreach "
                   "without capturable)",
             "betas": "0, 0.5, 0.9 and 0.5, 0.99, floats or tensors of both shapes; [0, 1) "
                      "else refused",
             "eps": "1e-8, 1e-3, 0; negative refused",
             "weight_decay": "0, 0.01, 0.1; negative refused", "amsgrad": "on and off",
             "maximize": "on and off", "foreach": "the for-loop and foreach paths",
             "fused": "where this build has the path (with foreach: refused)",
             # AdamW steps through Adam's step(), which is Adam's row.
             **({"decoupled_weight_decay": "AdamW's rule", "step()": "4 steps"}
                if api == "torch.optim.Adam" else {})},
            {"capturable": _CUDA_GRAPHS},
        )
    ),
    *(
        Entry("torch.optim.lr_scheduler.StepLR", member, COVERED,
              ("test_lr_schedulers::test_each_scheduler_follows_its_documented_schedule",), why)
        for member, why in (
            ("optimizer", "SGD with two param groups, each its own base learning rate"),
            ("step_size", "3"), ("gamma", "0.5"),
            ("get_lr()", "through step() and get_last_lr(), 10 epochs"),
        )
    ),
    _e("torch.optim.lr_scheduler.StepLR", "last_epoch", COVERED,
       "test_lr_schedulers::test_a_schedule_built_at_a_later_epoch_runs_on_from_it",
       "test_lr_schedulers::test_last_epoch_without_initial_learning_rates_is_refused",
       "test_lr_schedulers::test_a_schedule_resumed_from_its_state_dict_runs_on_as_documented",
       why="resumed at each epoch, the optimizer loaded from the run; at an epoch the schedule "
       "changes, the known issue; no initial_lr refused; and through state_dict() instead"),

    # -- torch.distributed.checkpoint: save, load, the filesystem storage, the planners -------
    *(
        _e(f"{_DCP_API}{api}", member, COVERED, *tests, why=why)
        for api, member, tests, why in _CHECKPOINT_ROWS
        if _offers(f"{_DCP_API}{api}", member)
    ),
    *(
        _e(f"{_DCP_API}{api}", member, status, why=why)
        for api, member, status, why in _CHECKPOINT_OTHERS
        if _offers(f"{_DCP_API}{api}", member)
    ),
    # -- BatchNorm and SyncBatchNorm -------------------------------------------------------
    *(
        _e(f"torch.nn.{cls}", member, COVERED, _NORM, why=why)
        for cls in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")
        for member, why in (
            ("num_features", "1 to 3 channels"), ("eps", "1e-5 and 0.25"),
            ("momentum", "0.1, 0.5, 1 and None (the cumulative average)"),
            ("affine", "on and off"), ("bias", "on and off (the weight alone)"),
            ("track_running_stats", "on and off (the batch normalises in evaluation)"),
            ("dtype", "float64"),
        )
    ),
    *(
        _e(f"torch.nn.{cls}", "device", OUT, why="placement: the CPU here, CUDA by the GPU check")
        for cls in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")
    ),
    _e("torch.nn.SyncBatchNorm", "process_group", COVERED, _CONVERT, _SYNC_CPU,
       why="set by the conversion; training under it needs GPUs (its CPU refusal checked)"),
    _e("torch.nn.SyncBatchNorm", "forward()", COVERED, _NORM, _SYNC_CPU,
       "test_ddp_options::test_sync_batch_norm_on_uneven_batches",
       why="without a group, in evaluation, and synchronised on GPUs"),
    _e("torch.nn.SyncBatchNorm.convert_sync_batchnorm", "module", COVERED, _CONVERT,
       "test_batch_norm::test_convert_sync_batchnorm_of_a_batchnorm_itself_returns_its_replacement",
       why="nested BatchNorm1d/2d, frozen, in evaluation, with a qconfig; a BatchNorm itself"),
    _e("torch.nn.SyncBatchNorm.convert_sync_batchnorm", "process_group", COVERED, _CONVERT,
       why="None and the world"),
    # -- Join ---------------------------------------------------------------------------------
    _e("torch.distributed.algorithms.Join", "joinables", COVERED,
       "test_join::test_join_with_uneven_batch_counts_follows_the_documented_semantics",
       "test_join::test_join_with_zero_redundancy_optimizer_follows_the_documented_semantics",
       why="[model] and [model, ZeroRedundancyOptimizer], divide_by_initial_world_size (a "
       "keyword it passes on) both ways"),
    _e("torch.distributed.algorithms.Join", "enable", COVERED,
       "test_join::test_join_disabled_does_nothing_and_enabled_tells_the_context_each_step",
       why="False: no joinable told to notify, training plain DDP's; True: a work handle a "
       "step (and the default in the other properties)"),
    _e("torch.distributed.algorithms.Join", "throw_on_early_termination", COVERED,
       "test_join::test_join_throwing_on_early_termination_stops_every_rank_where_the_first_"
       "runs_out", why="True: every rank raises once one runs out, after the shortest's steps; "
       "even batches, none; False: the default, in the other properties"),
    # -- DeviceMesh -----------------------------------------------------------------------------
    _e(_INIT_MESH, "device_type", COVERED, _MESH, why="'cpu' (CUDA by the GPU check)"),
    _e(_INIT_MESH, "mesh_shape", COVERED, _MESH,
       why="every way the world factors into one to three dimensions; one larger than the "
       "world refused"),
    _e(_INIT_MESH, "mesh_dim_names", COVERED, _MESH,
       why="named; names of another length, a name twice refused"),
    *(
        _e(api, "backend_override", COVERED,
           "test_device_mesh::test_a_mesh_dimension_given_its_own_backend_has_it", why=why)
        for api, why in (
            (_INIT_MESH, "one dimension, by index or name: gloo's options, ('gloo', options), "
             "'gloo'; held by that dimension's group alone"),
            (_DEVICE_MESH, "a (backend, options) pair a dimension, one given its own"),
        )
        if _offers(api, "backend_override")
    ),
    _e(_DEVICE_MESH, "device_type", COVERED, _MESH_OUTRIGHT, why="'cpu'"),
    _e(_DEVICE_MESH, "mesh", COVERED, _MESH_OUTRIGHT,
       "test_device_mesh::test_a_mesh_of_ranks_in_another_order_shards_by_its_coordinates",
       why="the world in order, the first rank alone, the world reversed (a known issue)"),
    _e(_DEVICE_MESH, "mesh_dim_names", COVERED, _MESH),
    *(
        _e(_DEVICE_MESH, member, OUT,
           why="private: what torch passes when it slices, flattens or unflattens a mesh "
           "(those are covered)")
        for member in ("_init_backend", "_rank", "_layout", "_rank_map", "_root_mesh")
    ),
    *(
        _e(_DEVICE_MESH, member, COVERED, _MESH, why=why)
        for member, why in (
            ("get_all_groups()", "every dimension's group, in order"),
            ("get_coordinate()", "the rank's index unravelled"),
            ("get_group()", "by index and by name, of submeshes and flattened ones too; "
             "a 1-D mesh's unasked, a wider one's refused"),
            ("get_local_rank()", "by name"),
            ("get_rank()", ""),
            ("size()", "the whole and each dimension's"),
            ("_flatten()", "every ordered choice of dimensions, one dimension alone too"),
            ("_unflatten()", "every dimension split in two, by each factor"),
        )
    ),
    # -- DTensor ---------------------------------------------------------------------------------
    _e(_DT + "distribute_tensor", "tensor", COVERED, _DT_WHOLE, _DT_FORMS,
       why="1-D and 2-D, uneven, fewer rows than ranks"),
    _e(_DT + "distribute_tensor", "device_mesh", COVERED, _DT_WHOLE, why="1-D and 2-D meshes"),
    _e(_DT + "distribute_tensor", "placements", COVERED, _DT_WHOLE, _DT_FORMS,
       why="shard either dimension, replicate; none (replicated from the first rank)"),
    _e(_DT + "distribute_tensor", "src_data_rank", COVERED, _DT_FORMS,
       why="0, the last rank, None (each rank's own data), every rank holding other data"),
    _e(_DT + "DTensor.from_local", "local_tensor", COVERED, _DT_WHOLE, _DT_FORMS,
       why="partial sums, uneven shards"),
    _e(_DT + "DTensor.from_local", "device_mesh", COVERED, _DT_WHOLE),
    _e(_DT + "DTensor.from_local", "placements", COVERED, _DT_WHOLE, _DT_FORMS,
       why="partial, shard, replicate"),
    _e(_DT + "DTensor.from_local", "run_check", COVERED, _DT_FORMS,
       why="False and True over replicas that differ (True: the first rank's broadcast)"),
    *(
        _e(_DT + "DTensor.from_local", member, COVERED, _DT_WHOLE, _DT_FORMS,
           why="the whole tensor's, given for uneven shards")
        for member in ("shape", "stride")
    ),
    _e(_DT + "DTensor.from_local", "grad_placements", COVERED, _DT_FORMS,
       why="a replicated input's gradient hinted partial (each rank's own contribution) and "
       "unhinted (the replicated sum)"),
    _e(_DT + "DTensor.redistribute", "device_mesh", COVERED, _DT_WHOLE, why="its own mesh"),
    _e(_DT + "DTensor.redistribute", "placements", COVERED, _DT_WHOLE,
       why="every placement to every other (to a partial sum: as torch documents)"),
    _e(_DT + "DTensor.redistribute", "async_op", COVERED, _DT_FORMS, why="True, waited"),
    _e(_DT + "DTensor.redistribute", "forward_dtype", COVERED, _DT_FORMS,
       why="float32 from float64: the result's dtype and values"),
    _e(_DT + "DTensor.redistribute", "backward_dtype", COVERED, _DT_FORMS,
       why="None and bfloat16: the gradient's collective rounds, the gradient comes back "
       "in float64"),
    *(
        _e(_DT + f"DTensor.{fn}", "grad_placements", COVERED, _DT_FORMS,
           why="none (the gradient taken as the layout said) and a partial hint (summed)")
        for fn in ("full_tensor", "to_local")
    ),
    # -- torch.amp.GradScaler -----------------------------------------------------------------
    *(
        _e("torch.amp.GradScaler", member, COVERED, _SCALER, why=why)
        for member, why in (
            ("init_scale", "2**4 and 2**10"), ("growth_factor", "2 and 4"),
            ("backoff_factor", "0.5 and 0.25"), ("growth_interval", "1 to 3"),
            ("get_scale()", "after every step"),
        )
    ),
    _e("torch.amp.GradScaler", "scale()", COVERED, _SCALER,
       "test_grad_scaler::test_scale_multiplies_each_tensor_of_an_iterable_keeping_its_shape",
       why="a float64 loss; nested lists and tuples, a generator; a non-tensor refused"),
    _e("torch.amp.GradScaler", "step()", COVERED, _SCALER, _SHARED_SCALER,
       "test_grad_scaler::test_calls_out_of_their_documented_order_are_refused",
       why="skipped on inf and NaN, taken otherwise; each of two optimizers on its own "
       "gradients; a second step, a closure, no gradients refused"),
    _e("torch.amp.GradScaler", "update()", COVERED, _SCALER, _SHARED_SCALER,
       "test_grad_scaler::test_update_takes_a_new_scale_as_a_float_or_a_one_element_tensor",
       "test_grad_scaler::test_update_takes_a_new_scale_as_a_tensor_of_shape_one",
       why="the schedule after every step, from the infs of every optimizer; new_scale as a "
       "float, a 0-dim and a (1,) tensor (torch refuses the last: a known issue); other "
       "tensors and an update with no inf checks refused"),
    _e("torch.amp.GradScaler", "unscale_()", COVERED, _SCALER,
       "test_grad_scaler::test_calls_out_of_their_documented_order_are_refused",
       "test_grad_scaler::test_half_precision_gradients_are_refused_by_unscale",
       why="before step, as before clipping; after step and on float16 gradients refused"),
    _e("torch.amp.GradScaler", "device", OUT, why="placement: 'cpu' here, CUDA by the GPU check"),
    _e("torch.amp.GradScaler", "enabled", COVERED,
       "test_grad_scaler::test_a_disabled_scaler_changes_nothing"),
    _e("torch.amp.GradScaler", "is_enabled()", COVERED,
       "test_grad_scaler::test_a_disabled_scaler_changes_nothing"),
    *(
        _e("torch.amp.GradScaler", member, COVERED,
           "test_grad_scaler::test_the_state_dict_carries_the_schedule_to_a_new_scaler")
        for member in ("state_dict()", "load_state_dict()")
    ),
    *(
        _e("torch.amp.GradScaler", f"{verb}_{what}()", COVERED,
           "test_grad_scaler::test_a_schedule_changed_between_steps_runs_on_from_then",
           why="changed between steps; in force from the next update")
        for verb in ("get", "set") for what in ("growth_factor", "backoff_factor",
                                               "growth_interval")
    ),
    # -- c10d: tensor collectives and groups --------------------------------------------------
    *(
        _e(f"torch.distributed.{name}", member, COVERED, _COLLECTIVES, why=why)
        for name, member, why in _COLLECTIVE_ROWS if hasattr(_dist, name)
    ),
    *(
        _e(f"torch.distributed.{name}", member, OUT, why=why)
        for name, member, why in _COLLECTIVE_OUT if hasattr(_dist, name)
    ),
    *(
        [_e("torch.distributed.new_subgroups", "group", COVERED, _COLLECTIVES,
            why="the world's ranks in any order (new_group with sort_ranks=False), in blocks "
            "of its rank order; every collective over the subgroup")]
        if _offers("torch.distributed.new_subgroups", "group")
        else []
    ),
    # -- torch.distributed.optim -------------------------------------------------------------
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "params", COVERED, _ZERO,
       "test_zero::test_zero_shards_every_parameter_once_by_sorted_greedy_packing",
       why="each parameter on one rank's local optimizer, packed sorted-greedy"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "optimizer_class", COVERED, _ZERO,
       why="SGD with momentum and AdamW"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "process_group", COVERED,
       "test_zero::test_zero_over_a_subgroup_steps_and_broadcasts_within_that_group",
       why="the world and subgroups of consecutive ranks, with and without bucket views"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "parameters_as_bucket_view", COVERED,
       "test_zero::test_zero_with_parameters_as_bucket_view_matches_the_reference",
       "test_zero::test_zero_follows_trainability_changed_between_its_steps",
       why="the buckets rebuilt when a parameter is frozen or unfrozen between steps"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "overlap_with_ddp", COVERED,
       "test_zero::test_zero_overlapped_with_ddp_steps_inside_the_hook_after_its_warm_up",
       "test_zero::test_zero_overlapped_with_ddp_sharding_its_buckets",
       "test_zero::test_every_construction_and_call_zero_refuses_is_refused",
       why="on nccl only (torch refuses gloo: pytorch#62300); both hooks, one bucket or one "
       "per parameter; shard_buckets=True a known torch issue "
       "(findings/zero_overlap_shard_buckets.py); on every backend, the state methods "
       "refused until DDP's buckets are rebuilt"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "defaults", COVERED, _ZERO,
       why="the optimizer's hyperparameters"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "step()", COVERED, _ZERO,
       "test_zero::test_zero_follows_trainability_changed_between_its_steps",
       why="parameters frozen or unfrozen between steps: stepped while they have a gradient"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "consolidate_state_dict()", COVERED,
       "test_zero::test_zero_resumes_from_its_consolidated_state",
       "test_zero::test_zero_over_a_subgroup_steps_and_broadcasts_within_that_group",
       why="within a subgroup, to any of its ranks (to=); under a default device that is "
       "not the parameters' (meta)"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "state_dict()", COVERED,
       "test_zero::test_zero_resumes_from_its_consolidated_state"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "load_state_dict()", COVERED,
       "test_zero::test_zero_resumes_from_its_consolidated_state"),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "add_param_group()", COVERED,
       _ZERO_ADDED),
    _e("torch.distributed.optim.ZeroRedundancyOptimizer", "join_hook()", COVERED,
       "test_join::test_join_with_zero_redundancy_optimizer_follows_the_documented_semantics",
       why="Join([model, optimizer]); a documented limit marked (stale gradients on joined "
       "ranks)"),
    *(
        _e("torch.distributed.optim.PostLocalSGDOptimizer", arg, COVERED, _AVERAGING)
        for arg in ("optim", "averager", "step()")
    ),
    *(
        _e("torch.distributed.optim.PostLocalSGDOptimizer", arg, COVERED, _AVERAGING,
           why="a fresh optimizer loads the state dict before a drawn step; a group added "
           "after construction")
        for arg in ("state_dict()", "load_state_dict()", "add_param_group()", "zero_grad()")
    ),
    # -- torch.distributed.nn ----------------------------------------------------------------
    *(
        _e(_NN + fn, arg, COVERED, _DIFFERENTIABLE)
        for fn, args in (("all_gather", ("tensor",)), ("all_reduce", ("tensor",)),
                         ("broadcast", ("tensor", "src")),
                         ("reduce_scatter", ("output", "input_list")),
                         ("all_to_all_single", ("output", "input", "output_split_sizes",
                                                "input_split_sizes")))
        for arg in args
    ),
    *(_e(_NN + fn, "group", COVERED, _DIFFERENTIABLE, why="subgroups of consecutive ranks")
      for fn in ("all_reduce", "reduce_scatter", "all_to_all_single")),
    _e(_NN + "all_gather", "group", COVERED, _DIFFERENTIABLE,
       "test_differentiable_collectives::test_differentiable_all_gather_over_subgroups_on_gloo",
       why="subgroups; on gloo a known torch issue (its backward scatters from a group rank "
       "as if global)"),
    _e(_NN + "broadcast", "group", COVERED,
       "test_differentiable_collectives::test_differentiable_broadcast_over_subgroups",
       why="a known torch issue (pytorch#130515): the source's gradient is zeroed where its "
       "group rank is not its global rank"),
    _e(_NN + "all_reduce", "op", COVERED, _DIFFERENTIABLE,
       why="SUM and AVG; MAX, MIN and PRODUCT not: their backward reduces the gradients "
       "with the same op, which is not their derivative (no torch issue found tracking it)"),
    *(_e(_NN + fn, "op", COVERED, _DIFFERENTIABLE,
         "test_differentiable_collectives::"
         "test_differentiable_averages_give_the_gradient_of_an_average",
         why="SUM; AVG a known torch issue (its backward does not divide)")
      for fn in ("reduce_scatter", "reduce")),
    *(
        _e(_NN + fn, arg, COVERED, _DIFFERENTIABLE)
        for fn, args in (("gather", ("tensor", "dst")), ("scatter", ("tensors", "src")),
                         ("reduce", ("tensor", "dst")),
                         ("all_to_all", ("output_tensor_list", "input_tensor_list")))
        for arg in args
    ),
    *(_e(_NN + fn, "group", COVERED, _DIFFERENTIABLE,
         why="the world and the subgroup of the first ranks only: elsewhere their code mixes "
         "group and global ranks as broadcast's does (pytorch#130515), not yet checked")
      for fn in ("gather", "scatter", "reduce", "all_to_all")),
    # -- FSDP2 -------------------------------------------------------------------------------
    _e("torch.distributed.fsdp.fully_shard", "module", COVERED, _FSDP, _WHERE,
       "test_fsdp::test_each_module_is_reduced_and_resharded_as_its_backward_ends",
       "test_fsdp::test_a_state_dict_taken_while_unsharded_holds_the_shards",
       "test_fsdp::test_a_model_holding_an_empty_parameter_trains_and_resumes",
       "test_fsdp::test_groups_a_forward_skips_finish_innermost_first_and_train",
       "test_fsdp::test_a_module_taking_nested_inputs_gets_each_back_in_its_place",
       "test_fsdp::test_inputs_nested_within_the_traversal_limit_are_taken_and_a_cycle_refused",
       why="a module (one taking its inputs nested in dicts, lists, tuples, NamedTuples, "
           "dataclasses, deep or in a cycle, refused; one holding a frozen parameter with no "
           "elements too), a list of "
           "modules (one group; refused as the root; nested groups whose forward skips a "
           "member, torch 2.13+), on the world's "
           "device or on the meta device then materialised (to_empty); nested, each module "
           "reduced and resharded as its own backward ends, each with its activations "
           "checkpointed (composable checkpoint: recomputed in backward); its state_dict() "
           "sharded DTensors, taken unsharded too (as the root is after a forward)"),
    _e("torch.distributed.fsdp.fully_shard", "mesh", COVERED, _HSDP, why="1-D and 2-D (HSDP)"),
    _e("torch.distributed.fsdp.fully_shard", "reshard_after_forward", COVERED, _WHERE,
       why="True, False and ints"),
    _e("torch.distributed.fsdp.fully_shard", "shard_placement_fn", COVERED, _WHERE,
       why="Shard(1) where the dimension divides evenly; refused (test_every_call_fully_shard"
           "_refuses_is_refused) where it does not, or the parameter lacks the dimension"),
    _e("torch.distributed.fsdp.fully_shard", "mp_policy", COVERED,
       "test_fsdp::test_mixed_precision_reduction_in_float32_of_a_bfloat16_model"),
    _e("torch.distributed.fsdp.fully_shard", "offload_policy", COVERED, _WHERE,
       why="CPUOffloadPolicy on accelerator worlds (a CPU world refuses it)"),
    _e("torch.distributed.fsdp.fully_shard", "ignored_params", COVERED,
       "test_fsdp::test_ignored_params_are_neither_sharded_nor_reduced"),
    _e("torch.distributed.fsdp.fully_shard", "dp_mesh_dims", COVERED,
       "test_fsdp::test_fully_shard_on_a_full_spmd_mesh_matches_the_reference",
       why="a full mesh of data-parallel dimensions only: shard, and shard with replicate "
       "(HSDP); with tensor-parallel dimensions beside them, DTensor's own computation, "
       "not yet checked"),
    _e("torch.distributed.fsdp.MixedPrecisionPolicy", "param_dtype", COVERED, _RECIPE,
       why="bfloat16 and float16 on float32 parameters"),
    _e("torch.distributed.fsdp.MixedPrecisionPolicy", "reduce_dtype", COVERED,
       "test_fsdp::test_mixed_precision_reduction_in_float32_of_a_bfloat16_model", _RECIPE),
    _e("torch.distributed.fsdp.MixedPrecisionPolicy", "output_dtype", COVERED, _RECIPE,
       "test_fsdp::test_groups_a_forward_skips_finish_innermost_first_and_train",
       why="None and float32; float16, bfloat16 and float32 on nested groups, the "
           "outer's applied last"),
    _e("torch.distributed.fsdp.MixedPrecisionPolicy", "cast_forward_inputs", COVERED, _RECIPE,
       why="True and False: what dtype the module's forward receives its input in"),
    _e("torch.distributed.fsdp.FSDPModule", "set_requires_gradient_sync()", COVERED, _HSDP,
       why="accumulation without synchronisation"),
    *(
        _e("torch.distributed.fsdp.FSDPModule", method, COVERED, _DIVIDE)
        for method in ("set_gradient_divide_factor()", "set_reduce_scatter_divide_factor()",
                       "set_force_sum_reduction_for_comms()")
    ),
    _e("torch.distributed.fsdp.FSDPModule", "set_requires_all_reduce()", COVERED, _HSDP,
       why="HSDP accumulation with the all-reduce skipped"),
    _e("torch.distributed.fsdp.FSDPModule", "set_reshard_after_forward()", COVERED, _WHERE),
    _e("torch.distributed.fsdp.FSDPModule", "set_reshard_after_backward()", COVERED, _MICRO,
       why="False between a step's micro-batches, True for its last"),
    _e("torch.distributed.fsdp.FSDPModule", "set_is_last_backward()", COVERED, _MICRO,
       why="False between a step's micro-batches, True for its last"),
    _e("torch.distributed.fsdp.FSDPModule", "set_all_reduce_hook()", COVERED, _UNUSED,
       why="HSDP by hand: an all-reduce over the replicas"),
    _e("torch.distributed.fsdp.FSDPModule", "set_reduce_scatter_unused_params()", COVERED,
       _UNUSED, since="2.13"),
    *(
        _e("torch.distributed.fsdp.FSDPModule", method, COVERED,
           "test_fsdp::test_unshard_gathers_the_full_parameters_and_reshard_frees_them",
           why="called by hand: the full parameters registered, then freed and the shards "
           "registered again (layers with fewer rows than ranks included)")
        for method in ("unshard()", "reshard()")
    ),
    *(
        _e("torch.distributed.fsdp.FSDPModule", method, OUT,
           why="scheduling, memory or communication plumbing: when and where, not what is "
           "computed")
        for method in (
            "set_modules_to_forward_prefetch()", "set_modules_to_backward_prefetch()",
            "set_custom_all_gather()", "set_custom_reduce_scatter()", "set_post_optim_event()",
            "set_unshard_in_backward()", "set_allocate_memory_from_process_group_for_comm()",
            "set_symm_mem_for_comm()",
        )
    ),
    *(
        _e("torch.distributed.fsdp.FSDPModule", method, OUT, since="2.13",
           why="scheduling, memory or communication plumbing: when and where, not what is "
           "computed")
        for method in ("reset_iter_state()", "set_separate_reduce_scatter_group()")
    ),
    _e("torch.distributed.fsdp.FSDPModule", "set_reduce_scatter_max_input_buffers()", COVERED,
       "test_fsdp::test_every_call_fully_shard_refuses_is_refused", since="2.13",
       why="how many reduce-scatter buffers are kept is memory, not values; its refusals are "
           "held (below 1, a bool, above 1 with the symmetric-memory reduce-scatter at the "
           "first forward) and the edge, the default with that comm, accepted"),
    # -- data ----------------------------------------------------------------------------------
    _e("torch.utils.data.DistributedSampler", "dataset", COVERED, _SAMPLER,
       "test_data::test_a_sampler_given_its_replicas_and_rank_shards_as_documented",
       why="1 to 40 items on the world; 0 to 30 given the replicas and rank, an empty one "
       "giving every rank an empty shard"),
    *(
        _e("torch.utils.data.DistributedSampler", arg, COVERED, _SAMPLER,
           "test_data::test_a_sampler_given_its_replicas_and_rank_shards_as_documented",
           why="from the group, and given outright (1 to 6 replicas; a rank outside refused)")
        for arg in ("num_replicas", "rank")
    ),
    _e("torch.utils.data.DistributedSampler", "shuffle", COVERED,
       "test_data::test_set_epoch_reshuffles_and_forgetting_it_does_not",
       "test_data::test_sampler_without_shuffle_keeps_the_datasets_order"),
    _e("torch.utils.data.DistributedSampler", "seed", COVERED,
       "test_data::test_the_seed_decides_the_order_on_every_rank_alike"),
    _e("torch.utils.data.DistributedSampler", "drop_last", COVERED, _SAMPLER, _SAMPLER_PAD),
    _e("torch.utils.data.DistributedSampler", "set_epoch()", COVERED,
       "test_data::test_set_epoch_reshuffles_and_forgetting_it_does_not"),
    *(
        _e("torch.utils.data.BatchSampler", arg, COVERED,
           "test_data::test_a_loader_batches_each_ranks_shard_as_documented", why=why)
        for arg, why in (
            ("sampler", "a DistributedSampler's shard, as DataLoader(sampler=...) builds it"),
            ("batch_size", "1 to 6; refused: 0, negative, a bool, a float"),
            ("drop_last", "True and False; refused: an int"),
        )
    ),
    # -- clipping ------------------------------------------------------------------------------
    _e("torch.nn.utils.clip_grad_norm_", "parameters", COVERED, _CLIP, _CLIP_NORMS,
       "test_optimizers::test_clip_grad_norm_of_no_gradients_is_zero_and_warns_on_an_empty_generator",
       why="a list, and a lone tensor; a generator, an empty one (warned about), none with a "
       "gradient"),
    _e("torch.nn.utils.clip_grad_norm_", "max_norm", COVERED, _CLIP),
    _e("torch.nn.utils.clip_grad_norm_", "norm_type", COVERED, _CLIP_NORMS,
       why="1, 2, 3 and inf (a float and the string 'inf'); and through get_total_norm and "
       "clip_grads_with_norm_, the halves it is documented as"),
    _e("torch.nn.utils.clip_grad_norm_", "error_if_nonfinite", COVERED,
       "test_optimizers::test_clip_grad_norm_raises_on_a_nonfinite_norm_only_when_asked"),
    _e("torch.nn.utils.clip_grad_norm_", "foreach", COVERED, _CLIP),
    # -- checkpointing -------------------------------------------------------------------------
    *(
        _e(_STATE + fn, arg, COVERED, _DCP, _DSD,
           why="plain, DDP, checkpointed DDP, FSDP2 and FSDP1 models (one with a layer "
               "shared by two blocks: loaded back into DDP or from a full state into FSDP2, a "
               "known torch issue; one with a module whose state dict hides a level); Adam, "
               "SGD, and the two together over parts of a model")
        for fn, args in (("get_state_dict", ("model", "optimizers")),
                         ("set_state_dict", ("model", "optimizers", "model_state_dict",
                                             "optim_state_dict")))
        for arg in args
    ),
    _e(_STATE + "get_state_dict", "submodules", COVERED, _SUBMODULES,
       why="deprecated, and still answered: a model's head alone, under DDP and FSDP2 too"),
    _e(_STATE + "get_state_dict", "options", COVERED, _DCP, _DSD, why="every field below"),
    _e(_STATE + "set_state_dict", "options", COVERED, _DCP, _DSD, why="every field below"),
    *(
        _e(_STATE + "StateDictOptions", field, COVERED, _DCP, _DSD, why=why)
        for field, why in (
            ("full_state_dict", "True and False; with an optimizer without state, and "
             "flattened, known torch issues (test_fsdp marks them)"),
            ("cpu_offload", "sharded state dicts only: a full one is rank 0's, to be loaded "
             "with broadcast_from_rank0, which set_state_dict cannot (a known torch issue, "
             "test_state_dict marks it)"),
            ("strict", "True and False"),
            ("broadcast_from_rank0", "with full state dicts of FSDP2 and DDP models; through "
             "set_model_state_dict and set_optimizer_state_dict apart"),
            ("flatten_optimizer_state_dict", "True and False; into FSDP1 where a rank holds "
             "none of a parameter, a known torch issue (test_state_dict marks it)"),
        )
    ),
    _e(_STATE + "StateDictOptions", "ignore_frozen_params", COVERED, _DSD,
       "test_fsdp::test_ignore_frozen_params_leaves_frozen_parameters_out_of_the_state_dict"),
    _e(_STATE + "StateDictOptions", "keep_submodule_prefixes", COVERED, _SUBMODULES,
       why="with get_state_dict's deprecated submodules: True and False"),
    _e(_STATE + "StateDictOptions", "dsd_fqn_modifiers", COVERED, _DSD,
       "test_state_dict::test_a_plain_state_dict_loads_where_a_module_hides_a_level_by_the_"
       "method_named",
       why="a module whose state-dict hooks hide a level of its keys, told by the default "
           "method or another the option names (its optimizer state's round trip, and "
           "another name where a state dict is taken, are known torch issues)"),
    # FSDP1 (deprecated for FSDP2) is on a training's path through get_state_dict, which
    # asks fsdp_modules whether a model holds FSDP1 units.
    *(
        _e("torch.distributed.fsdp.FullyShardedDataParallel.fsdp_modules", arg, COVERED,
           "test_state_dict::test_fsdp1_modules_are_found_in_module_order_and_roots_after_a_forward",
           why=why)
        for arg, why in (("module", "trees of FSDP1 units nested and side by side, in "
                                    "modules() order"),
                         ("root_only", "True and False, after a forward"))
    ),
    # -- pipelining: stages and schedules ----------------------------------------------------
    *(
        _e(_PP + "PipelineStage", arg, COVERED, _PP_TEST, why=why)
        for arg, why in (
            ("submodule", "each stage a layer of a chain (a linear map and tanh, the last to "
                          "the classes) passing on one tensor, or two (the last stage using "
                          "both, or one)"),
            ("stage_index", "one stage a rank, and two a rank looped over the ranks"),
            ("num_stages", "the world size, and twice it"),
            ("device", "CPU"),
        )
    ),
    *(
        _e(_PP + "PipelineStage", arg, COVERED, _PP_TEST, why=why)
        for arg, why in (
            ("input_args", "drawn: a micro-batch's inputs of the stage (activations taking "
                           "a gradient), or none (inferred by a forward of its own)"),
            ("output_args", "drawn with input_args: the stage's outputs on them"),
            ("output_grads", "drawn with input_args: shaped as the outputs (none on the last)"),
            ("input_grads", "drawn with input_args: shaped as the inputs; none for the "
                            "first stage's data"),
        )
    ),
    _gap(_PP + "PipelineStage", "group", "the default group only: a pipeline beside other "
         "dimensions of a mesh is not drawn"),
    _gap(_PP + "PipelineStage", "dw_builder", "the zero-bubble schedules' split weight "
         "gradient: not drawn"),
    _gap(_PP + "PipelineStage", "get_mesh", "a stage's DTensor parameters on a mesh: not "
         "drawn"),
    *(
        _e(_PP + "PipelineStage", method, COVERED, _PP_TEST,
           why="called by the schedules drawn, every micro-batch")
        for method in ("backward_maybe_with_nosync()", "backward_one_chunk()",
                       "clear_runtime_states()", "forward_maybe_with_nosync()",
                       "forward_one_chunk()", "get_bwd_recv_ops()", "get_bwd_send_ops()",
                       "get_fwd_recv_ops()", "get_fwd_send_ops()")
    ),
    _e(_PP + "PipelineStage", "scale_grads()", COVERED, _PP_TEST,
       why="called by the schedules with scale_grads=True: the gradients divided by the "
           "micro-batches, and not with False"),
    _gap(_PP + "PipelineStage", "backward_weight_one_chunk()", "the zero-bubble schedules' "
         "weight gradient: not drawn"),
    _gap(_PP + "PipelineStage", "perform_reduce_grad()", "the data-parallel reduction of a "
         "stage wrapped in FSDP or DDP: not drawn"),
    *(
        _gap(_PP + "PipelineStage", method, "adjacent stages on one rank (V-shaped "
             "schedules): the looped schedules drawn place them on other ranks")
        for method in ("get_local_bwd_output()", "set_local_bwd_input()",
                       "set_local_fwd_input()")
    ),
    *(
        _e(_PP + schedule, arg, COVERED, _PP_TEST, why=why)
        for schedule in _SCHEDULES
        for arg, why in (
            ("stages" if schedule in _LOOPED else "stage",
             "the rank's stages"),
            ("n_microbatches", "the stages a rank runs and more (a whole number of rounds for "
                               "the interleaved schedule)"),
            ("loss_fn", "each micro-batch's mean over its labels that count, and its sum over "
                        "the step's count; uneven counts"),
            ("scale_grads", "True and False with either loss"),
        )
    ),
    *(
        _e(_PP + schedule, "step()", COVERED, _PP_TEST,
           why="one step: the inputs on the first stage, the target and the losses list on "
               "the last, where it returns the outputs merged in the batch's order")
        for schedule in _SCHEDULES
    ),
    *(
        _gap(_PP + schedule, arg, "the batch split along its first dimension, outputs merged "
             "alike (the defaults) only")
        for schedule in _SCHEDULES
        for arg in ("args_chunk_spec", "kwargs_chunk_spec", "output_merge_spec")
        # Looped BFS chunks by the defaults alone: it takes no spec of the arguments.
        if schedule != "ScheduleLoopedBFS" or arg == "output_merge_spec"
    ),
    *(
        _gap(_PP + schedule, "eval()", "forward-only evaluation: not drawn")
        for schedule in _SCHEDULES
    ),
    *(
        _gap(_PP + schedule, arg, why)
        for schedule in _LOOPED
        for arg, why in (
            ("backward_requires_autograd", "a backward without autograd: not drawn"),
            ("defer_pp_recv", "receives deferred: not drawn"),
            ("register_custom_function()", "a custom action in the schedule: not drawn"),
        )
    ),
    # -- tensor parallel ---------------------------------------------------------------------
    _e(_TP + "parallelize_module", "module", COVERED, _TP_TEST,
       why="a block of a LayerNorm, a linear map up, tanh and one down"),
    _e(_TP + "parallelize_module", "device_mesh", COVERED, _TP_TEST,
       why="a 1-D mesh of every rank"),
    _e(_TP + "parallelize_module", "parallelize_plan", COVERED, _TP_TEST,
       why="Megatron's column-wise up and row-wise down; the up projection gathered whole; "
           "sequence parallel; the input gathered first"),
    _e(_TP + "parallelize_module", "src_data_rank", COVERED, _TP_TEST,
       why="drawn: the default with every rank's weights alike, or any rank, each rank's "
           "sharded weights its own (the source's distributed)"),
    *(
        _e(_TP + style, arg, COVERED, _TP_TEST, why=why)
        for style, arg, why in (
            ("ColwiseParallel", "input_layouts", "replicated (the default) and sharded along "
                                                 "the sequence"),
            ("ColwiseParallel", "output_layouts", "sharded (the default) and replicated"),
            ("ColwiseParallel", "use_local_output", "the default"),
            ("RowwiseParallel", "input_layouts", "the default (sharded along the last "
                                                 "dimension)"),
            ("RowwiseParallel", "output_layouts", "replicated (the default) and sharded along "
                                                  "the sequence"),
            ("RowwiseParallel", "use_local_output", "the default"),
            ("SequenceParallel", "sequence_dim", "the default (1)"),
            ("SequenceParallel", "use_local_output", "the default"),
            ("PrepareModuleInput", "input_layouts", "the sequence in pieces"),
            ("PrepareModuleInput", "desired_input_layouts", "replicated: gathered whole"),
            ("PrepareModuleInput", "use_local_output", "True: the module gets a plain tensor"),
        )
    ),
    *(
        _gap(_TP + "PrepareModuleInput", arg, "keyword inputs: not drawn")
        for arg in ("input_kwarg_layouts", "desired_input_kwarg_layouts")
    ),
)  # fmt: skip


def find(api: str, member: str) -> Entry:
    """The entry for ``member`` of ``api``; a ``KeyError`` for none."""
    for entry in ENTRIES:
        if entry.api == api and entry.member == member:
            return entry
    raise KeyError(f"{api}: {member}")


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        parent, _, attribute = module.rpartition(".")
        return getattr(getattr(importlib.import_module(parent), attribute), name)


def _arguments(function: Any) -> list[str]:
    skip = {"self", "args", "kwargs"}
    return [name for name in inspect.signature(function).parameters if name not in skip]


def _public_methods(cls: type) -> list[str]:
    """The public methods ``cls`` and its torch.distributed bases define themselves (an
    Optimizer's ``step`` that ZeRO overrides is ZeRO's; one it inherits is not)."""
    found = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("torch.distributed") and klass is not cls:
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or not inspect.isfunction(value):
                continue
            # An optimizer puts a profiling wrapper of its class's step on the class once it
            # is built (AdamW gets one of Adam's): the method is the class's own only where
            # what it wraps was defined there.
            defined = inspect.unwrap(value).__qualname__.rpartition(".")[0]
            if defined in (klass.__qualname__, ""):
                found.append(f"{name}()")
    return sorted(set(found))


# Members with a leading underscore that users call all the same (torch's own docs and
# tutorials use them): part of the surface.
_USED_PRIVATE: dict[str, tuple[str, ...]] = {
    _DDP: ("_register_fused_optim",),
    # torchtitan's layouts flatten and unflatten their meshes' dimensions.
    "torch.distributed.device_mesh.DeviceMesh": ("_flatten", "_unflatten"),
}


def members(api: str) -> list[str]:
    """What the installed torch offers of ``api``: its arguments, and the public methods it
    defines as ``name()``.

    Example::

        >>> "drop_last" in members("torch.utils.data.DistributedSampler")
        True
    """
    target, how = _resolve(api), APIS[api]
    found: list[str] = []
    if how == "call":
        found = _arguments(target)
    elif how in ("init", "methods"):
        if how == "init":
            init = target.__init__ if inspect.isclass(target) else target
            found = _arguments(init)
            if dataclasses.is_dataclass(target):
                found = [f.name for f in dataclasses.fields(target)]
        found += _public_methods(target)
    found += [f"{name}()" for name in _USED_PRIVATE.get(api, ()) if hasattr(target, name)]
    return found


def table() -> str:
    """The surface as a Markdown table, with the counts by status."""
    lines = ["| API | member | status | tests, or why |", "| --- | --- | --- | --- |"]
    for entry in ENTRIES:
        said = ", ".join(f"`{t}`" for t in entry.tests)
        said = "; ".join(x for x in (said, entry.why) if x)
        member = f"`{entry.member}`" + (f" (torch {entry.since}+)" if entry.since else "")
        lines.append(f"| `{entry.api}` | {member} | {entry.status} | {said} |")
    counts = {s: sum(1 for e in ENTRIES if e.status == s) for s in (COVERED, GAP, OUT)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    return "\n".join(lines) + f"\n\n{len(ENTRIES)} members: {summary}.\n"


PAGE = """# What the conformance suite covers

The surface of torch's data-parallel API as users call it, one row per argument and public
method, read from the installed torch by `ddp_verify/conformance/test_surface.py` (it fails
where torch has a member with no row, where a row names one torch lacks, or where a row claims
a test the suite does not hold). *covered*: the tests named exercise it; *gap*: the suite does
not yet; *out of scope*: why it has no arithmetic to hold to the reference. Generated by
`python -m ddp_verify.conformance.surface --write docs/conformance-surface.md`.

"""


def page() -> str:
    """The documentation page: the table under its explanation."""
    return PAGE + table()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--write"] and len(args) == 2:
        with open(args[1], "w") as out:
            out.write(page())
        return 0
    sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
