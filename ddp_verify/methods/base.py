"""What a method is: something that trains a scenario and returns its trace."""

from __future__ import annotations

import abc
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace, Trace, stepped_gradients
from ..world.protocol import Shipped

if TYPE_CHECKING:
    from ..world.interface import Ranked


class Method(abc.ABC):
    """How a scenario is trained. ``name`` labels it in reports."""

    name: str = "method"

    @abc.abstractmethod
    def run(self, scenario: Scenario, world: Ranked | None = None) -> Trace:
        """Train ``scenario`` and return the trace."""

    def __repr__(self) -> str:
        return self.name


class DistributedMethod(Method):
    """A method whose training runs on every rank of a world.

    ``by_value`` lists modules the ranks cannot import (a user's file loaded by path), whose
    functions must travel by value with the job.
    """

    by_value: tuple[ModuleType, ...] = ()

    @abc.abstractmethod
    def train_rank(self, scenario: Scenario) -> RankTrace:
        """Runs on each rank with the default process group initialised."""

    def run(self, scenario: Scenario, world: Ranked | None = None) -> Trace:
        if world is None:
            raise TypeError(f"{self.name} trains on a world: pass world=World(...)")
        return self.collect(
            world.run_job(train_on_rank, (self.shipped(), scenario), name=self.name)
        )

    # A method whose reference is always its own run on one rank (a coupled loss's: the
    # harness has no oracle for the user's loss).
    whole_batch_reference = False
    # A method that owns the whole step (a user's training step: its clip, its schedule, its
    # averages): with the user's own loss, optimizer or scheduler, its reference is its own
    # run on one rank, as the harness's loop cannot know what else the step does.
    owns_step = False

    def train_whole(self, scenario: Scenario, variant: int = 0) -> RankTrace:
        """The method's own reference: ``scenario``'s whole global batch in one micro-batch
        on this one-rank world (in the ``variant``-th seeded sample order where above 0: the
        same objective, its sums taken otherwise, a rounding-only variant)."""
        return self.train_rank(scenario.whole(order=variant))

    def shipped(self) -> Shipped:
        """This method pickled once for every job that carries it (see :class:`Shipped`)."""
        shipped = _shipped.get(self)
        if shipped is None:
            shipped = _shipped[self] = Shipped(self, by_value=self.by_value)
        return shipped

    def collect(self, rank_traces: list[Any]) -> Trace:
        ranks = list(rank_traces)
        # Code that owns its step records the gradients its optimizer steps on: under a
        # partitioned optimizer, a parameter's on the rank that steps it alone.
        return Trace(self.name, stepped_gradients(ranks) if self.owns_step else ranks)


# Kept beside the methods rather than on them: an attribute would travel inside the pickle.
_shipped: weakref.WeakKeyDictionary[DistributedMethod, Shipped] = weakref.WeakKeyDictionary()


def train_on_rank(method: DistributedMethod, scenario: Scenario) -> RankTrace:
    """The job every rank runs for a distributed method."""
    import torch.distributed as dist

    if dist.get_world_size() != scenario.world_size:
        raise ValueError(
            f"the scenario is for {scenario.world_size} ranks, the world has "
            f"{dist.get_world_size()}"
        )
    trace = method.train_rank(scenario)
    if isinstance(trace, RankTrace):
        from ..world.runtime import process_groups

        # The groups the code made: a factor that is one's size is named with it.
        trace.groups = process_groups()
    return trace


def judged_by_own(method: Method, scenario: Scenario) -> bool:
    """Whether ``method`` on ``scenario`` is judged against its own run on one rank holding
    the whole batch rather than the engine's reference: where the method has no other (a
    coupled loss), and where a method that owns the whole step (a user's training step)
    trains with the user's own loss, optimizer or scheduler. Other code trained with the
    user's recipe is judged against the engine's loop with that recipe (one process, the
    whole batch, the user's loss and optimizer), which shares nothing with the code.

    Example::

        >>> from ddp_verify.engine.scenario import Recipe
        >>> from ddp_verify.methods import ddp
        >>> mse = Recipe(loss="torch.nn:MSELoss")
        >>> judged_by_own(ddp(), Scenario(world_size=2, schedule=(((1,), (2,)),), recipe=mse))
        False
    """
    if getattr(method, "whole_batch_reference", False):
        return True
    return bool(getattr(method, "owns_step", False) and scenario.recipe)


def train_whole_variants(
    method: Any, scenario: Scenario, variants: int, first: int = 0
) -> list[RankTrace]:
    """The job a one-rank world runs for a method that is its own reference (its
    ``train_whole``: the whole global batch on one rank, a coupled loss's), in rounding-only
    variants ``first`` to ``variants - 1`` (variant ``k`` lays the pairs out in another
    order: the same loss, other sums; variant 0 is the pairs in rank order)."""
    import torch.distributed as dist

    if dist.get_world_size() != 1:
        raise ValueError(
            f"{method.name}'s reference runs on a world of one rank, not {dist.get_world_size()}"
        )
    return [method.train_whole(scenario, variant=k) for k in range(first, variants)]
