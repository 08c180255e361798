"""What a method is: something that trains a scenario and returns its trace."""

from __future__ import annotations

import abc
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..engine.scenario import Scenario
from ..engine.trace import RankTrace, Trace
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

    def shipped(self) -> Shipped:
        """This method pickled once for every job that carries it (see :class:`Shipped`)."""
        shipped = _shipped.get(self)
        if shipped is None:
            shipped = _shipped[self] = Shipped(self, by_value=self.by_value)
        return shipped

    def collect(self, rank_traces: list[Any]) -> Trace:
        return Trace(self.name, list(rank_traces))


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
    return method.train_rank(scenario)


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
