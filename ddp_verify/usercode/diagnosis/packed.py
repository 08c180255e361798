"""What code that reads packed rows wrong trains, simulated on one process, float64, as the
diagnosis's other alternatives are:

- code that takes a packed row for a sequence: the declared sequence mean with each packed
  row of every micro-batch as one sequence, normalised by the step's sequences (the count it
  is handed) or by its rows;
- a loss that shifts its labels within each packed row and never masks the boundaries: each
  sequence's last position also trained to predict the next one's first token (where that
  label is kept), normalised by the step's count, by the count with those boundaries, or per
  micro-batch.

Example::

    trace = rows_as_sequences(scenario, over="sequences")
    trace = boundaries_counted(scenario, over="step")
"""

from __future__ import annotations

import torch

from ...engine.models import loss_function
from ...engine.objectives import objective
from ...engine.packed_layout import packed_labels, packing_of, unshifted_labels
from ...engine.scenario import IGNORE_INDEX, Scenario
from ...engine.trace import Trace
from ...engine.training import Step, train

__all__ = ["BOUNDARY_OVER", "OVER", "boundaries_counted", "boundary_pairs", "rows_as_sequences"]

# What the sum of the rows' objectives is divided by: the sequences the code is handed (a
# padded-batch aggregation run on packed rows), or the rows themselves.
OVER = ("sequences", "rows")


def rows_as_sequences(scenario: Scenario, over: str) -> Trace:
    """Train ``scenario`` (packed, a sequence-level objective declared) with each packed row
    taken for a sequence, the rows' sum divided ``over`` the step's declared sequences or its
    rows that hold a counted token."""
    if over not in OVER:
        raise ValueError(f"over must be one of {OVER}, got {over!r}")
    declared = objective(scenario.objective)
    per_token = loss_function(scenario, "none")

    def backward(step: Step) -> list[float]:
        pieces = []
        for rank in range(scenario.world_size):
            for inputs, targets in step.micro_batches(rank):
                packed = packing_of(scenario, inputs, targets.shape[1])
                losses = packed.of(per_token(step.model(inputs), targets), 0.0)
                pieces.append((losses, packed.of(targets != IGNORE_INDEX, False)))
        rows = sum(declared.units(mask) for _, mask in pieces)
        count = declared.units(step.targets != IGNORE_INDEX) if over == "sequences" else rows
        total = torch.zeros((), dtype=torch.float64)
        for losses, mask in pieces:
            total = total + declared.value(losses, mask) * declared.units(mask)
        loss = total / max(count, 1) * step.factor
        loss.backward()
        return [loss.item()]

    return train(scenario, backward, dtype="float64", name=f"rows as sequences, over {over}")


# What a loss that counts the boundaries divides its sum by: the step's count it is handed,
# that count with the boundaries it counted, or each micro-batch's own (a loop without a
# count: each micro-batch's mean, divided by the micro-batches, averaged over ranks).
BOUNDARY_OVER = ("step", "step-and-boundaries", "micro-batch")


def _shifted_pairs(
    scenario: Scenario, inputs: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A micro-batch packed as a loss that shifts its labels gets it: each position's logits
    with the next position's label in its row; and which of the pairs are boundaries (the
    label is a segment's first)."""
    labels = unshifted_labels(scenario, inputs, targets)
    packed, labels, boundaries = packed_labels(scenario, inputs, logits, labels, True)
    starts = boundaries["position_ids"][:, 1:] == 0
    return packed[:, :-1, :], labels[:, 1:], starts & (labels[:, 1:] != IGNORE_INDEX)


def boundary_pairs(scenario: Scenario, step: int) -> int:
    """How many boundary predictions ``step``'s packed micro-batches hold (a label kept at a
    segment's start, the previous position in its row predicting it)."""
    from ...engine.models import build_data, build_model, micro_batches

    model = build_model(scenario, "float64")
    batch = build_data(scenario, "float64")[step]
    total = 0
    for rank in range(scenario.world_size):
        for inputs, targets in micro_batches(scenario, step, rank, batch):
            _, _, boundary = _shifted_pairs(scenario, inputs, model(inputs), targets)
            total += int(boundary.sum())
    return total


def boundaries_counted(scenario: Scenario, over: str) -> Trace:
    """Train ``scenario`` (packed, labels unshifted, each segment's first label kept) with
    a loss that shifts its labels within each packed row and counts every pair, the
    boundaries too, divided ``over`` one of :data:`BOUNDARY_OVER`."""
    if over not in BOUNDARY_OVER:
        raise ValueError(f"over must be one of {BOUNDARY_OVER}, got {over!r}")

    def backward(step: Step) -> list[float]:
        sums, counts, shares, boundaries = [], [], [], 0
        for rank in range(scenario.world_size):
            batches = step.micro_batches(rank)
            for inputs, targets in batches:
                # Without a count, each micro-batch's mean weighs 1 / (its rank's
                # micro-batches x the world size), as the loop divides and DDP averages.
                shares.append(1.0 / (len(batches) * scenario.world_size))
                logits, labels, boundary = _shifted_pairs(
                    scenario, inputs, step.model(inputs), targets
                )
                losses = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                sums.append(losses)
                counts.append(int((labels != IGNORE_INDEX).sum()))
                boundaries += int(boundary.sum())
        counted = int((step.targets != IGNORE_INDEX).sum())
        if over == "micro-batch":
            means = [s / max(c, 1) * w for s, c, w in zip(sums, counts, shares, strict=True)]
            loss = torch.stack(means).sum()
        else:
            whole = counted + (boundaries if over == "step-and-boundaries" else 0)
            loss = torch.stack(sums).sum() / max(whole, 1)
        loss.backward()
        return [loss.item()]

    return train(scenario, backward, dtype="float64", name=f"boundaries counted, over {over}")
