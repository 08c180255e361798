"""Gradient and loss aggregation patterns users copy, checked on a real world.

Run with ``pytest --world-size 4 examples/``. Every test body marked ``distributed`` runs on
every rank; ``world`` runs jobs on the ranks from a ``@given`` test.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_verify.world import rank_device

FEATURES = 5


def model_and_data(sizes: list[int]):
    """The same model on every rank, and every rank's slice of one global batch, on the
    rank's device (its GPU under --ddp-device cuda or nccl: nccl reduces GPU tensors only)."""
    torch.manual_seed(0)
    device = rank_device()
    model = nn.Sequential(nn.Linear(FEATURES, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    inputs = torch.randn(sum(sizes), FEATURES, dtype=torch.float64).to(device)
    targets = torch.randn(sum(sizes), 1, dtype=torch.float64).to(device)
    model = model.to(device)
    start = sum(sizes[: dist.get_rank()])
    mine = slice(start, start + sizes[dist.get_rank()])
    return model, inputs, targets, mine


def full_batch_gradient(model: nn.Module, inputs, targets) -> list[torch.Tensor]:
    model.zero_grad()
    nn.functional.mse_loss(model(inputs), targets).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def average_gradients(model: nn.Module) -> None:
    """The source documents' version: sum, then divide by the number of ranks."""
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
            param.grad.data /= dist.get_world_size()


def weighted_average_gradients(model: nn.Module, num_samples: int) -> None:
    """Sample-weighted: right for uneven batches too."""
    device = next(model.parameters()).device  # nccl reduces GPU tensors only
    total = torch.tensor([float(num_samples)], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(num_samples)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad.div_(total)


def local_gradient(model, inputs, targets, mine) -> None:
    model.zero_grad()
    nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()


def assert_gradients(model: nn.Module, expected: list[torch.Tensor], *, equal: bool) -> None:
    pairs = zip((p.grad for p in model.parameters()), expected, strict=True)
    close = all(torch.allclose(g, e, rtol=1e-10, atol=1e-12) for g, e in pairs)
    assert close == equal, f"rank {dist.get_rank()}: gradients {'differ' if equal else 'agree'}"


@pytest.mark.distributed
def test_manual_averaging_matches_full_batch_on_even_batches(world_size):
    model, inputs, targets, mine = model_and_data([3] * world_size)
    expected = full_batch_gradient(model, inputs, targets)
    local_gradient(model, inputs, targets, mine)
    average_gradients(model)
    assert_gradients(model, expected, equal=True)


@pytest.mark.distributed
def test_ddp_matches_full_batch_on_even_batches(world_size):
    model, inputs, targets, mine = model_and_data([3] * world_size)
    expected = full_batch_gradient(model, inputs, targets)
    ddp = DDP(model)
    nn.functional.mse_loss(ddp(inputs[mine]), targets[mine]).backward()
    assert_gradients(model, expected, equal=True)


@pytest.mark.distributed
def test_averaging_by_world_size_is_wrong_on_uneven_batches(world_size):
    if world_size == 1:
        pytest.skip("one rank cannot hold an uneven split")
    sizes = [2] * world_size
    sizes[0] = 5
    model, inputs, targets, mine = model_and_data(sizes)
    expected = full_batch_gradient(model, inputs, targets)
    local_gradient(model, inputs, targets, mine)
    average_gradients(model)
    assert_gradients(model, expected, equal=False)  # the quiet bug
    local_gradient(model, inputs, targets, mine)
    weighted_average_gradients(model, sizes[dist.get_rank()])
    assert_gradients(model, expected, equal=True)  # the fix


@pytest.mark.distributed
def test_loss_all_reduced_for_logging_is_the_global_mean_only_when_weighted(world_size):
    sizes = [1 + r for r in range(world_size)]
    model, inputs, targets, mine = model_and_data(sizes)
    with torch.no_grad():
        global_loss = nn.functional.mse_loss(model(inputs), targets)
        local_loss = nn.functional.mse_loss(model(inputs[mine]), targets[mine])
    weighted = local_loss * sizes[dist.get_rank()]
    dist.all_reduce(weighted)
    torch.testing.assert_close(weighted / sum(sizes), global_loss)


def _weighted_gradient_error(sizes: list[int]) -> float:
    model, inputs, targets, mine = model_and_data(sizes)
    expected = full_batch_gradient(model, inputs, targets)
    local_gradient(model, inputs, targets, mine)
    weighted_average_gradients(model, sizes[dist.get_rank()])
    pairs = zip(model.parameters(), expected, strict=True)
    return max((p.grad - e).abs().max().item() for p, e in pairs)


@given(data=st.data())
def test_sample_weighted_averaging_matches_full_batch_for_any_split(world, data):
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=world.size, max_size=world.size))
    errors = world.run(_weighted_gradient_error, sizes)
    assert max(errors) < 1e-12, f"split {sizes}: gradient error {max(errors):.3g}"
