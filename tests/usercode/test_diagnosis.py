"""The simulator of known mistakes, and the reproducer scripts, without a warm world."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.tolerances import Float64Tolerance
from ddp_verify.engine.trace import Trace
from ddp_verify.methods import reference
from ddp_verify.usercode.diagnosis.mistakes import Mistake, applies, candidates, matches, simulate
from ddp_verify.usercode.reproducer import write_reproducer

UNEVEN = Scenario(
    world_size=3,
    schedule=(((1, 2), (1,), (2,)), ((2,), (1, 1, 1), (1,))),
    model=ModelSpec(hidden=(3,), layernorm=True),
)
# Uneven sizes, but as many micro-batches on every rank of a step: what a training loop with
# a fixed number of accumulation steps gives, and what stepping per micro-batch needs.
SAME_COUNTS = Scenario(
    world_size=3,
    schedule=(((1, 2), (2, 2), (1, 1)), ((3,), (1,), (2,))),
    model=ModelSpec(hidden=(3,), layernorm=True),
)


def as_ranks(trace: Trace, ranks: int) -> Trace:
    return Trace(trace.method, [trace.ranks[0]] * ranks)


def test_simulating_no_mistake_is_the_reference():
    ref = as_ranks(reference().run(UNEVEN), 3)
    assert matches(simulate(UNEVEN, Mistake()), ref, Float64Tolerance())
    assert matches(
        simulate(UNEVEN, Mistake(combine="world", prescaled=True)), ref, Float64Tolerance()
    )


def test_every_candidate_mistake_differs_from_the_reference_on_an_uneven_split():
    refs = {s: as_ranks(reference().run(s), 3) for s in (UNEVEN, SAME_COUNTS)}
    for kind in ("grad-sync", "loss", "step", "comm-hook", "wrapper"):
        for mistake in candidates(kind):
            assert mistake.findings, mistake
            for scenario, ref in refs.items():
                if applies(mistake, scenario):
                    assert not matches(simulate(scenario, mistake), ref, Float64Tolerance())


def test_stepping_per_micro_batch_needs_equal_counts_and_differs_from_every_other_mistake():
    each = [m for m in candidates("step") if m.stepping == "each"]
    assert each and not any(applies(m, UNEVEN) for m in each)
    with pytest.raises(ValueError, match="micro-batch counts differ"):
        simulate(UNEVEN, each[0])
    stepped = simulate(SAME_COUNTS, Mistake(stepping="each"))
    for other in candidates("step"):
        if other != Mistake(stepping="each"):
            assert not matches(simulate(SAME_COUNTS, other), stepped, Float64Tolerance()), other


def test_candidates_come_fewest_mistakes_first():
    counts = [len(m.findings) for m in candidates("step")]
    assert counts == sorted(counts) and counts[0] == 1 and max(counts) == 3


def _summing_sync(model):
    import torch.distributed as dist

    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def test_a_reproducer_exits_1_while_the_bug_is_there_and_0_without_it(tmp_path):
    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),))
    buggy = write_reproducer(_summing_sync, "grad-sync", scenario, tmp_path)
    fixed = write_reproducer(
        lambda model: (
            _summing_sync(model)
            or [p.grad.div_(2) for p in model.parameters() if p.grad is not None]
        ),
        "grad-sync",
        Scenario(world_size=2, schedule=(((2,), (2,)),)),
        tmp_path,
    )
    for script, code, words in (
        (buggy, 1, "First divergence: step 0 of 1"),
        (fixed, 0, "is equivalent to the reference on this scenario"),
    ):
        result = _run_script(script)
        assert result.returncode == code, result.stdout + result.stderr
        assert words in result.stdout


def _run_script(script) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, timeout=120
    )


def _summing_sync_then_abort_at_exit(model):
    # Rank 0 dies of SIGABRT as its process exits, after its trace was sent: what gloo
    # sometimes does to a rank whose peers close their connections first.
    import multiprocessing.util
    import os
    import signal

    import torch.distributed as dist

    if dist.get_rank() == 0:
        multiprocessing.util.Finalize(
            None, os.kill, (os.getpid(), signal.SIGABRT), exitpriority=100
        )
    _summing_sync(model)


def test_a_reproducer_reports_even_when_a_rank_dies_after_its_trace_arrived(tmp_path):
    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),))
    script = write_reproducer(_summing_sync_then_abort_at_exit, "grad-sync", scenario, tmp_path)
    result = _run_script(script)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "First divergence: step 0 of 1" in result.stdout, result.stderr


def test_a_reproducer_runs_on_the_backend_and_device_that_showed_the_mistake(tmp_path):
    # Issue 61: the script once always used gloo, so a mistake only nccl shows was not
    # reproduced by the script the user was handed.
    scenario = Scenario(world_size=1, schedule=(((2,),),))
    script = write_reproducer(
        _summing_sync, "grad-sync", scenario, tmp_path, backend="nccl", device="cuda"
    )
    text = script.read_text()
    assert "BACKEND = 'nccl'" in text and "DEVICE = 'cuda'" in text
    result = _run_script(script)
    if torch.cuda.is_available():  # the GPU check: an nccl group of one rank, on its GPU
        assert result.returncode == 0, result.stdout + result.stderr
        assert "is equivalent to the reference on this scenario" in result.stdout
    else:  # the rank went for its GPU, as an nccl world's rank does, and said why it could not
        assert result.returncode != 0, result.stdout + result.stderr
        assert "this world trains on CUDA, but the rank sees no GPU" in result.stderr


def test_a_reproducer_runs_without_hypothesis(tmp_path):
    # A reproducer starts lean: no search, so no hypothesis (half a second of its start).
    # Blocked here, an import of it anywhere in the script or its forked ranks raises. A
    # declared objective takes the scenario through the validation that once imported it.
    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),), objective="sum")
    script = write_reproducer(_summing_sync, "grad-sync", scenario, tmp_path)
    blocked = (
        "import runpy, sys; sys.modules['hypothesis'] = None; sys.argv = [sys.argv[1]]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", blocked, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Summed gradients are the gradient of the summed objective: equivalent.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is equivalent to the reference on this scenario" in result.stdout


NOTING_SYNC = """
import os
import sys

import torch.distributed as dist

# Loaded on each rank once it has forked, before it trains: whether torch._dynamo (which a
# rank's first optimizer imports) came with the fork.
INHERITED = "torch._dynamo" in sys.modules


def noting_sync(model):
    with open(os.path.join(os.environ["NOTES"], f"rank{dist.get_rank()}"), "w") as note:
        note.write(str(INHERITED))
    for p in model.parameters():
        dist.all_reduce(p.grad)
"""


def test_a_reproducer_on_the_cpu_imports_torchs_compiler_once_before_its_ranks_fork(tmp_path):
    # torch's optimizers import torch._dynamo at their first use, seconds of CPU each: the
    # ranks inherit it rather than each importing it beside the others.
    (tmp_path / "noting.py").write_text(NOTING_SYNC)
    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),))
    sys.path.insert(0, str(tmp_path))
    try:
        import noting

        # Imported by name on each rank (a function pickled by value would carry this
        # process's INHERITED).
        script = write_reproducer(noting.noting_sync, "grad-sync", scenario, tmp_path)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("noting", None)
    assert "import_module('noting')" in script.read_text()
    notes = tmp_path / "notes"
    notes.mkdir()
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NOTES": str(notes)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert [(notes / f"rank{r}").read_text() for r in range(2)] == ["True", "True"]


def test_a_reproducer_calls_the_code_as_the_check_did(tmp_path):
    # A step written for a summed loss_fn on token-level scenarios: right as it was checked
    # (loss_reduction="sum"), wrong if the script handed it the default mean loss_fn.
    from tests.user_code import load

    steps = load("real_style/token_steps")
    scenario = Scenario(
        world_size=2,
        schedule=(((1, 2), (2, 1)),),
        model=ModelSpec(kind="transformer", hidden=(2,)),
        loss="tokens",
    )
    as_checked = write_reproducer(
        steps.global_token_count, "step", scenario, tmp_path, loss_reduction="sum"
    )
    with_mean = write_reproducer(steps.global_token_count, "step", scenario, tmp_path)
    assert as_checked != with_mean
    assert _run_script(as_checked).returncode == 0
    assert _run_script(with_mean).returncode == 1


def _steps_inside_and_after(model, optimizer, micro_batches, loss_fn):
    import torch.distributed as dist

    optimizer.zero_grad()
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches:
        (loss_fn(model(x), y) * len(y) / total).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()  # the mistake: inside the loop, beside the step after it
    optimizer.step()
    return 0.0


def test_an_optimizer_stepped_inside_the_loop_is_named_by_its_own_count(tmp_path, monkeypatch):
    # Stepping twice on one micro-batch's gradient moves the parameters as a gradient scaled
    # 2x would: the ground-truth table read it as a scale. The ranks count the optimizer's
    # steps (a step hook), and the count names it, with the numbers.
    from ddp_verify import NotEquivalent, check

    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(_steps_inside_and_after, kind="step", world_size=2, seed=0, max_examples=25,
              even=True)  # fmt: skip
    verdict = info.value.verdict
    first = verdict.causes[0]
    assert first.pattern == "step:each-micro-batch", [c.pattern for c in verdict.causes]
    assert "the optimizer stepped " in first.evidence and "once is due" in first.evidence
    calls = [trace.optimizer_calls for trace in verdict.outcome.got.ranks]
    assert all(steps and len(steps[0]) > 1 for steps in calls), calls


def _warms_up_per_micro_batch(model, optimizer, micro_batches, loss_fn):
    # A warm-up over 4 micro-batches, ticked per micro-batch (a per-step one is due): the
    # first optimizer step runs at lr / 4 times the micro-batches of that step.
    import torch.distributed as dist

    # Its state lives with the optimizer, as a scheduler made for it does: fresh each run.
    state = optimizer.__dict__.setdefault("warm_up", {"ticks": 0})
    base = state.setdefault("base", optimizer.param_groups[0]["lr"])
    optimizer.zero_grad()
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches:
        (loss_fn(model(x), y) * len(y) / total).backward()
        state["ticks"] = state.get("ticks", 0) + 1
        for group in optimizer.param_groups:
            group["lr"] = base * min(1.0, state["ticks"] / 4)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    optimizer.step()
    return 0.0


def test_a_learning_rate_the_code_sets_itself_is_named_with_its_numbers(tmp_path, monkeypatch):
    # Issue 62: a warm-up ticking per micro-batch was read as a weighting ("divided by the
    # world size once too often", its first factor 1/4 being 1/W). The ranks record the rate
    # each optimizer step ran at, and a rate the scenario's optimizer does not have is named.
    from ddp_verify import NotEquivalent, check

    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(_warms_up_per_micro_batch, kind="step", world_size=2, seed=0, max_examples=25,
              even=True, max_steps=1)  # fmt: skip
    verdict = info.value.verdict
    first = verdict.causes[0]
    assert first.pattern == "optimizer:settings", [c.pattern for c in verdict.causes]
    assert "lr 0.025 at step 0 on rank 0 where the scenario's optimizer's is 0.1" in first.text, (
        first.text
    )
