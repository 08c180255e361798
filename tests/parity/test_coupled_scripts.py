"""ddp-verify parity on a contrastive script whose loss couples samples across ranks (features
gathered from every rank), with real torchrun launches: layouts that accumulate are not judged
and the report says why, unless the script says it caches gradients; the recorder sees the
gather that carries gradient, and open_clip's default gather is named in the loss's terms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_verify.parity.launch import launch
from ddp_verify.parity.layouts import Layout
from ddp_verify.parity.recording import Recording, RecordingError
from ddp_verify.parity.run import compare_recordings, run_parity

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "contrastive.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip
GLOBAL_BATCH = 8
STEPS = 2


def _recorded(tmp_path: Path, layout: Layout, variant: str) -> Recording:
    directory = tmp_path / f"{variant}-{layout}"
    command = [*COMMAND, "--variant", variant]
    run = launch(layout, command, directory, steps=STEPS, global_batch=GLOBAL_BATCH)
    assert run.returncode == 0, run.output
    return Recording.load(directory)


def test_a_coupled_loss_is_judged_at_layouts_of_one_micro_batch_and_says_why(tmp_path):
    result = run_parity(
        COMMAND,
        layouts=[Layout(1, 2), Layout(2, 1)],
        steps=STEPS,
        global_batch=GLOBAL_BATCH,
        keep=tmp_path,
    )
    assert result.exit_code == 0, result.report
    rows = {row["layout"]: row for row in result.layouts}
    assert rows["2x1"]["verdict"] == "equivalent"
    assert rows["1x2"]["verdict"] == "not-judged" and "--caches-gradients" in rows["1x2"]["why"]
    # The layout that accumulates never ran: the gather showed at 2x1, which ran first.
    assert not (tmp_path / "1x2").exists() and (tmp_path / "2x1").exists()
    assert "Not judged: layouts 1x2." in result.report
    assert f"all_gather at {SCRIPT}" in result.report, result.report
    # The reference runs on one process: no gather there.
    assert Recording.load(tmp_path / "1x1").exchanged == []


def test_a_script_that_caches_gradients_is_judged_at_every_layout(tmp_path):
    command = [*COMMAND, "--variant", "grad-cache"]
    kwargs = dict(steps=STEPS, global_batch=GLOBAL_BATCH, keep=tmp_path)
    said = run_parity(command, layouts=[Layout(2, 2)], caches_gradients=True, **kwargs)
    assert said.exit_code == 0, said.report
    assert [row["verdict"] for row in said.layouts] == ["equivalent"]
    # Not said: the gather of the cached features (torch.cat of leaves) is seen, and the
    # only layout asked accumulates.
    with pytest.raises(RecordingError, match="no layout left to judge"):
        compare_recordings(
            Recording.load(tmp_path / "1x1"), [Recording.load(tmp_path / "2x2")], steps=STEPS
        )


def test_open_clips_default_gather_is_named_as_the_whole_batchs_gradient_over_w(tmp_path):
    reference = _recorded(tmp_path, Layout(1, 1), "correct")
    other = _recorded(tmp_path, Layout(2, 1), "local-features")
    assert other.exchanged and other.exchanged[0].startswith("all_gather at ")
    result = compare_recordings(reference, [other], steps=STEPS)
    assert result.exit_code == 1
    first = result.verdict.causes[0]
    assert first.key == "coupled:scale:1/W", result.report
    assert "1/2 times the reference's" in first.text and "every rank's gradient" in first.text
    assert "features that carry gradient: all_gather at" in first.evidence


def test_the_reference_of_a_coupled_loss_may_not_accumulate(tmp_path):
    accumulating = _recorded(tmp_path, Layout(1, 2), "correct")
    gathering = _recorded(tmp_path, Layout(2, 1), "correct")
    with pytest.raises(RecordingError, match="--reference 1x1"):
        compare_recordings(accumulating, [gathering], steps=STEPS)


def test_parity_compare_takes_caches_gradients_and_prints_one_json_document(tmp_path):
    reference = _recorded(tmp_path, Layout(1, 1), "correct")
    other = _recorded(tmp_path, Layout(2, 2), "correct")
    assert reference.directory is not None and other.directory is not None
    command = [sys.executable, "-m", "ddp_verify", "parity", "compare", str(reference.directory),
               str(other.directory), "--steps", str(STEPS), "--json"]  # fmt: skip
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no layout left to judge" in json.loads(refused.stdout)["report"]
    judged = subprocess.run(
        [*command, "--caches-gradients"], capture_output=True, text=True, timeout=120
    )
    # The script's accumulation is not GradCache's: judged, it differs, and is said to.
    assert judged.returncode == 1, judged.stdout + judged.stderr
    assert json.loads(judged.stdout)["layouts"][0]["verdict"] == "not-equivalent"
