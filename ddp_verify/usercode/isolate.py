"""Every mistake, not the first: scenarios that isolate one axis each, tried after the
counterexample is shrunk.

A shrunk counterexample shows the simplest mistake: one micro-batch per rank on an even split
hides every mistake in how micro-batches or ranks are weighted. So the diagnosis also trains
the code on scenarios built from the counterexample (its model, loss, optimizer, dtype and
seed) that each make one axis matter:

- ranks: uneven ranks, one micro-batch each (1, 2, ..., W samples);
- micro-batches: even ranks, each with uneven micro-batches (1 and 3 samples);
- steps: three steps, the two above in turn (state and momentum carried across steps);
- tokens: the first two on the token-level loss (sequences of different lengths, padding),
  where samples and tokens part.

Each mistake found there that the counterexample did not show is reported with the scenario
that shows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..engine.scenario import ModelSpec, Scenario
from ..engine.tolerances import Tolerance
from ..methods.base import Method
from ..methods.equivalence import HarnessError, check_equivalent
from ..world import RankError, WorldError
from ..world.interface import Ranked
from . import findings as f
from .diagnose import likely_causes
from .findings import Cause

# Findings that say only that something was not explained: never news on their own.
_SILENT = {f.UNEXPLAINED.code, f.DIAGNOSIS_FAILED.code, f.NONLINEAR.code, f.LOSS_UNEXPLAINED.code}


def isolating_scenarios(
    scenario: Scenario, bounds: Mapping[str, Any] | None = None
) -> Iterator[tuple[str, Scenario]]:
    """``(axis, scenario)`` for each axis the search's ``bounds`` allow: built from
    ``scenario``'s model, loss, optimizer, dtype and seed.

    Example::

        >>> s = Scenario(world_size=2, schedule=(((1,), (1,)),))
        >>> [(axis, p.schedule) for axis, p in isolating_scenarios(s)][:2]
        [('ranks', (((1,), (2,)),)), ('micro-batches', (((1, 3), (1, 3)),))]
    """
    bounds = dict(bounds or {})
    size = scenario.world_size
    # Within the samples per rank the search was bounded to.
    low, high = int(bounds.get("min_samples", 1)), int(bounds.get("max_samples", 4))
    ranks = tuple((min(low + r, high),) for r in range(size))
    micro = tuple((1, 3) for _ in range(size))
    even = bool(bounds.get("even", False))
    accumulates = int(bounds.get("max_micro_batches", 2)) >= 2
    steps = int(bounds.get("max_steps", 3)) >= 3
    layouts: list[tuple[str, tuple[tuple[tuple[int, ...], ...], ...]]] = []
    if size > 1 and not even and high > low:
        layouts.append(("ranks", (ranks,)))
    if accumulates and low <= 4 <= high:
        layouts.append(("micro-batches", (micro,)))
    if steps and len(layouts) == 2:
        layouts.append(("steps", (ranks, micro, ranks)))
    for axis, schedule in layouts:
        yield axis, dataclasses.replace(scenario, schedule=schedule)
    losses = tuple(bounds.get("losses", ()))
    if scenario.loss != "tokens" and "tokens" in losses and scenario.model.kind != "user":
        tokens = dataclasses.replace(scenario, loss="tokens", model=_transformer(scenario.model))
        for axis, schedule in layouts[:2]:
            yield f"{axis} (tokens)", dataclasses.replace(tokens, schedule=schedule)


def _transformer(model: ModelSpec) -> ModelSpec:
    return ModelSpec(
        kind="transformer", in_features=model.in_features, hidden=model.hidden[:1] or (2,)
    )


def every_mistake(
    world: Ranked,
    method: Method,
    kind: str,
    scenario: Scenario,
    found: list[Cause],
    bounds: Mapping[str, Any] | None = None,
    tolerance_for: Callable[[Scenario], Tolerance | None] | None = None,
) -> list[Cause]:
    """The causes the isolating scenarios show beyond ``found``, each with its scenario;
    ``tolerance_for`` holds each to what the search held its examples to (a declared lossy
    format's bound, the measured precision of the code).

    Example::

        more = every_mistake(world, method, "wrapped-step", shrunk, causes, bounds)
    """
    seen = {_key(c) for c in found}
    more: list[Cause] = []
    for axis, probe in isolating_scenarios(scenario, bounds):
        try:
            tolerance = tolerance_for(probe) if tolerance_for is not None else None
            outcome = check_equivalent(world, method, probe, tolerance=tolerance)
            if outcome.equivalent:
                continue
            causes = world.helper.run_job(
                likely_causes,
                (kind, probe, outcome.reference, outcome.got),
                name=f"the diagnosis of the {axis} scenario",
            )[0]
        except (RankError, WorldError, HarnessError, ValueError):
            continue  # the code fails there: the counterexample's report stands
        for cause in causes:
            if _key(cause) in seen or cause.pattern in _SILENT:
                continue
            seen.add(_key(cause))
            more.append(dataclasses.replace(cause, scenario=repr(probe)))
    return more


def _key(cause: Cause) -> str:
    """What makes a cause news: its finding; for a scale, also what the factor is (on the
    counterexample W and N/W may coincide, and a scenario where they part says which)."""
    if cause.pattern == f.SCALE.code:
        return f"{cause.pattern}:{cause.text.split(':')[0]}"
    return cause.pattern
