"""The tolerances keep their margins: correct methods far inside them, the real bug far outside.

Derandomized, so the examples are the same on every run: a regression test of the bounds
chosen in ddp_verify.engine.tolerances, not a statistical claim.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from ddp_verify.engine.outcome import Outcome
from ddp_verify.engine.scenario import Scenario
from ddp_verify.engine.strategies import scenarios
from ddp_verify.engine.tolerances import Float32Tolerance, Float64Tolerance, Tolerance
from ddp_verify.methods import ddp, manual_allreduce, reference

SAMPLES = settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def used_allowance(outcome: Outcome, scenario: Scenario) -> float:
    """The largest |got - expected| / allowed over every loss, gradient and parameter."""
    tolerance: Tolerance
    if scenario.dtype == "float64":
        tolerance = Float64Tolerance()
    else:
        tolerance = Float32Tolerance(outcome.reference, reference("float32").run(scenario))
    expected = outcome.reference.ranks[0]
    worst = 0.0
    for step in range(scenario.steps):
        for rank in outcome.got.ranks:
            pairs = [("loss", "loss", expected.losses[step], rank.losses[step])]
            pairs += [
                ("parameter", n, v, rank.params[step][n]) for n, v in expected.params[step].items()
            ]
            pairs += [
                ("gradient", n, v, rank.grads[step][n])
                for n, v in expected.grads[step].items()
                if v is not None
            ]
            for quantity, name, exp, got in pairs:
                exp_t = torch.as_tensor(exp, dtype=torch.float64)
                allowed = tolerance.allowed(quantity, step, name, exp_t)
                diff = (torch.as_tensor(got, dtype=torch.float64) - exp_t).abs()
                worst = max(worst, float((diff / allowed).max()))
    return worst


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_margins_on_both_sides_of_the_bound(world, dtype):
    correct: list[float] = []
    buggy: list[float] = []

    @SAMPLES
    @given(scenario=scenarios(world_size=world.size, dtypes=(dtype,), max_micro_batches=3))
    def measure(scenario):
        for method in (ddp(), manual_allreduce()):
            correct.append(used_allowance(world.check_equivalent(method, scenario), scenario))
        if not scenario.even:
            outcome = world.check_equivalent(manual_allreduce(weighting="world"), scenario)
            buggy.append(used_allowance(outcome, scenario))

    measure()
    assert max(correct) < 0.5, f"correct methods came within 2x of the bound: {max(correct):.3g}"
    assert statistics.median(buggy) > 1e3, f"the bug is too close to the bound: {buggy}"
