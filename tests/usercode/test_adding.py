"""Adding is small: a cause is one row of the diagnosis's axes with its words, a layout one row
of a kind's layout axis; each is then found and reported end to end, with nothing else
changed (ddp_verify/usercode/diagnosis/axes.py, ddp_verify/usercode/layouts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ddp_verify import EquivalenceError, check
from ddp_verify.usercode.diagnosis import axes, likely_causes
from ddp_verify.usercode.verdict import describe_causes


def weighted_by_squares(model, num_samples):
    """A grad-sync that weights each rank by the square of its sample count: a mistake no
    row names."""
    import torch
    import torch.distributed as dist

    squares = torch.tensor([float(num_samples) ** 2], dtype=torch.float64)
    dist.all_reduce(squares)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(float(num_samples) ** 2 / squares.item())
            dist.all_reduce(p.grad)


def _by_squares(context, group):
    ranks = {g.rank for g in context.groups}
    return context.items(group.rank) ** 2 / sum(context.items(r) ** 2 for r in ranks)


SQUARES = axes.Choice(
    "ranks",
    "squares",
    "ranks:squares",
    weight=_by_squares,
    words="ranks weighted by the square of their {unit} counts, not by their share",
)


def test_a_cause_added_as_one_row_is_found_and_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(weighted_by_squares, kind="grad-sync", world_size=2, max_examples=20, seed=0)
    outcome = caught.value.verdict.outcome
    found = (outcome.scenario, outcome.reference, outcome.got)
    without = likely_causes("grad-sync", *found)
    assert without[0].pattern != "ranks:squares"
    with axes.added(SQUARES):
        said = likely_causes("grad-sync", *found)
    assert said[0].pattern == "ranks:squares", [c.pattern for c in said]
    assert said[0].text.startswith("ranks weighted by the square of their sample counts")
    assert "ranks weighted by the square" in describe_causes(said)
    # The row is gone after the block: the mechanism holds no copy of it.
    assert likely_causes("grad-sync", *found)[0].pattern == without[0].pattern


def test_an_axis_takes_no_second_row_of_a_name():
    twin = axes.Choice("ranks", "world", "ranks:world", weight=_by_squares)
    with pytest.raises(ValueError, match="already has a choice 'world'"):
        axes.added(twin).__enter__()
    assert [c.name for c in axes.rows("ranks")].count("world") == 1


# A layout is one row; it must be in every rank process, so the script adds it before the
# world starts, as a plug-in module would on import.
_TUPLE_LAYOUT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from ddp_verify import check
    from ddp_verify.usercode import layouts

    def average_pair(values):
        if not isinstance(values, tuple):
            raise TypeError(f"takes a tuple of tensors, got {type(values).__name__}")
        stacked = torch.stack(values)
        dist.all_reduce(stacked)
        return tuple(stacked / dist.get_world_size())

    if sys.argv[1] == "added":
        layouts.add_choice(
            "tensors",
            layouts.Choice(
                "tuple",
                "a tuple of one tensor",
                hand_over=lambda tensor: (tensor,),
                take_back=lambda result, given: result[0],
            ),
        )
    try:
        verdict = check(average_pair, kind="reduce", world_size=2, max_examples=10, seed=0,
                        even=True)
    except Exception as exc:
        verdict = getattr(exc, "verdict", None)
        if verdict is None:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            sys.exit(0)
    print(json.dumps({"status": verdict.status.value, "layout": verdict.layout,
                      "call": verdict.call}))
    """
)


@pytest.mark.parametrize("added", ["added", pytest.param("not", marks=pytest.mark.slow)])
def test_a_layout_added_as_one_row_is_probed_chosen_and_reported(added, tmp_path):
    script = tmp_path / "tuple_layout.py"
    script.write_text(_TUPLE_LAYOUT)
    done = subprocess.run(
        [sys.executable, str(script), added],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if added == "not":
        # No layout of the kind runs a helper that takes a tuple: a usage error naming each.
        assert "raised TypeError: takes a tuple of tensors" in result["error"]
        return
    assert result["status"] == "equivalent", result
    assert result["layout"].startswith("a tuple of one tensor, as it agreed with the reference")
    assert "a tensor: raised TypeError: takes a tuple of tensors, got Tensor" in result["layout"]
