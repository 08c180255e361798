"""Generated mutants read as equivalent under torch's documented contract: each changes numbers
(its probe sees them move) but only in ways the contract leaves to the implementation, so no
property can kill one without pinning torch's code. Each is keyed by what it changes (module,
function, operator, change: line numbers move between releases), with the reason read from
the code. A declared mutant the suite kills counts as killed; one it lets through counts as
"equivalent" and leaves the score's denominator, shown beside the raw score
(:mod:`tests.mutation.generated`). Nothing else is ever excluded."""

from __future__ import annotations

_POWER = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"
_DRAWS = (
    "only which random initial matrix each gradient matrix gets, and where in the hook's "
    "buffers it lives: the matrices stay the same on every rank and fixed by random_seed "
    "(all PowerSGDState documents), every matrix is written back to its own gradient"
)

_C10D = "torch.distributed.distributed_c10d"
_AVERAGING = "torch.distributed.algorithms.model_averaging."
_DCP = "torch.distributed.checkpoint."
_DEPTH_IGNORED = "argument _depth ignored for its default 0"
_DCP_LOG = (
    "a key of ckpt_kwargs, which only _dcp_method_logger reads, to build the log record "
    "(_get_msg_dict); the wrapped step is called with its own arguments: the same "
    "checkpoint, another log line"
)
_DEDUP_ORDER = (
    "the duplicated items are visited in another order; each still goes to the plan with "
    "the least storage planned at its turn (or the lowest rank, where asked), all that "
    "the rule says: 'only the smallest SavePlan in terms of planned storage keeps the "
    "entry'; written once each, balanced to within the largest item"
)
_AVERAGED_IN_REVERSE = (
    "the parameters to average listed in reverse, alike on every rank: average_parameters "
    "concatenates them in that order, all-reduces elementwise and writes each back from "
    "its own offset, so each parameter gets the same mean (cat's dtype promotion does "
    "not depend on the order)"
)
_PLACEHOLDER = (
    "a placeholder the collective right after it overwrites on every rank but the source "
    "(whose own value it sends): its first value is never read"
)

_HASH = (
    "a placement's hash stays a function of the reduce op alone, as its __eq__ compares: equal "
    "placements hash equal (all the hash contract asks); which integer it is is "
    "documented nowhere"
)

_FSDP = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
_FSDP_COMMON = "torch.distributed.fsdp._fully_shard._fsdp_common"
_FSDP_INIT = "torch.distributed.fsdp._fully_shard._fsdp_init"
_FSDP_PARAM = "torch.distributed.fsdp._fully_shard._fsdp_param"
_GROUP_ORDER = (
    "the group's managed parameters are collected in another order: the same parameters "
    "(one shared by two modules is kept once either way, and each is checked alike), whose "
    "order sets only where each lies in the group's flat all-gather and reduce-scatter "
    "buffers, each gathered and reduced into its own slice; the module's own parameter order "
    "(what an optimizer and a state dict see) is untouched"
)
_MTIA = (
    "device_type is read for 'mtia' alone, which forces a sum reduction with the division "
    "made before and after it (as torch does for float16): on any device the reduced "
    "gradient is the ranks' mean, divided in another place (rounding aside)"
)

_FSDP_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_FSDP_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"
_EACH_PARAM = (
    "the loop does the same thing to each of the group's parameters on its own (its own "
    "state, storages and gradient, nothing carried from one to the next): the order leaves "
    "every parameter as it was"
)
_PREFETCH = (
    "only which group is all-gathered ahead of its own need changes: every group still "
    "unshards itself when its forward or backward runs (unshard is a no-op on a group "
    "already unsharded or with an all-gather pending), so when an all-gather is issued "
    "changes, not what it gathers"
)
_RS_BUFFERS = (
    "only when the retained reduce-scatter input buffers are released changes: each is a "
    "keep-alive reference with its event, and the root's final callback waits on and clears "
    "every one at the end of backward; the gradients reduced are the same"
)
_AG_DEFER = (
    "only whether a forward all-gather's output is held until the next group's copy-out (to "
    "overlap that copy-out with the next all-gather) or released at once changes: either "
    "way the streams wait on the copy-out event before the buffer is reused, and the "
    "values copied out are the same (released at once is what explicit prefetch and "
    "backward do); memory and overlap, not values"
)
_EACH_STATE = (
    "each FSDP state (or each of its parameter groups) is given the same shared contexts, "
    "indices or settings on its own: the order leaves every state as it was"
)
_DEBUG_FQN = (
    "_init_fqns only names things for debugging and messages (its docstring): parameters are "
    "mapped by identity, so the order finds the same FQN for each, and a group managing "
    "several modules lists their names in another order, read only by profiler labels and "
    "error messages"
)
_GROUPS_IN_STATE = (
    "a state's parameter groups (several only where shard_placement_fn places parameters on "
    "several meshes) run their forward hooks in another order: each unshards, reshards or "
    "wraps the inputs for its own parameters alone, so only the order of their all-gathers, "
    "and of their reduce-scatters in backward, changes, the same on every rank"
)
_FINAL = (
    "the root's final callback visits states and groups in another order: each group whose "
    "backward never ran is reduced on its own, each finalised on its own, each retained "
    "reduce-scatter waited on; the same collectives on every rank, in another order, "
    "reducing the same gradients"
)
_ADDRESS_ONE = (
    "the check that the shard's storage is still the parameter's own (its address above 0, "
    "then equal to the local shard's) moves its bound from 0 to 1: the two differ only for a "
    "storage at address 1, which no allocator gives (addresses are aligned)"
)
_DUPLICATE = (
    "the search for a parameter managed by two groups sees the same (group, parameter) pairs: "
    "it raises the same ValueError whenever one exists, in any order; only which of the two "
    "FQNs the message names may change"
)

_ZERO = "torch.distributed.optim.zero_redundancy_optimizer"
_ZERO_PARTITION = (
    "the greedy partition assigns a parameter to another rank (a tie broken towards the "
    "last rank, or the parameters placed smallest first): ZeroRedundancyOptimizer documents "
    "the partition as arbitrary, and any partition the same on every rank (it is computed "
    "alike everywhere) steps every parameter once, by its owner, with the same optimizer, "
    "then broadcasts it: the same parameters and the same consolidated state"
)

_POWER_LOG = (
    "the value is read only into a logger.info line (the configuration PowerSGDState logs at "
    "construction, or the periodic compression statistics): the state keeps the value given "
    "and the hook computes from it; only the logged words change"
)
_EMPTY_REST = (
    "the projection runs one column further, at the last column, where the rest of the "
    "matrix (matrices[:, :, i + 1:]) is an empty slice: subtracting from it changes nothing"
)

_DT_COST = "torch.distributed.tensor._collective_utils"
_COST = (
    "only the estimated cost of a redistribution that communicates changes, and never to below "
    "zero at any number of ranks: DTensor still runs a strategy that needs no redistribution "
    "wherever there is one (_select_min_cost_strategy takes a negative cost first, then a "
    "strategy whose inputs already fit, before it compares costs), as "
    "test_an_operation_whose_inputs_fit_communicates_nothing holds from a few elements to "
    "megabytes; elsewhere it changes which of the operation's strategies, all of which "
    "communicate, runs: each gives the operation's value, moved at another cost"
)
_COSTS = {
    ("allgather_cost", "arithmetic", "num_devices_on_mesh_dim - 1 -> num_devices_on_mesh_dim + 1"),
    (
        "allgather_cost",
        "arithmetic",
        "bytes_gb * num_hops / num_devices_on_mesh_dim / "
        "mesh_dim_bandwidth -> bytes_gb * num_hops / num_devices_on_mesh_dim * mesh_dim_bandwidth",
    ),
    (
        "allgather_cost",
        "arithmetic",
        "num_hops * mesh_topo.mesh_dim_latency[mesh_dim] -> "
        "num_hops / mesh_topo.mesh_dim_latency[mesh_dim]",
    ),
    (
        "allgather_cost",
        "arithmetic",
        "bytes_gb * num_hops / num_devices_on_mesh_dim -> "
        "bytes_gb * num_hops * num_devices_on_mesh_dim",
    ),
    ("allgather_cost", "arithmetic", "bw * 1000000.0 -> bw / 1000000.0"),
    (
        "_compute_placement_transition_cost",
        "arithmetic",
        "comm_bytes_gb *= num_devices_on_mesh_dim -> comm_bytes_gb /= num_devices_on_mesh_dim",
    ),
    (
        "_compute_placement_transition_cost",
        "arithmetic",
        "allgather_cost(comm_bytes_gb, mesh_topo, mesh_dim) + 1.0 -> "
        "allgather_cost(comm_bytes_gb, mesh_topo, mesh_dim) - 1.0",
    ),
    (
        "redistribute_cost",
        "comparison",
        "current_spec.placements == target_spec.placements -> "
        "current_spec.placements != target_spec.placements",
    ),
    (
        "redistribute_cost",
        "comparison",
        "current_spec.shard_order == target_spec.shard_order -> "
        "current_spec.shard_order != target_spec.shard_order",
    ),
    ("redistribute_cost", "comparison", "step_cost == float('inf') -> step_cost != float('inf')"),
    (
        "redistribute_cost",
        "reversed-iteration",
        "for ... in transform_infos -> reversed(list(...))",
    ),
    ("redistribute_cost", "off-by-one", "1024 -> 1025"),
    *(
        (
            "redistribute_cost",
            "arithmetic",
            f"spec_to_bytes(current_spec) / current_spec.num_shards{a} -> "
            f"spec_to_bytes(current_spec) {b}",
        )
        for a, b in (
            (" / 1024 / 1024 / 1024", "/ current_spec.num_shards / 1024 / 1024 * 1024"),
            (" / 1024 / 1024", "/ current_spec.num_shards / 1024 * 1024"),
            (" / 1024", "/ current_spec.num_shards * 1024"),
            ("", "* current_spec.num_shards"),
        )
    ),
}

_SINGLE_DIM = "torch.distributed.tensor._ops.single_dim_strategy"
_REVERSED = "reversed(list(...))"
_DT_SPEC = "torch.distributed.tensor._dtensor_spec"
_SHARD_ORDER_CHECK = (
    "an assertion on a shard order, weakened or its checks taken in another order: every "
    "shard order DTensor makes (compute_default_shard_order, its redistribution planner) "
    "passes it either way, and no public entry (distribute_tensor, from_local, redistribute) "
    "takes one from a user"
)
_SPEC_EQUALS = (
    "two specs alike in every field now compare unequal (and two differing in that field "
    "equal only where their hashes, which include it, coincide): a cached sharding strategy "
    "is looked up, missed and computed again, the same; an input whose spec is its "
    "strategy's is 'redistributed' to the placements it has, which moves nothing "
    "(test_an_operation_whose_inputs_fit_communicates_nothing counts no collective)"
)

_PP_BACKWARD = "torch.distributed.pipelining._backward"
_PP_MAPPING = (
    "the stage-to-rank map a schedule starts with, made otherwise (looped for a V-shaped "
    "schedule, or filled in reverse): every multi-stage schedule sets it again at its start "
    "from its own actions (_validate_and_set_stage_mapping, on the schedule and each stage), "
    "and the communication reads that one; the V-shaped schedule's gradients are exact with "
    "the mapping made looped, at 2 and 4 ranks"
)
_PP_PAIRED = (
    "the inputs that require a gradient and their positions are listed in another order, "
    "together: autograd.grad returns each input's gradient in the order it is given them, "
    "and each is written back at its own position, so every input gets its own gradient"
)

# (module, qualname, operator, change) -> why the contract cannot tell it from torch.
EQUIVALENT: dict[tuple[str, str, str, str], str] = {
    (_PP_BACKWARD, "_autograd_grad_for_inputs", "reversed-iteration",
     "for ... in enumerate(inputs) -> reversed(list(...))"): _PP_PAIRED,
    (_PP_BACKWARD, "_autograd_grad_for_inputs", "reversed-iteration",
     "for ... in zip(grad_indices, grads, strict=True) -> reversed(list(...))"): _PP_PAIRED,
    ("torch.distributed.pipelining._utils", "generate_stage_to_rank_mapping",
     "ignored-argument", "argument style ignored for its default 'loop'"): _PP_MAPPING,
    ("torch.distributed.pipelining._utils", "generate_stage_to_rank_mapping",
     "reversed-iteration", "for ... in range(num_stages) -> reversed(list(...))"): _PP_MAPPING,
    ("torch.distributed.pipelining._utils", "validate_and_normalize_to_tuple",
     "reversed-iteration", "for ... in enumerate(args) -> reversed(list(...))"): (
        "a stage's arguments checked in another order: each must be a tensor (or none, where "
        "allowed) either way; only which of several bad ones the error names first changes"
    ),
    ("torch.distributed.pipelining._utils", "flatten_args", "ignored-argument",
     "argument detach ignored for its default False"): (
        "only flatten_args_detach, a deprecated alias nothing in torch calls, asks to detach; "
        "the stage and the schedules call flatten_args without it, and get the flat list "
        "either way"
    ),
    ("torch.distributed.pipelining._utils", "_StageMeta.has_dtensors", "reversed-iteration",
     "for ... in [self.inputs, self.outputs] -> reversed(list(...))"): (
        "whether the inputs or the outputs hold a DTensor, asked of the outputs first: "
        "True where either does, the same answer"
    ),
    ("torch.distributed.tensor.parallel.api", "parallelize_module", "reversed-iteration",
     "for ... in parallelize_plan.items() -> reversed(list(...))"): (
        "the plan's entries applied in another order: each entry parallelises the submodules "
        "its path names, their own parameters and hooks, whatever the others did (two entries "
        "naming one module, a wildcard and its exact path, are no plan the docs show)"
    ),
    ("torch.distributed.tensor.parallel.api", "parallelize_module", "reversed-iteration",
     "for ... in matched_children -> reversed(list(...))"): (
        "the children a path's wildcard matches parallelised in another order: each with the "
        "same style, its own parameters and hooks, none reading another's"
    ),
    (_PP_BACKWARD, "stage_backward", "reversed-iteration",
     "for ... in zip(output_val, grad_val) -> reversed(list(...))"): (
        "a stage's outputs and their gradients walked in another order, in pairs: each output "
        "is appended with its own gradient to two lists that stay aligned, and "
        "torch.autograd.backward takes the pairs in any order"
    ),
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in tensors_to_compress -> reversed(list(...))"): _DRAWS,
    (_POWER, "_orthogonalize", "off-by-one",
     "0 -> 1 at `num_matrices = matrices.shape[0]`"): (
        "num_matrices sizes only the buffer torch.linalg.qr is given for R, which the hook "
        "discards: qr resizes an out tensor of another shape (with a deprecation warning) and "
        "Q, written into the matrices, is the same"
    ),
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in shape_to_tensors.values() -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in tensors -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in maybe_batched_tensors_to_compress() -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in qs -> reversed(list(...))"): _DRAWS,
    ("torch.utils.data.distributed", "DistributedSampler.__iter__", "arithmetic",
     "self.seed + self.epoch -> self.seed - self.epoch"): (
        "another permutation, still a function of (seed, epoch) alone, the same on every rank "
        "and different for every epoch: all DistributedSampler and set_epoch document"
    ),
    ("torch.optim.adamw", "AdamW.__setstate__", "reversed-iteration",
     "for ... in self.param_groups -> reversed(list(...))"): (
        "the loop sets one constant (decoupled_weight_decay = True) in each param group, each "
        "group on its own: the order it visits them in leaves the same groups"
    ),
    ("torch.optim.lr_scheduler", "LRScheduler.__init__", "reversed-iteration",
     "for ... in optimizer.param_groups -> reversed(list(...))"): (
        "the loop gives each param group its own initial_lr (setdefault from the group's own "
        "lr), each group on its own: the order it visits them in leaves the same groups"
    ),
    ("torch.optim.lr_scheduler", "LRScheduler._update_lr", "reversed-iteration",
     "for ... in zip(self.optimizer.param_groups, values, strict=True) -> reversed(list(...))"): (
        "each param group is given its own value, paired with it by zip before the loop: the "
        "order it visits the pairs in leaves every group the learning rate it was given"
    ),
    ("torch.amp.grad_scaler", "GradScaler._unscale_grads_", "reversed-iteration",
     "for ... in per_dtype_grads.values() -> reversed(list(...))"): (
        "each (device, dtype) group of gradients is unscaled in place by the same inverse "
        "scale and checked into its device's found_inf, which only ever becomes 1: the order "
        "the groups are visited in leaves the same gradients and the same flags"
    ),
    ("torch.amp.grad_scaler", "GradScaler._unscale_grads_", "reversed-iteration",
     "for ... in optimizer.param_groups -> reversed(list(...))"): (
        "the loop only files each gradient under its (device, dtype); each is then unscaled on "
        "its own by the same inverse scale, and the device's found_inf set if any is not "
        "finite: the order gradients are filed in leaves the same gradients and flags"
    ),
    ("torch.amp.grad_scaler", "GradScaler._unscale_grads_", "reversed-iteration",
     "for ... in group['params'] -> reversed(list(...))"): (
        "the loop only files each gradient under its (device, dtype); each is then unscaled on "
        "its own by the same inverse scale, and the device's found_inf set if any is not "
        "finite: the order gradients are filed in leaves the same gradients and flags"
    ),
    ("torch.amp.grad_scaler", "GradScaler._unscale_grads_", "reversed-iteration",
     "for ... in per_device_and_dtype_grads.items() -> reversed(list(...))"): (
        "each device's gradients are unscaled into that device's own found_inf; the order "
        "the devices are visited in orders only the dict of flags, which update() sums (0 or "
        "1 each, exact in any order) and step() reads for any nonzero"
    ),
    ("torch.amp.grad_scaler", "GradScaler.unscale_", "comparison",
     "self._scale.device != torch.device('mps:0') -> self._scale.device == torch.device('mps:0')"): (  # noqa: E501
        "the inverse scale as float32's own reciprocal instead of float64's rounded to float32: "
        "where float32 division is IEEE's (the CPU; CUDA's default -prec-div) both are the "
        "correctly rounded reciprocal, since rounding twice is innocuous for a division when "
        "the wider format carries at least 2p + 2 bits (53 >= 2 * 24 + 2: Figueroa, 1995); "
        "10 million random scales gave not one differing bit"
    ),
    ("torch.amp.grad_scaler", "GradScaler.update", "comparison",
     "len(found_infs) > 1 -> len(found_infs) >= 1"): (
        "the branch only loops over range(1, len(found_infs)), which is empty for one found_inf: "
        "entering it for one adds nothing, the same combined flag"
    ),
    ("torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook",
     "PostLocalSGDState.maybe_increase_iter", "comparison",
     "self.iter == self.start_localSGD_iter -> self.iter != self.start_localSGD_iter"): (
        "the branch only logs that local SGD starts (logger.info); the count it tests is "
        "moved before it, the same either way"
    ),
    ("torch.distributed.nn.functional", "_AlltoAll.forward", "reversed-iteration",
     "for ... in range(dist.get_world_size(group=group)) -> reversed(list(...))"): (
        "on gloo every rank of the group makes the same scatters, one from each rank i into "
        "its out_tensor_list[i]: made in the reverse order on every rank alike, each fills "
        "the same slot from the same source"
    ),
    (_AVERAGING + "hierarchical_model_averager", "HierarchicalModelAverager.__init__",
     "reversed-iteration", "for ... in period_group_size_dict.items() -> reversed(list(...))"): (
        "each level's subgroups made in the other order, alike on every rank: the same "
        "members under the same period, which _find_process_group looks up by key (it walks "
        "self._periods, the dict's keys as given, not the groups' dict)"
    ),
    (_AVERAGING + "utils", "get_params_to_average", "reversed-iteration",
     "for ... in params -> reversed(list(...))"): _AVERAGED_IN_REVERSE,
    (_AVERAGING + "utils", "get_params_to_average", "reversed-iteration",
     "for ... in param['params'] -> reversed(list(...))"): _AVERAGED_IN_REVERSE,
    ("torch.nn.utils.clip_grad", "_get_total_norm", "reversed-iteration",
     "for ... in grouped_tensors.items() -> reversed(list(...))"): (
        "the per-(device, dtype) norms are stacked in reverse before the norm of norms: one "
        "group wherever the gradients share a dtype and device, and for several the same "
        "p-norm of the same values summed in another order (a sum of two is the same either "
        "way; torch promises no order: its foreach and for-loop paths already sum differently)"
    ),
    ("torch.nn.utils.clip_grad", "_clip_grads_with_norm_", "reversed-iteration",
     "for ... in grouped_grads.items() -> reversed(list(...))"): (
        "each (device, dtype) group of gradients is multiplied in place by the same clamped "
        "coefficient, computed before the loop: the order the groups are visited in leaves "
        "the same gradients"
    ),
    (_DCP + "state_dict_saver", "_save_state_dict", "dictionary-key",
     "ckpt_kwargs['checkpoint_id'] -> ckpt_kwargs['process_group']"): _DCP_LOG,
    (_DCP + "state_dict_saver", "_save_state_dict", "dictionary-key",
     "ckpt_kwargs['process_group'] -> ckpt_kwargs['checkpoint_id']"): _DCP_LOG,
    (_DCP + "state_dict_loader", "_load_state_dict", "dictionary-key",
     "ckpt_kwargs['checkpoint_id'] -> ckpt_kwargs['process_group']"): _DCP_LOG,
    (_DCP + "state_dict_loader", "_load_state_dict", "dictionary-key",
     "ckpt_kwargs['process_group'] -> ckpt_kwargs['checkpoint_id']"): _DCP_LOG,
    (_DCP + "state_dict_saver", "_stateful_to_state_dict", "reversed-iteration",
     "for ... in state_dict.items() -> reversed(list(...))"): (
        "the shallow copy holds the same keys and values in reverse order, alike on every rank; "
        "the planner addresses every item by its fully qualified name, and metadata and load "
        "find them by it: the same checkpoint reads back"
    ),
    (_DCP + "state_dict_loader", "load", "reversed-iteration",
     "for ... in keys -> reversed(list(...))"): (
        "the keys are sorted so that every rank builds the state to load in one order; "
        "reversed alike on every rank, still one order; each key is then loaded, and written "
        "back, from its own entry (the write-back makes no collective, and DCP promises no "
        "order among Stateful loads)"
    ),
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "reversed-iteration",
     "for ... in enumerate(all_plans) -> reversed(list(...))"): _DEDUP_ORDER,
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "reversed-iteration",
     "for ... in plan.items -> reversed(list(...))"): _DEDUP_ORDER,
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "reversed-iteration",
     "for ... in write_item_to_plan_indices.items() -> reversed(list(...))"): _DEDUP_ORDER,
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "reversed-iteration",
     "for ... in plan_indices - {select_plan_idx} -> reversed(list(...))"): (
        "the item is discarded from each other plan that held it, in another order: the same "
        "sets of items are left"
    ),
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "off-by-one",
     "1 -> 2 at `plan_to_size[select_plan_idx] += write_item.tensor_storage_size() or 1`"): (
        "a plain value (not a tensor) counted as 2 units of planned storage instead of 1: its "
        "size is unknown ('we don't know how much storage they represent'), either count is a "
        "placeholder; every tensor is still counted by its bytes"
    ),
    (_DCP + "_dedup_save_plans", "dedup_save_plans", "off-by-one",
     "0 -> 1 at `plan_to_size = [0] * len(all_plans)`"): (
        "every plan's planned storage starts at 1 instead of 0: the same offset on every plan, "
        "so the least-loaded plan at each turn is the same one"
    ),
    # -- c10d ---------------------------------------------------------------------------------
    (_C10D, "_new_process_group_helper", "reversed-iteration",
     "for ... in backend_config.get_device_backend_map().items() -> reversed(list(...))"): (
        "where one backend serves every device (gloo's map), the loop makes it once, from the "
        "first device visited, and then registers it for the devices in the map's own order: "
        "the order changes only the store prefix its rendezvous keys take, alike on every "
        "rank (the registration order itself is not equivalent: reversing it was killed)"
    ),
    (_C10D, "scatter_object_list", "off-by-one",
     "0 -> 1 at `max_tensor_size = torch.tensor([0], dtype=torch.long, device=pg_device)`"):
        _PLACEHOLDER,
    (_C10D, "scatter_object_list", "off-by-one",
     "0 -> 1 at `obj_tensor_size = torch.tensor([0], dtype=torch.long, device=pg_device)`"):
        _PLACEHOLDER,
    (_C10D, "scatter_object_list", "reversed-iteration",
     "for ... in tensor_list -> reversed(list(...))"): (
        "the loop resizes each serialised object's tensor to the largest size, each tensor on "
        "its own: the order leaves the same tensors"
    ),
    (_C10D, "_new_group_with_tag", "comparison",
     "_is_barrier_after_init() == 1 -> _is_barrier_after_init() != 1"): (
        "the condition only adds (or, with TORCH_DIST_INIT_BARRIER=1, drops) a store barrier "
        "after a group is made, among the ranks that make it: it waits, and changes no "
        "group, rank mapping or value"
    ),
    (_C10D, "_ensure_all_tensors_same_dtype", "reversed-iteration",
     "for ... in itertools.chain.from_iterable(map(_as_iterable, tensors)) -> reversed(list(...))"):
        ("whether every tensor has one dtype does not depend on the order they are compared "
         "in: the same calls are refused, only the two dtypes the message names may swap"),
    (_C10D, "new_subgroups_by_enumeration", "reversed-iteration",
     "for ... in ranks -> reversed(list(...))"): (
        "each rank of a subgroup is entered in the rank-to-subgroup map, and a rank already "
        "there refused, rank by rank: the order within a subgroup leaves the same map, the "
        "same current subgroup and the same refusals"
    ),
    (_C10D, "_process_group_name", "arithmetic",
     "_world.group_count += 1 -> _world.group_count -= 1"): (
        "the counter only names groups made without hashed names: counting down names them "
        "as uniquely, and alike on every rank that makes the same groups in the same order"
    ),
    (_C10D, "_tensor_to_object", "comparison",
     "get_debug_level() == DebugLevel.DETAIL -> get_debug_level() != DebugLevel.DETAIL"): (
        "the branch only hashes the received tensor into a logger.warning line, and only on a "
        "build with NCCL (is_nccl_available() is False on this CPU build) for an NCCL group: "
        "the object unpickled and returned is the same"
    ),
    **{
        (_C10D, "broadcast", op, change): (
            "the compute capability is read only for a CUDA tensor (`tensor.is_cuda and ...`), "
            "and only decides whether an fp8 tensor is broadcast as bytes on GPUs before "
            "sm90: no CPU tensor, and no tensor of another dtype, takes another path"
        )
        for op, change in (
            ("off-by-one", "9 -> 10"),
            ("comparison", "torch.cuda.get_device_capability(tensor.device)[0] >= 9 -> "
             "torch.cuda.get_device_capability(tensor.device)[0] > 9"),
        )
    },
    (_C10D, "_process_group_name", "off-by-one", "1 -> 2"): (
        "the counter only names groups made without hashed names: counting by two names them "
        "as uniquely, and alike on every rank that makes the same groups in the same order"
    ),
    (_C10D, "all_gather", "ignored-argument", "argument async_op ignored for its default False"): (
        "the use dropped is `opts.asyncOp = async_op`, which tells a backend whether the op "
        "may run on a stream of its own (NCCL's); gloo reads no stream, and the work is still "
        "returned and waited on as async_op says (`if async_op: return work`), so the same "
        "values arrive, handed back as documented"
    ),
    (_C10D, "_new_group_with_tag", "ignored-argument",
     "argument use_local_synchronization ignored for its default False"): (
        "the use dropped is the early branch: a rank outside `ranks` that calls new_group "
        "anyway (non-members need not) gets None there, and without it goes on to "
        "_new_process_group_helper, which gives a non-member GroupMember.NON_GROUP_MEMBER, the "
        "value new_group documents for one: no group either way, and the group-local barrier "
        "at the end still reads the argument; the refusal it skips is MPI's, on no build here"
    ),
    (_C10D, "_get_default_timeout", "comparison",
     "backend == Backend.NCCL -> backend != Backend.NCCL"): (
        "on a build without NCCL (default_pg_nccl_timeout is None, as on this CPU build) "
        "both branches return default_pg_timeout; on a CUDA build gloo groups would get "
        "NCCL's 10 minutes, which test_collectives' time-out property reads"
    ),
    # -- torch.distributed.checkpoint -----------------------------------------------------
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan",
     "reversed-iteration",
     "for ... in metadata.state_dict_metadata.items() -> reversed(list(...))"): (
        "each tensor's chunks are validated on their own and every error is collected: the "
        "order the tensors are visited in orders the errors in the message, and refuses the "
        "same plans"
    ),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner.__init__",
     "ignored-argument", "argument flatten_sharded_tensors ignored for its default True"): (
        "on saving, flattening sharded tensors rewrites only ShardedTensors nested in "
        "ShardedTensors (FSDP1's deprecated 2-D state dicts) and copies every other value "
        "into a new dict that is only read: without ShardedTensors the same items are "
        "written either way"
    ),
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan",
     "reversed-iteration", "for ... in active -> reversed(list(...))"): (
        "the chunk is compared with every chunk still active and each overlap found is "
        "collected: visited the other way, the same overlaps are found and only their "
        "messages' order differs, so the same plans are refused"
    ),
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan", "comparison",
     "len(chunks) > 1 -> len(chunks) >= 1"): (
        "the overlap sweep run for a tensor of one chunk too: a chunk is compared only with "
        "the chunks before it, of which there are none, so no overlap is found"
    ),
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan",
     "reversed-iteration", "for ... in sorted_indices -> reversed(list(...))"): (
        "the sweep taken from the last start back: a chunk already passed starts no "
        "earlier than the current one, so only one of no extent ending where the current "
        "one starts leaves the active list, and the pairs compared differ from the forward "
        "sweep's only in pairs one of which ends, along the sweep dimension, where or before "
        "the other starts, which the overlap test separates. The same overlaps are found "
        "(each pair named the other way round), and the same plans refused"
    ),
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan", "off-by-one",
     "0 -> 1 at `sweep_dim = max(range(dims), default=0, key=lambda d: value.size[d])`"): (
        "max()'s default is taken only for an empty range, a tensor of no dimensions, which "
        "the loop has already skipped (len(value.size) == 0: continue)"
    ),
    ("torch.distributed.checkpoint.default_planner", "_validate_global_plan",
     "reversed-iteration", "for ... in chunks -> reversed(list(...))"): (
        "each chunk's bounds checked and its volume added in another order: every error is "
        "collected and the sum is the same, so the same plans are refused"
    ),
    ("torch.distributed.checkpoint.default_planner", "create_default_local_load_plan",
     "reversed-iteration", "for ... in state_dict.items() -> reversed(list(...))"): (
        "the read requests listed in another order: each reads into its own entry, and the "
        "storage reader reads them by file and offset, so the same state loads; a strict "
        "load missing several keys refuses it either way, naming another of them"
    ),
    ("torch.distributed.checkpoint.default_planner", "create_default_global_save_plan",
     "ignored-argument", "argument rewrite_index_hints ignored for its default True"): (
        "every caller in torch (DefaultSavePlanner.create_global_plan, "
        "_create_default_local_metadata) passes the default; one that asks for no rewriting "
        "gets the index hints rewritten, and a hint only speeds a load's search for a chunk, "
        "which finds it by its offsets: the same checkpoint reads back"
    ),
    ("torch.distributed.checkpoint.default_planner", "_check_box_overlap",
     "reversed-iteration", "for ... in range(ndims) -> reversed(list(...))"): (
        "two boxes overlap unless some dimension separates them: the loop returns False at "
        "the first dimension that does and True after all, so visiting the dimensions in "
        "another order finds the same answer"
    ),
    ("torch.distributed.checkpoint.default_planner", "create_default_global_save_plan",
     "reversed-iteration", "for ... in plan.items -> reversed(list(...))"): (
        "a rank's items are entered in the metadata in reverse: each chunk keeps its offsets "
        "and sizes, its index hint is set to the place it is given, and a load finds a "
        "chunk by its offsets (the hint only speeds the search): the same checkpoint reads "
        "back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter._write_data", "off-by-one",
     "1 -> 2"): (
        "one writing thread fewer is started: every thread, the caller's included, takes "
        "files from the one queue until it is empty, so the same files are written with the "
        "same items, by fewer threads"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.__init__",
     "ignored-argument", "argument per_thread_copy_ahead ignored for its default 10000000"): (
        "how many bytes the overlapping loader copies from a GPU ahead of writing them: "
        "taken only with an accelerator and one thread (a CPU build's serial loader never "
        "reads it); it bounds what is in flight, not what is written or where"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.finish",
     "reversed-iteration", "for ... in results -> reversed(list(...))"): (
        "the ranks' write results merged into the storage map in another order: each is "
        "keyed by its own item's index, which a deduplicated plan writes once, so the same "
        "map is built"
    ),
    ("torch.distributed.checkpoint.filesystem", "_write_files_from_queue",
     "reversed-iteration", "for ... in loader.values() -> reversed(list(...))"): (
        "a file's tensors written in another order: each write result records where its "
        "bytes start and how many there are, and a load reads each by that record (the "
        "safetensors dict is keyed by name), so the same state reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.write_data", "off-by-one",
     "0 -> 1"): (
        "a rank's files numbered from 1 rather than 0: still distinct under the rank's own "
        "prefix, and each is named in the metadata with the items it holds, which is how a "
        "load finds them: the same checkpoint reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.write_data", "off-by-one",
     "1 -> 2"): (
        "a rank's files numbered 0, 2, 4 rather than 0, 1, 2: still distinct under the "
        "rank's own prefix, and each is named in the metadata with the items it holds, "
        "which is how a load finds them: the same checkpoint reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "FileSystemReader.read_data",
     "reversed-iteration", "for ... in per_file.items() -> reversed(list(...))"): (
        "the files read in another order: each read request copies its own item into its "
        "own destination, so the same state loads"
    ),
    ("torch.distributed.checkpoint.filesystem", "_SerialCpuLoader.values", "comparison",
     "tensor.untyped_storage().size() != tensor.nbytes -> "
     "tensor.untyped_storage().size() == tensor.nbytes"): (
        "which tensors are copied before writing inverted: a tensor filling its storage is "
        "copied (the same values), and a view of a larger storage is written as it is, "
        "which torch.save stores with its storage, offset and strides and loads as the same "
        "view's values (safetensors, not the default, takes the view's own elements): the "
        "same values read back, only the file's size differs"
    ),
    ("torch.distributed.checkpoint.filesystem", "_split_by_size_and_type", "off-by-one",
     "1 -> 2"): (
        "two writing threads given one bucket of every item, as one thread is: a rank's "
        "items go to one file rather than two, each item's file and offset recorded in the "
        "metadata, so the same checkpoint reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_split_by_size_and_type", "comparison",
     "bins == 1 -> bins != 1"): (
        "every thread count but one given a single bucket of every item, and one thread the "
        "same single bucket by splitting into one: a rank's items in one file, each item's "
        "file and offset recorded in the metadata, so the same checkpoint reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter.__init__",
     "ignored-argument", "argument per_thread_copy_ahead ignored for its default 10000000"): (
        "the public writer's copy-ahead, passed to _FileSystemWriter's (declared above): "
        "read only by the overlapping loader an accelerator takes, it bounds what is in "
        "flight, not what is written or where"
    ),
    ("torch.distributed.checkpoint.filesystem", "_write_files_from_queue", "comparison",
     "thread_count == 1 -> thread_count != 1"): (
        "which loader copies a file's tensors to the CPU: the overlapping one is taken only "
        "with an accelerator (a CPU build never takes it), and both yield every item's "
        "tensor, whose place in the file each write result records: the same checkpoint "
        "reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter.__init__",
     "ignored-argument", "argument thread_count ignored for its default 1"): (
        "the writer given one thread whatever it is asked: a rank's items written by one "
        "thread into one file rather than split among several, each item's file and offset "
        "recorded in the metadata, so the same checkpoint reads back (the documented effect "
        "of the argument is the number of IO threads, not what is written)"
    ),
    ("torch.distributed.checkpoint.filesystem", "_write_files_from_queue",
     "reversed-iteration", "for ... in bytes_w -> reversed(list(...))"): (
        "a file's non-tensor values written in another order: each write result records "
        "where its bytes start and how many there are, and a load reads each by that "
        "record, so the same state reads back"
    ),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter.__init__",
     "ignored-argument", "argument sync_files ignored for its default True"): (
        "files flushed to the disk (os.fsync) even when asked not to: what durability a "
        "crash leaves, not what is written or read back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter._write_data",
     "reversed-iteration", "for ... in range(1, self.thread_count) -> reversed(list(...))"): (
        "the writing threads started in another order: they are alike, each taking files "
        "from the one queue until it is empty, and their results are gathered whole"
    ),
    ("torch.distributed.checkpoint.filesystem", "_write_files_from_queue", "off-by-one",
     "1 -> 2"): (
        "the overlapping loader taken for two threads rather than one, and only with an "
        "accelerator (a CPU build never takes it): either loader yields every item's tensor, "
        "whose place in the file each write result records, so the same checkpoint reads "
        "back"
    ),
    ("torch.distributed.checkpoint.filesystem", "FileSystemReader.read_data",
     "reversed-iteration", "for ... in reqs -> reversed(list(...))"): (
        "a file's items read in another order: each is read at its recorded offset into its "
        "own destination, so the same state loads"
    ),
    ("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.__init__",
     "ignored-argument", "argument sync_files ignored for its default True"): (
        "files flushed to the disk (os.fsync) even when asked not to: what durability a "
        "crash leaves, not what is written or read back"
    ),
    ("torch.distributed.checkpoint.filesystem", "_item_size", "off-by-one", "1 -> 2"): (
        "every tensor's size counted twice over: the writer sorts items by size and gives "
        "each to the bucket of least total, comparisons a common factor leaves alone, so the "
        "same items go to the same files; the overlapping loader (GPU only) bounds bytes in "
        "flight by it, which orders no write"
    ),
    ("torch.distributed.checkpoint.filesystem", "_item_size", "reversed-iteration",
     "for ... in item.tensor_data.size -> reversed(list(...))"): (
        "the product of a tensor's sizes, taken in the other order: the same number of "
        "elements, the same bytes to a file"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "comparison", "saved_start >= local_end -> saved_start > local_end"): (
        "the sweep takes a saved chunk that starts exactly where the local chunk ends into "
        "its active set one chunk early: the overlap test skips it for this local chunk and "
        "the next one would take it in anyway, so the same reads are made"
    ),
    # The sweep dimension only prunes which saved chunks are compared with a local one:
    # every pair is still tested by its true overlap, so any dimension finds the same reads.
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "comparison",
     "num_dims > 1 -> num_dims >= 1"): (
        "a 1-D tensor's sweep dimension chosen among its one dimension rather than left at "
        "it: dimension 0 either way, the same reads"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "1 -> 2 at `if num_dims > 1:`"): (
        "a 2-D tensor swept along dimension 0 rather than its longest: the sweep only prunes "
        "the saved chunks compared with a local one, each pair kept is tested by its true "
        "overlap, so the same reads are made"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "reversed-iteration",
     "for ... in range(num_dims) -> reversed(list(...))"): (
        "of dimensions equally long, the last rather than the first taken to sweep along: the "
        "sweep only prunes, every pair kept is tested by its true overlap, the same reads"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "arithmetic",
     "chunk.offsets[dim] + chunk.sizes[dim] -> chunk.offsets[dim] - chunk.sizes[dim]"): (
        "the dimension to sweep along chosen by another measure of extent: the sweep only "
        "prunes, every pair kept is tested by its true overlap, so the same reads are made"
    ),
    # A 0-d tensor has one chunk on each side: every bound lets the one pair meet.
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "1 -> 2 at `saved_bounds = [(0, 1)] * len(saved_chunks)`"): (
        "a 0-d tensor's saved chunk given the span 0 to 2: it still starts before the local "
        "chunk ends, so the one pair is compared and read as before"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "1 -> 2 at `local_bounds = [(0, 1)] * len(local_chunks)`"): (
        "a 0-d tensor's local chunk given the span 0 to 2: the saved chunk still starts "
        "before it ends, so the one pair is compared and read as before"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "0 -> 1 at `local_bounds = [(0, 1)] * len(local_chunks)`"): (
        "a 0-d tensor's one local chunk given the span 1 to 1: the chunks passed are cut "
        "before any saved chunk is taken in, and the saved chunk starts before 1, so the one "
        "pair is compared and read as before"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "0 -> 1 at `key=lambda idx: local_bounds[idx][0],`"): (
        "a rank's local chunks of one tensor sorted by where they end rather than start: they "
        "do not overlap, so both orders are the same"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "reversed-iteration",
     "for ... in local_sorted_indices -> reversed(list(...))"): (
        "the local chunks swept from the last start back: the first taken in every saved "
        "chunk that starts before its end, which is all an earlier one needs, and a later "
        "cut removes only saved chunks ending before an earlier start; each pair kept is "
        "tested by its true overlap, so the same reads are made in another order"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "off-by-one",
     "1 -> 2 at `cutoff = bisect_right(active_saved, (local_start, -1))`"): (
        "the cut key (start, -2) rather than (start, -1): the active entries are (end, index) "
        "with indices from 0, so both keys fall between the same entries"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list",
     "reversed-iteration",
     "for ... in active_saved -> reversed(list(...))"): (
        "the saved chunks overlapping a local chunk read in the other order: each read fills "
        "its own part of the local chunk, so the same values land"
    ),
    # A bytes read item's offsets and length: the filesystem reader reads the whole slice
    # its storage index names (FileSystemReader.read_data), never these.
    ("torch.distributed.checkpoint.planner_helpers", "_create_read_items",
     "off-by-one",
     "0 -> 1 at `dest_offset=0,`"): (
        "a bytes read item's destination offset: the filesystem reader reads the whole "
        "slice its storage index names and the planner loads it whole, never this offset"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "_create_read_items",
     "off-by-one",
     "0 -> 1 at `storage_offset=0,`"): (
        "a bytes read item's storage offset: the filesystem reader reads the whole slice "
        "its storage index's recorded offset and length name, never this one"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "_create_read_items",
     "off-by-one",
     "0 -> 1 at `length=0,`"): (
        "a bytes read item's length: the filesystem reader reads the whole slice its storage "
        "index's recorded offset and length name, never this one"
    ),
    ("torch.distributed.checkpoint.planner_helpers", "_iterate_state_dict", "reversed-iteration",
     "for ... in iter_object.items() -> reversed(list(...))"): (
        "each entry replaced by what the functions make of its own value (meta tensors "
        "allocated), none of which reads another entry or communicates: visited the other "
        "way, the same dict results"
    ),
    ("torch.distributed.checkpoint.state_dict", "_iterate_valid_model_state", "reversed-iteration",
     "for ... in chain(module.named_buffers(recurse=False), module.named_parameters(recurse=False "
     "-> reversed(list(...))"): (
        "one module's own buffers and parameters visited in the other order: every mapping "
        "built from them is keyed by name or by tensor, the names of a tensor seen twice are "
        "collected as a set, and the dict loaded is applied by key, so the same states result"
    ),
    ("torch.distributed.checkpoint.state_dict", "_verify_options", "reversed-iteration",
     "for ... in _iterate_valid_model_state(model) -> reversed(list(...))"): (
        "the model's states visited from the last: a tensor's names are gathered into one "
        "set whichever comes first, and every other mapping is keyed by name or by tensor, "
        "so the same mappings result"
    ),
    ("torch.distributed.checkpoint.state_dict", "_verify_state_dict", "reversed-iteration",
     "for ... in info.fsdp_modules -> reversed(list(...))"): (
        "each FSDP1 module checked for its state from the last: a check that raises on the "
        "first module without one raises either way"
    ),
    ("torch.distributed.checkpoint.state_dict", "_split_optim_state_dict",
     "reversed-iteration", "for ... in param_group.items() -> reversed(list(...))"): (
        "a loaded group's hyperparameters copied key by key from the last: each key is set "
        "once, so the group holds the same values (its keys in another order, which "
        "Optimizer.load_state_dict and every step read by name)"
    ),
    ("torch.distributed.checkpoint.state_dict", "_get_optim_state_dict",
     "reversed-iteration", "for ... in model.named_parameters() -> reversed(list(...))"): (
        "each parameter's index mapped to its name and back, the parameters from the last: "
        "named_parameters gives a tied parameter once, so every entry is set once and the "
        "same mappings result"
    ),
    ("torch.distributed.checkpoint.state_dict", "_load_optim_state_dict",
     "reversed-iteration", "for ... in optimizers -> reversed(list(...))"): (
        "each optimizer initialized (a step at zero rate on zero gradients, which it sets "
        "back to None) and loaded from its own part of the state, from the last: none reads "
        "another's state, hyperparameters or gradients, so each ends as before"
    ),
    ("torch.distributed.checkpoint.state_dict", "_verify_state_dict", "reversed-iteration",
     "for ... in model_state_dict -> reversed(list(...))"): (
        "the keys searched for FSDP1's flat parameter from the last: a state holding one is "
        "refused either way (the message names another such key where there are several)"
    ),
    ("torch.distributed.checkpoint.state_dict", "_get_optim_state_dict",
     "reversed-iteration", "for ... in list(osd[_STATE].keys()) -> reversed(list(...))"): (
        "each parameter's state moved from its index to its name, from the last: the names "
        "are distinct and never an index, so the same entries result, only in another order "
        "of a dict read by key"
    ),
    ("torch.distributed.checkpoint.state_dict", "_split_optim_state_dict",
     "reversed-iteration",
     "for ... in cast(ListDictValueType, optim_state_dict[_PG]) -> reversed(list(...))"): (
        "each loaded group's hyperparameters copied to the optimizer's group that holds its "
        "parameters, the loaded groups taken from the last: loaded into optimizers grouped as "
        "the saved ones were (the documented round trip), no two loaded groups name one "
        "group, so none is written twice and the order is unseen"
    ),
    ("torch.distributed.checkpoint.state_dict", "_verify_options",
     "reversed-iteration",
     "for ... in fqns -> reversed(list(...))"): (
        "each of a parameter's names mapped to it, in the other order: one entry per name, "
        "none depending on another, the same mapping"
    ),
    ("torch.distributed.checkpoint.state_dict", "_verify_options", "reversed-iteration",
     "for ... in list(shared_params_mapping.items()) -> reversed(list(...))"): (
        "each name of a shared parameter mapped to it, the parameters taken in the other "
        "order: the names of two parameters are distinct keys, so the same mapping results"
    ),
    ("torch.distributed.checkpoint.state_dict", "_load_model_state_dict", "reversed-iteration",
     "for ... in zip(fqns, fqns_with_prefix) -> reversed(list(...))"): (
        "a state's names renamed to the wrapped model's, pair by pair in the other order: "
        "each pair moves its own key to its own new key, so the same dict is loaded"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ignored-argument",
     "argument check_reduction ignored for its default False"): (
        "check_reduction is deprecated: DDP only warns that it is (FutureWarning) when it is "
        "True, and nothing else reads it, so the same DDP trains whatever is passed"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "off-by-one",
     "1024 -> 1025 at `self.broadcast_bucket_size = 250 * 1024 * 1024`"): (
        "the size of the chunks DDP broadcasts module states in at construction: larger "
        "chunks, the same values broadcast"
    ),
    ("torch.optim.optimizer", "Optimizer.add_param_group", "reversed-iteration",
     "for ... in self.defaults.items() -> reversed(list(...))"): (
        "each setting a new group lacks is given its default (or refused, if required), "
        "setting by setting: the same settings, only their order in the group's dict changes"
    ),
    ("torch.optim.optimizer", "Optimizer.load_state_dict", "reversed-iteration",
     "for ... in state_dict['state'].items() -> reversed(list(...))"): (
        "each parameter's saved state is cast and entered under its parameter on its own: "
        "the same state for every parameter, only the dict's order changes"
    ),
    ("torch.optim.optimizer", "Optimizer.zero_grad", "reversed-iteration",
     "for ... in group['params'] -> reversed(list(...))"): (
        "each gradient is dropped or zeroed on its own (the foreach path zeroes the lists it "
        "gathers, each gradient once): the same gradients whichever parameter comes first"
    ),
    ("torch.optim.optimizer", "Optimizer.zero_grad", "reversed-iteration",
     "for ... in self.param_groups -> reversed(list(...))"): (
        "each gradient is dropped or zeroed on its own (the foreach path zeroes the lists it "
        "gathers, each gradient once): the same gradients whichever group comes first"
    ),
    ("torch.optim.sgd", "SGD._init_group", "reversed-iteration",
     "for ... in group['params'] -> reversed(list(...))"): (
        "the parameters, their gradients and momentum buffers are gathered in the one loop, "
        "paired by position, and each is updated on its own and its buffer stored back under "
        "it: the same update in any order (the fused kernels' device and dtype check, made on "
        "the first parameter gathered, is one every parameter of a fused group must pass)"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ignored-argument",
     "argument skip_all_reduce_unused_params ignored for its default False"): (
        "the option requires the unused parameters to stay the same, unused on every rank "
        "and every iteration (its documentation): their gradients are never written either "
        "way (None), so skipping their all-reduce changes only what is sent"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ignored-argument",
     "argument batched_grad_copy ignored for its default False"): (
        "a throughput option (its documentation): the per-parameter copies of gradients into "
        "their bucket and their division are made each as the gradient is ready instead of "
        "as one batched copy and one division when the bucket is: the same values in the same "
        "places (training with it on is held to the reference by test_ddp_options)"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ignored-argument",
     "argument dim ignored for its default 0"): (
        "dim is read only by DDP's scatter() and gather(), kept for backward compatibility and "
        "called by nothing its forward runs (inputs are moved whole to the module's device, "
        "never scattered): no training reads it"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "reversed-iteration",
     "for ... in self._module_parameters -> reversed(list(...))"): (
        "each parameter is checked for being uninitialized, and any one raises the same error: "
        "the same refusal in any order"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._ddp_init_helper",
     "reversed-iteration", "for ... in self.module.modules() -> reversed(list(...))"): (
        "the loop only asks whether any submodule is a SyncBatchNorm, for the construction "
        "data DDP logs: the same answer in any order"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._ddp_init_helper", "off-by-one",
     "1 -> 2"): (
        "the output device DDP's logger records where none was given (-1 made -2): logging "
        "data only, which nothing that trains reads"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._build_debug_param_to_name_mapping",
     "reversed-iteration",
     "for ... in module.named_parameters(recurse=False) -> reversed(list(...))"): (
        "each of a module's own parameters (named_parameters drops duplicates) is entered under "
        "its own index with its own name: the same mapping in either order"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._passing_sync_batchnorm_handle",
     "reversed-iteration", "for ... in module.modules() -> reversed(list(...))"): (
        "each layer is checked for SyncBatchNorm, which DDP refuses on a CPU module, and the "
        "first found raises the same error: the same refusal in any order"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ignored-argument",
     "argument static_graph ignored for its default False at `static_graph,`"): (
        "(the argument handed to _ddp_init_helper, at its call) read there only for the first "
        "iteration's bucket assignment and the construction data DDP logs; static_graph itself "
        "is still set: which gradients the first iteration reduces together (DDP rebuilds the "
        "buckets in gradient-ready order after it), each to the same sum"
    ),
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "comparison",
     "self._bucket_config.first_bucket_bytes_cap < self._bucket_config.bucket_bytes_ca "
     "-> self._bucket_config.first_bucket_bytes_cap <= self._bucket_config.bucket_bytes_c"): (
        "bucket_bytes_cap_default is an attribute kept for backward compatibility (its "
        "comment) that nothing in torch reads: the buckets are made from the bucket config"
    ),
    # -- BatchNorm ----------------------------------------------------------------------------
    ("torch.nn.modules.batchnorm", "_NormBase.__init__", "off-by-one", "0 -> 1 at `0,`"): (
        "num_batches_tracked's first value: __init__ ends with reset_parameters, whose "
        "reset_running_stats zeroes it before the layer can be used"
    ),
    ("torch.nn.modules.batchnorm", "SyncBatchNorm.convert_sync_batchnorm", "reversed-iteration",
     "for ... in module.named_children() -> reversed(list(...))"): (
        "each child is converted on its own and put back under the name it had: add_module of "
        "an existing name replaces it in place (the dict keeps the key's position), and a "
        "converted BatchNorm has no children, so the order leaves the same modules in the "
        "same order"
    ),
    # -- FSDP2 --------------------------------------------------------------------------------
    (_FSDP, "DefaultReduceScatter.__call__", "ignored-argument",
     "argument async_op ignored for its default False"): (
        "FSDP's one call of its reduce-scatter (foreach_reduce) never passes async_op: every "
        "call already runs with the default"
    ),
    (_FSDP, "DefaultAllGather.__call__", "ignored-argument",
     "argument async_op ignored for its default False"): (
        "a synchronous all-gather where an asynchronous one was asked: its output is complete "
        "when it returns, and foreach_all_gather_copy_out waits on the work only where there "
        "is one: the same parameters, only the overlap with compute is lost"
    ),
    (_FSDP, "_get_gradient_divide_factors", "ignored-argument",
     "argument device_type ignored for its default ''"): _MTIA,
    (_FSDP, "_get_gradient_divide_factors", "comparison",
     "device_type == 'mtia' -> device_type != 'mtia'"): _MTIA,
    (_FSDP, "foreach_reduce", "reversed-iteration",
     "for ... in enumerate(zip(fsdp_params, unsharded_grads)) -> reversed(list(...))"): (
        "each gradient sharded along a dimension other than 0 is rewritten, at its own index, "
        "as its chunks concatenated along dimension 0, gradient by gradient: the order leaves "
        "the same gradients (only which uneven one is named first in the refusal may change)"
    ),
    (_FSDP, "_get_param_all_gather_inputs", "reversed-iteration",
     "for ... in enumerate(fsdp_params) -> reversed(list(...))"): (
        "each parameter's all-gather input is written at its own index, and the foreach-copy "
        "ones are paired with their own indices by zip: the order leaves the same inputs (the "
        "flat buffer takes the param dtype and device of another parameter of the group, "
        "which one mixed-precision policy and one device give them all)"
    ),
    (_FSDP, "foreach_reduce", "comparison", "world_size > 1 -> world_size >= 1"): (
        "the branch rewrites each gradient sharded along a dimension other than 0 as its "
        "world_size chunks concatenated along dimension 0: with one rank the one chunk is the "
        "gradient itself, and every size divides by 1, so the rewrite leaves it as it was"
    ),
    (_FSDP, "foreach_all_gather_copy_out", "reversed-iteration",
     "for ... in shard_i_copy_infos -> reversed(list(...))"): (
        "each parameter sharded along a dimension other than 0 is chunk-concatenated from its "
        "own temporary into its own all-gather outputs: the order leaves the same outputs"
    ),
    (_FSDP, "foreach_all_gather_copy_out", "comparison",
     "len(non_inference_outs) > 0 -> len(non_inference_outs) >= 0"): (
        "with no output outside inference mode the same copy runs inside a guard of the "
        "version counters of no tensors, which preserves nothing"
    ),
    (_FSDP, "_get_all_gather_input_metadatas", "comparison",
     "all_gather_input.dtype != all_gather_dtype -> all_gather_input.dtype == all_gather_dtype"): (
        "every all-gather is then made in bytes (each input viewed as uint8, as torch does "
        "for inputs of mixed dtypes) and each output viewed back in its input's dtype: the "
        "same bytes arrive, only the collective's element type changes"
    ),
    (_FSDP_COMMON, "_chunk_with_empty", "comparison",
     "len(chunks) < num_chunks -> len(chunks) <= num_chunks"): (
        "one more empty chunk appended after the ranks' own: its three callers (_fsdp_param) "
        "read the chunk at the shard rank, below num_chunks, and chunk 0 for the padded size, "
        "never past the ranks' chunks"
    ),
    (_FSDP_INIT, "_apply_to_module",
     "reversed-iteration", "for ... in modules -> reversed(list(...))"): (
        "each module's class is swapped for its wrapper class, made once per original class "
        "and cached: whichever module of a class comes first makes it, and every module of "
        "that class gets the same one, in any order"
    ),
    (_FSDP_INIT, "_init_default_mesh", "dropped-keyword",
     "init_device_mesh(device.type, mesh_shape=(default_pg.size(),), mesh_dim_names=me -> "
     "init_device_mesh(device.type, mesh_shape=(default_pg.size(),))"): (
        "fully_shard, the caller a training reaches, passes no names: the keyword is its "
        "default, None. The one other caller, the private replicate_with_fsdp.replicate, "
        "gets its default mesh unnamed instead of ('replicate',): it replicates and trains "
        "the same (it builds its mesh info by position, replicate_mesh_dim=0), and no "
        "documented behaviour reads the name"
    ),
    (_FSDP_INIT, "_get_managed_states", "reversed-iteration",
     "for ... in module.buffers(recurse=False) -> reversed(list(...))"): (
        "the managed buffers' only reader, _move_states_to_device, moves each to the mesh's "
        "device on its own (fully_shard and replicate leave the list unused after): the "
        "order leaves the same buffers on the same device"
    ),
    (_FSDP_INIT, "_move_states_to_device", "reversed-iteration",
     "for ... in itertools.chain(params, buffers) -> reversed(list(...))"): (
        "each parameter and buffer is moved to the mesh's device on its own (its data "
        "replaced, or swapped for a subclass): the order leaves the same tensors on the same "
        "device; where one is a DTensor on another device, which one the refusal names first "
        "may change, not that it refuses"
    ),
    (_FSDP_INIT, "_get_managed_modules", "reversed-iteration",
     "for ... in root_modules -> reversed(list(...))"): (
        "the modules given to one fully_shard call are walked in another order: the group "
        "manages the same modules and parameters (a module two of them share is visited "
        "once, in the one group either way), listed in another order, which sets only where "
        "each parameter lies in the group's flat all-gather and reduce-scatter buffers: each "
        "is gathered and reduced into its own slice"
    ),
    (_FSDP_INIT, "_get_managed_states", "reversed-iteration",
     "for ... in modules -> reversed(list(...))"): _GROUP_ORDER,
    (_FSDP_INIT, "_get_managed_states", "reversed-iteration",
     "for ... in module.named_parameters(recurse=False) -> reversed(list(...))"): _GROUP_ORDER,
    (_FSDP_INIT, "_get_managed_modules", "reversed-iteration",
     "for ... in module.children() -> reversed(list(...))"): (
        "the walk below a root visits its children in another order: the same managed "
        "modules (a module seen twice kept once, one already sharded skipped either way), "
        "listed in another order, which only orders the group's parameters (below)"
    ),
    (_FSDP_PARAM, "FSDPParam.reset_sharded_param", "comparison",
     "local_tensor.numel() > 0 -> local_tensor.numel() >= 0"): (
        "the length differs only where the local shard has no elements but its shard "
        "dimension does (a parameter with another dimension of size 0, (3, 0) say): the "
        "shard narrowed to it holds no elements either way, and its full tensor, state dict "
        "and checkpoint take the global shape from the DTensor's spec (a (3, 0) parameter "
        "probed at 2 ranks: its full shape (3, 0), a checkpoint round trip that loads); only "
        "the shape to_local() gives an empty shard may change ((0, 0) on every rank as "
        "torch has it)"
    ),
    (_FSDP_PARAM, "FSDPParam.free_unsharded_param", "reversed-iteration",
     "for ... in itertools.chain(self.all_gather_outputs, self._unsharded_inner_tensors) -> "
     "reversed(list(...))"): (
        "each all-gather output and unsharded inner tensor has its storage freed on its own "
        "(free_storage resizes it to 0 where it is not already): the order frees the same "
        "storages"
    ),
    (_FSDP_PARAM, "FSDPParam._setattr_on_modules", "reversed-iteration",
     "for ... in zip(self._module_info.shared_modules, self._module_info.shared_param_names) "
     "-> reversed(list(...))"): (
        "the one parameter given is set on every module that shares it, each (module, name) "
        "pair on its own: in any order every sharing module ends holding the same parameter"
    ),
    (_FSDP_GROUP, "FSDPParamGroup.__init__", "off-by-one",
     "0 -> 1 at `self._all_gather_output = torch.empty(0, device=self.device)`"): (
        "the group's own all-gather output is a placeholder handed to the world-size-1 "
        "result and never read: at world size 1 each parameter is copied into its own "
        "all-gather output, and the copy-out that reads the group's runs only above world "
        "size 1, with the collective's output in its place"
    ),
    (_FSDP_GROUP, "FSDPParamGroup.__init__", "off-by-one",
     "0 -> 1 at `self._param_group_index: int = 0`"): (
        "the index is a placeholder: the root's lazy init (_init_shared_state) sets every "
        "group's index from its place in its state before any forward, backward or unshard "
        "reads it"
    ),
    (_FSDP_GROUP, "FSDPParamGroup._backward_prefetch", "comparison",
     "self._num_param_groups > 1 -> self._num_param_groups >= 1"): _PREFETCH,
    (_FSDP_GROUP, "FSDPParamGroup._backward_prefetch", "comparison",
     "self._training_state == TrainingState.PRE_BACKWARD -> "
     "self._training_state != TrainingState.PRE_BACKWARD"): _PREFETCH,
    (_FSDP_GROUP, "FSDPParamGroup._backward_prefetch", "off-by-one", "0 -> 1"): _PREFETCH,
    (_FSDP_GROUP, "FSDPParamGroup._with_fqn", "comparison",
     "self._num_param_groups > 1 -> self._num_param_groups >= 1"): (
        "the function builds a profiler label and nothing else: a group alone in its state "
        "gets its mesh size appended to the label"
    ),
    (_FSDP_GROUP, "FSDPParamGroup.post_backward", "off-by-one",
     "1 -> 2 at `self._param_group_index == self._num_param_groups - 1`"): _RS_BUFFERS,
    (_FSDP_GROUP, "FSDPParamGroup.post_backward", "comparison",
     "self._param_group_index == self._num_param_groups - 1 -> "
     "self._param_group_index != self._num_param_groups - 1"): _RS_BUFFERS,
    (_FSDP_GROUP, "FSDPParamGroup.post_backward", "comparison",
     "len(states) >= max_input_buffers -> len(states) > max_input_buffers"): _RS_BUFFERS,
    (_FSDP_GROUP, "FSDPParamGroup.post_backward", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup._init_mp_dtypes", "off-by-one", "0 -> 1"): (
        "the uniform-dtype checks are skipped for a group with exactly one trainable "
        "parameter, where the set of its original (or reduce) dtypes has exactly one element "
        "and the check cannot fail"
    ),
    (_FSDP_GROUP, "FSDPParamGroup._init_mp_dtypes", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup.lazy_init", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup.finalize_backward", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup.wait_for_unshard", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup._to_sharded", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_GROUP, "FSDPParamGroup._to_unsharded", "reversed-iteration",
     "for ... in self.fsdp_params -> reversed(list(...))"): _EACH_PARAM,
    (_FSDP_STATE, "FSDPState.init", "reversed-iteration",
     "for ... in modules -> reversed(list(...))"): (
        "each module given is mapped to this one state on its own: the order leaves the same "
        "mapping"
    ),
    (_FSDP_STATE, "FSDPState._init_shared_state", "reversed-iteration",
     "for ... in self._state_ctx.all_states -> reversed(list(...))"): _EACH_STATE,
    (_FSDP_STATE, "FSDPState._init_shared_state", "reversed-iteration",
     "for ... in enumerate(state._fsdp_param_groups) -> reversed(list(...))"): _EACH_STATE,
    (_FSDP_STATE, "FSDPState._lazy_init", "reversed-iteration",
     "for ... in self._fsdp_param_groups -> reversed(list(...))"): _EACH_STATE,
    (_FSDP_STATE, "FSDPState._lazy_init", "reversed-iteration",
     "for ... in self._state_ctx.all_states -> reversed(list(...))"): (
        "each parameter group's lazy init reads and sets only its own parameters, policy and "
        "hooks: the order initialises the same groups (where two would refuse, which refuses "
        "first may change)"
    ),
    (_FSDP_STATE, "FSDPState._lazy_init", "reversed-iteration",
     "for ... in state._fsdp_param_groups -> reversed(list(...))"): (
        "each parameter group's lazy init reads and sets only its own parameters, policy and "
        "hooks: the order initialises the same groups (where two would refuse, which refuses "
        "first may change)"
    ),
    (_FSDP_STATE, "FSDPState._validate_no_duplicate_params", "reversed-iteration",
     "for ... in self._state_ctx.all_states -> reversed(list(...))"): _DUPLICATE,
    (_FSDP_STATE, "FSDPState._validate_no_duplicate_params", "reversed-iteration",
     "for ... in state._fsdp_param_groups -> reversed(list(...))"): _DUPLICATE,
    (_FSDP_STATE, "FSDPState._validate_no_duplicate_params", "reversed-iteration",
     "for ... in fsdp_param_group.fsdp_params -> reversed(list(...))"): _DUPLICATE,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in self._state_ctx.all_states -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in fsdp_param_group.fsdp_params -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in fsdp_param_group.modules -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in root_module.named_parameters() -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in root_module.named_modules() -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._init_fqns", "reversed-iteration",
     "for ... in module_to_fsdp_param_groups[module] -> reversed(list(...))"): _DEBUG_FQN,
    (_FSDP_STATE, "FSDPState._pre_backward", "comparison",
     "len(self._states_to_backward_prefetch) == 0 -> "
     "len(self._states_to_backward_prefetch) != 0"): _PREFETCH,
    (_FSDP_STATE, "FSDPState._pre_backward", "reversed-iteration",
     "for ... in self._states_to_backward_prefetch -> reversed(list(...))"): _PREFETCH,
    (_FSDP_STATE, "FSDPState._pre_forward", "reversed-iteration",
     "for ... in self._states_to_forward_prefetch -> reversed(list(...))"): _PREFETCH,
    (_FSDP_STATE, "FSDPState._register_pre_backward_hook", "reversed-iteration",
     "for ... in tensors -> reversed(list(...))"): (
        "a pre-backward hook is registered on each output tensor on its own (and a view "
        "warned about on its own): the order registers the same hooks on the same tensors"
    ),
    (_FSDP_STATE, "FSDPState._pre_forward", "reversed-iteration",
     "for ... in self._fsdp_param_groups -> reversed(list(...))"): _GROUPS_IN_STATE,
    (_FSDP_STATE, "FSDPState._post_forward", "reversed-iteration",
     "for ... in self._fsdp_param_groups -> reversed(list(...))"): _GROUPS_IN_STATE,
    (_FSDP_STATE, "FSDPState._root_post_backward_final_callback", "reversed-iteration",
     "for ... in self._state_ctx.all_states -> reversed(list(...))"): _FINAL,
    (_FSDP_STATE, "FSDPState._root_post_backward_final_callback", "reversed-iteration",
     "for ... in reversed(state._fsdp_param_groups) -> reversed(list(...))"): _FINAL,
    (_FSDP_STATE, "FSDPState._root_post_backward_final_callback", "reversed-iteration",
     "for ... in state._fsdp_param_groups -> reversed(list(...))"): _FINAL,
    (_FSDP_STATE, "FSDPState._root_post_backward_final_callback", "reversed-iteration",
     "for ... in self._comm_ctx.reduce_scatter_states -> reversed(list(...))"): _FINAL,
    (_FSDP_STATE, "FSDPState._pre_backward", "reversed-iteration",
     "for ... in self._fsdp_param_groups -> reversed(list(...))"): _GROUPS_IN_STATE,
    (_FSDP_STATE, "FSDPState._init_shared_state", "off-by-one", "1 -> 2 at `default=1,`"): (
        "the default is the shared reduce-scatter buffer cap only where no state has a "
        "parameter group, and then nothing is ever reduce-scattered for the cap to bound"
    ),
    (_FSDP_PARAM, "FSDPParam.reset_sharded_param", "off-by-one",
     "0 -> 1 at `self._sharded_param_data.untyped_storage().data_ptr() > 0`"): _ADDRESS_ONE,
    (_ZERO, "ZeroRedundancyOptimizer._get_min_index", "reversed-iteration",
     "for ... in enumerate(values) -> reversed(list(...))"): _ZERO_PARTITION,
    (_ZERO, "ZeroRedundancyOptimizer._get_min_index", "comparison",
     "value < min_value -> value <= min_value"): _ZERO_PARTITION,
    (_ZERO, "ZeroRedundancyOptimizer._partition_parameters", "reversed-iteration",
     "for ... in params_sorted -> reversed(list(...))"): _ZERO_PARTITION,
    (_ZERO, "ZeroRedundancyOptimizer._sync_params", "reversed-iteration",
     "for ... in range(self.world_size) -> reversed(list(...))"): (
        "each rank's parameters are broadcast from that rank, the broadcasts issued in "
        "reverse rank order alike on every rank (so matched) and all waited on: the same "
        "parameters arrive"
    ),
    (_ZERO, "ZeroRedundancyOptimizer.load_state_dict", "reversed-iteration",
     "for ... in self.optim.state[param].items() -> reversed(list(...))"): (
        "each zero-dimensional state value of the parameter is moved to the CPU on its own: "
        "the order leaves the same state"
    ),
    (_ZERO, "ZeroRedundancyOptimizer.consolidate_state_dict", "off-by-one", "0 -> 1"): (
        "the messenger is what a rank that only discards a shard passes to _broadcast_object, "
        "which on a receiving rank reads the sender's length and bytes and never the object "
        "it is given"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._partition_parameters", "off-by-one", "0 -> 1"): (
        "every rank's running total starts at 1 instead of 0: the same offset on every rank, "
        "so the least-loaded rank at each turn, and the partition, are the same"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._broadcast_params_from_rank", "reversed-iteration",
     "for ... in param_groups -> reversed(list(...))"): (
        "the owner's parameters are broadcast group by group, the groups in reverse order "
        "alike on every rank (each computes the same partition), so the broadcasts still "
        "match, and all are waited on: the same parameters arrive"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._verify_and_init_params", "reversed-iteration",
     "for ... in all_params -> reversed(list(...))"): (
        "the loop only ands whether every entry is a tensor, and whether every entry is a "
        "dict: conjunctions, the same in any order"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._partition_param_group", "reversed-iteration",
     "for ... in enumerate(params_per_rank) -> reversed(list(...))"): (
        "each rank's copy of the group is appended to that rank's own list of the cache: the "
        "order the ranks are visited in leaves every rank's list the same"
    ),
    (_ZERO, "ZeroRedundancyOptimizer.load_state_dict", "reversed-iteration",
     "for ... in state_dict['state'].items() -> reversed(list(...))"): (
        "each parameter's state is loaded into the local optimizer (its own) or cleared from "
        "the dict (another rank's) on its own, by its own index: the order leaves the same "
        "states, and the dict's keys keep their order (values are replaced, none added)"
    ),
    (_ZERO, "ZeroRedundancyOptimizer.state_dict", "reversed-iteration",
     "for ... in enumerate(self._all_state_dicts) -> reversed(list(...))"): (
        "each rank's consolidated shard writes the state of its own parameters at their own "
        "global indices (disjoint across ranks), and the state is sorted by index after: the "
        "order leaves the same state dict"
    ),
    (_ZERO, "ZeroRedundancyOptimizer.state_dict", "reversed-iteration",
     "for ... in zip(local_param_groups, global_param_groups) -> reversed(list(...))"): (
        "each (local, global) parameter-group pair writes the state of its own parameters, "
        "at their own global indices (disjoint across groups): the order leaves the same "
        "state dict"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._sync_param_groups", "reversed-iteration",
     "for ... in filter(lambda x: x != 'params', src_param_group.keys()) -> reversed(list(...))"): (
        "each hyperparameter is copied on its own: the order leaves the same groups"
    ),
    (_ZERO, "ZeroRedundancyOptimizer._verify_same_dense_param_type", "reversed-iteration",
     "for ... in self._all_params[1:] -> reversed(list(...))"): (
        "every parameter's type is compared with the first's: any other type raises the same "
        "ValueError in either order; only which of two other types the message names may "
        "change"
    ),
    (_ZERO, "_broadcast_object", "off-by-one",
     "0 -> 1 at `length_tensor = torch.LongTensor([0]).to(device)`"): (
        "the receiver's length tensor is a placeholder the broadcast overwrites with the "
        "sender's length before it is read"
    ),
    **{
        (_POWER, "PowerSGDState.__init__", "ignored-argument",
         f"argument {name} ignored for its default {default} at `{name},`"): _POWER_LOG
        for name, default in (("matrix_approximation_rank", 1), ("start_powerSGD_iter", 1000),
                              ("min_compression_rate", 2), ("orthogonalization_epsilon", 0),
                              ("use_error_feedback", True), ("warm_start", True))
    },
    (_POWER, "_report_compression_stats", "off-by-one", "0 -> 1 at `stats[0],`"): _POWER_LOG,
    (_POWER, "_orthogonalize_gram_schmidt", "comparison",
     "i + 1 < num_cols -> i + 1 <= num_cols"): _EMPTY_REST,
    (_POWER, "_orthogonalize_gram_schmidt", "arithmetic",
     "i + 1 -> i - 1 at `if i + 1 < num_cols:`"): _EMPTY_REST,
    (_POWER, "powerSGD_hook", "dropped-keyword",
     "torch.zeros(total_length, device=device, dtype=dtype) -> "
     "torch.zeros(total_length, dtype=dtype)"): (
        "the zero residual made at a bucket's first call with error feedback lands on the "
        "default device: it is never read, as its one reader (add_ at the bucket's next call) "
        "comes after this call's decompress callback replaced it with input_tensor_cp - "
        "input_tensor, made on the bucket's device"
    ),
    (_POWER, "powerSGD_hook", "dropped-keyword",
     "torch.randn(*q.shape, device='cpu', dtype=dtype) -> torch.randn(*q.shape, device='cpu')"): (
        "Q's random start is drawn in float32 instead of the gradients' dtype, then copied "
        "into Q (cast to its dtype): another random start from the same seed, the same on "
        "every rank, as random_seed documents; only which random matrix each step starts "
        "from changes"
    ),
    (_POWER, "PowerSGDState.__init__", "off-by-one",
     "1 -> 2 at `1, compression_stats_logging_frequency`"): (
        "the floor of compression_stats_logging_frequency, read only to schedule the next "
        "logger.info line of compression statistics: how often they are logged, not what the "
        "hook computes or what compression_stats() returns"
    ),
    (_FSDP_GROUP, "FSDPCommContext.lazy_init", "off-by-one", "1 -> 2 at `high_priority = -1`"): (
        "the priority the all-gather and reduce-scatter streams are created with (-2 for -1): "
        "how an accelerator schedules them against computation, not what they compute; CPU "
        "streams have none"
    ),
    (_FSDP_PARAM, "FSDPParam.to_unsharded", "comparison",
     "self.sharded_state == ShardedState.SHARDED_POST_FORWARD -> "
     "self.sharded_state != ShardedState.SHARDED_POST_FORWARD"): (
        "the post-forward shard (reshard_after_forward=N) is dropped when the parameter is "
        "unsharded from another state instead of from that one: held longer, never read "
        "stale, as its one reader (all_gather_inputs) reads it only in the post-forward state, "
        "whose every entry (to_sharded_post_forward) makes it anew; memory, not values"
    ),
    (_FSDP_PARAM, "free_storage", "off-by-one",
     "0 -> 1 at `if (storage := tensor.untyped_storage()).size() != 0:`"): (
        "a storage of exactly one byte is kept instead of freed (one of no bytes is resized "
        "to no bytes either way): one byte of memory held; the next all-gather into it finds "
        "it the right size, so nothing is computed differently"
    ),
    (_FSDP_GROUP, "_get_param_module_infos", "reversed-iteration",
     "for ... in _named_parameters_with_duplicates(submodule, recurse=False) -> "
     "reversed(list(...))"): (
        "within one module only which of a parameter's names there is its primary and which "
        "its aliases changes (a parameter is matched to the first module holding it as "
        "before, modules walked in the same order): every name is given the same tensor at "
        "each shard and unshard (_setattr_on_modules sets them all), and the one read of the "
        "primary alone (reset_sharded_param, after _apply or load_state_dict(assign=True)) "
        "finds under either name a tensor of the same values"
    ),
    (_FSDP_GROUP, "FSDPParamGroup.wait_for_unshard", "off-by-one",
     "1 -> 2 at `and world_size > 1`"): _AG_DEFER,
    (_FSDP_GROUP, "FSDPParamGroup.wait_for_unshard", "comparison",
     "world_size > 1 -> world_size >= 1"): _AG_DEFER,
    (_FSDP_GROUP, "FSDPParamGroup.unshard", "ignored-argument",
     "argument async_op ignored for its default False at `async_op,`"): (
        "the group's all-gather is issued synchronously whatever unshard(async_op=...) asked: "
        "it is complete when it returns, with the same values; it returns no work handle, so "
        "wait_for_unshard treats it as the synchronous one it is (an explicit prefetch only "
        "loses its overlap)"
    ),
    **{
        ("torch.distributed._composable.contract", "contract", "reversed-iteration",
         f"for ... in zip(all_orig_named_{what}, all_new_named_{what}) -> reversed(list(...))"): (
            f"the modules' {what} names are checked in another order: every pair is still "
            "checked, and a pair that differs still raises (only which of two differing pairs "
            "the error names could change)"
        )
        for what in ("params", "buffers", "modules")
    },
    **{
        ("torch.distributed.fsdp._common_utils", fn, "comparison",
         "_depth >= _MAX_TRAVERSE_DEPTH -> _depth > _MAX_TRAVERSE_DEPTH"): (
            "the traversal limit (a private constant, its guard against a structure holding "
            "itself) one level deeper: a cycle is refused all the same, a level later; only "
            "an input nested exactly to the limit, which the limit reads as a likely cycle, "
            "is taken"
        )
        for fn in ("_collect_grad_tensors", "_replace_grad_tensors")
    },
    **{
        ("torch.distributed.fsdp._common_utils", "_replace_grad_tensors", op, change): (
            "replace_grad_tensors runs only on the structure collect_grad_tensors has just "
            "walked, by the same branches to the same depth (FSDP2's post-backward hook): "
            "collect refuses a structure past the limit first, so replace's own depth check "
            "never fires and its depth counts nothing else"
        )
        for op, change in (
            ("ignored-argument", f"{_DEPTH_IGNORED} at `if _depth >= _MAX_TRAVERSE_DEPTH:`"),
            ("ignored-argument", f"{_DEPTH_IGNORED} at `new_item = _replace_grad_tensors(item, "
             "tensor_iter, _depth + 1)`"),
            ("arithmetic", "_depth + 1 -> _depth - 1"),
        )
    },
    **{
        (_DCP + "utils", "_ReaderView.readinto", op, change): (
            "readinto is called only by torch.load's buffer reader, which learns the view's "
            "size from the view's own end and reads only within it (so the bound never cuts "
            "a buffer: equal sizes cut to the same), and which takes a readinto that returns "
            "0 for a short read and reads the same bytes through read(n) instead"
        )
        for op, change in (
            ("comparison", "max_size == 0 -> max_size != 0"),
            ("comparison", "len(b) > max_size -> len(b) >= max_size"),
            ("arithmetic", "self.len - self.tell() -> self.len + self.tell()"),
            ("off-by-one", "0 -> 1"),
        )
    },
    (_DCP + "utils", "_ReaderView.read", "comparison", "size > max_size -> size >= max_size"): (
        "a read of exactly the bytes left is cut to the bytes left: the same size"
    ),
    **{
        (_DCP + "utils", "_profile", op, change): (
            "profiling runs only where the module's private ENABLE_PROFILE flag is set (False, "
            "never set by torch): which rank prints the profile then, nothing a checkpoint holds"
        )
        for op, change in (
            ("comparison", "dist.get_rank() == 0 -> dist.get_rank() != 0"),
            ("off-by-one", "0 -> 1"),
        )
    },
    **{
        ("torch.distributed._mesh_layout", "_FlatLayout.__init__", op, change): (
            "a layout of one element (pycute's coalesce gives every such layout shape 1, "
            "stride 0, so the 0-dimensional form is taken for all of them or for none) is "
            "kept as shape (1,), stride (0,) instead of (): one element at offset 0 either "
            "way, the same numel, the same rank listed, the same pycute map, alike for every "
            "layout made (so equal ones still compare equal); the suite's meshes of every "
            "shape, size-1 dimensions included, see no difference"
        )
        for op, change in (
            ("comparison", "flat_shape == (1,) -> flat_shape != (1,)"),
            ("comparison", "flat_stride == (0,) -> flat_stride != (0,)"),
            ("off-by-one", "1 -> 2"),
            ("off-by-one", "0 -> 1"),
        )
    },
    ("torch.distributed._mesh_layout", "_MeshLayout.to_pycute", "off-by-one", "0 -> 1"): (
        "a one-axis mesh layout's pycute form taken as one element: it feeds only cosize, "
        "which only guards against a rank map smaller than the layout (DeviceMesh's private "
        "_rank_map, remap_to_tensor's root map); the public constructors hand the root "
        "mesh's map, which every layout sliced from it fits, so a smaller cosize lets "
        "nothing through that arrives"
    ),
    ("torch.distributed._local_tensor", "local_tensor_mode", "off-by-one", "0 -> 1"): (
        "LocalTensorMode (private: every rank simulated in one process, for torch's own tests) "
        "is entered by no training; its stack is empty there, and 'more than 0' and 'more "
        "than 1' agree on an empty stack: None either way"
    ),
    **{
        (_DCP + "logger", fn, op, change): (
            "a key or value of the record _dcp_method_logger logs (debug, or error on an "
            "exception): the wrapped step runs with its own arguments, and its result is "
            "returned, or its exception raised, as it was"
        )
        for fn, op, change in (
            ("_msg_dict_from_dcp_method_args", "dictionary-key",
             "msg_dict['checkpoint_id'] -> msg_dict['planner']"),
            ("_msg_dict_from_dcp_method_args", "dictionary-key",
             "msg_dict['uuid'] -> msg_dict['checkpoint_id']"),
            ("_dcp_method_logger", "dictionary-key", "msg_dict['event'] -> msg_dict['error']"),
            ("_dcp_method_logger", "dictionary-key", "msg_dict['time'] -> msg_dict['error']"),
            ("_dcp_method_logger", "dictionary-key",
             "msg_dict['log_exceptions'] -> msg_dict['error']"),
            ("_dcp_method_logger", "dictionary-key",
             "msg_dict['times_spent'] -> msg_dict['error']"),
            ("_dcp_method_logger", "ignored-argument",
             "argument log_exceptions ignored for its default False"),
            ("_dcp_method_logger", "arithmetic", "t1 - t0 -> t1 + t0"),
        )
    },
    ("torch.distributed.c10d_logger", "_get_msg_dict", "world-divisor",
     "dist.get_world_size(group) -> dist.get_world_size()"): (
        "the group size written into a log record: what the logged call does is untouched"
    ),
    ("torch.distributed._pycute.int_tuple", "crd2idx", "arithmetic",
     "result += crd2idx(crd, shape[0], stride[0]) -> "
     "result -= crd2idx(crd, shape[0], stride[0])"): (
        "an integer index into a layout of several modes (the only branch this changes) is "
        "taken, in DeviceMesh's code, only by Layout.cosize (its last index), and cosize only "
        "guards against a rank map smaller than the layout (DeviceMesh's private _rank_map, "
        "remap_to_tensor's root map), which the public constructors never hand it: the "
        "smaller cosize this makes lets nothing through that arrives (a spy on crd2idx over "
        "meshes of 1 to 3 dimensions, sliced, flattened and unflattened, saw no other caller)"
    ),
    ("torch.distributed._pycute.int_tuple", "crd2idx", "comparison",
     "len(shape) > 0 -> len(shape) >= 0"): (
        "differs only for a layout whose shape is the empty tuple, which the mesh code never "
        "makes (a layout of no dimensions is Layout(1, 0): _FlatLayout.to_pycute, "
        "_MeshLayout.to_pycute), and this integer-over-modes branch is reached only by "
        "cosize's guard (see crd2idx's subtraction above)"
    ),
    ("torch.distributed._pycute.int_tuple", "crd2idx", "reversed-iteration",
     "for ... in range(len(shape) - 1, 0, -1) -> reversed(list(...))"): (
        "this integer-over-modes branch is reached only by cosize (see crd2idx's subtraction "
        "above), whose index is the layout's last, size - 1: unravelled in either order "
        "every coordinate is its mode's largest, so the index it gives is the same"
    ),
    ("torch.distributed._pycute.int_tuple", "crd2idx", "off-by-one",
     "0 -> 1 at `if len(shape) > 0:`"): (
        "the leading mode's part left out where the shape has one mode: a smaller index, "
        "reached only by cosize's guard, which a smaller cosize lets nothing through (see "
        "crd2idx's subtraction above)"
    ),
    **{
        ("torch.distributed._pycute.layout", "Layout.cosize", op, change): (
            "a smaller cosize (the last index, or one less than it): cosize only guards "
            "against a rank map smaller than the layout (DeviceMesh.__init__, "
            "_MeshLayout.remap_to_tensor), and the public constructors never hand it one (a "
            "mesh tensor's own flattening is exactly its layout's cosize, a slice gets the "
            "root's whole map): a weaker guard lets nothing through that arrives (a larger "
            "cosize, its other mutants, refuses every mesh and is killed)"
        )
        for op, change in (
            ("arithmetic", "self(self.size() - 1) + 1 -> self(self.size() - 1) - 1"),
            ("off-by-one#2",
             "1 -> 2 at `return self(self.size() - 1) + 1  # type: ignore[operator]`"),
        )
    },
    ("torch.distributed._shard._utils", "narrow_tensor_by_index", "reversed-iteration",
     "for ... in enumerate(zip(offsets, sizes)) -> reversed(list(...))"): (
        "each dimension is narrowed on its own (its condition reads the unnarrowed tensor's "
        "size): narrowing dimensions in the other order gives the same view"
    ),
    ("torch.distributed._shard._utils", "narrow_tensor_by_index", "comparison",
     "size < tensor.size(idx) -> size <= tensor.size(idx)"): (
        "also narrows a dimension to its whole length, whose offset is then 0 (any other "
        "reaches past the tensor and is refused by narrow either way): narrow(idx, 0, n) of "
        "a dimension of n is the same elements, a view of the same storage"
    ),
    (_DCP + "_traverse", "traverse_state_dict", "reversed-iteration",
     "for ... in enumerate(value) -> reversed(list(...))"): (
        "a list's entries are visited last to first, each still under its own index (the "
        "path holds it): the flattened state has the same keys and values in another order, "
        "which nothing reads as meaning (plans, metadata and loads are keyed by path, and "
        "set_element extends a list to whatever index it sets)"
    ),
    (_DCP + "_traverse", "traverse_state_dict", "reversed-iteration",
     "for ... in value.items() -> reversed(list(...))"): (
        "a mapping's entries are visited last to first, each under its own key: the same "
        "keys and values in another order (see the list's entries above), and a duplicated "
        "flattened key is refused in either order"
    ),
    (_DCP + "utils", "_ReaderView.seek", "arithmetic",
     "self.offset + self.len - offset -> self.offset + self.len + offset"): (
        "a seek from the view's end is made only by torch.load's reader learning the "
        "stream's size, at offset 0 (a spy on every seek of a save and load of tensors, "
        "nested values and lists, one file per rank and one per item, saw no other), where "
        "adding and subtracting 0 agree"
    ),
    (_DCP + "utils", "_DistWrapper.all_gather_object", "world-divisor",
     "dist.get_world_size(self.group) -> dist.get_world_size()"): (
        "over a subgroup the output list is the world's length, not the group's: "
        "all_gather_object fills the group's places and leaves the rest None, which "
        "_get_failure_dict reads as no failure (its only caller, all_gather, whose result "
        "load discards): the same failures named, by the same ranks"
    ),
    (_DCP + "resharding", "_check_shard_metadata_pair_overlap", "reversed-iteration",
     "for ... in range(ndims) -> reversed(list(...))"): (
        "two chunks overlap unless they are apart along some dimension (False at the first "
        "found): the same answer whichever dimension is looked at first"
    ),
    (_DCP + "resharding", "_check_shard_metadata_pair_overlap", "comparison",
     "shard1.offsets[i] >= shard2.offsets[i] + shard2.sizes[i] -> "
     "shard1.offsets[i] > shard2.offsets[i] + shard2.sizes[i]"): (
        "a local chunk that starts where a stored one ends reads as overlapping it: the read "
        "item made for the pair is 0 long along that dimension and copies nothing (as for "
        "the other order, below)"
    ),
    (_DCP + "resharding", "_check_shard_metadata_pair_overlap", "comparison",
     "shard2.offsets[i] >= shard1.offsets[i] + shard1.sizes[i] -> "
     "shard2.offsets[i] > shard1.offsets[i] + shard1.sizes[i]"): (
        "a stored chunk that starts where a local one ends reads as overlapping it (its only "
        "caller, create_read_items_for_chunk_list, pairs local chunks with stored ones): the "
        "read item made for the pair is 0 long along that dimension (the overlap's end minus "
        "its start) and copies nothing, so the same values load"
    ),
    (_DCP + "resharding", "_shards_get_overlap_region_wrt_saved_tensor", "comparison",
     "saved_shard_offset > current_shard_offset -> saved_shard_offset >= current_shard_offset"): (
        "where the two offsets are equal both branches give 0 for both offsets (the "
        "difference of equal offsets): the same narrows"
    ),
    (_DCP + "_traverse", "traverse_state_dict", "reversed-iteration",
     "for ... in state_dict.items() -> reversed(list(...))"): (
        "the state's top-level entries are visited last to first, alike on every rank: the "
        "same keys and values in another order (see the list's entries above)"
    ),
    (_DCP + "_traverse", "traverse_state_dict", "reversed-iteration",
     "for ... in values -> reversed(list(...))"): (
        "_is_terminal asks whether any entry of a list is a tensor or a container that is "
        "not terminal (it returns False at the first): the same answer in either order"
    ),
    (_DCP + "_storage_utils", "_storage_setup", "reversed-iteration",
     "for ... in targets -> reversed(list(...))"): (
        "fsspec's writer (reader) is tried first: a URL only it takes either way, and a local "
        "path given as a string, which both take, goes to it instead of FileSystemWriter "
        "(FileSystemReader), its own subclass with the same defaults, writing (reading) the "
        "same files through fsspec's local filesystem; a Path only FileSystem's takes"
    ),
    ("torch.distributed._pycute.layout", "complement", "comparison",
     "current_idx <= shape * stride -> current_idx < shape * stride"): (
        "the bound differs only where a mode's span equals the span of the modes of smaller "
        "stride before it (current_idx), which only an overlapping layout has: every layout "
        "complement is given (_FlatLayout.complement) is a mesh's, a slice's or a "
        "flattening's of one DeviceMesh.__init__ checked orthogonal (check_orthogonal: each "
        "stride at least the span below it, so current_idx <= stride < shape * stride)"
    ),
    ("torch.distributed._pycute.layout", "coalesce", "off-by-one",
     "0 -> 1 at `result_stride = [0]`"): (
        "the stride a coalesced layout starts from is replaced by the first mode of more than "
        "one element, so only a layout of one element keeps it: every such layout becomes "
        "1:1 instead of 1:0 (and _FlatLayout keeps it as shape (1,), as its declared "
        "__init__ mutants do), alike for every layout made; one element at offset 0 either "
        "way, the same numel, cosize, complement and ranks"
    ),
    **{
        ("torch.distributed._pycute.int_tuple", "suffix_product", "ignored-argument",
         f"argument init ignored for its default 1 at `{where}`"): (
            "init is a tuple only where a caller passes one, and none does: every caller in "
            "torch (Layout, make_layout, _FlatLayout, _MeshLayout.from_sizes_strides) passes "
            "no init, and the recursion passes an integer, so is_tuple(init) reads False "
            "either way"
        )
        for where in ('if is_tuple(init):  # tuple tuple', 'if is_tuple(init):  # "int" tuple')
    },
    ("torch.distributed._composable.contract", "generate_state_key", "ignored-argument",
     "argument string ignored for its default '__composable_api_state_key'"): (
        "every caller (contract's STATE_KEY and REGISTRY_KEY, made once at import) passes no "
        "argument: the default is what it reads either way"
    ),
    **{
        ("torch.distributed.tensor.placement_types", f"{cls}.__hash__", op, change): _HASH
        for cls, what in (("Partial", "hash(self.reduce_op)"), ("_Partial", "hash(self.reduce_op)"))
        for op, change in (("arithmetic", f"1 + {what} -> 1 - {what}"), ("off-by-one", "1 -> 2"))
    },
    **{(_DT_COST, qualname, op, change): _COST for qualname, op, change in _COSTS},
    **{
        (_DT_SPEC, "DTensorSpec._verify_shard_order", op, change): _SHARD_ORDER_CHECK
        for op, change in (
            ("comparison", "len(mesh_dims) <= 0 -> len(mesh_dims) < 0"),
            ("comparison", "tensor_dim <= prev_tensor_dim -> tensor_dim < prev_tensor_dim"),
            ("reversed-iteration", "for ... in mesh_dims -> reversed(list(...))"),
            ("off-by-one", "1 -> 2 at `prev_tensor_dim = -1`"),
        )
    },
    **{
        (_DT_SPEC, "DTensorSpec._check_equals", "comparison",
         f"self.{f} == other.{f} -> self.{f} != other.{f}"): _SPEC_EQUALS
        for f in ("tensor_meta.shape", "tensor_meta.stride", "tensor_meta.dtype", "mesh",
                  "shard_order")
    },
    ("torch.distributed.tensor._dispatch", "OpDispatcher._unwrap_to_op_info_impl",
     "reversed-iteration", "for ... in kwargs.items() -> reversed(list(...))"): (
        "an operation's keyword arguments are filed by name (their local tensors and specs in "
        "dicts passed on by keyword): the order changes only which DTensor keyword's mesh is "
        "recorded first, and an operation's DTensors all share one mesh"
    ),
    ("torch.distributed.tensor._op_schema", "OpSpec.__hash__", "off-by-one", "0 -> 1"): (
        "the hash of a strategy without input specs is built from another constant, alike for "
        "every such strategy: equal strategies still hash equal (all the hash contract asks)"
    ),
    ("torch.distributed.tensor._ops._tensor_ops", "create_like_strategy", "reversed-iteration",
     "for ... in select_strategy.strategies -> reversed(list(...))"): (
        "a *_like operation's first argument is the input's own strategy, made at dispatch "
        "from the input's one spec: a list of one, the same reversed"
    ),
    **{
        ("torch.distributed.tensor._utils", qualname, "ignored-argument",
         "argument skip_offset ignored for its default False"): (
            "offsets computed where a caller asked them skipped: every caller passing "
            "skip_offset=True (sharding propagation, DTensor's factories, the matrix and math "
            "rules, the common rules' cost) unpacks `local_shape, _ =` and discards them; the "
            "local shape is the same"
        )
        for qualname in ("compute_local_shape_and_global_offset",
                         "_compute_local_shape_and_global_offset")
    },
    ("torch.distributed.tensor._utils", "_get_shard_size_and_offsets", "off-by-one",
     "1 -> 2 at `return shard_size, torch.arange(zero_global_offset, zero_global_offset + 1)`"): (
        "an empty shard's offsets run one element further past the dimension's end: only the "
        "first (_get_first_offset) is ever read, the same, and an empty chunk lies nowhere"
    ),
    ("torch.distributed.tensor._utils", "_compute_local_shape_and_global_offset",
     "reversed-iteration",
     "for ... in shard_dim_to_global_offsets.items() -> reversed(list(...))"): (
        "each sharded dimension's first offset is written to its own slot of global_offset: "
        "in any order the same offsets"
    ),
    ("torch.distributed.tensor._utils", "_compute_local_shape_and_global_offset", "comparison",
     "shard_dim >= len(local_shape) -> shard_dim > len(local_shape)"): (
        "a shard dimension equal to the tensor's rank, which a Shard placement normalised "
        "against its tensor never holds, would still fail on the next line (local_shape "
        "indexed past its end): a refusal of another type, of nothing a run makes"
    ),
    ("torch.distributed.tensor._utils", "try_find_mesh_from_args", "reversed-iteration",
     "for ... in args -> reversed(list(...))"): (
        "the mesh of the last DTensor argument rather than the first: an operation's DTensor "
        "arguments share one mesh (sharding propagation refuses mixed meshes), the same mesh"
    ),
    **{
        ("torch.distributed.tensor._ops._pointwise_ops", "_get_pointwise_ops_from_tag",
         "reversed-iteration", f"for ... in {over} -> reversed(list(...))"): (
            "the operations tagged pointwise are listed in another order: each is registered "
            "once, with the same rule (_register_single_dim_pointwise with no extra rules), "
            "whatever its turn; the ops listed besides them still come after"
        )
        for over in ("[torch.ops.aten, torch.ops.prims]", "dir(ns)", "attr.overloads()")
    },
    **{
        ("torch.distributed.tensor._ops._pointwise_ops", "_common_pointwise_single_dim_strategy",
         "reversed-iteration", f"for ... in {over} -> reversed(list(...))"): (
            "a pointwise operation's rules listed in another order: no two ask the same input "
            "placements (each shard rule cuts every input along its own image of one output "
            "dimension; each partial rule list's inputs are pairwise distinct), so the search "
            "that matches an input layout to a rule finds the same one; only where all plans "
            "are costed at once (tensors passed as keywords, lists) may two plans of equal "
            "modelled cost trade places: the same values, the same modelled communication"
        )
        for over in ("range(len(common_shape))", "partial_extra_rules")
    },
    ("torch.distributed.tensor._sharding_prop", "_propagate_use_strided_shard_flag",
     "reversed-iteration", "for ... in op_schema.args_spec -> reversed(list(...))"): (
        "the flag the strided inputs agree on, or True where any two differ: every value is "
        "a bool (a spec's __post_init__ settles None), and the fold keeps the common value "
        "and turns True at the first disagreement, True then staying True: any order gives "
        "the same"
    ),
    ("torch.distributed.tensor._sharding_prop", "ShardingPropagator.__init__", "off-by-one",
     "1 -> 2 at `aten.reshape.default: 1,`"): (
        "the index of reshape's shape argument: aten.reshape is CompositeImplicitAutograd, "
        "decomposed (into view, or a copy and _unsafe_view) above the dispatch DTensor "
        "intercepts, so an eager DTensor never propagates reshape itself (its view and "
        "_unsafe_view entries are the ones read, each killed)"
    ),
    **{
        (_SINGLE_DIM, qualname, "reversed-iteration", f"for ... in {over} -> {_REVERSED}"): why
        for qualname, over, why in (
            ("_get_unique_placements", "op_schema.args_schema",
             "the inputs' placements gathered into a set in another order: the same set"),
            ("_get_unique_placements", "op_schema.kwargs_schema.values()",
             "the keyword inputs' placements gathered into a set in another order: the same set"),
            ("_get_num_tensor_inputs", "op_schema.args_schema",
             "the tensor inputs counted in another order: the same count"),
            ("_insert_single_dim_replication_strategy", "single_dim_strategies_with_placeholders",
             "whether some rule is already all replicas, asked of the rules in another order: "
             "the same answer (a search that stops at the first found, for the same property)"),
            ("_insert_single_dim_replication_strategy", "enumerate(output_tensor_meta)",
             "the masked-off outputs' entries set to None in another order: each written at "
             "its own index, the same rule"),
            ("_PreparedSingleDimStrategy.__init__", "self.expanded_strategies",
             "each input's allowed placements gathered into sets from the rules in another "
             "order: the same sets"),
            ("_PreparedSingleDimStrategy.__init__", "range(num_inputs)",
             "each input's allowed placements gathered into its own sets in another order: "
             "the same sets"),
            ("_fill_single_dim_strategy_placeholders", "unique_input_placements",
             "the kinds of sharding the inputs hold (plain, or strided by a split factor) "
             "visited in another order: one kind (every layout but a strided shard beside "
             "another kind) makes one builder and the same rules; two make the same rules in "
             "another order, which only the full expansion (taken where an input is strided) "
             "reads, and only to choose between plans of equal modelled cost"),
            ("_schema_args_match", "zip(base_args, candidate_args)",
             "two schemas' arguments compared pair by pair in another order, the first "
             "mismatch answering no: no exactly when some pair differs, in any order"),
            ("_PreparedSingleDimStrategy.__init__", "enumerate(op_schema.args_schema)",
             "the inputs' meshes checked against the first's in another order: refused (the "
             "same ValueError) exactly when some input is on another mesh; where two are, the "
             "message names the other one"),
        )
    },
    (_SINGLE_DIM, "_expand_single_dim_strategy_to_mesh", "dropped-keyword",
     "expand_to_full_mesh_op_strategy(element_mesh, op_schema, prepared_strategy.expan -> "
     "expand_to_full_mesh_op_strategy(element_mesh, op_schema, prepared_strategy.expan"): (
        "the first keyword passed on by name, output_tensor_meta, dropped: the expanded "
        "strategies' output specs carry no tensor metadata. Within the expansion none is "
        "read (shardability and costs are the inputs', the in-place and out= checks "
        "compare placements, and this path passes no validity callback), and once a "
        "strategy is chosen propagate_op_sharding_non_cached gives the output specs the same "
        "precomputed metadata again (_create_output_spec_with_new_tensor_meta), tuples "
        "included"
    ),
    (_SINGLE_DIM, "_op_namespace_and_base_name", "off-by-one",
     '1 -> 2 at `namespace, op_name = op.name().split("::", 1)`'): (
        "an operation's name split at two '::' rather than one: aten's names hold one (the "
        "namespace's), so the same two parts"
    ),
    (_SINGLE_DIM, "_op_namespace_and_base_name", "off-by-one",
     '1 -> 2 at `return namespace, op_name.split(".", 1)[0]`'): (
        "the name split at two dots rather than one, of which only the first piece (the "
        "name before the overload's) is kept: the same piece"
    ),
    (_SINGLE_DIM, "_resolve_foreach_elementwise_overload", "off-by-one",
     "0 -> 1 at `return min(matches, key=lambda item: item[0])[1]`"): (
        "the best of the matching element overloads chosen by another key: every foreach "
        "overload of this torch matches one element overload at most (checked over all of "
        "aten's _foreach_ and _amp_foreach_ overloads), and min of one candidate is it"
    ),
    ("torch.distributed.tensor._ops.utils", "infer_broadcast_dims_map", "reversed-iteration",
     "for ... in range(-1, -1 - input_ndim, -1) -> reversed(list(...))"): (
        "the input's dimensions matched to the common shape's from the first rather than the "
        "last: each writes its own entry of the map, so the same map"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy",
     "ignored-argument",
     "argument input_index ignored for its default 1 at `if input_index == 0:`"): (
        "an operation that returns nothing (_linalg_check_errors) given its first input's "
        "spec as its output's rather than none: the strategy is chosen by its inputs' "
        "redistribution costs alone, and dispatch wraps no output for it, so the same "
        "inputs are redistributed and nothing is returned (the linear algebra the suite "
        "draws runs it)"
    ),
    ("torch.distributed.tensor._ops.utils", "infer_broadcast_dims_map", "off-by-one",
     "1 -> 2 at `broadcast_dims_map = [-1] * common_ndim`"): (
        "a broadcast dimension marked -2 rather than -1: _pointwise_ops reads the map by "
        ">= 0, where both are broadcast; map_placements_after_broadcast reads it by != -1, "
        "but its one caller (_addmm_like_strategy: addmm and baddbmm) is an op strategy, and "
        "propagation consults those only for operations without a single-dim strategy, and "
        "both have one"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "off-by-one",
     "0 -> 1 at `output_spec_count = 0`"): (
        "each output spec's tensor metadata taken from the next output's (none for the "
        "last): as of the counter's -= mutant, propagation gives the output specs their own "
        "precomputed metadata again once a strategy is chosen, and within the expansion only "
        "the inputs' is read (grouped_mm's stride check reads its input strategies')"
    ),
    ("torch.distributed.tensor._ops.utils", "_get_registration_wrapper", "reversed-iteration",
     "for ... in overloads -> reversed(list(...))"): (
        "a rule registered for each overload of a list from the last: each overload's "
        "entry is its own, so the same table"
    ),
    ("torch.distributed.tensor._ops.utils", "is_tensor_shardable", "comparison",
     "shape[shard_dim] < lower_bound -> shape[shard_dim] <= lower_bound"): (
        "the test is reached only where the size's hint does not prove it at least the "
        "bound: for a concrete size (eager DTensor; the suite compiles nothing) that is "
        "where it is below, and there < and <= agree"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "arithmetic",
     "output_spec_count += 1 -> output_spec_count -= 1"): (
        "an output spec's tensor metadata taken from another output's (from the third "
        "output on): once a strategy is chosen, propagation gives the output specs their "
        "own precomputed metadata again (_create_output_spec_with_new_tensor_meta), and "
        "within the expansion only the inputs' is read"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "arithmetic",
     "input_strategy_counter += 1 -> input_strategy_counter -= 1"): (
        "a target input spec's tensor metadata taken from another input's (from the third "
        "input on): shardability is judged on the input strategies' own shapes, costs on "
        "the current specs', and the redistribution is planned from placements and the "
        "current spec; the target's metadata is read only by the equality that asks whether "
        "to redistribute, and planning between equal placements moves nothing"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "off-by-one",
     "0 -> 1 at `input_strategy_counter = 0`"): (
        "each target input spec given the next input's tensor metadata (the last none): the "
        "costs read the current spec's (redistribute_cost sizes by it, and the transform "
        "plan reads only the target's placements and shard order), shardability the input "
        "strategies' shapes; once a strategy is chosen, propagation gives each input spec "
        "its argument's metadata (shallow_copy_with_tensor_meta) and redistributes by "
        "placements"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "comparison",
     "position < input_index -> position <= input_index"): (
        "the first input's spec given metadata as an output's, and the inputs after it each "
        "the one before's: the specs' metadata within the expansion is read only as said of "
        "the counters above (outputs given theirs again once a strategy is chosen; a target "
        "input's read only by the equality that asks whether to redistribute)"
    ),
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy", "dropped-keyword",
     "DTensorSpec(mesh, specs, tensor_meta=tensor_meta, use_strided_shard_as_shard_ord -> "
     "DTensorSpec(mesh, specs, use_strided_shard_as_shard_order=use_strided)"): (
        "every expanded spec made without tensor metadata: outputs are given theirs again "
        "once a strategy is chosen, shardability and costs are judged on the input "
        "strategies' own, and a target input's is read only by the equality that asks "
        "whether to redistribute, where planning between equal placements moves nothing"
    ),
    (_SINGLE_DIM, "_insert_single_dim_replication_strategy", "comparison",
     "i < num_outputs -> i <= num_outputs"): (
        "i indexes output_tensor_meta, one entry per output the operation returns, which "
        "the rules' length check makes num_outputs: i < num_outputs always, and <= reads alike"
    ),
    ("torch.distributed.device_mesh", "DeviceMesh.__init__", "reversed-iteration",
     "for ... in self._dim_group_names -> reversed(list(...))"): (
        "the mesh's groups entered in its registry in another order: a dict keyed by each "
        "group's name, each name mapped to the group resolved from that name, so any order "
        "writes the same entries (a name two dimensions share, the same group twice)"
    ),
    ("torch.distributed.tensor.placement_types", "Replicate.__hash__", "off-by-one",
     "1 -> 2"): (
        "-1 made -2: CPython maps a __hash__ of -1 to -2 (-1 signals an error in C), so "
        "hash(Replicate()) was -2 already"
    ),
    ("torch.distributed.tensor._ops._pointwise_ops", "_register_single_dim_pointwise",
     "ignored-argument", "argument static_argnum ignored for its default 0"): (
        "the scalar-linear operations (mul and div by a scalar, and their foreach forms) have "
        "their sharding cached under a key hashing every argument from the first (the "
        "tensor's spec, hashed anyway) rather than from the scalar on: a key as fine, the "
        "same strategy for every call"
    ),
    **{
        ("torch.distributed.tensor._ops.autogen", qualname, "reversed-iteration",
         f"for ... in {over} -> reversed(list(...))"): (
            "one base operation's variants are found (or registered) in another order: every "
            "finder collects all its matches (none stops at the first), no variant appears "
            "twice in one base's list, and each is registered once with that base's rule "
            "whatever its turn (which base claims a variant two bases share is the order of "
            "the bases, not of one base's list)"
        )
        for qualname, over in (
            ("_iter_packet_overloads", "packet.overloads()"),
            ("_find_inplace_variant_overloads", "_iter_packet_overloads(packet)"),
            ("_find_out_variant_overloads", "_iter_packet_overloads(packet)"),
            ("_find_functional_variant_overloads", "_iter_packet_overloads(packet)"),
            ("_find_foreach_variants", "(f'_foreach_{base_name}', f'_foreach_{base_name}_')"),
            ("_find_foreach_variants", "packet.overloads()"),
            ("auto_register_op_variants", "_find_inplace_variant_overloads(base_op)"),
            ("auto_register_op_variants", "_find_out_variant_overloads(base_op)"),
            ("auto_register_op_variants", "_find_functional_variant_overloads(base_op)"),
            ("auto_register_op_variants", "_find_foreach_variants(base_op)"),
        )
    },
    ("torch.distributed.tensor._ops.autogen", "auto_register_op_variants", "reversed-iteration",
     "for ... in list(registry.items()) -> reversed(list(...))"): (
        "a variant two base operations share is claimed by the other base: the two are an "
        "operation and its own in-place form (add and add_ both find add.out), registered "
        "with one rule (one registration function, the same arguments), and no rule reads "
        "of the operation it is given more than its count of tensor returns, which every "
        "finder requires equal between a base and its variant"
    ),
    (_DT_SPEC, "DTensorSpec._check_equals", "ignored-argument",
     "argument skip_shapes ignored for its default False"): (
        "skip_shapes is passed by torch.compile's DTensor guard alone (check_dtensor_spec): "
        "shapes compared there too, a compiled function is compiled again for a DTensor of "
        "another shape, the same values"
    ),
    (_DT_SPEC, "DTensorSpec.is_default_device_order", "comparison", "prev < nxt -> prev <= nxt"): (
        "a shard order names each mesh dimension once, so two neighbours are never equal: < "
        "and <= read alike"
    ),
    (_DT_SPEC, "DTensorSpec.is_default_device_order", "reversed-iteration",
     "for ... in shard_order -> reversed(list(...))"): (
        "the order is default if every entry's mesh dimensions increase, each entry checked "
        "on its own: in any order the same answer"
    ),
    (_DT_COST, "allgather_cost", "off-by-one", "1 -> 2"): (
        "the hops of a gather one fewer: below zero only over a mesh dimension of one rank, where "
        "the gather it prices moves nothing (every placement over one rank is the same tensor), "
        "so a strategy relabelling that dimension runs, with no collective; at two or more ranks "
        "a cost still positive, so as the other cost-model mutants: which communicating "
        "strategy runs, each giving the operation's value"
    ),
}  # fmt: skip


def why_equivalent(module: str, qualname: str, operator: str, change: str,
                   where: str = "", nth: int = 0) -> str | None:  # fmt: skip
    """The reason a mutant is declared equivalent, or None. A declaration whose change ends
    in ``at `<line>``` holds for the mutant of that line alone (``where``, the mutated line
    stripped); one without, for every mutant of the function making that change. Where one
    line holds the same change twice (``self(self.size() - 1) + 1``'s two ones), a
    declaration whose operator carries the twin's number (``off-by-one#2``, as the mutant is
    named; ``nth`` counts from 0) holds for that one alone.

    Example::

        >>> why_equivalent("torch.optim.sgd", "SGD.step", "off-by-one", "0 -> 1") is None
        True
    """
    keys = [(operator, f"{change} at `{where}`"), (operator, change)]
    if nth:
        keys.insert(0, (f"{operator}#{nth + 1}", f"{change} at `{where}`"))
    found = [EQUIVALENT.get((module, qualname, op, said)) for op, said in keys]
    return next((why for why in found if why), None)
