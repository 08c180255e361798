"""ddp-verify parity on a real script with real torchrun launches: the plain DDP script is
equivalent at every layout, each classic variant is caught for the reason it names, and the
command line says so in its report and in one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_verify.parity.launch import launch
from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.recording import Recording
from ddp_verify.parity.run import compare_recordings, run_parity

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "plain_ddp.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip
GLOBAL_BATCH = 16
STEPS = 2
SHORT = 27  # samples in the data set for the short-last-batch variants


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Recording:
    # At one process and one micro-batch every variant is the correct script.
    directory = tmp_path_factory.mktemp("reference") / "1x1"
    run = launch(Layout(1, 1), COMMAND, directory, steps=STEPS, global_batch=GLOBAL_BATCH)
    assert run.returncode == 0, run.output
    return Recording.load(directory)


def _variant(tmp_path, variant: str, layout: Layout) -> Recording:
    directory = tmp_path / str(layout)
    command = [*COMMAND, "--variant", variant]
    run = launch(layout, command, directory, steps=STEPS, global_batch=GLOBAL_BATCH)
    assert run.returncode == 0, run.output
    return Recording.load(directory)


def test_the_correct_script_trains_the_same_at_every_layout(tmp_path):
    result = run_parity(
        COMMAND,
        layouts=[Layout(1, 4), Layout(2, 2)],
        steps=STEPS,
        global_batch=GLOBAL_BATCH,
        keep=tmp_path,
    )
    assert result.exit_code == 0, result.report
    assert [row["layout"] for row in result.layouts] == ["1x4", "2x2"]
    for row in result.layouts:
        assert row["verdict"] == "equivalent" and row["steps"] == STEPS
        # float64 throughout: a correct layout differs by rounding alone.
        assert row["gradient_difference"] < 1e-12 and row["parameter_difference"] < 1e-12
    recording = Recording.load(tmp_path / "2x2")
    assert recording.world_size == 2 and recording.grad_accum == 2 and recording.float64
    assert sum(recording.samples(0).values()) == GLOBAL_BATCH
    assert "Every layout trains what the reference trains" in result.report


@pytest.mark.parametrize(
    ("variant", "layout", "pattern", "words"),
    [
        ("no-divide", Layout(1, 4), "scale:A", "not divided by the accumulation steps"),
        ("zero-grad-inside", Layout(2, 2), "micro:cleared", "zero_grad() inside"),
        ("no-sampler", Layout(2, 1), "data:same-samples", "no DistributedSampler"),
        ("local-sync", Layout(2, 1), "sync:left-out", "'2.weight'"),
        ("seed-by-world", Layout(2, 1), "data:order", "depend on the layout"),
        # Training is right; the loss it logs is rank 0's own.
        ("log-local", Layout(2, 1), "loss:local", "the rank's local loss"),
    ],
)
def test_each_classic_mistake_is_caught_for_its_reason(
    reference, tmp_path, variant, layout, pattern, words
):
    recorded = _variant(tmp_path, variant, layout)
    # Training decides: a layout that trains the same and logs another loss passes, warned.
    logged_only = pattern.startswith("loss:")
    result = compare_recordings(reference, [recorded], steps=STEPS, strict_loss=True)
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.key == pattern and words in first.text, result.report
    assert result.layouts[0]["causes"][0] == pattern
    # Only the logged loss is wrong where the loss is all that differs, and said so.
    training = "equivalent" if logged_only else "not-equivalent"
    assert result.layouts[0]["training"] == result.to_json()["training"] == training
    said = "NOT equivalent: training is equivalent; only the logged loss differs: "
    assert (said in result.report) == logged_only, result.report
    assert result.layouts[0]["logged_loss_differs"] == logged_only
    lenient = compare_recordings(reference, [recorded], steps=STEPS)
    document = json.loads(json.dumps(lenient.to_json()))
    assert lenient.exit_code == document["exit_code"] == (0 if logged_only else 1), lenient.report
    assert document["strict_loss"] is False and result.to_json()["strict_loss"] is True
    assert bool(document["warnings"]) == logged_only, document["warnings"]
    if logged_only:
        assert document["verdict"] == "equivalent" and "strict_loss" in document["warnings"][0]
        assert "Warning: layout 2x1: training is equivalent" in lenient.report
        assert words in document["warnings"][0]


@pytest.fixture(scope="module")
def short_reference(tmp_path_factory) -> Recording:
    # 27 samples: the second step's global batch is 11, split 6 and 5 at two ranks.
    directory = tmp_path_factory.mktemp("short") / "1x1"
    command = [*COMMAND, "--samples", str(SHORT)]
    run = launch(Layout(1, 1), command, directory, steps=STEPS, global_batch=GLOBAL_BATCH)
    assert run.returncode == 0, run.output
    return Recording.load(directory)


@pytest.mark.parametrize(
    ("variant", "pattern", "words"),
    [
        # DistributedSampler pads 27 samples to 28: one sample of step 0 is trained again.
        ("correct", "data:duplicated", "1 sample(s) the layout trained at an earlier step"),
        ("drop-last", "data:missing", "step 1: 1 of 11 missing"),
        # Right while the ranks hold 8 and 8; at 6 and 5 DDP's average weighs them alike.
        ("uneven-last", "ranks:world", "not weighted by each rank's samples"),
    ],
)
def test_a_short_last_batch_is_caught_for_its_reason(
    short_reference, tmp_path, variant, pattern, words
):
    directory = tmp_path / "2x1"
    command = [*COMMAND, "--variant", variant, "--samples", str(SHORT)]
    run = launch(Layout(2, 1), command, directory, steps=STEPS, global_batch=GLOBAL_BATCH)
    assert run.returncode == 0, run.output
    result = compare_recordings(short_reference, [Recording.load(directory)], steps=STEPS)
    assert result.exit_code == 1, result.report
    first = result.verdict.causes[0]
    assert first.key == pattern and words in first.text + first.evidence, result.report
    if pattern == "ranks:world":
        # Found at the step that splits unevenly, with the counts that show it.
        assert "step 1" in first.evidence and "6 of the step's 11 samples" in first.evidence


@pytest.mark.parametrize(
    ("variant", "equivalent"),
    [("correct", True), pytest.param("no-divide", False, marks=pytest.mark.slow)],
)
def test_a_step_through_a_closure_is_read_once_the_closure_has_run(tmp_path, variant, equivalent):
    # Lightning's Trainer steps so: the last micro-batch's forward and backward run inside
    # optimizer.step(closure). Read before the closure ran, the 2x2 gradient was the ranks'
    # unsynchronised accumulation ("parameters left out of synchronisation").
    result = run_parity(
        [*COMMAND, "--closure", "--variant", variant],
        layouts=[Layout(2, 2)],
        steps=STEPS,
        global_batch=GLOBAL_BATCH,
        keep=tmp_path,
    )
    assert (result.exit_code == 0) is equivalent, result.report
    if not equivalent:
        assert result.verdict.causes[0].key == "scale:A", result.report


def test_accumulation_without_no_sync_is_correct(reference, tmp_path):
    recording = _variant(tmp_path, "without-no-sync", Layout(2, 2))
    result = compare_recordings(reference, [recording], steps=STEPS)
    assert result.exit_code == 0, result.report


def test_the_command_prints_one_json_document_and_exits_as_check_does(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "1x2", "--steps", "1",
         "--global-batch", str(GLOBAL_BATCH), "--json", "--", *COMMAND, "--variant",
         "no-divide"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["verdict"] == "not-equivalent" and document["exit_code"] == 1
    assert document["likely_causes"][0]["reading"] == "scale:A"
    assert "2x what it should" in document["likely_cause"]
    assert [row["layout"] for row in document["layouts"]] == ["1x2"]
    assert "--grad-accum 2 --batch-size 8" in document["reproducer"]
    assert "[ddp-verify] layout 1x2: running" in done.stderr
    assert not list(tmp_path.iterdir())  # recordings in a temporary directory, removed


def test_bad_layouts_and_commands_are_usage_errors_before_anything_runs(tmp_path, capsys):
    from ddp_verify.frontends import parity_command

    for argv, said in [
        (["--layouts", "2y2", "--", *COMMAND], "is neither WORLD_SIZExGRAD_ACCUM"),
        (["--layouts", "2x3", "--global-batch", "16", "--", *COMMAND], "does not divide"),
        (["--layouts", "2x2", "--", *COMMAND], "{micro_batch} needs --global-batch N"),
        (["--layouts", "2x2", "--", "python", "missing.py"], "missing.py: no such script"),
        # A command that forgets a placeholder: named before any layout trains other batches.
        (
            [
                "--layouts",
                "2x2",
                "--global-batch",
                "16",
                "--",
                "python",
                str(SCRIPT),
                "--grad-accum",
                "{grad_accum}",
            ],
            "never passes the script a batch size",
        ),
        (
            [
                "--layouts",
                "2x1,2x2",
                "--global-batch",
                "16",
                "--",
                "python",
                str(SCRIPT),
                "--batch-size",
                "{micro_batch}",
            ],
            "layout 2x2 accumulates gradients, but the command never",
        ),
        (["--layouts", "2y2"], "2y2"),
        (["compare", str(tmp_path)], "give the reference's directory"),
        (["compare", str(tmp_path), str(tmp_path)], "no recording (rank0.pt is missing)"),
    ]:
        result = parity_command.run(argv)
        assert result.exit_code == 2 and said in result.report, (argv, result.report)
        assert "[ddp-verify] layout" not in capsys.readouterr().err  # nothing was launched
    # The command itself: exit 2, the message on stderr, one JSON document with --json.
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "--json", "--layouts", "2y2", "--",
         *COMMAND],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["verdict"] == "usage-error"


def test_with_no_script_parity_checks_the_bundled_example(tmp_path):
    # The README's first command: nothing of the user's needed, run from anywhere.
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "1x2", "--steps", "1",
         "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checking the bundled example, example_script.py" in done.stderr
    document = json.loads(done.stdout)
    assert document["verdict"] == "equivalent"
    assert [row["layout"] for row in document["layouts"]] == ["1x2"], document["layouts"]


def test_a_test_asserts_parity_and_fails_with_the_report(tmp_path):
    import ddp_verify

    with pytest.raises(ddp_verify.ParityFailed) as caught:
        ddp_verify.assert_parity(
            [*COMMAND, "--variant", "no-divide"],
            layouts="1x2",
            steps=1,
            global_batch=GLOBAL_BATCH,
        )
    assert isinstance(caught.value, AssertionError)  # pytest shows it as a test failure
    assert "Layout 1x2 is not equivalent to the reference" in str(caught.value)
    assert caught.value.result.verdict.causes[0].key == "scale:A"


# Two agents are test_parity_starts_a_layout_across_two_node_agents_itself and parity compare
# is test_compare_of_recordings_in_a_forced_precision_needs_the_variant (both in CI).
@pytest.mark.slow
def test_a_layout_across_two_node_agents_recorded_by_the_users_own_launch(reference, tmp_path):
    # On a cluster each layout is launched by hand: DDP_VERIFY_RECORD alone installs the
    # recorder (the package's .pth file), the script and torchrun's command are unmodified,
    # and `ddp-verify parity compare` judges the recordings.
    from tests.spmd import environment, torchrun_nodes

    directory = tmp_path / "2x2-two-nodes"
    env = environment(DDP_VERIFY_RECORD=str(directory), DDP_VERIFY_STEPS=str(STEPS))
    script = [str(SCRIPT), "--grad-accum", "2", "--batch-size", "4"]
    jobs = torchrun_nodes(script, cwd=tmp_path, nodes=2, nproc=1, env=env)
    assert all(job.returncode == 0 for job in jobs), [job.output[-2000:] for job in jobs]
    # One file per rank of the job; the agents, which train nothing, wrote none.
    assert sorted(p.name for p in directory.iterdir()) == ["rank0.pt", "rank1.pt"]
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "compare", str(reference.directory),
         str(directory), "--steps", str(STEPS), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    document = json.loads(done.stdout)
    assert done.returncode == 0 and document["verdict"] == "equivalent", done.stdout
    (row,) = document["layouts"]
    assert (row["world_size"], row["grad_accum"]) == (2, 2)


def test_parity_starts_a_layout_across_two_node_agents_itself(tmp_path):
    # --nnodes 2 with the default launcher: two torchrun agents on this machine, joined by the
    # c10d rendezvous on loopback, one rank each.
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "2x2", "--nnodes", "2",
         "--global-batch", str(GLOBAL_BATCH), "--steps", "1", "--keep", str(tmp_path),
         "--json", "--", *COMMAND],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    document = json.loads(done.stdout)
    assert done.returncode == 0 and document["verdict"] == "equivalent", done.stdout
    (row,) = document["layouts"]
    assert "--nnodes 2" in row["command"] and "--rdzv-backend c10d" in row["command"]
    # Each rank ran under its own agent (torchrun's GROUP_RANK: the node).
    recording = Recording.load(tmp_path / "2x2")
    assert sorted(r["meta"]["node"] for r in recording.ranks) == [0, 1]
    # A world size the nodes do not divide is refused before anything runs.
    refused = subprocess.run(
        [sys.executable, "-m", "ddp_verify", "parity", "--layouts", "3x1", "--nnodes", "2",
         "--global-batch", "15", "--", *COMMAND],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "do not divide over 2 nodes" in refused.stderr


def test_a_layout_whose_run_fails_is_an_error_with_its_output(tmp_path):
    result = run_parity(
        [*COMMAND, "--variant", "crash"],
        layouts=[Layout(2, 1)],
        steps=STEPS,
        global_batch=GLOBAL_BATCH,
        timeout=120,
    )
    assert result.verdict.status.value == "error" and result.exit_code == 1, result.report
    assert "Layout 2x1 exited with status" in result.report
    assert "rank 1 found no data for its shard" in result.report  # the ranks' own words
    assert result.layouts[0] == {"layout": "2x1", "verdict": "error"}


def test_compare_of_recordings_in_a_forced_precision_needs_the_variant(tmp_path, capsys):
    from ddp_verify.frontends import parity_command

    command = [*COMMAND, "--precision", "float32"]
    for layout, name, perturb in [
        (Layout(1, 1), "1x1", None),
        (Layout(1, 1), "variant", 1),
        (Layout(1, 2), "1x2", None),
    ]:
        run = launch(
            layout, command, tmp_path / name, steps=1, global_batch=GLOBAL_BATCH, perturb=perturb
        )
        assert run.returncode == 0, run.output
    dirs = [str(tmp_path / "1x1"), str(tmp_path / "1x2"), "--steps", "1"]
    refused = parity_command.run(["compare", *dirs])
    assert refused.exit_code == 2 and "give it with --variant DIR" in refused.report
    assert "DDP_VERIFY_PERTURB=1 and" in refused.report, refused.report
    judged = parity_command.run(["compare", *dirs, "--variant", str(tmp_path / "variant")])
    assert judged.exit_code == 0, judged.report
    assert "rounding-only variant" in judged.layouts[0]["tolerance"]


@pytest.mark.parametrize(
    ("precision", "variant", "equivalent"),
    [
        ("bf16-autocast", "correct", True),  # no false alarm under the script's own autocast
        ("float32", "one-percent", False),  # a 1% weighting error, held to float32's bound
        ("default", "one-percent", False),  # and in float64, the recorder's default
        # A model cast with .bfloat16(): bounded by bf16's rounding (a 1% weighting is below
        # it), a factor of 2 still read.
        ("bf16-model", "correct", True),
        ("bf16-model", "no-divide", False),
    ],
)
def test_the_bound_follows_the_scripts_precision(tmp_path, precision, variant, equivalent):
    command = [*COMMAND, "--precision", precision, "--variant", variant]
    layout = Layout(2, 2) if equivalent else Layout(1, 2)
    result = run_parity(command, layouts=[layout], steps=STEPS, global_batch=GLOBAL_BATCH)
    assert result.exit_code == (0 if equivalent else 1), result.report
    (row,) = result.layouts
    forced = precision != "default"
    assert ("rounding-only variant" in row["tolerance"]) == forced, row
    if equivalent:
        # Each figure printed is the largest difference as a fraction of its tensor's largest
        # value, as the row says: bf16's rounding, not a parameter's near-zero element (read
        # per element, a relative difference of several units).
        assert "of its tensor's largest value" in result.report
        assert 0 < row["parameter_difference"] < 0.1, row
    if precision == "bf16-model":
        assert "computed in bfloat16" in result.report, result.report
    if not equivalent and variant == "no-divide":
        assert result.verdict.causes[0].reading == "scale:A", result.report
    elif not equivalent:
        # The first micro-batch counted 1.01: to give the reference's gradient it must count
        # 1/1.01 of what it did, the second as it did. (The logged loss is the one the
        # layout trained: no second cause.)
        (cause,) = result.verdict.causes
        assert cause.key == "micro:weights", result.report
        weights = [float(w) for w in cause.text.split("must count ")[1].split(" (")[0].split(", ")]
        assert weights == pytest.approx([1 / 1.01, 1], rel=1e-3), cause.text


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 1, reason=f"needs a visible GPU; {GPUS} visible here")
@pytest.mark.parametrize(
    ("variant", "equivalent"), [("correct", True), ("zero-grad-inside", False)]
)
def test_a_script_that_trains_on_gpus(tmp_path, variant, equivalent):
    # The recorder reads CUDA tensors (gradients, parameters, inputs, losses). One rank on
    # one GPU reduces through nccl; at 2x2 on one GPU the ranks share it through gloo.
    command = [*COMMAND, "--device", "cuda", "--variant", variant]
    layouts = [Layout(1, 2), Layout(2, 2)]
    result = run_parity(command, layouts=layouts, steps=STEPS, global_batch=12, keep=tmp_path)
    assert result.exit_code == (0 if equivalent else 1), result.report
    if equivalent:
        for row in result.layouts:
            assert row["gradient_difference"] < 1e-12, row
    else:
        assert result.verdict.causes[0].key == "micro:cleared", result.report
    # Each layout trained where the script put it, with the backend it chose.
    assert "rank 0 on cuda:0 via nccl" in (tmp_path / "1x2" / "output.log").read_text()
    shared = "nccl" if GPUS >= 2 else "gloo"
    output = (tmp_path / "2x2" / "output.log").read_text()
    assert f"rank 1 on cuda:{1 % GPUS} via {shared}" in output


STEPPING = [
    "python",
    str(Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "stepping.py"),
    "--grad-accum",
    "{grad_accum}",
    "--batch-size",
    "{micro_batch}",
]


@pytest.mark.parametrize(
    "flags",
    [
        # LBFGS calls its closure again at other parameters within one step: the samples of
        # those calls are the step's, not more micro-batches (read as duplicates before).
        ["--optimizer", "lbfgs"],
        pytest.param(["--scaler", "--scheduler", "per-step"], marks=pytest.mark.slow),
    ],
    ids=["lbfgs", "scaler-scheduler"],
)
def test_other_ways_of_stepping_train_the_same(tmp_path, flags):
    result = run_parity(
        [*STEPPING, *flags], layouts=[Layout(2, 2)], steps=3, global_batch=16, keep=tmp_path
    )
    assert result.exit_code == 0, result.report
    (row,) = result.layouts
    assert row["gradient_difference"] < 1e-10 and row["parameter_difference"] < 1e-10, row
    # Each layout's micro-batches and samples counted once a step, re-evaluations left out.
    assert row["grad_accum"] == 2, row
    assert "1 micro-batch(es), 16 samples a step" in result.report, result.report


def test_a_schedule_stepped_per_micro_batch_is_named_by_the_learning_rate(tmp_path):
    result = run_parity(
        [*STEPPING, "--scheduler", "per-micro-batch"],
        layouts=[Layout(1, 2)],
        steps=2,
        global_batch=16,
        keep=tmp_path,
    )
    assert result.exit_code == 1, result.report
    (cause,) = result.verdict.causes
    assert cause.pattern == "optimizer:settings", result.report
    # Stepped twice before step 0 applied it: 0.8² of the reference's rate at step 0.
    assert "step 0: lr 0.064, the reference's 0.08, 0.8x" in cause.text, result.report


def _not_blank(path) -> int:
    """The number of colours the image at ``path`` uses (a blank one has one)."""
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 20) or [])


def test_the_curves_are_drawn_with_the_first_divergence_marked(reference, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")
    from ddp_verify.parity.plot import save_curves, save_html

    result = compare_recordings(
        reference,
        [_variant(tmp_path, "zero-grad-inside", Layout(1, 2)), _variant(tmp_path, "correct",
                                                                        Layout(2, 1))],
        steps=STEPS,
    )  # fmt: skip
    document = json.loads(json.dumps(result.to_json()))  # a saved --json draws the same
    rows = {row["layout"]: row for row in document["layouts"]}
    assert (
        rows["1x2"]["first_divergence_step"] == 0 and rows["2x1"]["first_divergence_step"] is None
    )
    expected = document["reference_layout"]["curves"]
    assert len(expected["loss"]) == len(expected["gradient_norm"]) == STEPS
    # The correct layout's curve is the reference's; the mistaken one's gradient is not.
    assert rows["2x1"]["curves"]["gradient_norm"] == pytest.approx(expected["gradient_norm"])
    assert rows["1x2"]["curves"]["gradient_norm"][0] != pytest.approx(expected["gradient_norm"][0])
    picture = save_curves(document, tmp_path / "parity.png")
    assert _not_blank(picture) > 50
    page = save_html(document, tmp_path / "parity.html").read_text()
    assert "data:image/png;base64," in page and "zero_grad() inside" in page
