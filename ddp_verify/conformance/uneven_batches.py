"""Ranks with different numbers of batches, trained under torch's ``Join`` context manager.

torch documents what DDP computes once a rank has run out of batches: the ranks that have
joined shadow the gradient all-reduce with zeros, so at a step where only the ranks ``A`` still
train, the gradient is ``sum_{i in A} g_i / D``, with ``g_i`` rank i's mean-loss gradient and
``D`` the initial world size (``divide_by_initial_world_size=True``, the default) or ``|A|``;
after the loop every rank receives the parameters of the last rank to join. The reference here
computes exactly that on one process, and :func:`check_join` compares every rank's parameters
after each step it trained and after the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hypothesis import strategies as st

from ..engine.compare import outside
from ..engine.scenario import Scenario
from ..engine.strategies import scenarios
from ..engine.tolerances import Float64Tolerance
from ..engine.training import Step, train
from ..methods.ddp import DDP
from ..methods.loop import RankRun


@dataclasses.dataclass(frozen=True)
class JoinRun:
    """A scenario of one micro-batch per rank per step, of which rank i trains the first
    ``batches[i]`` steps only (the longest rank trains them all).

    Example::

        run = JoinRun(scenario, batches=(3, 1), divide_by_initial_world_size=True)
    """

    scenario: Scenario
    batches: tuple[int, ...]
    divide_by_initial_world_size: bool = True
    # How the script enters Join: the generic context manager over its joinables, or DDP's
    # own model.join(...), which must pass the flag on.
    entered: str = "Join"
    # ZeroRedundancyOptimizer joins too (Join([model, optimizer], ...)): its join hook steps a
    # joined rank's shard so that the others still receive its parameters.
    zero: bool = False

    def __post_init__(self) -> None:
        steps, size = self.scenario.steps, self.scenario.world_size
        if len(self.batches) != size:
            raise ValueError(f"batches lists {len(self.batches)} ranks, the world has {size}")
        if any(not 1 <= b <= steps for b in self.batches) or max(self.batches) != steps:
            raise ValueError(
                f"every rank needs between 1 and {steps} batches and one rank all {steps}: "
                f"got {self.batches}"
            )

    def active(self, step: int) -> list[int]:
        """The ranks that still train at ``step``."""
        return [rank for rank, count in enumerate(self.batches) if count > step]

    def divisor(self, step: int) -> int:
        if self.divide_by_initial_world_size:
            return self.scenario.world_size
        return len(self.active(step))

    def describe(self) -> str:
        flag = self.divide_by_initial_world_size
        how = "Join([model], ...)" if self.entered == "Join" else "model.join(...)"
        if self.zero:
            how = "Join([model, ZeroRedundancyOptimizer], ...)"
        return (
            f"batches per rank {list(self.batches)}, {how} with "
            f"divide_by_initial_world_size={flag}; " + self.scenario.describe()
        )


def join_runs(
    *, world_size: int, max_steps: int = 4, zero: bool = False
) -> st.SearchStrategy[JoinRun]:
    """Join runs for ``world_size`` ranks; shrinks toward two steps, one rank one batch short,
    the default divisor.

    Example::

        @given(join_runs(world_size=4))
        def test_join(world, run): check_join(world, run)
    """

    @st.composite
    def draw(draw_: st.DrawFn) -> JoinRun:
        scenario = draw_(
            scenarios(world_size=world_size, max_micro_batches=1, max_steps=max_steps).filter(
                lambda s: s.steps >= 2
            )
        )
        steps = scenario.steps
        counts = [draw_(st.integers(1, steps)) for _ in range(world_size)]
        longest = draw_(st.integers(0, world_size - 1))
        counts[longest] = steps
        flag = draw_(st.booleans().map(lambda b: not b))  # shrinks toward True, the default
        entered = "Join" if zero else draw_(st.sampled_from(("Join", "model.join")))
        return JoinRun(scenario, tuple(counts), flag, entered, zero)

    return draw()


def reference_join(run: JoinRun) -> list[dict[str, torch.Tensor]]:
    """The parameters after every step, computed on one process as torch documents Join."""

    def active_ranks_only(step: Step) -> list[float]:
        losses = [step.loss(step.model, step.rank_batch(r)) for r in run.active(step.index)]
        (sum(losses) / run.divisor(step.index)).backward()
        return [0.0]  # Join's reference has no loss to compare

    trace = train(run.scenario, active_ranks_only, name="Join reference")
    return trace.ranks[0].params


def train_with_join(
    run: JoinRun, method: DDP
) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """On each rank: its batches through ``method``'s DDP (or wrapper) under ``Join``; returns
    its parameters after each step it trained, and after the loop."""
    from torch.distributed.algorithms.join import Join

    rank_run = RankRun(run.scenario)
    wrapped = method.wrap(rank_run.model, run.scenario)
    if run.zero:
        from ddp_verify.methods.ddp import zero_redundancy

        optimizer = zero_redundancy(run.scenario, list(wrapped.parameters()))
    else:
        optimizer = rank_run.optimizer(wrapped.parameters())
    after = []
    flag = run.divide_by_initial_world_size
    joined = (
        Join([wrapped, optimizer] if run.zero else [wrapped], divide_by_initial_world_size=flag)
        if run.entered == "Join"
        else wrapped.join(divide_by_initial_world_size=flag)
    )
    with joined:
        for step in range(run.batches[rank_run.rank]):
            optimizer.zero_grad(set_to_none=True)
            ((inputs, targets),) = rank_run.micro_batches(step)
            rank_run.loss_fn(wrapped(inputs), targets).backward()
            optimizer.step()
            after.append({k: p.detach().clone() for k, p in rank_run.model.named_parameters()})
    final = {k: p.detach().clone() for k, p in rank_run.model.named_parameters()}
    return after, final


def check_join(world: Any, run: JoinRun, method: DDP) -> None:
    """Raise ``AssertionError`` naming the rank, step and parameter where training under
    ``Join`` leaves :func:`reference_join` (float64 tolerances)."""
    pending = world.submit(train_with_join, (run, method), name=f"Join({method.name})")
    expected = reference_join(run)
    results = pending.result()
    tolerance = Float64Tolerance()
    for rank, (after, final) in enumerate(results):
        checks = [(f"after step {s}", got, expected[s]) for s, got in enumerate(after)]
        checks.append(("after the Join loop", final, expected[-1]))
        for when, got, want in checks:
            for name, value in want.items():
                allowed = tolerance.allowed("parameter", 0, name, value)
                if bool(outside(got[name], value, allowed).any()):
                    worst = float((got[name].double() - value.double()).abs().max())
                    raise AssertionError(
                        f"under Join, rank {rank}'s parameter {name!r} {when} is off by "
                        f"{worst:.3g} (allowed {tolerance.describe()}) from the documented "
                        f"semantics: gradient = sum over active ranks / {_divisor(run)}"
                        f"\n{run.describe()}\nReproduce with: {run!r}"
                    )


def _divisor(run: JoinRun) -> str:
    return "initial world size" if run.divide_by_initial_world_size else "active ranks"
