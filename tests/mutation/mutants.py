"""Regressions injected into torch's data-parallel code at run time, one at a time.

Each :class:`Mutant` is a plausible regression in torch's Python code (a hook that forgets to
divide, a broadcast skipped, a sampler that pads wrongly), written as a replacement for one
function or method and named with the conformance test that must catch it. The replacement is
torch's own function recompiled from its source with the regression's lines changed
(:func:`_source_patch`): what runs is the code path the mutant names, never our code imitating a
bug from outside. torch's files are never edited.

:func:`install` (run in every rank by the ``--ddp-preload`` module
:mod:`tests.mutation.rank_patches`, and in the session's own process by the plugin) replaces
each targeted attribute by a dispatcher that calls the active mutant's replacement, or the
original when no mutant is active. Which mutant is active is read from the file
``$DDP_VERIFY_MUTANT_FILE`` names, on every call, so that one session of the conformance suite
can run every mutant, one test at a time (see :mod:`tests.mutation.plugin`). A mutant is active
in every process of the session, the one that computes the reference included: were the
reference to share the mutated code with what it judges, the two would move together and the
mutant would get through.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
from collections.abc import Callable
from typing import Any

MUTANT_FILE_ENV = "DDP_VERIFY_MUTANT_FILE"


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One regression: ``target`` (``"module:attribute.path"``) replaced by
    ``make(original)``; ``caught_by`` names the conformance test (with its parameters' id, if
    any) that must fail on it with a property's failure, not a crash or a time-out."""

    name: str
    area: str
    regression: str
    target: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    caught_by: str

    @property
    def catcher_function(self) -> str:
        return self.caught_by.partition("[")[0]

    @property
    def catcher_params(self) -> str:
        return self.caught_by.partition("[")[2].rstrip("]")


class PatchDoesNotApply(Exception):
    """The line a source patch changes is not in this torch's function, exactly once."""


_OWN = "_ddp_verify_mutated_"


def compile_like(original: Callable[..., Any], source: str) -> Any:
    """``source`` (a ``def`` with its decorators) compiled as ``original`` was: in its module's
    globals, under its file name, inside a function whose parameters are the original's free
    variables, so that it closes over the same names (zero-argument ``super()`` too). Returns
    what the ``def`` with its decorators makes (a ``staticmethod`` for a static method)."""
    name = original.__name__
    patched = _rebound(original, source, name)
    function = getattr(patched, "__func__", patched)
    if name in function.__code__.co_freevars and name not in original.__code__.co_freevars:  # type: ignore[attr-defined]
        # A function that calls itself by name (a recursion, as ``_pycute``'s and some of
        # c10d's do) closes, defined inside _rebind, over _rebind's local of that name where
        # the original reads its module's global: defined under another name and named back,
        # it reads the global as the original does.
        renamed = re.sub(rf"^(\s*(?:async\s+)?def\s+){re.escape(name)}\b", rf"\g<1>{_OWN}",
                         source, count=1, flags=re.MULTILINE)  # fmt: skip
        patched = _rebound(original, renamed, _OWN)
        function = getattr(patched, "__func__", patched)
        function.__code__ = function.__code__.replace(co_name=name)
        function.__name__ = name
    function.__qualname__ = original.__qualname__
    for target in (patched, function):  # a staticmethod object holds attributes too
        target.__patched_source__ = source
    return patched


def _rebound(original: Callable[..., Any], source: str, defined: str) -> Any:
    """What ``source``'s ``def`` of ``defined`` makes, compiled inside a function whose
    parameters are ``original``'s free variables, called with what its cells hold."""
    import inspect
    import textwrap

    code = original.__code__  # type: ignore[attr-defined]
    wrapped = (
        f"def _rebind({', '.join(code.co_freevars)}):\n"
        + textwrap.indent(source, "    ")
        + f"\n    return {defined}\n"
    )
    namespace: dict[str, Any] = {}
    compiled = compile(wrapped, inspect.getsourcefile(original) or "", "exec")
    exec(compiled, original.__globals__, namespace)  # type: ignore[attr-defined]
    cells = original.__closure__ or ()  # type: ignore[attr-defined]
    return namespace["_rebind"](*(cell.cell_contents for cell in cells))


def _source_patch(
    old: str, new: str, *more: tuple[str, str]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The regression as torch's own code: the original function's source with the line
    ``old`` replaced by ``new`` (and each further ``(old, new)`` of ``more``, for a regression
    that is more than one line), compiled into the module the original was defined in (its
    globals, its file name for tracebacks). What runs is torch's code path, nothing imitating
    it from outside. A decorated function (``@torch.no_grad()``) is recompiled with its
    decorators, which apply again; a closure's free variables (``__class__`` for a method that
    calls ``super()``) are bound to what the original's cells hold when the patch is made.
    """

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        import inspect
        import textwrap

        original = inspect.unwrap(original)
        source = textwrap.dedent(inspect.getsource(original))
        for line, replacement in ((old, new), *more):
            if source.count(line) != 1:
                raise PatchDoesNotApply(
                    f"{line.strip()!r} is in {original.__qualname__} {source.count(line)} "
                    "times, not once: this torch's source differs from the one the mutant was "
                    "written for"
                )
            source = source.replace(line, replacement)
        return compile_like(original, source)

    make.changes = ((old, new), *more)  # type: ignore[attr-defined]
    return make


_DDP = "torch.nn.parallel.distributed:DistributedDataParallel"
_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
_ZERO = "torch.distributed.optim.zero_redundancy_optimizer:ZeroRedundancyOptimizer"
_SAMPLER = "torch.utils.data.distributed:DistributedSampler.__iter__"
_FSDP = "torch.distributed.fsdp._fully_shard._fsdp_collectives:_get_gradient_divide_factors"
_OPTIONS = "test_ddp_option_keeps_training_equivalent[defaults]"
_FP16 = "test_compression_hook_is_within_its_formats_precision[fp16_compress_hook]"
_FP16_LARGE = "test_compression_hook_averages_large_gradients[fp16_compress_hook]"
_POWERSGD = "test_powersgd_at_full_rank_is_exact_on_matrices_wider_than_two[defaults]"
_POWERSGD_DEFAULTS = "test_powersgd_with_its_defaults_keeps_what_it_does_not_apply"
_BUFFERS = "test_broadcast_buffers_means_every_rank_uses_rank_0s_buffers[broadcast-in_place]"
_REASSIGNED = "test_broadcast_buffers_means_every_rank_uses_rank_0s_buffers[broadcast-reassigned]"
_NO_SYNC = "test_no_sync_leaves_gradients_local_until_the_syncing_backward"
_JOIN = "test_join_with_uneven_batch_counts_follows_the_documented_semantics"
_OBJECTS = "test_object_collectives_deliver_every_ranks_object"
_FROM_ONE = "test_object_collectives_from_one_source_deliver_what_it_sent"
_DIFFERENTIABLE = "test_differentiable_collectives_give_the_gradient_of_every_ranks_loss"
_AVERAGING = "test_periodic_model_averager_averages_its_group_at_the_steps_it_names"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "allreduce_hook_sums",
        "comm hooks",
        "allreduce_hook sums the gradients and forgets to divide by the world size (its "
        "all-reduce's source, one line changed)",
        f"{_HOOKS}.default_hooks:_allreduce_fut",
        _source_patch("tensor.div_(group_to_use.size())\n", "pass\n"),
        "test_allreduce_hook_is_exact",
    ),
    Mutant(
        "allreduce_hook_returns_its_own",
        "comm hooks",
        "allreduce_hook all-reduces a copy of the bucket and returns the rank's own gradient, "
        "divided by the world size (its all-reduce's source, two lines changed)",
        f"{_HOOKS}.default_hooks:_allreduce_fut",
        _source_patch(
            "dist.all_reduce(tensor, group=group_to_use, async_op=True)",
            "dist.all_reduce(tensor.clone(), group=group_to_use, async_op=True)",
            (".then(lambda fut: fut.value()[0])", ".then(lambda fut: tensor)"),
        ),
        "test_allreduce_hook_is_exact",
    ),
    Mutant(
        "fp16_divides_after_all_reduce",
        "comm hooks",
        "fp16_compress_hook divides by the world size after the float16 all-reduce (the sum "
        "overflows on large gradients) (its compression's source, two lines changed)",
        f"{_HOOKS}.default_hooks:_compress_hook",
        _source_patch(
            "compressed_tensor = buffer.to(dtype).div_(world_size)",
            "compressed_tensor = buffer.to(dtype)",
            (
                "decompressed_tensor.copy_(value)",
                "decompressed_tensor.copy_(value.div_(world_size))",
            ),
        ),
        _FP16_LARGE,
    ),
    Mutant(
        "fp16_sums",
        "comm hooks",
        "fp16_compress_hook decompresses the sum, not the average (its compression's source, "
        "one line changed)",
        f"{_HOOKS}.default_hooks:_compress_hook",
        _source_patch(
            "compressed_tensor = buffer.to(dtype).div_(world_size)",
            "compressed_tensor = buffer.to(dtype)",
        ),
        _FP16,
    ),
    Mutant(
        "powersgd_sums_uncompressed",
        "PowerSGD",
        "powerSGD_hook no longer divides the all-reduced tensors it leaves uncompressed by the "
        "world size (its source, one line changed)",
        f"{_HOOKS}.powerSGD_hook:powerSGD_hook",
        _source_patch(
            "uncompressed_tensors_memory = fut.value()[0].div_(world_size)",
            "uncompressed_tensors_memory = fut.value()[0]",
        ),
        _POWERSGD_DEFAULTS,
    ),
    Mutant(
        "powersgd_drops_error_feedback",
        "PowerSGD",
        "powerSGD_hook with error feedback no longer adds the residual it kept to the next "
        "gradient (its source, one line changed)",
        f"{_HOOKS}.powerSGD_hook:powerSGD_hook",
        _source_patch(
            "input_tensor.add_(state.error_dict[bucket_index])",
            "input_tensor.add_(0 * state.error_dict[bucket_index])",
        ),
        _POWERSGD_DEFAULTS,
    ),
    Mutant(
        "powersgd_sums_compressed",
        "PowerSGD",
        "powerSGD_hook no longer divides the all-reduced Qs of the matrices it compresses by "
        "the world size (its source, one line changed)",
        f"{_HOOKS}.powerSGD_hook:powerSGD_hook",
        _source_patch(
            "state.q_memory_dict[bucket_index] = fut.value().div_(world_size)",
            "state.q_memory_dict[bucket_index] = fut.value()",
        ),
        _POWERSGD,
    ),
    Mutant(
        "checkpoint_redraws_dropout",
        "checkpointing",
        "non-reentrant activation checkpointing no longer restores the forward's RNG state "
        "before it recomputes: dropout draws another mask (its source, one line changed)",
        "torch.utils.checkpoint:_checkpoint_without_reentrant_generator",
        _source_patch("torch.set_rng_state(fwd_cpu_state)\n", "pass\n"),
        "test_activation_checkpointing_recomputes_dropout_with_the_forwards_mask[non_reentrant]",
    ),
    Mutant(
        "ddp_skips_buffer_broadcast",
        "DDP",
        "DDP skips the broadcast of rank 0's buffers before each forward (its source, one line "
        "changed)",
        f"{_DDP}._check_sync_bufs_pre_fwd",
        _source_patch("return self.will_sync_module_buffers() and (", "return False and ("),
        _BUFFERS,
    ),
    Mutant(
        "ddp_broadcasts_stale_buffers",
        "DDP",
        "DDP broadcasts the buffers it found when it was built, not the ones the module holds "
        "now: a buffer the module re-assigned is never broadcast (its source, one line changed)",
        f"{_DDP}._sync_buffers",
        _source_patch("self._assign_modules_buffers()\n", "pass\n"),
        _REASSIGNED,
    ),
    Mutant(
        "ddp_fills_missing_output_grads",
        "DDP",
        "DDP's pass-through of forward's outputs materialises the gradient of an output the "
        "loss left out as zeros: its head gets zero gradients, not None (its source, one line "
        "changed)",
        f"{_DDP[: _DDP.index(':')]}:_DDPSink.forward",
        _source_patch("ctx.set_materialize_grads(False)\n", "pass\n"),
        "test_find_unused_parameters_with_an_output_left_out_of_the_loss",
    ),
    Mutant(
        "ddp_skips_initial_sync",
        "DDP",
        "DDP's constructor no longer broadcasts rank 0's parameters and buffers (its source, one "
        "line changed)",
        "torch.nn.parallel.distributed:_sync_module_states",
        _source_patch(
            "_sync_params_and_buffers(process_group, module_states, broadcast_bucket_size, src)",
            "pass",
        ),
        "test_ddp_starts_every_rank_from_rank_0s_state",
    ),
    Mutant(
        "no_sync_does_nothing",
        "DDP",
        "no_sync() is a no-op: gradients are all-reduced inside it (its source, one line changed)",
        f"{_DDP}.no_sync",
        _source_patch("self.require_backward_grad_sync = False\n", "pass\n"),
        _NO_SYNC,
    ),
    Mutant(
        "no_sync_never_restores",
        "DDP",
        "no_sync() does not restore gradient synchronisation when it exits (its source, one line "
        "changed)",
        f"{_DDP}.no_sync",
        _source_patch(
            "self.require_backward_grad_sync = old_require_backward_grad_sync\n", "pass\n"
        ),
        _NO_SYNC,
    ),
    Mutant(
        "ddp_ignores_a_parameter",
        "DDP",
        # Not in _build_params_for_reducer: a parameter left out of the reducer's list there
        # trips DDP's own check ("found in module parameters, but not DDP parameters") before
        # any property sees it. Where the ignored set starts, DDP's checks agree with it.
        "DDP starts its set of ignored parameters with the last trainable one, as if told to "
        "ignore it: its gradient stays local (its constructor's source, one line changed)",
        f"{_DDP}.__init__",
        _source_patch(
            "self.parameters_to_ignore = set()\n",
            "self.parameters_to_ignore = {\n"
            "    [n for n, p in module.named_parameters() if p.requires_grad][-1]\n"
            "}\n",
        ),
        _OPTIONS,
    ),
    Mutant(
        "join_syncs_from_the_highest_rank",
        "Join",
        "under Join, the final broadcast after the loop is from the highest rank, not the last "
        "joiner (its source, one line changed)",
        f"{_DDP}._sync_final_model",
        _source_patch("self._distributed_rank, is_last_joiner\n", "self._distributed_rank, True\n"),
        _JOIN,
    ),
    Mutant(
        "join_divisor_inverted",
        "Join",
        "Join's divide_by_initial_world_size is read inverted when DDP hands the reducer its "
        "forward's join work (its source, one line changed)",
        f"{_DDP}._pre_forward",
        _source_patch(
            "self._divide_by_initial_world_size,  # type: ignore[arg-type]",
            "not self._divide_by_initial_world_size,  # type: ignore[arg-type]",
        ),
        _JOIN,
    ),
    Mutant(
        "zero_ignores_its_process_group",
        "ZeRO",
        "ZeroRedundancyOptimizer shards over the world whatever process_group it is given (its "
        "source, one line changed)",
        "torch.distributed.optim:ZeroRedundancyOptimizer.__init__",
        _source_patch(
            "process_group if process_group is not None else dist.group.WORLD",
            "dist.group.WORLD",
        ),
        "test_zero_over_a_subgroup_steps_and_broadcasts_within_that_group",
    ),
    Mutant(
        "zero_skips_parameter_sync",
        "ZeRO",
        "ZeroRedundancyOptimizer steps its shard but never broadcasts the updated parameters "
        "(its source, one line changed)",
        f"{_ZERO}._sync_params",
        _source_patch("handles.extend(self._broadcast_params_from_rank(rank))\n", "pass\n"),
        "test_zero_redundancy_optimizer_matches_the_reference[sgd]",
    ),
    Mutant(
        "zero_ignores_param_group_edits",
        "ZeRO",
        "ZeroRedundancyOptimizer no longer passes its param_groups to the shard's optimizer "
        "before a step: a scheduler's learning rate has no effect (its source, one line changed)",
        f"{_ZERO}._local_step",
        _source_patch(
            "self._sync_param_groups(self.param_groups, self.optim.param_groups)\n",
            "pass\n",
        ),
        "test_zero_redundancy_optimizer_matches_the_reference[adamw]",
    ),
    Mutant(
        "zero_broadcasts_from_wrong_rank",
        "ZeRO",
        "ZeroRedundancyOptimizer broadcasts, from each shard's owner, the next rank's shard: "
        "the owner's update never reaches the others (its source, one line changed)",
        f"{_ZERO}._broadcast_params_from_rank",
        _source_patch(
            "param_groups = self._partition_parameters()[rank]",
            "param_groups = self._partition_parameters()[(rank + 1) % self.world_size]",
        ),
        "test_zero_redundancy_optimizer_matches_the_reference[adam]",
    ),
    Mutant(
        "zero_bucket_view_detached",
        "ZeRO",
        "ZeroRedundancyOptimizer(parameters_as_bucket_view=True) copies the parameters into "
        "its buckets but does not make them views of them: broadcasting a bucket no longer "
        "updates its parameters (its source, one line changed)",
        f"{_ZERO}._build_param_buckets",
        _source_patch("param.data = bucket[offset:offset_next].view_as(param.data)\n", "pass\n"),
        "test_zero_with_parameters_as_bucket_view_matches_the_reference",
    ),
    Mutant(
        "sampler_without_padding",
        "DistributedSampler",
        # Three lines: without the padding branch, torch's own length checks stop __iter__
        # before any property sees it; the regression that gets out removes them too.
        "DistributedSampler(drop_last=False) no longer pads, and its length checks are gone: "
        "ranks get different counts (its source, three lines changed)",
        _SAMPLER,
        _source_patch(
            "if not self.drop_last:",
            "if False:",
            ("if len(indices) != self.total_size:", "if False:"),
            ("if len(indices) != self.num_samples:", "if False:"),
        ),
        "test_sampler_without_drop_last_covers_the_dataset_and_pads_with_duplicates",
    ),
    Mutant(
        "sampler_ignores_seed",
        "DistributedSampler",
        "DistributedSampler shuffles with the epoch alone, ignoring its seed (its source, one "
        "line changed)",
        _SAMPLER,
        _source_patch("g.manual_seed(self.seed + self.epoch)", "g.manual_seed(self.epoch)"),
        "test_the_seed_decides_the_order_on_every_rank_alike",
    ),
    Mutant(
        "sampler_ignores_epoch",
        "DistributedSampler",
        "DistributedSampler shuffles with the seed alone, ignoring set_epoch() (its source, one "
        "line changed)",
        _SAMPLER,
        _source_patch("g.manual_seed(self.seed + self.epoch)", "g.manual_seed(self.seed)"),
        "test_set_epoch_reshuffles_and_forgetting_it_does_not",
    ),
    Mutant(
        "sampler_seeds_by_rank",
        "DistributedSampler",
        "DistributedSampler seeds its shuffle with the rank: ranks shard different orders (its "
        "source, one line changed)",
        _SAMPLER,
        _source_patch(
            "g.manual_seed(self.seed + self.epoch)",
            "g.manual_seed(self.seed + self.epoch + self.rank)",
        ),
        "test_sampler_with_drop_last_shards_are_disjoint_and_equal",
    ),
    Mutant(
        "fsdp_reduce_scatter_sums",
        "fully_shard",
        "fully_shard's reduce-scatter sums the gradients: its divisor is lost (its source, one "
        "line changed)",
        _FSDP,
        _source_patch(
            "return None, None, ReduceOp.AVG, ReduceOp.AVG",
            "return None, None, ReduceOp.SUM, ReduceOp.SUM",
        ),
        "test_fully_shard_matches_the_reference",
    ),
    Mutant(
        "fsdp_divides_twice",
        "fully_shard",
        "fully_shard divides the gradients by the world size before and after the reduce-scatter "
        "(its source, one line changed)",
        _FSDP,
        _source_patch(
            "return None, None, ReduceOp.AVG, ReduceOp.AVG",
            "return data_parallel_size, data_parallel_size, ReduceOp.SUM, ReduceOp.SUM",
        ),
        "test_fully_shard_matches_the_reference",
    ),
    Mutant(
        "fsdp_spmd_mesh_drops_replicate_dims",
        "fully_shard",
        "fully_shard(dp_mesh_dims=...) reads only the shard dimensions of the full mesh: the "
        "replicate ones are never all-reduced over (its source, one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_init:_get_mesh_info_from_named_dims",
        _source_patch("if len(replicate_names) == 0:  # FSDP", "if True:  # FSDP"),
        "test_fully_shard_on_a_full_spmd_mesh_matches_the_reference[2]",
    ),
    Mutant(
        "fsdp_clips_by_local_norm",
        "fully_shard",
        "clip_grad_norm_ takes a sharded gradient's local tensor: it clips by the norm of the "
        "rank's own shards (its source, one line changed)",
        "torch.nn.utils:clip_grad_norm_",
        _source_patch(
            "grads = [p.grad for p in parameters if p.grad is not None]",
            'grads = [getattr(p.grad, "_local_tensor", p.grad) for p in parameters if p.grad '
            "is not None]",
        ),
        "test_fully_shard_clips_by_the_total_norm_across_shards",
    ),
    Mutant(
        "clip_scales_small_gradients_up",
        "optimizer",
        "clip_grad_norm_ no longer clamps its coefficient at 1: gradients whose norm is below "
        "max_norm are scaled up to it (its source, one line changed)",
        "torch.nn.utils.clip_grad:_clip_grads_with_norm_",
        _source_patch(
            "clip_coef_clamped = torch.clamp(clip_coef, max=1.0)", "clip_coef_clamped = clip_coef"
        ),
        "test_clip_grad_norm_follows_its_definition[foreach]",
    ),
    Mutant(
        "adam_foreach_corrects_v_by_beta1",
        "optimizer",
        "Adam's foreach path corrects the second moment's bias with beta1, not beta2 (its "
        "source, one line changed)",
        "torch.optim.adam:_multi_tensor_adam",
        _source_patch(
            "1 - beta2 ** _get_value(step) for step in device_state_steps",
            "1 - beta1 ** _get_value(step) for step in device_state_steps",
        ),
        "test_torch_optimizers_follow_the_published_rules[foreach]",
    ),
    Mutant(
        "zero_grad_in_place_skipped",
        "optimizer",
        "Optimizer.zero_grad(set_to_none=False) leaves the gradients as they are (its source, one "
        "line changed)",
        "torch.optim.optimizer:Optimizer.zero_grad",
        _source_patch("p.grad.zero_()\n", "pass\n"),
        "test_ddp_option_keeps_training_equivalent[zero_grad_in_place]",
    ),
    Mutant(
        "optimizer_state_not_saved",
        "checkpointing",
        "Optimizer.state_dict() leaves out the per-parameter state (moments, momentum) (its "
        "source, one line changed)",
        "torch.optim.optimizer:Optimizer.state_dict",
        _source_patch('"state": packed_state,', '"state": {},'),
        "test_checkpoint_and_resume_continues_as_the_uninterrupted_run",
    ),
    Mutant(
        "dcp_load_skips_every_key",
        "checkpointing",
        "torch.distributed.checkpoint.load loads none of the state dict's keys (its source, one "
        "line changed)",
        "torch.distributed.checkpoint:load",
        _source_patch("keys = sorted(state_dict.keys())", "keys = []"),
        "test_fully_shard_resumes_from_a_distributed_checkpoint",
    ),
    Mutant(
        "dcp_swaps_param_group_settings",
        "fully_shard",
        "set_state_dict hands each param group the other group's settings (learning rate, "
        "weight decay) when it loads a checkpoint (its source, one line changed)",
        "torch.distributed.checkpoint.state_dict:_split_optim_state_dict",
        _source_patch("pg_state[pg_idx][key] = value", "pg_state[-1 - pg_idx][key] = value"),
        "test_fully_shard_resumes_from_a_distributed_checkpoint",
    ),
    Mutant(
        "hsdp_drops_partial_reductions",
        "fully_shard",
        "HSDP accumulating with set_requires_all_reduce(False) no longer adds the partial "
        "reductions of earlier micro-batches to the last one's (its source, one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_param_group:foreach_reduce",
        _source_patch("reduce_output += partial_reduce_output\n", "pass\n"),
        "test_hybrid_sharding_on_a_2d_mesh_matches_the_reference[all_reduce]",
    ),
    Mutant(
        "all_gather_object_missized",
        "object collectives",
        "all_gather_object reads every rank's object with rank 0's size (its source, one line "
        "changed)",
        "torch.distributed:all_gather_object",
        _source_patch("tensor_size = object_size_list[i]", "tensor_size = object_size_list[0]"),
        _OBJECTS,
    ),
    Mutant(
        "gather_object_reversed",
        "object collectives",
        "gather_object hands the destination the objects in reverse rank order (its source, one "
        "line changed)",
        "torch.distributed:gather_object",
        _source_patch(
            "object_gather_list[i] = _tensor_to_object(tensor, tensor_size, group)",
            "object_gather_list[-1 - i] = _tensor_to_object(tensor, tensor_size, group)",
        ),
        _OBJECTS,
    ),
    Mutant(
        "broadcast_object_list_offset_stuck",
        "object collectives",
        "broadcast_object_list never advances its offset into the received bytes: every rank but "
        "the source reads each object from the first one's (its source, one line changed)",
        "torch.distributed:broadcast_object_list",
        _source_patch("offset += obj_size\n", "pass\n"),
        _FROM_ONE,
    ),
    Mutant(
        "scatter_object_list_reversed",
        "object collectives",
        "scatter_object_list sends the source's objects in reverse rank order (its source, one "
        "line changed)",
        "torch.distributed:scatter_object_list",
        _source_patch(
            "tensor_list, tensor_sizes = list(tensor_list), list(tensor_sizes)",
            "tensor_list, tensor_sizes = list(tensor_list)[::-1], list(tensor_sizes)[::-1]",
        ),
        _FROM_ONE,
    ),
    Mutant(
        "model_join_drops_its_divisor_flag",
        "Join",
        "DDP's model.join(divide_by_initial_world_size=...) no longer passes the flag on to Join "
        "(its source, one line changed)",
        f"{_DDP}.join",
        _source_patch(
            "divide_by_initial_world_size=divide_by_initial_world_size,",
            "divide_by_initial_world_size=True,",
        ),
        _JOIN,
    ),
    Mutant(
        "differentiable_all_gather_averages",
        "differentiable collectives",
        "torch.distributed.nn's all_gather averages the gradients its inputs get back instead "
        "of summing them (its backward's source, one line changed)",
        "torch.distributed.nn.functional:_AllGather.backward",
        _source_patch(
            "gx = torch.sum(torch.stack(gxs), dim=0)",
            "gx = torch.mean(torch.stack(gxs), dim=0)",
        ),
        f"{_DIFFERENTIABLE}[all_gather]",
    ),
    Mutant(
        "differentiable_all_reduce_stays_local",
        "differentiable collectives",
        "torch.distributed.nn's all_reduce passes each rank its own gradient back, never "
        "all-reduced (its backward's source, one line changed)",
        "torch.distributed.nn.functional:_AllReduce.backward",
        _source_patch(
            "return (None, None) + (_AllReduce.apply(ctx.op, ctx.group, grad_output),)",
            "return (None, None) + (grad_output,)",
        ),
        f"{_DIFFERENTIABLE}[all_reduce]",
    ),
    Mutant(
        "clip_for_loop_ignores_norm_type",
        "optimizer",
        "clip_grad_norm_(foreach=False) takes every gradient's 2-norm whatever norm_type says "
        "(its total norm's source, one line changed)",
        "torch.nn.utils.clip_grad:_get_total_norm",
        _source_patch(
            "[torch.linalg.vector_norm(g, norm_type) for g in device_tensors]",
            "[torch.linalg.vector_norm(g, 2.0) for g in device_tensors]",
        ),
        "test_clip_grad_norm_follows_its_definition_in_every_norm[for_loop]",
    ),
    Mutant(
        "clip_never_raises_on_nonfinite",
        "optimizer",
        "clip_grad_norm_(error_if_nonfinite=True) never raises (its total norm's source, one "
        "line changed)",
        "torch.nn.utils.clip_grad:_get_total_norm",
        _source_patch(
            "if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):",
            "if False and torch.logical_or(total_norm.isnan(), total_norm.isinf()):",
        ),
        "test_clip_grad_norm_raises_on_a_nonfinite_norm_only_when_asked[nan-for_loop]",
    ),
    Mutant(
        "hierarchical_top_level_over_the_world",
        "model averaging",
        "HierarchicalModelAverager's top level averages over the world, not the process_group it "
        "was given (its source, one line changed)",
        "torch.distributed.algorithms.model_averaging.hierarchical_model_averager:"
        "HierarchicalModelAverager.__init__",
        _source_patch(
            "self.period_process_group_dict[period] = self.process_group",
            "self.period_process_group_dict[period] = dist.group.WORLD",
        ),
        "test_hierarchical_model_averager_averages_the_largest_dividing_periods_groups",
    ),
    Mutant(
        "averager_period_from_step_0",
        "model averaging",
        "PeriodicModelAverager counts its period from step 0, not from the end of the warm-up "
        "(its source, one line changed)",
        "torch.distributed.algorithms.model_averaging.averagers:"
        "PeriodicModelAverager.average_parameters",
        _source_patch(
            "and (self.step - self.warmup_steps) % self.period == 0",
            "and self.step % self.period == 0",
        ),
        _AVERAGING,
    ),
    Mutant(
        "average_parameters_by_world_size",
        "model averaging",
        "average_parameters over a subgroup divides by the world's size, not the group's (its "
        "source, one line changed)",
        "torch.distributed.algorithms.model_averaging.utils:average_parameters",
        _source_patch(
            "flat_params /= dist.get_world_size(group_to_use)",
            "flat_params /= dist.get_world_size()",
        ),
        _AVERAGING,
    ),
    Mutant(
        "hierarchical_never_averages_globally",
        "model averaging",
        "HierarchicalModelAverager takes the smallest dividing period's groups, not the "
        "largest's: the top level (the world) never averages where a lower one also could (its "
        "source, one line changed)",
        "torch.distributed.algorithms.model_averaging.hierarchical_model_averager:"
        "HierarchicalModelAverager._find_process_group",
        _source_patch("for period in reversed(self._periods):", "for period in self._periods:"),
        "test_hierarchical_model_averager_averages_the_largest_dividing_periods_groups",
    ),
    Mutant(
        "fsdp_recipe_reduces_in_param_dtype",
        "fully_shard",
        "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) on float32 "
        "parameters reduces in bfloat16: reduce_dtype is dropped when it equals the "
        "parameters' dtype, not param_dtype (FSDPParam's source, one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_param:FSDPParam.init_dtype_attrs",
        _source_patch(
            "if reduce_dtype == param_dtype:", "if reduce_dtype == self.sharded_param.dtype:"
        ),
        "test_standard_mixed_precision_recipe_computes_in_param_dtype_and_reduces_in_float32",
    ),
    Mutant(
        "fsdp_divide_factor_ignored",
        "fully_shard",
        "set_gradient_divide_factor is ignored: the gradients are still averaged over the "
        "world (its source, one line changed)",
        "torch.distributed.fsdp._fully_shard._fully_shard:FSDPModule.set_gradient_divide_factor",
        _source_patch(
            "fsdp_param_group.gradient_divide_factor = factor",
            "fsdp_param_group.gradient_divide_factor = None",
        ),
        "test_gradient_divide_factor_replaces_the_world_size",
    ),
    Mutant(
        "post_local_sgd_one_global_step_too_many",
        "model averaging",
        "post_localSGD_hook all-reduces over the world one step past start_localSGD_iter (its "
        "source, one line changed)",
        "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook:post_localSGD_hook",
        _source_patch(
            "if state.iter < state.start_localSGD_iter:",
            "if state.iter <= state.start_localSGD_iter:",
        ),
        "test_post_local_sgd_hook_averages_over_the_world_then_over_the_subgroup",
    ),
    Mutant(
        "reduce_scatter_gradient_averaged",
        "differentiable collectives",
        "torch.distributed.nn.functional.reduce_scatter's backward averages the gradient it "
        "all-gathers instead of passing it on (its source, one line changed)",
        "torch.distributed.nn.functional:_Reduce_Scatter.backward",
        _source_patch(
            "return (None, None, None) + _AllGather.apply(ctx.group, grad_output)",
            "return (None, None, None) + _AllGather.apply(\n"
            "            ctx.group, grad_output / dist.get_world_size(ctx.group))",
        ),
        "test_differentiable_collectives_give_the_gradient_of_every_ranks_loss[reduce_scatter]",
    ),
    Mutant(
        "ddp_device_mesh_reduces_over_the_world",
        "DDP",
        "DDP(device_mesh=...) takes the default group, not the mesh's: a mesh sliced out of a "
        "larger one averages over the whole world (its constructor's source, one line changed)",
        _DDP + ".__init__",
        _source_patch(
            "self.process_group = device_mesh.get_group(mesh_dim=0)",
            "self.process_group = _get_default_group()",
        ),
        "test_ddp_over_a_subgroup_starts_from_and_averages_over_that_group",
    ),
    Mutant(
        "fsdp_reduce_ignores_shard_dim",
        "fully_shard",
        "fully_shard's reduce-scatter cuts every gradient along dimension 0, whatever "
        "dimension shard_placement_fn sharded its parameter along (foreach_reduce's source, "
        "one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_param_group:foreach_reduce",
        _source_patch(
            "chunks = torch.chunk(unsharded_grad, world_size, dim=shard_dim)",
            "chunks = torch.chunk(unsharded_grad, world_size, dim=0)",
        ),
        "test_where_and_when_fully_shard_keeps_parameters_changes_nothing",
    ),
    Mutant(
        "post_local_sgd_optimizer_forgets_the_step",
        "model averaging",
        "PostLocalSGDOptimizer.load_state_dict leaves the averager's step count at 0 (its "
        "source, one line changed): a resumed run averages at the wrong steps",
        "torch.distributed.optim.post_localSGD_optimizer:PostLocalSGDOptimizer.load_state_dict",
        _source_patch('self.averager.step = state_dict["step"]', "self.averager.step = 0"),
        _AVERAGING,
    ),
    Mutant(
        "fsdp_manages_ignored_params",
        "fully_shard",
        "fully_shard takes the parameters in ignored_params under management: sharded, their "
        "gradients averaged (its managed-state collection, one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_init:_get_managed_states",
        _source_patch("if param in ignored_params:", "if param in ignored_params and False:"),
        "test_ignored_params_are_neither_sharded_nor_reduced",
    ),
    Mutant(
        "fsdp_all_reduce_hook_never_called",
        "fully_shard",
        "fully_shard never calls the hook set_all_reduce_hook gave it after the reduce-scatter "
        "(foreach_reduce's source, one line changed)",
        "torch.distributed.fsdp._fully_shard._fsdp_param_group:foreach_reduce",
        _source_patch("all_reduce_hook(reduce_output)", "None  # the hook not called"),
        "test_unused_parameters_reduce_as_zeros_and_an_all_reduce_hook_replicates",
    ),
    Mutant(
        "fused_sgd_without_momentum",
        "DDP",
        "DDP's fused SGD (_register_fused_optim) steps without its momentum (the functional "
        "SGD's per-parameter step, one line changed)",
        "torch.distributed.optim.functional_sgd:_FunctionalSGD.step_param",
        _source_patch('momentum = self.defaults["momentum"]', "momentum = 0.0"),
        "test_ddp_fused_sgd_follows_the_published_rule_on_the_averaged_gradient",
    ),
)

BY_NAME = {m.name: m for m in MUTANTS}


def active() -> str:
    """The mutant this process runs now ("" for none)."""
    path = os.environ.get(MUTANT_FILE_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _resolve(target: str) -> tuple[Any, str]:
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *parents, attribute = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, attribute


def install() -> None:
    """Put a dispatcher in place of every mutant's target (idempotent)."""
    targets: dict[str, list[Mutant]] = {}
    for mutant in MUTANTS:
        targets.setdefault(mutant.target, []).append(mutant)
    for target, mutants in targets.items():
        owner, attribute = _resolve(target)
        original = (
            owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        )
        if getattr(original, "_mutation_dispatcher", False):
            continue
        replacements = {m.name: m.make(original) for m in mutants}

        @functools.wraps(original)
        def dispatch(*args: Any, _original=original, _by=replacements, **kwargs: Any) -> Any:
            return _by.get(active(), _original)(*args, **kwargs)

        dispatch._mutation_dispatcher = True  # type: ignore[attr-defined]
        setattr(owner, attribute, dispatch)
