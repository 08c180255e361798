"""Every mistake, not the first: scenarios that isolate one axis each, tried after the
counterexample is shrunk.

A shrunk counterexample shows the simplest mistake: one micro-batch per rank on an even split
hides every mistake in how micro-batches or ranks are weighted. So the diagnosis also trains
the code on scenarios built from the counterexample (its model, loss, optimizer, dtype and
seed) that each make one axis matter:

- ranks: uneven ranks, one micro-batch each (1, 2, ..., W samples);
- micro-batches: even ranks, each with uneven micro-batches (1 and 3 samples; 1, 1 and 2
  where the world size is 2, so that a factor of the micro-batch count is not one of the
  world size);
- steps: three steps, the two above in turn (state and momentum carried across steps);
- tokens: the first two on the token-level loss (sequences of different lengths, padding),
  where samples and tokens part.

Each mistake found there that the counterexample did not show is reported with the scenario
that shows it. And where the counterexample's numbers fit two readings (a factor equal to both
the world size and the sample count, ranks weighted by samples or by the world size where they
hold one sample each), the first of these scenarios where only one of them fits says which it
is, before either is named; one whose data happen to fit both alike is drawn again, with the
seeds where the two readings' predictions part most (computed in closed form, no run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ...engine.scenario import ModelSpec, Scenario
from ...engine.tolerances import Tolerance
from ...methods.base import Method
from ...methods.equivalence import HarnessError, check_equivalent
from ...world import RankError, WorldError
from ...world.interface import Ranked
from .. import findings as f
from ..findings import Cause
from ..kinds import Kind
from .diagnose import likely_causes
from .engine import hypotheses_of, separation
from .evidence import Terms, group_terms

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
        [('ranks', (((1,), (2,)),)), ('micro-batches', (((1, 1, 2), (1, 1, 2)),))]
        >>> s = Scenario(world_size=4, schedule=(((1,), (1,), (1,), (1,)),))
        >>> [p.schedule[0][0] for axis, p in isolating_scenarios(s) if axis == "micro-batches"]
        [(1, 3)]
    """
    bounds = dict(bounds or {})
    size = scenario.world_size
    # Within the samples per rank the search was bounded to.
    low, high = int(bounds.get("min_samples", 1)), int(bounds.get("max_samples", 4))
    ranks = tuple((min(low + r, high),) for r in range(size))
    accumulates = int(bounds.get("max_micro_batches", 2)) >= 2
    # As many micro-batches as the world size would make their count's factor (M) and the
    # world size's (W) one number: the probe could not tell them apart. Three where the
    # search drew at most two: that bound keeps the search small, and code that accumulates
    # two micro-batches takes three alike.
    micro = tuple(((1, 1, 2) if size == 2 else (1, 3)) for _ in range(size))
    even = bool(bounds.get("even", False))
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


@dataclasses.dataclass(frozen=True)
class Probe:
    """One isolating scenario, trained: its axis, the scenario and the causes its divergence
    shows (none where the code is equivalent there, or fails to run)."""

    axis: str
    scenario: Scenario
    causes: tuple[Cause, ...]


# Where a probe's data happen to weight two readings alike (tokens in proportion to
# sequences, say), it is drawn again with the next seeds, at most this many times.
REDRAWS = 2


def probes(
    world: Ranked,
    method: Method,
    kind: Kind,
    scenario: Scenario,
    bounds: Mapping[str, Any] | None = None,
    tolerance_for: Callable[[Scenario], Tolerance | None] | None = None,
    *,
    unsettled: Sequence[Cause] = (),
) -> list[Probe]:
    """Every isolating scenario of ``scenario`` trained with ``method`` and diagnosed;
    ``tolerance_for`` holds each to what the search held its examples to (a declared lossy
    format's bound, the measured precision of the code). While a cause of ``unsettled`` (one
    whose numbers fit other readings too) is not told apart, a probe that does not tell it
    apart is drawn again, with the seeds where its readings part most (:func:`redraws`).

    Example::

        found = probes(world, method, "wrapped-step", shrunk, bounds, unsettled=causes)
    """
    pending = [c for c in unsettled if c.alternatives]
    done: list[Probe] = []
    for axis, probe in isolating_scenarios(scenario, bounds):
        tried = _probe(world, method, kind, axis, probe, tolerance_for)
        for seed in redraws(probe, pending):
            if not pending or any(_settles(tried, c) for c in pending):
                break
            again = dataclasses.replace(probe, seed=seed)
            redrawn = _probe(world, method, kind, axis, again, tolerance_for)
            if any(_settles(redrawn, c) for c in pending):
                tried = redrawn
        pending = [c for c in pending if not _settles(tried, c)]
        done.append(tried)
    return done


# Seeds a redraw is chosen from: the ones where the readings' predictions part most.
SEEDS = 8


def redraws(probe: Scenario, pending: Sequence[Cause]) -> list[int]:
    """The seeds to draw ``probe`` again with, at most :data:`REDRAWS`: of the next
    :data:`SEEDS`, those where the readings of ``pending`` causes that the gradient's rows
    predict part most (their smallest relative distance, in closed form from each seed's
    micro-batch gradients: no run of the code), a seed where they coincide never; the next
    seeds in turn where no reading is a row's.

    Example::

        redraws(probe, [scale_w_or_n])  # [7, 3]: where W and N part most
    """
    following = [probe.seed + k for k in range(1, SEEDS + 1)]
    readings = [hypotheses_of([c.key, *c.alternatives]) for c in pending]
    readings = [h for h in readings if len(h) > 1]
    if not readings:
        return following[:REDRAWS]
    parted = []
    for seed in following:
        drawn = dataclasses.replace(probe, seed=seed)
        try:
            groups, columns, losses = group_terms(drawn, 0)
        except Exception:
            return following[:REDRAWS]
        terms = Terms(0, tuple(groups), columns, torch.tensor(losses, dtype=torch.float64))
        parted.append((min(separation(h, terms) for h in readings), seed))
    best = sorted((p for p in parted if p[0] > 0), key=lambda p: -p[0])
    return [seed for _, seed in best[:REDRAWS]]


def _probe(
    world: Ranked,
    method: Method,
    kind: Kind,
    axis: str,
    probe: Scenario,
    tolerance_for: Callable[[Scenario], Tolerance | None] | None,
) -> Probe:
    causes: tuple[Cause, ...] = ()
    try:
        tolerance = tolerance_for(probe) if tolerance_for is not None else None
        outcome = check_equivalent(world, method, probe, tolerance=tolerance)
        if not outcome.equivalent:
            causes = tuple(
                world.helper.run_job(
                    likely_causes,
                    (kind, probe, outcome.reference, outcome.got),
                    name=f"the diagnosis of the {axis} scenario",
                )[0]
            )
    except (RankError, WorldError, HarnessError, ValueError):
        pass  # the code fails there: the counterexample's report stands
    return Probe(axis, probe, causes)


def _settling(probe: Probe, cause: Cause) -> Cause | None:
    """The cause of ``probe`` that is one of ``cause``'s readings and fits no other of them."""
    candidates = {cause.key, *cause.alternatives}
    return next(
        (
            c
            for c in probe.causes
            if c.key in candidates and not candidates.intersection(c.alternatives)
        ),
        None,
    )


def _settles(probe: Probe, cause: Cause) -> bool:
    return _settling(probe, cause) is not None


def told_apart(found: list[Cause], tried: list[Probe]) -> list[Cause]:
    """``found``, each cause whose numbers fit other readings too replaced by the reading the
    first probe where exactly one of them fits shows, with that probe's scenario and numbers;
    a cause no probe told apart keeps its alternatives, and says so.

    Example::

        told_apart([scale_w_or_n], tried)[0].key  # 'scale:N' (the ranks scenario said)
    """
    told: list[Cause] = []
    for cause in found:
        if not cause.alternatives:
            told.append(cause)
            continue
        candidates = {cause.key, *cause.alternatives}
        settled = next(
            ((probe, c) for probe in tried for c in [_settling(probe, cause)] if c is not None),
            None,
        )
        if settled is None:
            others = ", ".join(cause.alternatives)
            told.append(
                dataclasses.replace(
                    cause,
                    evidence=f"{cause.evidence} (these numbers fit {others} as well; no "
                    "scenario tried told them apart)".lstrip(),
                )
            )
            continue
        probe, chosen = settled
        ruled_out = ", ".join(sorted(candidates - {chosen.key}))
        told.append(
            dataclasses.replace(
                chosen,
                evidence=f"{chosen.evidence} (the counterexample fit {ruled_out} as well; the "
                f"{probe.axis} scenario tells them apart)".lstrip(),
                scenario=repr(probe.scenario),
                alternatives=(),
            )
        )
    return told


def every_mistake(found: list[Cause], tried: list[Probe]) -> list[Cause]:
    """The causes the probes show beyond ``found``, each with its scenario.

    Example::

        more = every_mistake(causes, probes(world, method, "wrapped-step", shrunk, bounds))
    """
    seen = {c.key for c in found} | {a for c in found for a in c.alternatives}
    more: list[Cause] = []
    for probe in tried:
        for cause in probe.causes:
            # A cause one of whose readings is already said is that mistake again.
            if seen.intersection((cause.key, *cause.alternatives)) or cause.pattern in _SILENT:
                continue
            seen.add(cause.key)
            more.append(dataclasses.replace(cause, scenario=repr(probe.scenario)))
    return more
