"""What code that takes a packed row for a sequence trains: the declared sequence mean with
each packed row of every micro-batch as one sequence, normalised by the step's sequences
(the count it is handed) or by its rows. Simulated on one process, float64, one replica per
rank, as the diagnosis's other alternatives are.

Example::

    trace = rows_as_sequences(scenario, over="sequences")
"""

from __future__ import annotations

import torch

from ...engine.models import PAD_ID, loss_function
from ...engine.objectives import objective
from ...engine.packing import pack
from ...engine.scenario import IGNORE_INDEX, Scenario
from ...engine.trace import Trace
from ...engine.training import Step, train

__all__ = ["OVER", "rows_as_sequences"]

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
                lengths = (inputs != PAD_ID).sum(dim=1).clamp(min=1).tolist()
                packed = pack(lengths, scenario.packing, width=targets.shape[1])
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
