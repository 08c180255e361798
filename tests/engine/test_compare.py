"""Comparison and reports on traces built in this process: what is caught and how it reads."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from ddp_verify.engine.compare import compare, prepare_comparison
from ddp_verify.engine.outcome import EquivalenceError, Outcome
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.engine.tolerances import Float32Tolerance, Float64Tolerance, float32_variant
from ddp_verify.engine.trace import Trace
from ddp_verify.methods import reference

SCENARIO = Scenario(
    world_size=2,
    schedule=(((2,), (1,)), ((1,), (2,))),
    model=ModelSpec(hidden=(3,), unused=True),
)


def as_ranks(trace: Trace, ranks: int = 2) -> Trace:
    """The reference's record copied onto ``ranks`` ranks: what a perfect method returns."""
    return Trace("perfect", [copy.deepcopy(trace.ranks[0]) for _ in range(ranks)])


@pytest.fixture(scope="module")
def ref() -> Trace:
    return reference().run(SCENARIO)


def test_a_perfect_copy_is_equivalent(ref):
    assert compare(ref, as_ranks(ref), SCENARIO, Float64Tolerance()) is None


def test_rounding_noise_is_tolerated(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        for step in rank.params:
            for name in step:
                step[name] = step[name] * (1 + 1e-10)
    assert compare(ref, got, SCENARIO, Float64Tolerance()) is None


def test_a_parameter_off_on_one_rank_is_a_rank_disagreement(ref):
    got = as_ranks(ref)
    got.ranks[1].params[1]["head.bias"] += 1e-3
    m = compare(ref, got, SCENARIO, Float64Tolerance())
    assert (m.step, m.quantity, m.name, m.ranks) == (
        1,
        "rank agreement on parameter",
        "head.bias",
        [1],
    )
    text = m.render()
    assert "First divergence: step 1 of 2, rank agreement on parameter 'head.bias'" in text
    assert "got" in text and "(rank 1)" in text and "expected" in text and "(rank 0)" in text


def test_ranks_each_within_the_reference_but_apart_from_each_other_disagree(ref):
    # Each rank is within the reference's allowance, on either side of it: together they are
    # almost twice the allowance apart, which rank agreement (against rank 0) does not allow.
    got = as_ranks(ref)
    tolerance = Float64Tolerance()
    expected = ref.ranks[0].params[0]["head.weight"]
    allowed = tolerance.allowed("parameter", 0, "head.weight", expected)
    got.ranks[0].params[0]["head.weight"] = expected + 0.9 * allowed
    got.ranks[1].params[0]["head.weight"] = expected - 0.9 * allowed
    m = compare(ref, got, SCENARIO, tolerance)
    assert m is not None
    assert (m.step, m.quantity, m.name, m.ranks) == (
        0,
        "rank agreement on parameter",
        "head.weight",
        [1],
    )


def arrived(trace: Trace) -> Trace:
    """``trace`` as a check receives it from another process (flat, unpacked on first use)."""
    return pickle.loads(pickle.dumps(trace))


def test_the_prepared_half_of_a_comparison_is_used_when_a_trace_arrives(ref, monkeypatch):
    reference, tolerance = arrived(ref), Float64Tolerance()
    prepare_comparison(reference, tolerance)

    def worked_out_again(*args, **kwargs):
        raise AssertionError("the reference's allowances were worked out again")

    # Ranks equal bit for bit need no allowance of their own, and the reference's was
    # worked out ahead: nothing is left to work out.
    monkeypatch.setattr(tolerance, "allowed_flat", worked_out_again)
    assert compare(reference, arrived(as_ranks(ref)), SCENARIO, tolerance) is None


def test_what_was_prepared_is_never_used_for_a_reference_edited_since(ref):
    reference, tolerance = arrived(ref), Float64Tolerance()
    prepare_comparison(reference, tolerance)
    got = arrived(as_ranks(ref))
    steps = reference.ranks[0].params  # unpacked here; the flat form it arrived in stays
    steps[1]["head.bias"] = steps[1]["head.bias"] + 1e-3
    m = compare(reference, got, SCENARIO, tolerance)
    assert m is not None and (m.step, m.quantity, m.name) == (1, "parameter", "head.bias")


def test_what_was_prepared_is_never_used_for_other_losses_or_another_tolerance(ref):
    reference, tolerance = arrived(ref), Float64Tolerance()
    prepare_comparison(reference, tolerance)
    got = arrived(as_ranks(ref))
    reference.ranks[0].losses[0] += 1e-3
    m = compare(reference, got, SCENARIO, tolerance)
    assert m is not None and (m.step, m.quantity) == (0, "loss")
    # Prepared under a loose tolerance, compared under a strict one: the strict one judges.
    reference = arrived(ref)
    prepare_comparison(reference, Float64Tolerance(rtol=1.0, atol=1.0))
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.params[0]["head.weight"] = rank.params[0]["head.weight"] + 1e-3
    m = compare(reference, got, SCENARIO, Float64Tolerance())
    assert m is not None and (m.step, m.quantity, m.name) == (0, "parameter", "head.weight")


def test_a_gradient_off_everywhere_is_reported_like_assert_close(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.grads[0]["body.0.weight"] = rank.grads[0]["body.0.weight"] * 1.5
    m = compare(ref, got, SCENARIO, Float64Tolerance())
    assert (m.step, m.quantity, m.name, m.ranks) == (0, "gradient", "body.0.weight", [0, 1])
    text = m.render()
    assert (
        "First divergence: step 0 of 2, gradient 'body.0.weight' (shape (3, 2)), on ranks 0, 1"
        in text
    )
    assert "Mismatched elements: " in text and " / 6 (" in text
    assert "Greatest absolute difference: " in text and "allowed: atol 1e-08 + rtol 1e-07" in text
    assert "Greatest relative difference: 0.5 at index" in text


def test_the_worst_tensor_of_a_step_is_the_one_reported(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.params[0]["head.weight"] = rank.params[0]["head.weight"] + 1e-6
        rank.params[0]["body.0.bias"] = rank.params[0]["body.0.bias"] + 1e-2
    assert compare(ref, got, SCENARIO, Float64Tolerance()).name == "body.0.bias"


def test_a_wrong_loss_is_caught_even_with_right_parameters(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.losses[1] *= 2
    m = compare(ref, got, SCENARIO, Float64Tolerance())
    assert (m.step, m.quantity, m.name) == (1, "loss", "loss")


def test_a_gradient_where_the_reference_has_none_is_named(ref):
    got = as_ranks(ref)
    got.ranks[0].grads[0]["unused.weight"] = torch.zeros(1, 3, dtype=torch.float64)
    got.ranks[1].grads[0]["unused.weight"] = torch.zeros(1, 3, dtype=torch.float64)
    m = compare(ref, got, SCENARIO, Float64Tolerance())
    assert m.note == "rank 0 has a gradient where the reference has none"


def test_a_short_trace_is_reported(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        del rank.params[1], rank.losses[1], rank.grads[1]
    assert "recorded 1 step(s)" in compare(ref, got, SCENARIO, Float64Tolerance()).note


def test_float32_bound_is_derived_from_float32_runs_that_differ_only_in_rounding():
    scenario = Scenario(world_size=1, schedule=(((3,),),) * 2, dtype="float32")
    ref64 = reference("float64").run(scenario)
    tolerance = Float32Tolerance.derive(scenario, ref64)
    # Every run it was measured on passes, the float32 reference among them, with a margin
    # of 8; and it stays a rounding bound, far below any aggregation bug.
    ref32 = reference("float32").run(scenario)
    assert compare(ref64, ref32, scenario, tolerance) is None
    error = max(
        float((ref32.ranks[0].params[1][n].double() - p).abs().max())
        for n, p in ref64.ranks[0].params[1].items()
    )
    bound = float(tolerance.allowed("parameter", 1, "head.bias", torch.zeros(1)))
    assert bound >= 8 * error and bound < 1e-4
    assert tolerance.describe() == (
        "8 × the largest deviation of 9 float32 runs that differ only in summation order and "
        "loss scaling"
    )


def test_float32_variants_differ_from_each_other_only_by_rounding():
    scenario = Scenario(world_size=2, schedule=(((3,), (2,)),) * 2, dtype="float32")
    exact = reference("float64").run(scenario).ranks[0].params[1]
    runs = [float32_variant(scenario, v).ranks[0].params[1] for v in range(4)]
    # Their roundings differ (that is what they sample; a model this small has few ways to
    # round, so two may coincide, not all)...
    distinct = {tuple(tuple(run[n].flatten().tolist()) for n in exact) for run in runs}
    assert len(distinct) > 1
    # ...but not their mathematics: each stays within float32 rounding of the exact run.
    for run in runs:
        for name, value in exact.items():
            assert float((run[name].double() - value).abs().max()) < 1e-5, name
    # And the same variant of the same scenario is the same run, bit for bit.
    again = float32_variant(scenario, 0).ranks[0].params[1]
    assert all(torch.equal(again[n], runs[0][n]) for n in exact)


def test_equivalence_error_report_has_divergence_losses_and_scenario(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.params[0]["head.bias"] = rank.params[0]["head.bias"] + 0.5
    mismatch = compare(ref, got, SCENARIO, Float64Tolerance())
    outcome = Outcome("my_method", SCENARIO, ref, got, mismatch, Float64Tolerance())
    error = EquivalenceError.from_outcome(outcome)
    assert isinstance(error, AssertionError)
    text = str(error)
    assert text.startswith("my_method is not equivalent to single-process full-batch training.")
    assert "First divergence: step 0 of 2, parameter 'head.bias'" in text
    assert "Losses at step 0: reference" in text
    assert "Scenario: world_size=2, 2 step(s), model mlp 2→[3]→1 tanh +unused" in text
    assert f"Reproduce with: {SCENARIO!r}" in text


def test_nan_never_passes_for_a_number(ref):
    got = as_ranks(ref)
    for rank in got.ranks:
        rank.params[0]["head.weight"] = torch.full_like(rank.params[0]["head.weight"], torch.nan)
    m = compare(ref, got, SCENARIO, Float64Tolerance())
    assert m is not None and (m.step, m.quantity, m.name) == (0, "parameter", "head.weight")
    assert "Mismatched elements: 3 / 3" in m.render()


def test_the_fast_path_and_the_full_comparison_agree_on_every_kind_of_divergence(ref):
    # compare() first checks whole flat traces at once and only walks tensor by tensor when
    # something is off; a change anywhere must still be found.
    for field in ("params", "grads"):
        for step in range(SCENARIO.steps):
            for name, value in getattr(ref.ranks[0], field)[step].items():
                if value is None:
                    continue
                got = as_ranks(ref)
                getattr(got.ranks[1], field)[step][name] = value + 1e-4
                m = compare(ref, got, SCENARIO, Float64Tolerance())
                assert m is not None and m.name == name and m.step == step, (field, step, name)


def test_the_measured_bound_uses_its_dtypes_unit_roundoff_and_tf32_only_on_cuda():
    from ddp_verify.engine.reference import train_reference
    from ddp_verify.engine.tolerances import MeasuredTolerance

    scenario = Scenario(world_size=2, schedule=(((1,), (2,)),), dtype="bfloat16")
    tolerance = MeasuredTolerance.derive(scenario, train_reference(scenario, "float64"))
    assert tolerance.precision == "bfloat16" and "9 bfloat16 runs" in tolerance.describe()
    assert tolerance.fallback == 8.0 * (2 + 2) * 2.0**-8
    on_cpu = dataclasses.replace(scenario, dtype="float32")
    # TF32 rounds CUDA matmuls only: asked for on the CPU, float32 stays float32.
    cpu_tf32 = MeasuredTolerance.derive(on_cpu, train_reference(on_cpu, "float64"), tf32=True)
    assert cpu_tf32.precision == "float32" and cpu_tf32.fallback == 8.0 * 4 * 2.0**-24
    with pytest.raises(ValueError, match="not float64"):
        MeasuredTolerance.derive(
            dataclasses.replace(scenario, dtype="float64"), train_reference(scenario, "float64")
        )


def test_a_gradient_the_reference_never_has_is_reported_without_a_made_up_shape():
    from ddp_verify.engine.tolerances import Float64Tolerance
    from ddp_verify.engine.trace import RankTrace

    scenario = Scenario(world_size=1, schedule=(((1,),),))
    weight = torch.ones(2, 3, dtype=torch.float64)
    reference = Trace("reference", [RankTrace([0.5], [{"w": None}], [{"w": weight}])])
    got = Trace("method", [RankTrace([0.5], [{"w": torch.zeros(2, 3)}], [{"w": weight}])])
    mismatch = compare(reference, got, scenario, Float64Tolerance())
    assert mismatch is not None
    report = mismatch.render()
    assert "rank 0 has a gradient where the reference has none" in report
    assert "(0,)" not in report and "shape" not in report
