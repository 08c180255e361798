"""DDP's constructor options and ``no_sync()``: each must leave training equivalent to
single-process full-batch training (sample-weighted, uneven batches and accumulation)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance import jobs, refusal_jobs
from ddp_verify.conformance.closed_forms import one_sample_per_rank, rounded
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.engine.outcome import EquivalenceError
from ddp_verify.engine.strategies import models, optimizers, scenarios
from ddp_verify.world import RankError

# One byte: every parameter gets a bucket of its own, the most all-reduces DDP can make.
TINY_BUCKET_MB = 1e-6

OPTIONS = {
    "defaults": {},
    "bucket_cap_mb_tiny": {"bucket_cap_mb": TINY_BUCKET_MB},
    "bucket_cap_mb_default": {"bucket_cap_mb": 25},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "tiny_buckets_as_views": {"bucket_cap_mb": TINY_BUCKET_MB, "gradient_as_bucket_view": True},
    # zero_grad(set_to_none=False) between steps: gradients zeroed in place, not dropped; with
    # gradient_as_bucket_view they are DDP's bucket views, zeroed where the reducer writes.
    "zero_grad_in_place": {"set_to_none": False},
    "bucket_views_zeroed_in_place": {"gradient_as_bucket_view": True, "set_to_none": False},
    # Per-bucket caps (the first buckets one byte: one parameter each, the rest one bucket).
    "bucket_cap_mb_list": {"bucket_cap_mb_list": [TINY_BUCKET_MB, TINY_BUCKET_MB, 25]},
    # Gradients copied into a bucket and divided once per bucket, not per parameter.
    "batched_grad_copy": {"batched_grad_copy": True},
    "batched_grad_copy_one_byte_buckets": {
        "batched_grad_copy": True,
        "bucket_cap_mb": TINY_BUCKET_MB,
    },
    # broadcast_buffers' replacement, said outright.
    "forward_sync_buffers": {"forward_sync_buffers": True},
}


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
def test_ddp_option_keeps_training_equivalent(world, data_parallel, prove, options):
    method = data_parallel(**options)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            dtypes=("float64", "float32"),
            optimizers=optimizers(schedules=True),  # a scheduler between steps, as in training
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant"])
@pytest.mark.parametrize("static_graph", [False, True], ids=["dynamic_graph", "static_graph"])
def test_activation_checkpointing_keeps_training_equivalent(
    world, data_parallel, prove, how, static_graph
):
    # The model's forward under torch.utils.checkpoint, recomputed in backward: DDP must see
    # every gradient once, as without it. The reentrant form needs an input that requires grad
    # and does not support parameters forward leaves unused under DDP (torch documents both:
    # no embedding models, whose inputs are indices, and no unused parameters), and
    # static_graph with no_sync() accumulation is a known torch issue (above): left out.
    options = {"checkpoint": how}
    if static_graph:
        options |= {"static_graph": True, "find_unused_parameters": False}
    excluded = ("unused",) if how == "reentrant" or static_graph else ()
    kinds = ("mlp", "conv") if how == "reentrant" else ("mlp", "conv", "embedding")
    method = data_parallel(**options)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=1 if static_graph else 3,
            dtypes=("float64", "float32"),
            models=models(kinds=kinds, excluded_features=excluded),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant"])
def test_activation_checkpointing_recomputes_dropout_with_the_forwards_mask(
    world, data_parallel, prove, how
):
    # Checkpointing restores the RNG state before it recomputes the forward (its default,
    # preserve_rng_state=True), so a dropout mask drawn again is the one the forward drew:
    # checkpointed and plain training give the same gradients for the same RNG state.
    plain, checkpointed = data_parallel(), data_parallel(checkpoint=how)
    cases = st.tuples(st.integers(2, 8), st.integers(0, 2**16), st.integers(0, 2**16))

    def check(case):
        width, seed, draw = case
        other = draw + 1
        without = world.run(jobs.dropout_gradients, plain, width, seed, (draw, other))
        within = world.run(jobs.dropout_gradients, checkpointed, width, seed, (draw, other))
        for rank, ((want, want_other), (got, _)) in enumerate(zip(without, within, strict=True)):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (
                f"rank {rank}: the {how} checkpointed gradients of a dropout model are not the "
                f"plain ones for the same RNG state (width {width}, seed {seed}, draw {draw}): "
                "the recomputed forward drew another mask"
            )
            if rank == 0:
                masks.append(want != want_other)

    masks: list[bool] = []
    prove(cases, check)
    # Not blind: another RNG state drew another mask, so the gradients depend on it.
    assert any(masks), "dropout never changed the gradients: the check is blind"


def test_clip_grad_norm_under_ddp_clips_by_the_global_norm(world, data_parallel, prove):
    # clip_grad_norm_ after DDP's backward sees the averaged gradients: the norm and the
    # clipped step are the full batch's, on every rank.
    method = data_parallel()
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            dtypes=("float64", "float32"),
            optimizers=optimizers(clip=True),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_checkpoint_and_resume_continues_as_the_uninterrupted_run(world, data_parallel, prove):
    # The state dicts saved before a step and loaded into a fresh (perturbed) model and
    # optimizer: training goes on as if never interrupted (optimizer state included: Adam's
    # moments, SGD's momentum, each param group's settings), so it still matches the
    # reference at every step.
    def check(scenario):
        method = data_parallel(resume_at=scenario.steps - 1)
        world.assert_equivalent(method, scenario)

    prove(
        scenarios(
            world_size=world.size, max_micro_batches=3, optimizers=optimizers(groups=True)
        ).filter(lambda s: s.steps >= 2),
        check,
    )


def test_compiled_ddp_keeps_training_equivalent(world, data_parallel, prove, finding):
    # torch.compile on the DDP model: dynamo's DDP optimizer splits the graph at bucket
    # boundaries so that all-reduces still overlap backward. The aot_eager backend runs the
    # captured graphs with eager kernels, so the compiled model must give eager's numbers:
    # the float64 tolerance, not a looser one. (Inductor generates kernels of its own, which
    # may sum in another order; it is not checked here: compiling them for every scenario is
    # too slow for the suite on a CPU.)
    method = data_parallel(compile_backend="aot_eager")
    prove(
        scenarios(world_size=world.size, max_micro_batches=2, models=models(kinds=("mlp",))),
        lambda scenario: world.assert_equivalent(method, scenario),
    )
    finding("torch.compile(backend='aot_eager') DDP: equivalent within float64 rounding")


def test_autocast_bfloat16_forward_keeps_training_equivalent(world, data_parallel, prove):
    # A float32 model whose forward runs under torch.autocast(bfloat16), the loss and the
    # optimizer in float32, as mixed-precision training loops do. The tolerance is float32's,
    # measured on the scenario (ddp_verify.engine.tolerances): its rounding variants run under
    # the same autocast, so bfloat16's roundings are in the bound. GradScaler does not apply:
    # bfloat16 has float32's exponent range, nothing underflows that scaling would save.
    method = data_parallel()
    prove(
        scenarios(world_size=world.size, max_micro_batches=3, dtypes=("float32",)).map(
            lambda scenario: dataclasses.replace(scenario, autocast="bfloat16")
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_sync_batch_norm_on_uneven_batches(world, data_parallel, prove):
    # SyncBatchNorm normalises each forward by the statistics of every rank's batch: with one
    # micro-batch per rank per step, that is the full batch's, however unevenly it is split.
    if world.device != "cuda":
        pytest.skip(
            "SyncBatchNorm runs on CUDA tensors only (torch raises for CPU tensors): run with "
            "--ddp-device cuda on GPUs"
        )
    method = data_parallel()
    prove(
        scenarios(
            world_size=world.size,
            # Training-mode BatchNorm needs two samples in the batch it normalises: on one
            # rank (nccl on one GPU) the one rank's batch is the whole of it.
            min_samples=2 if world.size == 1 else 1,
            max_micro_batches=1,
            models=models(batch_norm="sync"),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_static_graph_without_accumulation(world, data_parallel, prove):
    # static_graph finds unused parameters itself: find_unused_parameters stays off.
    method = data_parallel(static_graph=True, find_unused_parameters=False)
    prove(
        scenarios(world_size=world.size, max_micro_batches=1, dtypes=("float64", "float32")),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


@known_torch_issue(
    "static_graph=True with no_sync() accumulation: the first backward inside no_sync() "
    "fails an INTERNAL ASSERT (expect_autograd_hooks_) in the reducer; the fix in review also "
    "found that, once unblocked, gradients stop being all-reduced from the second iteration",
    raises=RankError,
    url="https://github.com/pytorch/pytorch/issues/143580 (fix: pull 187732)",
    match=r"expect_autograd_hooks_ INTERNAL ASSERT FAILED",
)
def test_static_graph_with_no_sync_accumulation(world, data_parallel, prove):
    method = data_parallel(static_graph=True, find_unused_parameters=False)
    prove(
        # Every rank accumulates from the first step: each scenario is a test of the property,
        # however few are drawn, and every rank meets the issue at once (a rank left waiting
        # in an all-reduce would turn it into a hang under a launcher).
        scenarios(world_size=world.size, max_micro_batches=3).filter(
            lambda s: all(len(sizes) > 1 for sizes in s.schedule[0])
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def _delayed(world, data_parallel, prove, dtype, accumulation=False):
    method = data_parallel(delay_all_reduce=True)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3 if accumulation else 1,
            same_micro_batch_counts=not accumulation,
            dtypes=(dtype,),
            models=models(excluded_features=("unused",)),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


# DDP's delayed all-reduce (delay_all_reduce_named_params with param_to_hook_all_reduce, the
# parameters after the input layer all-reduced when its gradient is ready) meets three torch
# issues here; each test below keeps the property and names the one it meets.
@known_torch_issue(
    "DDP's delayed all-reduce starts an asynchronous all-reduce of the delayed gradients and "
    "never waits for it: right after backward the ranks can read, and step on, a buffer it has "
    "not finished (the ranks' gradients disagree, or agree on a stale value)",
    raises=EquivalenceError,
    # A race: any wrong gradient or parameter can be it, so on a torch the mark covers this
    # test gates nothing; it reports when torch waits (a steady pass on a fixed release).
    match=r"not equivalent to single-process",
    flaky=True,
    repro="findings/ddp_delayed_all_reduce_not_waited.py",
)
def test_delayed_all_reduce_keeps_training_equivalent(world, data_parallel, prove):
    # Float32, one micro-batch per step: the other two issues left out.
    _delayed(world, data_parallel, prove, "float32")


@known_torch_issue(
    "DDP's delayed all-reduce runs on every backward, inside no_sync() too: accumulated "
    "micro-batches are all-reduced and divided again each time (wrong gradients), and ranks "
    "with different numbers of micro-batches call different numbers of all-reduces (gloo "
    "aborts, or the ranks wait forever)",
    raises=(RankError, EquivalenceError),
    match=r"op\.preamble\.length <= op\.nbytes|waited in a collective|Connection reset"
    r"|not equivalent to single-process",
    flaky=True,
    repro="findings/ddp_delayed_all_reduce_no_sync.py",
)
def test_delayed_all_reduce_with_accumulation(world, data_parallel, prove):
    if world.lockstep:
        pytest.skip(
            "this known torch issue can make gloo abort a rank's process, and under a "
            "launcher a rank that dies ends the whole job: it runs in fork mode only"
        )
    _delayed(world, data_parallel, prove, "float32", accumulation=True)


@known_torch_issue(
    "DDP's delayed all-reduce allocates its gradient buffer in the default dtype: a model in "
    "any other (float64, bfloat16) fails assigning the buffer's views as gradients",
    raises=RankError,
    match=r"assign a gradient with dtype|assigned grad has data of a different type",
    repro="findings/ddp_delayed_all_reduce_dtype.py",
)
def test_delayed_all_reduce_in_float64(world, data_parallel, prove):
    _delayed(world, data_parallel, prove, "float64")


@pytest.mark.parametrize("skip", [False, True], ids=["reduced", "skip_all_reduce_unused"])
def test_find_unused_parameters_with_unused_parameters(world, data_parallel, prove, skip):
    # skip_all_reduce_unused_params: the unused parameters (the same on every rank, as it
    # requires) are left out of the all-reduce; their gradients stay None either way.
    options = {"skip_all_reduce_unused_params": True} if skip else {}
    method = data_parallel(find_unused_parameters=True, **options)
    prove(
        scenarios(world_size=world.size, models=models(required_features=("unused",))),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_find_unused_parameters_with_an_output_left_out_of_the_loss(world, data_parallel, prove):
    # forward returns two outputs and the loss takes the first: the second's head gets no
    # gradient on any rank, so its grad must stay None, as in single-process training, not
    # become zeros (weight decay, always drawn here, would then move it where the reference
    # leaves it alone). DDP passes the outputs through a function whose backward must keep
    # the missing gradient missing.
    method = data_parallel(find_unused_parameters=True)
    prove(
        scenarios(
            world_size=world.size,
            max_micro_batches=3,
            models=models(aside=True),
            optimizers=optimizers().filter(lambda o: o.weight_decay > 0),
        ),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_find_unused_parameters_when_every_parameter_is_used(world, data_parallel, prove):
    method = data_parallel(find_unused_parameters=True)
    prove(
        scenarios(world_size=world.size, models=models(features=False)),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "no_broadcast"])
def test_broadcast_buffers_with_models_that_have_buffers(world, data_parallel, prove, broadcast):
    method = data_parallel(broadcast_buffers=broadcast)
    prove(
        scenarios(world_size=world.size, models=models(required_features=("buffer",))),
        lambda scenario: world.assert_equivalent(method, scenario),
    )


def test_ddp_starts_every_rank_from_rank_0s_state(world, data_parallel, prove):
    # Each rank shifts its parameters and buffers by its rank before wrapping: DDP's
    # constructor must hand every rank rank 0's (unshifted) state.
    method = data_parallel()

    def check(scenario):
        states = world.run(jobs.state_after_wrapping, method, scenario)
        for rank, state in enumerate(states):
            assert state == states[0], (
                f"after wrapping, rank {rank}'s parameters and buffers differ from rank 0's: "
                f"{state} vs {states[0]}"
            )

    prove(scenarios(world_size=world.size, models=models(required_features=("buffer",))), check)


@pytest.mark.parametrize("how", ["in_place", "reassigned"])
@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "no_broadcast"])
def test_broadcast_buffers_means_every_rank_uses_rank_0s_buffers(
    world, data_parallel, prove, broadcast, how
):
    # The documented semantics: with broadcast_buffers, each forward starts by broadcasting
    # rank 0's buffers; without it, a rank keeps its own. Each rank perturbs its buffer after
    # wrapping, so that the constructor's broadcast cannot be what makes them agree: in place,
    # or as a new tensor assigned to the module (DDP must look its buffers up again before
    # each broadcast, not keep the ones it found when it was built).
    method = data_parallel(broadcast_buffers=broadcast)

    def check(scenario):
        results = world.run(jobs.buffers_after_forward, method, scenario, how == "reassigned")
        before, seen = zip(*results, strict=True)
        if broadcast:
            assert all(s == before[0] for s in seen), (
                f"ranks' buffers after forward: {seen}; rank 0's before it: {before[0]} (the "
                "forward must start from rank 0's)"
            )
        else:
            assert list(seen) == list(before), (
                f"ranks' buffers after forward: {seen}; each rank's own before it: {before}"
            )

    prove(scenarios(world_size=world.size, models=models(required_features=("buffer",))), check)


def test_no_sync_leaves_gradients_local_until_the_syncing_backward(
    world, peers, data_parallel, prove
):
    # The negative check: inside no_sync() each rank's gradient is its own (they differ between
    # ranks); the backward outside it makes them the global average (identical on every rank).
    method = data_parallel(needs=("no_sync",))

    def check(scenario):
        results = world.run(jobs.gradients_inside_and_after_no_sync, method, scenario)
        differ, agree = zip(*results, strict=True)
        assert all(differ), "gradients were already identical across ranks inside no_sync()"
        assert all(agree), "gradients still differ across ranks after the syncing backward"

    prove(
        scenarios(
            world_size=world.size,
            min_samples=2,
            max_steps=1,
            models=models(features=False),
            losses=("mse",),
        ),
        check,
    )


def test_ddp_over_a_subgroup_starts_from_and_averages_over_that_group(world, prove):
    # DDP(process_group=g) or DDP(device_mesh=m): parameters broadcast from the group's first
    # rank at wrapping (left as they are with init_sync=False), gradients averaged over the
    # group's ranks only (divided by its size, not the world's). Closed form: small integers.
    size = world.size
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    values = st.integers(-8, 8).map(float)

    @st.composite
    def draw(draw_):
        n = draw_(st.integers(1, 3))
        vector = st.lists(values, min_size=n, max_size=n)
        vectors = st.lists(vector, min_size=size, max_size=size)
        via = st.sampled_from(("process_group", "device_mesh"))
        return (
            draw_(vectors),
            draw_(vectors),
            draw_(st.sampled_from(divisors)),
            draw_(via),
            draw_(st.booleans()),
        )

    def check(case):
        starts, gradients, group_size, via, init_sync = case
        results = world.run(jobs.ddp_in_a_group, *case)
        for rank, (after, grad) in enumerate(results):
            first = rank - rank % group_size
            block = gradients[first : first + group_size]
            said = (
                f"DDP({via}=<{group_size} consecutive ranks>, init_sync={init_sync}): rank {rank}"
            )
            want = starts[first] if init_sync else starts[rank]
            assert after == want, (
                f"{said} starts from {after}, not {want} (the group's first rank's parameters "
                f"{'broadcast' if init_sync else 'left unsynchronised'})"
            )
            mean = [sum(column) / group_size for column in zip(*block, strict=True)]
            torch.testing.assert_close(
                torch.tensor(grad, dtype=torch.float64),
                torch.tensor(mean, dtype=torch.float64),
                rtol=1e-12,
                atol=1e-12,
                msg=lambda m, said=said: f"{said}'s gradient is not its group's mean.\n{m}",
            )

    size = world.size
    distinct = [[float(r + 1)] for r in range(size)]  # every rank its own start
    prove(
        draw(),
        check,
        # Left unsynchronised, and broadcast, over the whole world: a rank whose start is
        # its own tells init_sync apart (a group of one cannot).
        examples=[
            (distinct, distinct, size, "process_group", False),
            (distinct, distinct, size, "device_mesh", True),
        ],
    )


def _mixed_precision_cases(size: int) -> st.SearchStrategy:
    return st.tuples(one_sample_per_rank(size), st.sampled_from(("bfloat16", "float16"))).map(
        lambda case: (*case[0], case[1], 3)
    )


def _mixed_precision(world, prove, first_backward: bool) -> None:
    # DDP(mixed_precision=_MixedPrecision(param_dtype, reduce_dtype=float32)) on float32
    # parameters: the forward runs on param_dtype copies (inputs cast too), each rank's
    # gradient is param_dtype's, the all-reduce is in float32 and the gradient the optimizer
    # sees float32; the parameters stay float32 between steps. Integer inputs and loss
    # weights: the gradient of a Linear's weight is outer(weights, inputs) whatever the
    # weights are, so every step's is known exactly; a mean reduced in param_dtype, or
    # parameters kept in it, round by about 1 part in 256 where float32 keeps 1 in 10^6.
    # first_backward: the first step's gradient only (a torch issue, checked apart), else
    # every later one and the parameters the optimizer made of the gradients DDP gave it.
    size = world.size

    def close(got, exact, said):
        got = torch.tensor(got, dtype=torch.float64)
        exact = torch.tensor(exact, dtype=torch.float64)
        scale = float(exact.abs().max()) or 1.0
        torch.testing.assert_close(
            got, exact, rtol=1e-6, atol=1e-6 * scale, msg=lambda m: f"{said}\n{m}"
        )

    def check(case):
        inputs, weights, param_dtype, steps = case
        received, dtypes, grads, after = world.run(jobs.ddp_mixed_precision_gradients, *case)[0]
        said = (
            f"DDP(mixed_precision=_MixedPrecision(param_dtype={param_dtype}, "
            "reduce_dtype=float32)) on float32 parameters"
        )
        want = f"torch.{param_dtype} computing in torch.{param_dtype}"
        assert received == want, f"{said}: the module received {received}, not {want}"
        assert dtypes == ["torch.float32"] * steps, f"{said}: gradients in {dtypes}, not float32"
        r = lambda v: rounded(v, param_dtype)  # noqa: E731
        mean = [
            [sum(r(r(c[i]) * r(x[j])) for x, c in zip(inputs, weights, strict=True)) / size
             for j in range(len(inputs[0]))]
            for i in range(len(weights[0]))
        ]  # fmt: skip
        what = f"the float32 mean of the ranks' {param_dtype} gradients"
        if first_backward:
            close(grads[0], mean, f"{said}: the first backward's gradient is not {what}")
            return
        for step in range(1, steps):
            close(grads[step], mean, f"{said}: step {step}'s gradient is not {what}")
        start = [[float((i * len(inputs[0]) + j) % 5) for j in range(len(inputs[0]))]
                 for i in range(len(weights[0]))]  # fmt: skip
        trained = [
            [w - sum(g[i][j] for g in grads) / 64 for j, w in enumerate(row)]
            for i, row in enumerate(start)
        ]
        close(after, trained, f"{said}: the parameters after {steps} SGD steps (lr 1/64) on "
              "the gradients DDP gave are not float32's")  # fmt: skip

    # Never left to chance: a mean that bfloat16 does not hold (255 and 510 are bfloat16
    # numbers, their mean 382.5 is not), and parameters that move off bfloat16's grid.
    boundary = ([[255.0 * (r + 1), 1.0, 3.0] for r in range(size)], [[1.0, 3.0]] * size,
                "bfloat16", 3)  # fmt: skip
    try:
        world.run(jobs.ddp_mixed_precision_gradients, *boundary)
    except RankError as exc:
        # DDP's mixed precision copies parameters on a side stream and waits on an event:
        # where the device has none (a CPU world), torch says so, and nothing is checked. A
        # CUDA build in a CPU world reaches for the accelerator it was built for, and says
        # it cannot use it.
        first, text = str(exc).splitlines()[0], str(exc)
        no_accelerator = world.device == "cpu" and re.search(
            r"AcceleratorError|CUDA driver version is insufficient|no CUDA GPUs", text
        )
        if "doesn't support events" in text or no_accelerator:
            pytest.skip(f"DDP's mixed precision does not run here (torch on {world.backend}): "
                        f"{first}")  # fmt: skip
        raise
    prove(_mixed_precision_cases(size), check, examples=[boundary])


def test_ddp_mixed_precision_computes_in_param_dtype_reduces_in_float32_keeps_float32(world, prove):
    _mixed_precision(world, prove, first_backward=False)


@known_torch_issue(
    "DDP's mixed precision leaves the first backward's gradients zero: the optimizer's first "
    "step moves nothing (every later backward gives the mean)",
    raises=AssertionError,
    match=r"the first backward's gradient is not the float32 mean",
    repro="findings/ddp_mixed_precision_gradient.py",
)
def test_ddp_mixed_precision_first_backward_gives_the_gradient(world, prove):
    _mixed_precision(world, prove, first_backward=True)


# What DDP says for each construction and comm hook it refuses (torch 2.13's words, the part
# that names the problem).
_POWERSGD_START = r"ValueError: Expect `start_powerSGD_iter` > 1"
DDP_REFUSED = {
    "PowerSGD with error feedback from iteration 1": _POWERSGD_START,
    "PowerSGD with warm start from iteration 1": _POWERSGD_START,
    "delay_all_reduce_named_params alone": r"ValueError: .*need to be set at the same time",
    "process_group and device_mesh both": r"RuntimeError: Cannot specify both process_group",
    "a two-dimensional device_mesh": r"RuntimeError: Only 1D device mesh is supported",
    "a module with nothing to train": r"RuntimeError: .*doesn't have any parameter that "
    r"requires a gradient",
    "device_ids of two devices": r"ValueError: device_ids can only be None or contain a single",
    "device_ids for a CPU module": r"ValueError: .*device_ids and output_device arguments only "
    r"work with",
    "a module on two kinds of device": r"ValueError: .*must be on the same type of devices",
    "a module with uninitialized parameters": r"RuntimeError: Modules with uninitialized "
    r"parameters",
    "a comm hook that is not callable": r"TypeError: Communication hook must be callable",
    "a comm hook whose bucket is not a GradBucket": r"ValueError: .*bucket annotation should "
    r"be dist.GradBucket",
    "a comm hook that returns no Future of a tensor": r"ValueError: .*return annotation should "
    r"be torch.futures.Future",
}


def test_every_construction_and_comm_hook_ddp_refuses_is_refused(world):
    # A regression that stops refusing lets a run start that cannot train as asked: a frozen
    # module wrapped for nothing, a CPU module bound to a GPU, a hook of the wrong shape.
    if world.device != "cpu":
        pytest.skip("the refusals of device_ids are a CPU module's: this world runs on GPUs")
    results = world.run(refusal_jobs.ddp_refusals)
    refusal_jobs.assert_refused(results, DDP_REFUSED, "DistributedDataParallel")
    for rank, said in enumerate(results):
        for accepted in ("a comm hook annotated as documented",
                         "PowerSGD with neither from iteration 1"):  # fmt: skip
            assert said[accepted] is None, f"{accepted}: refused on rank {rank}: {said[accepted]}"


@pytest.mark.parametrize("cap_mb", [TINY_BUCKET_MB, 0.001, 0.004, 1, 25, None])
def test_bucket_cap_mb_sets_the_size_of_the_buckets_a_comm_hook_is_handed(world, cap_mb):
    # Documented: DDP puts the gradients in buckets of bucket_cap_mb MiB (25 if None) to
    # overlap their all-reduce with backward, and rebuilds them in the order gradients become
    # ready after the first iteration. From then on, every gradient is in exactly one bucket
    # each iteration; a bucket holds its gradients up to the cap (past it by its last one at
    # most); and only the last bucket stops short of it (else it would have taken the next).
    # A cap read wrong (a bucket per parameter, or one for all) reduces the same sums in
    # other all-reduces: only this tells it.
    cap = 25 * 2**20 if cap_mb is None else int(cap_mb * 2**20)
    for rank, iterations in enumerate(world.run(jobs.bucket_layout, cap_mb)):
        for iteration, buckets in enumerate(iterations[1:], start=2):
            where = f"rank {rank}, bucket_cap_mb={cap_mb}, iteration {iteration}: {buckets}"
            assert sorted(size for bucket in buckets for size in bucket) == sorted(
                [64 * 32 * 4, 32 * 4, 32 * 16 * 4, 16 * 4, 16 * 4 * 4, 4 * 4]
            ), f"{where}: not every gradient once"
            for index, bucket in enumerate(buckets):
                assert sum(bucket[:-1]) < cap, f"{where}: bucket {index} is past its cap of {cap}"
                if index < len(buckets) - 1:
                    assert sum(bucket) >= cap, f"{where}: bucket {index} stops short of {cap}"


@pytest.mark.parametrize("skipped", [None, "first", "third"])
def test_parameters_a_forward_left_unused_are_refused_and_named_when_debugging(world, skipped):
    # Without find_unused_parameters, DDP waits for every parameter's gradient: the next
    # iteration after a forward that left some unused raises, naming their indices (the
    # order of module.parameters()), and their names under TORCH_DISTRIBUTED_DEBUG=INFO or
    # DETAIL (documented). A regression here fails the debugging run or names the wrong layer.
    results = world.run(refusal_jobs.ddp_unused_parameters, skipped)
    names = ["first.weight", "first.bias", "second.weight", "second.bias", "third.weight",
             "third.bias"]  # fmt: skip
    unused = [i for i, name in enumerate(names) if name.split(".")[0] == skipped]
    for rank, said in enumerate(results):
        for level, message in said.items():
            if skipped is None:
                assert message is None, f"rank {rank}, debug {level}: all used, refused: {message}"
                continue
            assert message is not None, f"rank {rank}, debug {level}: {skipped} unused, accepted"
            found = re.search(rf"Parameter indices which did not receive grad for rank {rank}: "
                              r"([\d ]+)", message)  # fmt: skip
            assert found and sorted(map(int, found[1].split())) == unused, (rank, level, message)
            named = re.search(rf"Parameters which did not receive grad for rank {rank}: "
                              r"([\w., ]+)", message)  # fmt: skip
            if level == "OFF":
                assert named is None, (rank, level, message)
            else:
                expected = sorted(names[i] for i in unused)
                assert named and sorted(named[1].split(", ")) == expected, (rank, level, message)


@pytest.mark.parametrize("as_views", [True, False], ids=["bucket_views", "own_storage"])
def test_gradient_as_bucket_view_makes_gradients_views_of_the_bucket(world, as_views):
    # Documented: with gradient_as_bucket_view=True the gradients are views into the
    # all-reduce bucket (one storage for a bucket's parameters, the memory it saves);
    # without it each gradient has its own. Training is the same either way (the option's
    # equivalence property), so only this tells an option that is ignored.
    for rank, (storages, grads) in enumerate(world.run(jobs.gradient_storages, as_views)):
        want = 1 if as_views else grads
        assert storages == want, (
            f"gradient_as_bucket_view={as_views} on rank {rank}: {grads} gradients in "
            f"{storages} storages, documented {want}"
        )
