"""A factor that is the size of a process group the code made is named with the group
(issue 62: a hook dividing by another group's size read as "scaled 2x", the group unnamed)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ddp_verify import NotEquivalent, VerifyingWorld, check

_groups: dict[str, object] = {}


def _own_group():
    # One group per rank (a node's, with one process a node), made once on every rank.
    if "own" not in _groups:
        made = [dist.new_group([r]) for r in range(dist.get_world_size())]
        _groups["own"] = made[dist.get_rank()]
    return _groups["own"]


def divides_by_its_groups_size(state, bucket):
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group=_own_group()))
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda f: f.value()[0])


@pytest.fixture(scope="module")
def world2():
    with VerifyingWorld(2) as world:
        yield world


def test_the_groups_the_code_made_are_recorded_and_the_scale_names_one(
    world2, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotEquivalent) as info:
        check(divides_by_its_groups_size, kind="comm-hook", world=world2, seed=0, max_examples=20)
    verdict = info.value.verdict
    assert [t.groups for t in verdict.outcome.got.ranks] == [((0,), (1,))] * 2
    first = verdict.causes[0]
    assert first.pattern == "scale", [c.pattern for c in verdict.causes]
    assert "the size of the process group over ranks [0], [1] the code made" in first.text
