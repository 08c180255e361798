"""Every world, helper and pool offers what the world protocol (ddp_verify/world/interface.py)
declares: mypy checks the types in `tox -e lint`; this checks the live objects."""

from __future__ import annotations

import pytest

from ddp_verify.world import World, WorldPool
from ddp_verify.world.interface import Agreeing, Pool, Ranked, Ranks
from ddp_verify.world.launch import Launched
from ddp_verify.world.spmd import Member, SpmdPool, SpmdWorld


def test_a_forked_world_its_helper_and_its_pool_implement_the_protocol():
    world = World(2)  # nothing starts until a job or start()
    assert isinstance(world, Ranked) and not world.lockstep
    assert not isinstance(world, Agreeing)  # forked ranks never run hypothesis themselves
    assert isinstance(world.helper, Ranks) and world.helper.size == 1
    pool = WorldPool(timeout=30.0)
    assert isinstance(pool, Pool) and pool.get(2, start=False).size == 2
    pool.close()
    world.close()


def test_the_launched_world_its_helper_and_its_pool_implement_the_protocol():
    # A member of a launched job of 4, not joined: nothing is reached until it connects.
    member = Member(Launched("torchrun", 1, 4, 1, "127.0.0.1", 29500))
    world = SpmdWorld(member)
    assert isinstance(world, Ranked) and world.lockstep
    assert isinstance(world, Agreeing) and world.rank == 1
    assert world.restart() is False  # the job's ranks cannot be replaced, and stay as they are
    assert not member.joined
    assert isinstance(world.helper, Ranks) and world.helper.size == 1
    assert world.helper.timeout == world.timeout
    # The one-rank world (a coupled loss's reference) is forked by a rank only when used.
    assert isinstance(world.solo, Ranks) and world.solo.size == 1 and world.solo.process_group
    pool = SpmdPool(world)
    assert isinstance(pool, Pool) and pool.get(4, start=False) is world
    with pytest.raises(Exception, match="launched with 4 ranks"):
        pool.get(2, start=False)
