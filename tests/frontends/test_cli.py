"""The ddp-verify command, run as users run it: exit codes, JSON verdicts, usage errors.

The tests of what only a process shows (its exit, its imports, its one JSON document on
stdout, its terminal) start the command as a subprocess (``ddp_verify``); the tests of
verdicts, options and reports run it in this process (``ddp_verify_here``: the same ranks,
forked from a fork server started once)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_verify.usercode.verdict import JSON_FIELDS
from tests.frontends.in_process import ddp_verify_here
from tests.user_code import FIXTURES
from tests.world.test_exit import TEARDOWN_MARKER


def ddp_verify(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddp_verify", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def python_script(
    script: str, *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter, as a user's program would be."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def check_command(target: str, *options: str, kind: str = "grad-sync") -> list[str]:
    """``ddp-verify check`` on a world of 2, as the tests run it."""
    return ["check", target, "--kind", kind, "--world-size", "2", *options]


def test_a_counterexample_exits_1_with_a_json_verdict(tmp_path):
    result = ddp_verify(
        *check_command(
            f"{FIXTURES}/grad_sync.py:average_gradients", "--max-examples", "30", "--json"
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "not-equivalent" and verdict["exit_code"] == 1
    assert verdict["call"] == "average_gradients(model)"
    assert verdict["scenario"].startswith("Scenario(world_size=2, schedule=(((")
    assert "First divergence: step 0 of 1" in verdict["report"]
    assert "averaged over ranks by the world size" in verdict["likely_cause"]
    assert (tmp_path / verdict["reproducer"]).is_file()
    assert verdict["examples"] >= 1
    assert "[ddp-verify] " in result.stderr  # progress


@pytest.mark.parametrize(
    ("target", "kind", "message"),
    [
        ("missing.py:fn", "grad-sync", "no such file: missing.py"),
        ("{f}/grad_sync.py", "grad-sync", "expected PATH.py:FUNCTION"),
        ("{f}/grad_sync.py:nope", "grad-sync", "has no 'nope'; names it defines or imports:"),
        ("{f}/loss.py:sample_weighted", "step", "read as --kind loss (fn(local_loss, num_samples)"),
        # What the function and its flags alone say, refused before a rank starts.
        ("{f}/grad_sync.py:sample_weighted --bind n=world_sizes", "grad-sync",
         "cannot bind n=world_sizes: 'world_sizes' is neither a value the harness knows"),
        ("{f}/grad_sync.py:sample_weighted --layout logits=3d", "grad-sync",
         "--logits 3d applies to loss-fn plug-ins, not to grad-sync"),
        ("{f}/real_style/trl_losses.py:bnpo --objective token-mean --losses mse", "loss-agg",
         "objective='token-mean' aggregates token losses"),
        ("{f}/grad_sync.py:sample_weighted --lossy fp16", "grad-sync",
         "--lossy applies to comm hooks"),
        ("{f}/grad_sync.py:sample_weighted --negatives 2", "grad-sync",
         "--negatives 2 shapes the encoder whose features a coupled-loss function is given"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_and_say_what_was_expected(target, kind, message):
    target, *flags = target.format(f=FIXTURES).split()
    result = ddp_verify_here("check", target, "--kind", kind, "--world-size", "4", *flags)
    assert result.returncode == 2
    assert message in result.stderr
    assert "[ddp-verify] " not in result.stderr  # said before anything started


ENDED_BY_MARKER = (
    TEARDOWN_MARKER
    + """
import runpy

sys.argv = ["ddp-verify", "check", "missing.py:fn", "--kind", "grad-sync"]
runpy.run_module("ddp_verify", run_name="__main__")
"""
)


def test_the_command_ends_without_tearing_its_modules_down(tmp_path):
    # The interpreter's teardown is a second of CPU once torch is imported: the command ends
    # through cleanup.exit_now (tests/world/test_exit.py), its exit code and output kept.
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="ddp-verify")
    assert script.value == "ddp_verify.frontends.cli:console"
    result = python_script(ENDED_BY_MARKER, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "ddp-verify: error: no such file: missing.py\n"


def test_a_name_the_file_imports_can_be_checked(tmp_path):
    (tmp_path / "mine.py").write_text(
        f"import sys\nsys.path.insert(0, {str(FIXTURES)!r})\n"
        "from grad_sync import sample_weighted as my_sync\n"
    )
    result = ddp_verify_here(*check_command(f"{tmp_path}/mine.py:my_sync", "--max-examples", "5"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equivalent on 5 generated scenarios at world size 2" in result.stdout


_WITHOUT_NUMPY = f"""
import sys
sys.path.insert(0, {str(FIXTURES)!r})
import torch.distributed as dist
import ddp_verify
from ddp_verify.world import World
from grad_sync import sample_weighted


def numpy_missing():
    try:
        import numpy  # noqa: F401
    except ImportError:
        return True
    return False


assert numpy_missing(), "numpy is importable in the controller"
with World(2) as world:
    assert world.run(numpy_missing) == [True, True], "numpy is importable on the ranks"
verdict = ddp_verify.check(sample_weighted, kind="grad-sync", world_size=2, max_examples=5, seed=0)
print("examples", verdict.examples)
"""


def test_a_check_needs_no_numpy(tmp_path):
    # torch runs without numpy, so ddp_verify must too: a package that refuses to import
    # stands first on the path of the controller and of every rank.
    hidden = tmp_path / "hidden" / "numpy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError('numpy hidden by a test')\n")
    done = python_script(_WITHOUT_NUMPY, cwd=tmp_path, env={"PYTHONPATH": str(hidden.parent)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "examples 5" in done.stdout


MISBEHAVING = """
import os
import torch.distributed as dist


def crashes(model):
    if dist.get_rank() == 1:
        os._exit(7)


def returns_a_word(model, optimizer, micro_batches, loss_fn):
    return "not a number"
"""


@pytest.mark.parametrize(
    ("args", "env", "code", "verdict", "words"),
    [
        (["{f}/grad_sync.py:sample_weighted"], {}, 0, "equivalent", "equivalent on 3"),
        (
            ["{t}/my_code.py:crashes"],
            {},
            1,
            "error",
            "failed on a world of 2 (gloo): rank 1 exited with code 7 without a result",
        ),
        (
            ["{t}/my_code.py:returns_a_word", "--kind", "step"],
            {},
            2,
            "usage-error",
            "must return the global mean loss",
        ),
        (["{t}/my_code.py:crashes", "--timeout", "0"], {}, 2, "usage-error", "--timeout"),
        (["{t}/my_code.py:crashes", "--no-such-option"], {}, 2, "usage-error", "--no-such-option"),
        (["{t}/missing.py:fn"], {}, 2, "usage-error", "no such file"),
        (
            ["{f}/grad_sync.py:sample_weighted"],
            {"GLOO_SOCKET_IFNAME": "ddpverify0"},
            3,
            "harness-error",
            "could not start a world of 2",
        ),
    ],
    ids=[
        "equivalent",
        "crash",
        "kind-error-on-ranks",
        "timeout-0",
        "unknown-option",
        "no-file",
        "world-start",
    ],
)
def test_every_outcome_has_its_exit_code_and_one_json_document(
    tmp_path, args, env, code, verdict, words
):
    (tmp_path / "my_code.py").write_text(MISBEHAVING)
    target, *options = (a.format(f=FIXTURES, t=tmp_path) for a in args)
    kind = options.pop(options.index("--kind") + 1) if "--kind" in options else "grad-sync"
    options = [o for o in options if o != "--kind"]
    command = check_command(target, *options, "--max-examples", "3", "--json", kind=kind)
    result = ddp_verify(*command, cwd=tmp_path, env=env)
    assert result.returncode == code, result.stdout + result.stderr
    document = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert document.keys() == JSON_FIELDS.keys()  # the documented schema, in every outcome
    assert (document["verdict"], document["exit_code"]) == (verdict, code)
    assert words in document["report"], document["report"]


_RAISES_IN_A_HELPER = """\
import torch.distributed as dist


def scale(grad):
    raise RuntimeError(f"no scale for rank {dist.get_rank()}")


def sync(model):
    for p in model.parameters():
        scale(p.grad)
"""


def test_an_error_verdict_names_the_users_file_and_line_and_cuts_the_harness(tmp_path):
    (tmp_path / "my_sync.py").write_text(_RAISES_IN_A_HELPER)
    command = check_command("my_sync.py:sync", "--max-examples", "2", "--json")
    cut = json.loads(ddp_verify_here(*command, cwd=tmp_path).stdout)
    assert cut["verdict"] == "error"
    traceback = (
        "  Traceback (most recent call last):\n"
        '    File "my_sync.py", line 10, in sync\n'
        "      scale(p.grad)\n"
        '    File "my_sync.py", line 5, in scale\n'
        '      raise RuntimeError(f"no scale for rank {dist.get_rank()}")\n'
        "  RuntimeError: no scale for rank 0\n"
    )
    assert traceback in cut["report"], cut["report"]
    full = json.loads(ddp_verify_here(*command, "--full-trace", cwd=tmp_path).stdout)
    # The training loop and the adapter that called the code, and the rank that ran it.
    for harness in ("in train_local_then_sync", "in users_sync", "in run_job"):
        assert harness not in cut["report"]
        assert harness in full["report"], full["report"]


def test_ddp_debug_does_not_hide_the_cause_of_collectives_that_do_not_pair_up(tmp_path):
    # Per-micro-batch collectives on ranks with different micro-batch counts: gloo aborts, or
    # (with --ddp-debug, as the report advises) torch names the mismatch. Either way the
    # cause is the same: classified from what failed, not from whether advice was given.
    command = check_command(
        f"{FIXTURES}/step.py:sync_each_micro_batch",
        "--micro-batch-counts",
        "varied",
        "--seed",
        "1",
        "--json",
        kind="step",
    )
    plain = json.loads(ddp_verify_here(*command, cwd=tmp_path).stdout)
    debug = json.loads(ddp_verify_here(*command, "--ddp-debug", cwd=tmp_path).stdout)
    assert "Detected mismatch between collectives" in debug["report"]
    assert plain["verdict"] == debug["verdict"] == "error"
    assert plain["likely_cause"].startswith("collectives called once per micro-batch")
    assert debug["likely_cause"] == plain["likely_cause"]


_USAGE_ERROR_IN_PROCESS = """
import os, sys
from ddp_verify.frontends.cli import main

code = main(["check", "missing.py:fn", "--kind", "grad-sync"])
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


children = [p for p in os.listdir("/proc") if p.isdigit() and parent(p) == os.getpid()]
print(code, "torch" in sys.modules, len(children))
"""


def test_a_usage_error_starts_nothing(tmp_path):
    # Arguments are checked before a fork server starts importing torch for the ranks.
    done = python_script(_USAGE_ERROR_IN_PROCESS, cwd=tmp_path)
    assert done.stdout.split() == ["2", "False", "0"], done.stdout + done.stderr


_LEAN_CONTROLLER = f"""
import sys
from ddp_verify.frontends.cli import main

HEAVY = ("torch._dynamo", "torch.distributed.fsdp", "sympy")
common = ["--kind", "grad-sync", "--world-size", "2", "--max-examples", "5", "--dtype", "float32"]
passed = main(["check", "{FIXTURES}/grad_sync.py:sample_weighted", *common])
failed = main(["check", "{FIXTURES}/grad_sync.py:average_gradients", *common])
print("codes", passed, failed, "heavy", [m for m in HEAVY if m in sys.modules])
"""


def test_the_controller_trains_nothing_and_imports_none_of_what_optimizers_pull_in(tmp_path):
    # The reference, the float32 tolerance's runs and the diagnosis's simulations train on the
    # world's helper process: the controller builds no optimizer, so torch._dynamo (with FSDP
    # and sympy inside it) stays out of it, for a passing check and a failing one alike.
    done = python_script(_LEAN_CONTROLLER, cwd=tmp_path)
    assert done.stdout.split()[-4:] == ["0", "1", "heavy", "[]"], done.stdout + done.stderr


_NO_GPU = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a GPU is visible here"
)


@_NO_GPU
@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--device", "cuda"], "device 'cuda' asked for, but no GPU is visible here"),
        (["--backend", "nccl"], "nccl needs one GPU per rank: a world of 2 needs 2 GPUs, 0"),
        (["--backend", "nccl", "--device", "cpu"], "nccl reduces CUDA tensors only"),
    ],
    ids=["cuda", "nccl", "nccl-on-cpu"],
)
def test_gpus_that_are_not_there_are_a_usage_error_said_before_anything_starts(
    tmp_path, options, words
):
    command = check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", *options, "--json")
    script = (
        "import os, sys\nfrom ddp_verify.frontends.cli import main\n"
        f"code = main({command!r})\n"
        # Any process of the machine may end between the listing and the read of its stat.
        "def parent(p):\n"
        "    try:\n"
        "        return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1]\n"
        "    except OSError:\n"
        "        return None\n"
        "children = [p for p in os.listdir('/proc') if p.isdigit() and "
        "parent(p) == str(os.getpid())]\n"
        "print('RESULT', code, len(children))\n"
    )
    done = python_script(script, cwd=tmp_path)
    document, result = done.stdout.strip().splitlines()
    assert result.split() == ["RESULT", "2", "0"], done.stdout + done.stderr  # no fork server
    verdict = json.loads(document)
    assert (verdict["verdict"], verdict["exit_code"]) == ("usage-error", 2)
    assert words in verdict["report"]


def test_bfloat16_is_a_dtype_of_the_check(tmp_path):
    result = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/grad_sync.py:sample_weighted",
            "--dtype",
            "bfloat16",
            "--max-examples",
            "10",
            "--json",
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert (verdict["verdict"], verdict["device"], verdict["examples"]) == ("equivalent", "cpu", 10)


def test_conformance_passes_the_device_options_to_pytest():
    from ddp_verify.frontends.cli import _parser, conformance_args

    command = "conformance --world-size 1 --backend nccl --device cuda --allow-tf32"
    args = _parser().parse_args(command.split())
    assert conformance_args(args, ["--", "-x"]) == [
        "--pyargs",
        "ddp_verify.conformance",
        "--world-size",
        "1",
        "--ddp-backend",
        "nccl",
        "--ddp-device",
        "cuda",
        "--ddp-allow-tf32",
        "-x",
    ]


MISMATCHED = """
import torch, torch.distributed as dist


def mismatched(model):
    t = torch.ones(3 if dist.get_rank() == 0 else 5, dtype=torch.float64)
    dist.all_reduce(t)
"""


# The name of the mismatched collective is test_plugin's test (in CI), and --ddp-debug on the
# CLI is test_ddp_debug_does_not_hide_the_cause_of_collectives_that_do_not_pair_up.
@pytest.mark.slow
def test_ddp_debug_on_the_cli_names_the_mismatched_collective(tmp_path):
    # Without it, the report of a crashed or stuck world suggests it; with it, torch names
    # the mismatch. Either way the verdict is "error": the code failed to run.
    (tmp_path / "my_code.py").write_text(MISMATCHED)
    command = check_command(f"{tmp_path}/my_code.py:mismatched", "--max-examples", "2", "--json")
    plain = json.loads(ddp_verify(*command, "--timeout", "10", cwd=tmp_path).stdout)
    assert plain["verdict"] == "error" and "rerun with --ddp-debug" in plain["report"]
    debug = json.loads(ddp_verify(*command, "--timeout", "10", "--ddp-debug", cwd=tmp_path).stdout)
    assert debug["verdict"] == "error", debug["report"]
    assert "Detected mismatch between collectives" in debug["report"]


EVERY_GRADIENT = """
import torch, torch.distributed as dist


def flat_sync(model, num_samples):
    # Assumes every parameter has a gradient, as much training code does.
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads), "a parameter without a gradient"
    flat = torch.cat([g.reshape(-1) * num_samples for g in grads])
    count = torch.tensor([float(num_samples)], dtype=flat.dtype)
    both = torch.cat([flat, count])
    dist.all_reduce(both)
    offset = 0
    for g in grads:
        g.copy_(both[offset : offset + g.numel()].view_as(g) / both[-1])
        offset += g.numel()
"""


def test_model_features_the_code_does_not_support_can_be_left_out(tmp_path):
    (tmp_path / "my_code.py").write_text(EVERY_GRADIENT)
    command = check_command(f"{tmp_path}/my_code.py:flat_sync", "--max-examples", "30", "--json")
    with_all = json.loads(ddp_verify_here(*command, "--seed", "1", cwd=tmp_path).stdout)
    assert with_all["verdict"] == "error", with_all["report"]
    assert "a parameter without a gradient" in with_all["report"]
    without = ddp_verify_here(
        *command, "--exclude-features", "unused,frozen", "--model-kinds", "mlp", cwd=tmp_path
    )
    assert json.loads(without.stdout)["verdict"] == "equivalent", without.stdout
    bad = ddp_verify_here(*command, "--exclude-features", "wings", cwd=tmp_path)
    assert bad.returncode == 2
    report = json.loads(bad.stdout)["report"]
    assert "expected model features from layernorm, tied, unused" in report


def test_a_stateful_hook_gets_the_state_its_factory_makes_on_each_rank(tmp_path):
    hooks = f"{FIXTURES}/real_style/stateful_hooks.py"
    command = check_command(
        f"{hooks}:group_average", "--max-examples", "5", "--json", kind="comm-hook"
    )
    with_state = ddp_verify_here(*command, "--hook-state", f"{hooks}:counting_state", cwd=tmp_path)
    assert json.loads(with_state.stdout)["verdict"] == "equivalent", with_state.stdout
    # Without one the hook gets state=None, as DDP gives it, and fails on the ranks.
    without = json.loads(ddp_verify_here(*command, cwd=tmp_path).stdout)
    assert without["verdict"] == "error"
    assert "'NoneType' object has no attribute 'buckets_seen'" in without["report"]
    misplaced = ddp_verify_here(
        *check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--json"),
        "--hook-state",
        f"{hooks}:counting_state",
        cwd=tmp_path,
    )
    assert misplaced.returncode == 2
    assert "--hook-state applies to comm hooks" in json.loads(misplaced.stdout)["report"]


def test_loss_reduction_applies_to_step_functions_only(tmp_path):
    steps = f"{FIXTURES}/real_style/sum_loss_steps.py"
    written_for_sum = check_command(
        f"{steps}:divide_by_global_count", "--max-examples", "5", "--json", kind="step"
    )
    ok = ddp_verify_here(*written_for_sum, "--loss-reduction", "sum", cwd=tmp_path)
    assert json.loads(ok.stdout)["verdict"] == "equivalent", ok.stdout
    # Given a mean-reduced loss_fn, the same code divides a mean by the sample count again.
    wrong = json.loads(ddp_verify_here(*written_for_sum, cwd=tmp_path).stdout)
    assert wrong["verdict"] == "not-equivalent"
    misplaced = ddp_verify_here(
        *check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--json"),
        "--loss-reduction",
        "sum",
        cwd=tmp_path,
    )
    assert misplaced.returncode == 2
    assert "--loss-reduction applies to step functions" in json.loads(misplaced.stdout)["report"]


TEAM_WRAPPER = """
from torch.nn.parallel import DistributedDataParallel


class TeamDDP(DistributedDataParallel):
    '''A team's own DDP subclass.'''
"""

TEAM_STEP = f"""
import sys
sys.path.insert(0, {str(FIXTURES / "real_style")!r})
from ddp_steps import accumulate_with_no_sync


def team_step(ddp_model, optimizer, micro_batches, loss_fn):
    assert type(ddp_model).__name__ == "TeamDDP", type(ddp_model).__name__
    return accumulate_with_no_sync(ddp_model, optimizer, micro_batches, loss_fn)
"""


def test_a_wrapped_step_gets_the_model_in_the_teams_own_wrapper(tmp_path):
    (tmp_path / "team_parallel.py").write_text(TEAM_WRAPPER)
    (tmp_path / "my_code.py").write_text(TEAM_STEP)
    env = {"PYTHONPATH": str(tmp_path)}
    command = check_command(
        f"{tmp_path}/my_code.py:team_step", "--max-examples", "5", "--json", kind="wrapped-step"
    )
    wrapped = ddp_verify(*command, "--ddp-wrapper", "team_parallel:TeamDDP", cwd=tmp_path, env=env)
    assert json.loads(wrapped.stdout)["verdict"] == "equivalent", wrapped.stdout
    plain = json.loads(ddp_verify(*command, cwd=tmp_path, env=env).stdout)
    assert plain["verdict"] == "error" and "DistributedDataParallel" in plain["report"]
    misplaced = ddp_verify(
        *check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--json"),
        "--ddp-wrapper",
        "team_parallel:TeamDDP",
        cwd=tmp_path,
        env=env,
    )
    assert misplaced.returncode == 2
    assert "--ddp-wrapper applies to wrapped-step" in json.loads(misplaced.stdout)["report"]


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, ["--world-size", "4"]),  # forked worlds: the command's default size
        # Under torchrun: the launched size, so no --world-size that could contradict it.
        (
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
            },
            [],
        ),
    ],
)
def test_conformance_without_a_world_size_runs_at_4_unless_launched(
    monkeypatch, environment, expected
):
    from ddp_verify.frontends.cli import _parser, conformance_args

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = _parser().parse_args(["conformance"])
    assert conformance_args(args, []) == ["--pyargs", "ddp_verify.conformance", *expected]


def test_the_2024_accumulation_bug_on_the_cli_lists_every_cause_in_json(tmp_path):
    # A Trainer-style loss without num_items_in_batch, on token-level scenarios (loss-fn's
    # default): per micro-batch (or per rank) normalisation, found by the fitted weights.
    result = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/real_style/trainer_losses.py:mean_cross_entropy",
            "--max-examples",
            "25",
            "--seed",
            "0",
            "--json",
            kind="loss-fn",
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    verdict = json.loads(result.stdout)
    # No layout option: the flattened logits it is written for are found by probing.
    assert verdict["call"] == (
        "mean_cross_entropy(logits[batch*seq, vocab] or [batch, classes], labels[batch*seq] or "
        "[batch])"
    )
    assert verdict["layout"].startswith("(positions, vocab) logits, labels aligned, as it agreed")
    assert (
        "(batch, seq, vocab) logits: raised RuntimeError: Expected target size"
        in (verdict["layout"])
    )
    assert "--logits 2d --labels aligned" in verdict["layout"]
    causes = verdict["likely_causes"]
    assert causes and causes[0]["cause"] == verdict["likely_cause"]
    assert {"cause", "subject", "pattern", "evidence", "weights"} <= set(causes[0])
    assert {c["pattern"] for c in causes} & {"micro:equal", "ranks:world"}
    assert "by its own token count instead of the global count" in verdict["likely_cause"]
    assert "loss='tokens'" in verdict["scenario"]
    assert "tokens that count per micro-batch:\n  step 0: rank 0: " in verdict["report"]


def test_code_that_runs_in_no_layout_is_a_usage_error_listing_each(tmp_path):
    # Every layout a loss-fn can be called in raises: nothing to search, exit 2, one JSON
    # document that names each layout with its error and the options that pin one.
    (tmp_path / "loss.py").write_text(
        "def token_loss(logits, labels):\n    return logits.sum(dim=5) / labels.numel()\n"
    )
    result = ddp_verify_here(
        *check_command("loss.py:token_loss", "--json", kind="loss-fn"), cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "usage-error"
    report = verdict["report"]
    assert "the code raised in every layout a loss-fn plug-in can be called in" in report
    for layout in (
        "(batch, seq, vocab) logits, labels aligned: raised IndexError",
        "(positions, vocab) logits, labels unshifted (shifted by the code): raised IndexError",
    ):
        assert layout in report
    assert "--logits 3d --labels aligned" in report


def test_a_users_model_is_trained_and_a_bad_factory_is_a_usage_error(tmp_path):
    good = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/real_style/token_grad_sync.py:weight_by_tokens",
            "--model",
            f"{FIXTURES}/user_models.py:tiny_lm",
            "--max-examples",
            "5",
            "--json",
        ),
        cwd=tmp_path,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["examples"] == 5
    bad = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/grad_sync.py:sample_weighted",
            "--model",
            f"{FIXTURES}/user_models.py:same_batch_every_time",
            "--json",
        ),
        cwd=tmp_path,
    )
    assert bad.returncode == 2
    assert "ignores the generator it is given" in json.loads(bad.stdout)["report"]
    mixed = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/grad_sync.py:sample_weighted",
            "--model",
            f"{FIXTURES}/user_models.py:tiny_lm",
            "--losses",
            "mse",
        ),
        cwd=tmp_path,
    )
    assert mixed.returncode == 2 and "the loss follows from your targets" in mixed.stderr


def test_a_parameter_that_says_nothing_is_a_usage_error_whose_suggested_bind_runs(tmp_path):
    # timm's reduce_tensor(tensor, n) takes the world size as n: the command refuses to guess
    # (exit 2), names the parameter and the --bind that would fit; run as suggested, the check
    # runs and finds the world-size averaging it does (exit 1).
    target = f"{FIXTURES}/real_style/bound_helpers.py:reduce_tensor"
    refused = ddp_verify_here(*check_command(target, "--json", kind="reduce"), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    verdict = json.loads(refused.stdout)
    assert verdict["verdict"] == "usage-error"
    assert "cannot tell what 'n' should get" in verdict["report"]
    suggested = re.findall(r"--bind (n=\w+)", verdict["report"])
    assert suggested[:2] == ["n=world_size", "n=count"]
    result = ddp_verify_here(
        *check_command(
            target, "--bind", suggested[0], "--max-examples", "20", "--json", kind="reduce"
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    checked = json.loads(result.stdout)
    assert checked["call"] == "reduce_tensor(tensor[], n=<the number of ranks>)"
    assert "unweighted mean of rank means" in checked["likely_cause"]


def test_version_says_its_own_python_and_torch_and_imports_no_torch():
    import platform

    import ddp_verify as package

    done = ddp_verify("--version", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    torch = __import__("importlib.metadata").metadata.version("torch")
    assert done.stdout.strip() == (
        f"ddp-verify {package.__version__} (Python {platform.python_version()}, torch {torch})"
    )
    # Python's import log (stderr) shows what the flag loaded: the CLI, not torch.
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    assert "ddp_verify.frontends.cli" in imported and "torch" not in imported
    # One place for the version: pyproject.toml reads it from the package.
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), project
    assert re.search(r'^dynamic = \["version"\]', project, re.M), project


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[str, str, int]:
    """``argv`` with stderr on a pseudo-terminal (as a user's shell gives it): what the
    terminal showed, stdout, and the exit code."""
    import pty
    import select

    leader, follower = pty.openpty()
    child = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**os.environ, "TERM": "xterm"},
    )
    os.close(follower)
    shown = b""
    while select.select([leader], [], [], 120)[0]:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    stdout = child.stdout.read().decode() if child.stdout else ""
    return shown.decode(), stdout, child.wait(timeout=60)


def test_progress_is_a_bar_with_the_total_and_the_time_on_a_terminal(tmp_path):
    argv = [sys.executable, "-m", "ddp_verify"]
    argv += check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--max-examples", "6")
    shown, stdout, code = _on_a_terminal(argv, tmp_path)
    assert code == 0, shown + stdout
    frames = shown.split("\r\x1b[K")
    assert re.fullmatch(r"\[ddp-verify\] \[#{20}\] searching: 6/6 examples, \d+ s", frames[-2])
    assert frames[-1] == "", "the bar is cleared before the report"
    assert stdout.startswith(
        f"{FIXTURES}/grad_sync.py:sample_weighted (grad-sync): equivalent on 6"
    )


def test_progress_is_plain_lines_with_the_total_and_the_time_in_a_log(tmp_path):
    result = ddp_verify(
        *check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--max-examples", "6"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert re.fullmatch(r"\[ddp-verify\] searching: 1/6 examples, \d+ s", lines[0]), lines
    assert "\r" not in result.stderr and "\x1b" not in result.stderr


def test_a_missing_function_is_said_before_the_file_is_imported(tmp_path):
    # The file would fail to import (as one that imports torch would take seconds): the
    # answer comes from reading it.
    (tmp_path / "helpers.py").write_text(
        "raise RuntimeError('imported')\n"
        "try:\n    from math import fsum as total\nexcept ImportError:\n    total = sum\n"
        "def sync(model):\n    pass\n"
        "class Reducer:\n    pass\n"
    )
    result = ddp_verify_here("check", "helpers.py:synk", "--kind", "grad-sync", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ddp-verify: error: helpers.py has no 'synk'; names it defines or imports: "
        "Reducer, sync, total"
    )


def test_a_file_whose_names_cannot_be_read_is_imported_to_find_them(tmp_path):
    (tmp_path / "starred.py").write_text("from math import *\n")
    result = ddp_verify_here("check", "starred.py:nope", "--kind", "loss", cwd=tmp_path)
    assert result.returncode == 2
    # The import's answer (its words differ from the reading's): the names math brought.
    assert "starred.py has no 'nope'; callables it defines or imports: " in result.stderr
    assert "fsum" in result.stderr


@pytest.mark.parametrize(
    ("target", "kind", "reads_as", "checked_as"),
    [
        ("grad_sync.py:average_gradients", "loss", "(model) read as --kind grad-sync", "loss"),
        # Issue 61: a loss helper checked as a grad-sync once started 4 ranks, failed on them
        # and exited 1, the right kind said only then.
        ("loss.py:sample_weighted", "grad-sync", "(local_loss, num_samples) read as --kind loss",
         "grad-sync"),
    ],
)  # fmt: skip
def test_code_checked_as_the_wrong_kind_is_refused_before_any_rank_starts(
    tmp_path, target, kind, reads_as, checked_as
):
    result = ddp_verify_here(
        *check_command(f"{FIXTURES}/{target}", kind=kind), "--world-size", "4", cwd=tmp_path
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"its parameters {reads_as} (" in result.stderr
    assert f"not as a {checked_as} plug-in" in result.stderr
    assert "raised" not in result.stdout + result.stderr  # no rank ran it
    assert "[ddp-verify] " not in result.stderr  # no progress: nothing started


def test_a_signature_of_another_kind_is_a_usage_error_naming_it(tmp_path):
    result = ddp_verify_here(
        *check_command(f"{FIXTURES}/step.py:accumulate_weighted"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.rstrip().endswith("check it with --kind step"), result.stderr


def test_check_plots_the_fitted_weights_of_a_counterexample(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")
    from PIL import Image

    result = ddp_verify_here(
        *check_command(f"{FIXTURES}/grad_sync.py:average_gradients", "--plot", "w.png"),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert "[ddp-verify] wrote w.png" in result.stderr
    with Image.open(tmp_path / "w.png") as image:
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50  # not blank
    # An equivalent verdict has no weights to draw: said, and the verdict stands.
    result = ddp_verify_here(
        *check_command(
            f"{FIXTURES}/grad_sync.py:sample_weighted", "--max-examples", "3", "--plot", "e.png"
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "no picture written to e.png: nothing to plot: the verdict is 'equivalent'" in (
        result.stderr
    )
    assert not (tmp_path / "e.png").exists()


def test_plots_without_matplotlib_are_a_usage_error_before_anything_runs(tmp_path):
    for argv in (
        check_command(f"{FIXTURES}/grad_sync.py:sample_weighted", "--plot", "w.png"),
        ["parity", "--html", "p.html", "--", "python", "-c", "pass"],
    ):
        # matplotlib made unimportable in the command's own process, as if not installed.
        script = (
            "import sys; sys.modules['matplotlib'] = None; "
            "from ddp_verify.frontends.cli import main; "
            f"sys.exit(main({argv!r}))"
        )
        result = python_script(script, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "plots need matplotlib: pip install 'ddp_verify[plot]'" in result.stderr
        assert "[ddp-verify] layout" not in result.stderr and "searching" not in result.stderr


def test_the_default_report_leaves_the_evidence_to_verbose_and_json(tmp_path):
    target = f"{FIXTURES}/grad_sync.py:average_gradients"
    brief = ddp_verify_here(*check_command(target, "--seed", "0"), cwd=tmp_path)
    full = ddp_verify_here(*check_command(target, "--seed", "0", "--verbose"), cwd=tmp_path)
    assert brief.returncode == full.returncode == 1
    assert "evidence:" not in brief.stdout and "evidence:" in full.stdout
    assert brief.stdout.rstrip().endswith(
        "(The evidence behind each cause: rerun with --verbose, or --json.)"
    )
    # Nothing else is left out: the same report, less the evidence lines.
    kept = [line for line in full.stdout.splitlines() if "evidence:" not in line]
    assert brief.stdout.splitlines()[:-1] == kept


@pytest.mark.parametrize(
    ("target", "kind", "options", "says"),
    [
        ("grad_sync.py:sample_weighted", "grad-sync", ("--towers", "1"), "--towers 1 shapes"),
        (
            "real_style/open_clip_losses.py:clip_loss_gather_with_grad",
            "coupled-loss",
            ("--losses", "tokens"),
            "--losses chooses the models or losses",
        ),
        (
            "real_style/open_clip_losses.py:clip_loss_gather_with_grad",
            "coupled-loss",
            ("--dtype", "bfloat16"),
            "a 16-bit one is not measured yet",
        ),
    ],
)
def test_a_bound_the_kinds_scenarios_do_not_draw_is_a_usage_error(
    tmp_path, target, kind, options, says
):
    # Exit 2, in the words the user typed.
    command = check_command(f"{FIXTURES}/{target}", *options, kind=kind)
    result = ddp_verify_here(*command, "--json", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "usage-error" and says in verdict["report"], verdict["report"]


_PRESTART_ORDER = """
import argparse, sys
from ddp_verify.frontends import cli
from ddp_verify.world import forkserver

def server_for(*args, **kwargs):
    print("torch imported first" if "torch" in sys.modules else "server asked first")
    raise forkserver.ForkServerError("not started: the order is all this test wants")

forkserver.server_for = server_for
cli._prestart(argparse.Namespace(
    world_size=2, backend="gloo", device="cpu", allow_tf32=False, debug=False
))
"""


def test_the_cli_asks_for_the_fork_server_before_it_imports_torch():
    # The server's torch import overlaps this process's only if it is asked for first: a
    # prestart that imports torch on its way costs the whole import again (3 s here).
    result = subprocess.run(
        [sys.executable, "-c", _PRESTART_ORDER], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "server asked first"


# User code reached through another module's code: a library's closure, a partial, a
# decorator's wrapper. The function handed over is not the user's, so what the ranks need of
# the user's file is known only where pickling reaches it.
_WRAPPED_HOOKS = """
import functools
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper


def my_hook(state, bucket, divide=True):
    tensor = bucket.buffer()
    if divide:
        tensor.div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def traced(hook):
    @functools.wraps(hook)
    def wrapper(state, bucket):
        return hook(state, bucket)
    return wrapper


def weighted_sync(model, num_samples, *, total_dtype):
    total = torch.tensor([float(num_samples)], dtype=total_dtype)
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(num_samples)
            dist.all_reduce(p.grad)
            p.grad.div_(total.item())


compressed = fp16_compress_wrapper(my_hook)
decorated = traced(my_hook)
# torch's DDP refuses a partial as a comm hook (it reads the hook's __name__): a sync here.
partial_sync = functools.partial(weighted_sync, total_dtype=torch.float64)
"""


@pytest.mark.parametrize(
    ("name", "kind", "options"),
    [
        ("compressed", "comm-hook", ("--lossy", "fp16")),
        ("decorated", "comm-hook", ()),
        ("partial_sync", "grad-sync", ()),
    ],
)
def test_user_code_inside_a_library_closure_reaches_the_ranks(tmp_path, name, kind, options):
    (tmp_path / "hooks.py").write_text(_WRAPPED_HOOKS)
    target = f"{tmp_path}/hooks.py:{name}"
    command = check_command(target, "--max-examples", "3", *options, kind=kind)
    result = ddp_verify_here(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equivalent on 3 generated scenarios" in result.stdout
