"""The weight fit: a gradient explained as a weighted sum of the micro-batches' gradients, and
a reported loss as a weighting of their losses. Observed gradients here are built from the
weights a mistake gives (or trained by the real reference), and the fit must recover those
weights and name the pattern; a loss is checked on traces of simulated mistakes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ddp_verify.engine.models import build_model, item_counts
from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.usercode.diagnosis import likely_causes
from ddp_verify.usercode.diagnosis.evidence import group_gradients
from ddp_verify.usercode.diagnosis.mistakes import Mistake, simulate
from ddp_verify.usercode.diagnosis.readings import explain_fit, gradient_causes
from ddp_verify.usercode.diagnosis.weights import fit_gradient

UNEVEN = Scenario(
    world_size=4,
    schedule=(((1,), (1,), (1,), (2,)),),
    model=ModelSpec(in_features=2, hidden=(3,)),
)
ACCUMULATING = Scenario(
    world_size=2,
    schedule=(((1, 2), (2, 1)),),
    model=ModelSpec(in_features=2, hidden=(3,)),
)
TOKENS = Scenario(
    world_size=2,
    schedule=(((1, 2), (2, 1)), ((2,), (1,))),
    model=ModelSpec(kind="transformer", hidden=(3,), tied=True),
    loss="tokens",
    seed=3,
)


def observed(scenario: Scenario, weight) -> dict[str, torch.Tensor]:
    """The gradient (by parameter name) if each item of group (rank, micro) counted
    ``weight(group)``."""
    groups, columns = group_gradients(scenario)
    coefficients = torch.tensor([weight(g) * g.items for g in groups], dtype=torch.float64)
    flat = columns @ coefficients
    out, at = {}, 0
    for name, p in build_model(scenario, "float64").named_parameters():
        out[name] = flat[at : at + p.numel()].reshape(p.shape)
        at += p.numel()
    return out


def rank_items(scenario: Scenario, rank: int) -> int:
    return sum(item_counts(scenario)[0][rank])


def test_the_references_own_gradient_counts_every_sample_once() -> None:
    reference = train_reference(UNEVEN, "float64")
    fit = fit_gradient(UNEVEN, reference.ranks[0].grads[0])
    assert fit.identifiable
    assert fit.residual < 1e-10
    assert explain_fit(fit, 1e-3) == []
    assert all(abs(w - 1 / 5) < 1e-9 for w in fit.fitted)


def test_averaging_by_world_size_is_named_with_the_rank_totals() -> None:
    fit = fit_gradient(UNEVEN, observed(UNEVEN, lambda g: 1 / (4 * rank_items(UNEVEN, g.rank))))
    assert [round(fit.rank_total(r), 9) for r in range(4)] == [0.25] * 4
    [(pattern, text)] = explain_fit(fit, 1e-3)
    assert pattern == "ranks:world"
    assert "rank 3's 2 samples counted 0.25 in all instead of 0.4" in text


def test_a_sum_over_ranks_of_prescaled_gradients_is_every_weight_world_size_times() -> None:
    fit = fit_gradient(UNEVEN, observed(UNEVEN, lambda g: 4 / 5))
    [(pattern, text)] = explain_fit(fit, 1e-3)
    assert pattern == "scale"
    assert text.endswith("every sample counted 4x what it should")


def test_rank_means_summed_and_divided_by_the_global_count() -> None:
    # sum_r g_r / N, with g_r rank r's mean gradient: each rank's total is 1/N, not n_r/N.
    fit = fit_gradient(UNEVEN, observed(UNEVEN, lambda g: 1 / (5 * rank_items(UNEVEN, g.rank))))
    [(pattern, _)] = explain_fit(fit, 1e-3)
    assert pattern == "ranks:means-over-count"
    assert [round(fit.rank_total(r), 9) for r in range(4)] == [0.2] * 4


def test_another_ranks_gradient_and_a_rank_of_its_own() -> None:
    from_zero = observed(UNEVEN, lambda g: 1.0 if g.rank == 0 else 0.0)
    fits = [fit_gradient(UNEVEN, from_zero, rank=r) for r in range(4)]
    assert [p for p, _ in explain_fit(fits[2], 1e-3)] == ["ranks:one"]
    assert "rank 0's gradient used on rank 2" in explain_fit(fits[2], 1e-3)[0][1]
    own = [
        fit_gradient(
            UNEVEN,
            observed(UNEVEN, lambda g, r=r: 0.0 if g.rank != r else 1 / rank_items(UNEVEN, r)),
            rank=r,
        )
        for r in range(4)
    ]
    [cause] = gradient_causes(UNEVEN, own)
    assert cause.pattern == "ranks:own" and "never synchronised" in cause.text


def test_zero_grad_inside_the_accumulation_loop_keeps_the_last_micro_batch_only() -> None:
    # Only the last micro-batch's gradient survives, each rank's averaged over ranks.
    def last_only(g):
        return 0.0 if g.micro == 0 else 1 / (2 * g.items)

    fit = fit_gradient(ACCUMULATING, observed(ACCUMULATING, last_only))
    patterns = [p for p, _ in explain_fit(fit, 1e-3)]
    assert "micro:last-only" in patterns
    assert fit.residual < 1e-10


def test_the_2024_accumulation_bug_on_tokens_is_per_micro_batch_normalisation() -> None:
    # Each micro-batch's mean over its own tokens, divided by the number of micro-batches,
    # then averaged over ranks: what transformers' Trainer did before num_items_in_batch.
    counts = item_counts(TOKENS)[0]
    assert counts[0][0] != counts[0][1] or counts[1][0] != counts[1][1]

    def per_micro_mean(g):
        return 1 / (2 * len(counts[g.rank]) * g.items)

    fit = fit_gradient(TOKENS, observed(TOKENS, per_micro_mean))
    assert fit.unit == "token"
    found = dict(explain_fit(fit, 1e-3))
    assert "micro:equal" in found
    assert (
        "normalised per micro-batch by its own token count instead of the global count"
        in (found["micro:equal"])
    )
    shares = [fit.fitted[i] * g.items for i, g in enumerate(fit.groups)]
    assert shares == pytest.approx([0.25] * 4)  # every micro-batch a quarter, whatever its tokens


@pytest.mark.parametrize(
    ("mistake", "pattern"),
    [
        (Mistake(report="own"), "loss:local"),
        (Mistake(report="sum"), "loss:sum"),
        (Mistake(report="world"), "loss:world"),
        (Mistake(report="carried"), "loss:carried"),
        (Mistake(micro="equal"), "loss:micro-equal"),
    ],
)
def test_the_reported_loss_is_explained_by_its_weighting(mistake, pattern) -> None:
    scenario = Scenario(
        world_size=2,
        schedule=(((1, 2), (1,)), ((2,), (1, 1, 1))),
        model=ModelSpec(in_features=2, hidden=(3,)),
    )
    reference = train_reference(scenario, "float64")
    if mistake.micro != "items":
        # A gradient mistake changes the loss only through the parameters: report the global
        # mean of what the mistaken run had, the weighting itself wrong only in the report.
        got = simulate(scenario, Mistake(report="share"))
    else:
        got = simulate(scenario, mistake)
    causes = [c for c in likely_causes("step", scenario, reference, got) if c.subject == "loss"]
    if mistake.micro != "items":
        assert causes == []  # a right report of a run is right, whatever the run did
        return
    assert [c.pattern for c in causes] == [pattern]
    said = likely_causes("step", scenario, reference, reference)
    assert [c for c in said if c.subject == "loss"] == []


def test_where_many_weightings_fit_the_simplest_structured_one_is_taken() -> None:
    # 8 micro-batches and a model of 7 parameters: their gradients are linearly dependent, so
    # least squares alone would pick the smallest weights, not the true ones.
    crowded = Scenario(
        world_size=4,
        schedule=(((1, 2), (1, 1), (2, 1), (3, 1)),),
        model=ModelSpec(in_features=1, hidden=(2,)),
    )
    counts = [sum(item_counts(crowded)[0][r]) for r in range(4)]
    fit = fit_gradient(crowded, observed(crowded, lambda g: 1 / (4 * counts[g.rank])))
    assert not fit.identifiable
    assert [p for p, _ in explain_fit(fit, 1e-3)] == ["ranks:world"]
    assert [round(fit.rank_total(r), 9) for r in range(4)] == [0.25] * 4


def test_weights_the_runs_rounding_cannot_pin_down_are_read_as_the_simplest_pattern() -> None:
    # A one-feature model: its micro-batches' gradients are independent in float64 (the
    # smallest singular value 3e-5 of the largest), but a float32 run's rounding (about 1e-6
    # of the gradient, the table's) moves least squares' weights by more than a pattern's
    # closeness. The fit is then rank-deficient at that precision, and the weights shown are
    # the simplest structured ones that explain it: here micro-batches averaged equally.
    scenario = Scenario(
        world_size=2,
        schedule=(((1, 2), (2, 1)),),
        model=ModelSpec(in_features=1, hidden=(1,)),
        seed=2,
    )
    exact = observed(scenario, lambda g: 1 / (2 * 2 * g.items))  # each micro-batch: 1/4
    fit = fit_gradient(scenario, exact)
    assert fit.identifiable
    assert [p for p, _ in explain_fit(fit, 1e-3)] == ["micro:equal"]
    noise = torch.Generator().manual_seed(0)
    rounded = {
        name: (g * (1 + 1e-6 * torch.randn(g.shape, generator=noise, dtype=g.dtype))).float()
        for name, g in exact.items()
    }
    fit = fit_gradient(dataclasses.replace(scenario, dtype="float32"), rounded)
    assert not fit.identifiable
    assert [p for p, _ in explain_fit(fit, 1e-3)] == ["micro:equal"]
    assert [round(w * g.items, 6) for w, g in zip(fit.fitted, fit.groups, strict=True)] == [
        0.25
    ] * 4
