"""The diagnosis's one mechanism on its own: hypotheses chosen by cost among the consistent,
ties kept as alternatives, and probes drawn where alternatives part
(ddp_verify/usercode/diagnosis/engine.py, probes.py)."""

from __future__ import annotations

import dataclasses

import torch

from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.usercode.diagnosis.engine import Hypothesis, choose, hypotheses_of, separation
from ddp_verify.usercode.diagnosis.evidence import Terms, group_terms
from ddp_verify.usercode.diagnosis.probes import redraws
from ddp_verify.usercode.findings import Cause


def _made(name: str, cost: float, misfit: float, covers=("gradient",)) -> Hypothesis:
    cause = Cause(name, "gradient", name)
    return Hypothesis("gradient", frozenset(covers), cost, misfit, causes=(cause,), source=name)


def test_the_cheapest_consistent_hypothesis_wins_and_its_equals_are_alternatives():
    found = [
        _made("a", 2.0, 0.5),
        _made("b", 1.0, 3.0),  # cheaper, but inconsistent
        _made("c", 2.0, 0.9),
        _made("d", 3.5, 0.0),
    ]
    chosen, open_subjects = choose(found)
    ((best, ties),) = chosen
    assert best.source == "a" and [t.source for t in ties] == ["c"]
    assert open_subjects == []


def test_a_subject_nothing_explains_is_left_open():
    chosen, open_subjects = choose([_made("a", 1.0, 2.0, covers=("gradient", "loss"))])
    assert chosen == [] and open_subjects == ["gradient", "loss"]


def _terms(scenario: Scenario) -> Terms:
    groups, columns, losses = group_terms(scenario, 0)
    return Terms(0, tuple(groups), columns, torch.tensor(losses, dtype=torch.float64))


def test_readings_that_coincide_on_even_ranks_part_on_uneven_ones():
    readings = hypotheses_of(["scale:W", "ranks:sum"])
    assert [h.describe() for h in readings] == [
        "scale=W (every other choice right)",
        "ranks=sum (every other choice right)",
    ]
    even = Scenario(world_size=2, schedule=(((2,), (2,)),), model=ModelSpec(in_features=2))
    uneven = dataclasses.replace(even, schedule=(((1,), (3,)),))
    assert separation(readings, _terms(even)) < 1e-12
    assert separation(readings, _terms(uneven)) > 0.1


def test_a_probe_is_drawn_again_where_the_readings_part_most_and_never_where_they_coincide():
    pending = [Cause("...", "gradient", "scale", reading="scale:W", alternatives=("ranks:sum",))]
    even = Scenario(world_size=2, schedule=(((2,), (2,)),), model=ModelSpec(in_features=2))
    assert redraws(even, pending) == []  # W and a plain sum are one reading on every seed
    uneven = dataclasses.replace(even, schedule=(((1,), (3,)),))
    seeds = redraws(uneven, pending)
    assert len(seeds) == 2 and uneven.seed not in seeds
    apart = {
        seed: separation(
            hypotheses_of(["scale:W", "ranks:sum"]),
            _terms(dataclasses.replace(uneven, seed=seed)),
        )
        for seed in range(uneven.seed + 1, uneven.seed + 9)
    }
    assert [apart[s] for s in seeds] == sorted(apart.values(), reverse=True)[:2]
    # A cause whose readings are no row's: the next seeds in turn.
    other = [Cause("...", "loss", "loss:sum", alternatives=("loss:scaled",))]
    assert redraws(uneven, other) == [uneven.seed + 1, uneven.seed + 2]
