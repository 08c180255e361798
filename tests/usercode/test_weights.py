"""The weight fit: a gradient explained as a weighted sum of the micro-batches' gradients.
Observed gradients here are built from the weights a mistake gives (or trained by the real
reference), and the fit must recover those weights and say what is wrong with them."""

from __future__ import annotations

import torch

from ddp_verify.engine.models import build_model
from ddp_verify.engine.reference import train_reference
from ddp_verify.engine.scenario import ModelSpec, Scenario
from ddp_verify.usercode.weights import fit_gradient, group_gradients

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


def observed(scenario: Scenario, weight) -> dict[str, torch.Tensor]:
    """The gradient (by parameter name) if each sample of group (rank, micro) counted
    ``weight(group)``."""
    groups, columns = group_gradients(scenario)
    coefficients = torch.tensor([weight(g) * g.samples for g in groups], dtype=torch.float64)
    flat = columns @ coefficients
    out, at = {}, 0
    for name, p in build_model(scenario, "float64").named_parameters():
        out[name] = flat[at : at + p.numel()].reshape(p.shape)
        at += p.numel()
    return out


def test_the_references_own_gradient_counts_every_sample_once() -> None:
    reference = train_reference(UNEVEN, "float64")
    fit = fit_gradient(UNEVEN, reference.ranks[0].grads[0])
    assert fit.identifiable
    assert fit.residual < 1e-10
    assert fit.deviations() == []
    assert all(abs(w - 1 / 5) < 1e-9 for w in fit.fitted)


def test_averaging_by_world_size_is_named_with_the_numbers() -> None:
    per_rank = {r: sum(UNEVEN.schedule[0][r]) for r in range(4)}
    fit = fit_gradient(UNEVEN, observed(UNEVEN, lambda g: 1 / (4 * per_rank[g.rank])))
    said = fit.deviations()
    assert said[-1].startswith(
        "rank 3's 2 samples counted 0.125 each instead of 0.2 (weighted by 1/world size"
    )
    assert any("rank 0's 1 sample counted 0.25 each instead of 0.2" in s for s in said)


def test_a_sum_over_ranks_is_every_weight_world_size_times_too_large() -> None:
    fit = fit_gradient(UNEVEN, observed(UNEVEN, lambda g: 4 / 5))
    assert fit.deviations() == [
        "every sample counted 4x what it should (summed across ranks, not averaged)"
    ]


def test_zero_grad_inside_the_accumulation_loop_drops_the_first_micro_batch_everywhere() -> None:
    # Only the last micro-batch's gradient survives, each rank's averaged over ranks.
    def last_only(g):
        if g.micro == 0:
            return 0.0
        return 1 / (2 * g.samples)

    fit = fit_gradient(ACCUMULATING, observed(ACCUMULATING, last_only))
    said = fit.deviations()
    assert said[0] == "micro-batch 0 of every rank counted 0"
    assert fit.residual < 1e-10
