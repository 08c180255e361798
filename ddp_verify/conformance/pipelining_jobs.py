"""Rank jobs of the pipelining properties (``test_pipelining.py``): a chain of small layers cut
into pipeline stages (one a rank, or several in a loop over the ranks), run by one of
``torch.distributed.pipelining``'s schedules over the batch's micro-batches, each rank
returning its stages' gradients and the last stage's losses; and the same chain on one process
(the oracle: plain autograd, nothing of pipelining), every micro-batch's loss backpropagated
in turn.

Example::

    world.run(pipelining_jobs.pipelined, case)  # per rank: {stage: gradients, "losses": ...}
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["SCHEDULES", "layers", "one_process", "pipelined"]

# The schedules drawn: one stage a rank, or several a rank (looped over the ranks).
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "looped_bfs": ("ScheduleLoopedBFS", 2),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2),
    # Zero bubble: each backward split into the inputs' gradients, then the weights' later.
    "interleaved_zero_bubble": ("ScheduleInterleavedZeroBubble", 2),
    # V-shaped: rank r holds stages r and 2W - 1 - r (the first and the last on rank 0).
    "zbv_zero_bubble": ("ScheduleZBVZeroBubble", 2),
}
V_SHAPED = {"zbv_zero_bubble"}
WIDTH, CLASSES = 3, 4
SECOND = 2  # the width of the second tensor a chain that carries two passes on
# What passes between stages: one tensor, or two (a hidden state and a second stream, as a
# residual or a position embedding is carried along), the last stage using both or only
# the first (a stage input that takes no part in its output: its gradient is none).
CARRIES = ("one", "two", "two_last_ignores")


class _Pair(torch.nn.Module):
    """A layer of a chain that carries two tensors of other widths: ``(h, s) -> (tanh(A h) +
    P s, Q s)``; the last, ``(h, s) -> C h + D s`` (or ``C h``, ignoring ``s``)."""

    def __init__(self, last: bool, ignores: bool, generator: torch.Generator) -> None:
        super().__init__()
        out = CLASSES if last else WIDTH
        self.last = last
        self.a = torch.nn.Linear(WIDTH, out, dtype=torch.float64)
        self.p = None if last and ignores else torch.nn.Linear(SECOND, out, dtype=torch.float64)
        self.q = None if last else torch.nn.Linear(SECOND, SECOND, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))

    def forward(self, h: torch.Tensor, s: torch.Tensor) -> Any:
        if self.last:
            return self.a(h) if self.p is None else self.a(h) + self.p(s)
        assert self.p is not None and self.q is not None
        return torch.tanh(self.a(h)) + self.p(s), self.q(s)


def layers(case: dict[str, Any], count: int) -> list[torch.nn.Module]:
    """The chain's ``count`` layers, the same on every rank and in the oracle (float64): each
    a linear map and a tanh, the last a linear map to the classes."""
    generator = torch.Generator().manual_seed(case["seed"])
    made: list[torch.nn.Module] = []
    carry = case.get("carry", "one")
    if carry != "one":
        ignores = carry == "two_last_ignores"
        return [_Pair(i == count - 1, ignores, generator) for i in range(count)]
    for index in range(count):
        out = CLASSES if index == count - 1 else WIDTH
        linear = torch.nn.Linear(WIDTH, out, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out, WIDTH, generator=generator, dtype=torch.float64))
            linear.bias.copy_(torch.randn(out, generator=generator, dtype=torch.float64))
        made.append(linear if index == count - 1 else torch.nn.Sequential(linear, torch.nn.Tanh()))
    return made


def batch(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's inputs (one tensor, or two where the chain carries two) and labels: -100
    where a sample does not count (so micro-batches hold uneven counts), never a whole
    micro-batch of them."""
    generator = torch.Generator().manual_seed(case["seed"] + 1)
    rows = case["micro_batches"] * case["micro_batch_size"]
    inputs = torch.randn(rows, WIDTH, generator=generator, dtype=torch.float64)
    if case.get("carry", "one") != "one":
        second = torch.randn(rows, SECOND, generator=generator, dtype=torch.float64)
        inputs = torch.cat([inputs, second], dim=1)  # split into (h, s) by the chain
    labels = torch.randint(0, CLASSES, (rows,), generator=generator)
    for row in case["ignored"]:
        labels[row] = -100
    return inputs, labels


def loss_fn(case: dict[str, Any]) -> Any:
    """Each micro-batch's loss: its own mean, or its sum over the step's count of labels."""
    import torch.nn.functional as F

    counted = int((batch(case)[1] != -100).sum())

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if case["loss"] == "mean":
            return F.cross_entropy(output, target, ignore_index=-100)
        summed = F.cross_entropy(output, target, ignore_index=-100, reduction="sum")
        return summed / counted

    return loss


def _split(case: dict[str, Any], inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The first stage's positional inputs: the one tensor, or the two the chain carries."""
    if case.get("carry", "one") == "one":
        return (inputs,)
    return inputs[:, :WIDTH], inputs[:, WIDTH:]


def _run(chain: list[torch.nn.Module], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    out: Any = inputs
    for layer in chain:
        out = layer(*out) if isinstance(out, tuple) else layer(out)
    return out


def _given(case: dict[str, Any], chain: list[torch.nn.Module], index: int) -> dict[str, Any]:
    """What stage ``index`` is told of its tensors where the case gives them (``metadata``
    "given": a micro-batch's inputs and outputs of the stage, and for the first stage input
    gradients of none, as the data takes none), instead of inferring them by a forward of its
    own; nothing where it infers them."""
    if case.get("metadata", "inferred") != "given":
        return {}
    inputs, _ = batch(case)
    out: Any = _split(case, torch.tensor_split(inputs, case["micro_batches"])[0])
    with torch.no_grad():
        for layer in chain[:index]:
            out = layer(*out) if isinstance(out, tuple) else layer(out)
        given = out if isinstance(out, tuple) else (out,)
        made = chain[index](*given)
    # An activation a later stage receives takes a gradient; the data the first takes, none.
    given = tuple(t.detach().requires_grad_(index > 0) for t in given)
    outputs = made if isinstance(made, tuple) else (made,)
    told: dict[str, Any] = {"input_args": given, "output_args": made}
    # The gradients' shapes as the tensors'; none for the data the first stage takes.
    told["input_grads"] = tuple(None if index == 0 else torch.zeros_like(t) for t in given)
    if index < len(chain) - 1:
        told["output_grads"] = tuple(torch.zeros_like(t) for t in outputs)
    return told


def one_process(case: dict[str, Any], stages: int) -> dict[str, Any]:
    """The oracle: the whole chain on one process, each micro-batch's loss backpropagated in
    turn, the gradients divided by the micro-batches where the schedule scales them."""
    chain = torch.nn.ModuleList(layers(case, stages))
    inputs, labels = batch(case)
    loss = loss_fn(case)
    losses = []
    n = case["micro_batches"]
    outputs = []
    for x, y in zip(torch.tensor_split(inputs, n), torch.tensor_split(labels, n), strict=True):
        out = _run(list(chain), _split(case, x))
        outputs.append(out.detach())
        value = loss(out, y)
        value.backward()
        losses.append(value.detach())
    if case["scale_grads"]:
        for p in chain.parameters():
            if p.grad is not None:  # None: no loss reaches it
                p.grad.div_(n)
    grads = {i: [p.grad for p in chain[i].parameters()] for i in range(stages)}
    return {"grads": grads, "losses": losses, "output": torch.cat(outputs)}


def pipelined(case: dict[str, Any]) -> dict[str, Any]:
    """On each rank: its stages of the chain under the case's schedule, one step over the
    batch; its stages' gradients, and the losses the schedule returns on the last stage."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    world, rank = dist.get_world_size(), dist.get_rank()
    name, per_rank = SCHEDULES[case["schedule"]]
    stages = world * per_rank
    chain = layers(case, stages)
    # Looped schedules place stage i on rank i % world; V-shaped ones, ranks 0..W-1 then back.
    if case["schedule"] in V_SHAPED:
        mine = [rank, stages - 1 - rank]
    else:
        mine = [i for i in range(stages) if i % world == rank]
    made = [
        pipelining.PipelineStage(chain[i], i, stages, torch.device("cpu"), **_given(case, chain, i))
        for i in mine
    ]
    kind = getattr(pipelining, name)
    schedule = kind(
        made[0] if per_rank == 1 else made,
        n_microbatches=case["micro_batches"],
        loss_fn=loss_fn(case),
        scale_grads=case["scale_grads"],
    )
    inputs, labels = batch(case)
    losses: list[torch.Tensor] = []
    first, last = 0 in mine, stages - 1 in mine
    args = _split(case, inputs) if first else ()
    kwargs: dict[str, Any] = {"target": labels, "losses": losses} if last else {}
    # Where the training made another device the default (torch.set_default_device): the
    # stage's buffers must still be made on its own device ("meta" holds no data).
    default = case.get("default_device")
    with torch.device(default) if default else contextlib.nullcontext():
        merged = schedule.step(*args, **kwargs)
    grads = {i: [p.grad for p in chain[i].parameters()] for i in mine}
    # The last stage's outputs, merged back into the batch's order (what step returns there).
    output = merged.detach() if isinstance(merged, torch.Tensor) and last else None
    return {"grads": grads, "losses": [value.detach() for value in losses], "output": output}
