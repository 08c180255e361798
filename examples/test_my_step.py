"""Your own training step, checked under pytest: copy this file into your tests and import
your step instead of the one written here.

``ddp_verify.check(train_step, kind="step")`` calls the step on every rank of the session's
world (``pytest --world-size N``; 2 ranks unless said) on generated scenarios, and holds it to
one process training on the whole global batch. On each rank the step gets:

- ``model``: the scenario's model, the same weights on every rank, not wrapped;
- ``optimizer``: an optimizer over its parameters (SGD, with or without momentum, or Adam);
- ``micro_batches``: this rank's micro-batches of one optimizer step, in order, as a list of
  ``(inputs, targets)`` pairs; sizes differ between micro-batches and between ranks (uneven
  batches), and every rank gets as many micro-batches (``--micro-batch-counts varied`` on the
  command line lifts that);
- ``loss_fn(outputs, targets)``: the scenario's loss, averaged over the micro-batch's samples.

It must leave every parameter where the single process leaves it, and return the step's loss
averaged over every sample of every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import ddp_verify


def train_step(model, optimizer, micro_batches, loss_fn):
    """A step written as users write one: each micro-batch's loss weighted by its share of the
    global batch, gradients summed over ranks."""
    param = next(model.parameters())
    count = torch.tensor([float(sum(len(x) for x, _ in micro_batches))], device=param.device)
    dist.all_reduce(count)  # the global batch: every rank's samples
    optimizer.zero_grad()
    reported = torch.zeros((), dtype=param.dtype, device=param.device)
    for inputs, targets in micro_batches:
        loss = loss_fn(model(inputs), targets) * len(inputs) / count.item()
        loss.backward()
        reported += loss.detach()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    dist.all_reduce(reported)
    optimizer.step()
    return reported


def test_train_step_trains_what_one_process_trains():
    verdict = ddp_verify.check(train_step, kind="step", max_examples=25)
    assert verdict.examples == 25
