"""A micro-batch's token logits and labels as packed code is handed them: labels unshifted for
a loss that shifts them itself (each segment's first label dropped or kept, as
``Scenario.boundary`` says), the sequences packed into rows as ``Scenario.packing`` says
(:mod:`.packing`), and the boundaries code may take by name.

Example::

    logits, labels, boundaries = packed_labels(scenario, inputs, logits, labels, False)
"""

from __future__ import annotations

import torch

from .models import PAD_ID, VOCABULARY
from .packing import Packed, pack
from .scenario import IGNORE_INDEX, Scenario

__all__ = [
    "MICRO_BATCH_KEYS",
    "micro_batch_dict",
    "packed_boundaries",
    "packed_labels",
    "packing_of",
    "unpacked_boundaries",
    "unshifted_labels",
]


# The keys of a micro-batch handed as a dict (a step's, as a padding-free collator gives it).
MICRO_BATCH_KEYS = ("input_ids", "labels", "position_ids", "segment_ids", "cu_seq_lens")


def micro_batch_dict(
    scenario: Scenario, inputs: torch.Tensor, targets: torch.Tensor
) -> dict[str, torch.Tensor]:
    """A micro-batch of token ``inputs`` and aligned ``targets`` (``[sequences, width]``) as
    a padding-free collator hands it to a training step: ``input_ids`` and ``labels`` packed
    into rows as the scenario says (each position's label is what it predicts, -100 where
    nothing counts), with the boundaries the model needs to keep each sequence to itself
    (:data:`MICRO_BATCH_KEYS`); unpacked, the padded batch with the trivial boundaries.

    Example::

        >>> from ddp_verify.engine.scenario import ModelSpec
        >>> scenario = Scenario(world_size=1, schedule=(((2,),),), loss="tokens",
        ...                     model=ModelSpec(kind="transformer"), packing="flat")
        >>> batch = micro_batch_dict(scenario, torch.tensor([[5, 6], [7, 0]]),
        ...                          torch.tensor([[1, 2], [3, -100]]))
        >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
        ([[5, 6, 7]], [[0, 1, 0]])
    """
    if not scenario.packing:
        rows, width = targets.shape
        boundaries = unpacked_boundaries(rows, width, targets.device)
        return {"input_ids": inputs, "labels": targets, **boundaries}
    packed = packing_of(scenario, inputs, targets.shape[1])
    return {
        "input_ids": packed.of(inputs, PAD_ID),
        "labels": packed.of(targets, IGNORE_INDEX),
        **packed_boundaries(packed, targets.device),
    }


def unpacked_boundaries(
    rows: int, width: int, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """The boundaries of ``rows`` sequences padded to ``width``, a sequence a row.

    Example::

        >>> unpacked_boundaries(2, 3)["cu_seq_lens"].tolist()
        [0, 3, 6]
    """
    positions = torch.arange(width, device=device).expand(rows, width).clone()
    segments = torch.arange(rows, device=device).unsqueeze(1).expand(rows, width).clone()
    starts = torch.arange(rows + 1, device=device, dtype=torch.int32) * width
    return {"position_ids": positions, "segment_ids": segments, "cu_seq_lens": starts}


def unshifted_labels(
    scenario: Scenario, inputs: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Aligned ``labels`` (position ``i``'s target at ``i``) as a loss that shifts them
    expects (at ``i + 1``); position 0's is ignore_index, or under ``boundary="kept"`` the
    sequence's first token (which nothing before it predicts, unless packed after another).

    Example::

        labels = unshifted_labels(scenario, inputs, targets)
    """
    unshifted = torch.full_like(labels, IGNORE_INDEX)
    unshifted[:, 1:] = labels[:, :-1]
    if scenario.boundary == "kept":
        unshifted[:, 0] = inputs[:, 0].clamp(min=0) % VOCABULARY
    return unshifted


def packed_labels(
    scenario: Scenario,
    inputs: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    unshifted: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's ``logits`` (``[sequences, width, vocab]``) and ``labels`` laid out as
    the scenario packs them (:mod:`ddp_verify.engine.packing`), with their boundaries; each
    sequence's positions are its tokens, plus one where the labels are ``unshifted`` (the
    last token's target sits one further on), so that the previous segment's last position
    meets the next segment's first label, as in a packed row. Unpacked: as given, with the
    trivial boundaries.

    Example::

        logits, labels, boundaries = packed_labels(scenario, inputs, logits, labels, False)
    """
    device = labels.device
    if not scenario.packing:
        rows, width = labels.shape
        return logits, labels, unpacked_boundaries(rows, width, device)
    packed = packing_of(scenario, inputs, labels.shape[1], extra=int(unshifted))
    boundaries = packed_boundaries(packed, device)
    return packed.of(logits, 0.0), packed.of(labels, IGNORE_INDEX), boundaries


def packing_of(scenario: Scenario, inputs: torch.Tensor, width: int, extra: int = 0) -> Packed:
    """How ``scenario`` packs a micro-batch of ``inputs`` (``[sequences, width]``): each
    sequence's positions are its tokens (padding excluded), plus ``extra`` (the slot of an
    unshifted last target).

    Example::

        packed = packing_of(scenario, inputs, targets.shape[1])
    """
    lengths = ((inputs != PAD_ID).sum(dim=1).clamp(min=1) + extra).tolist()
    return pack(lengths, scenario.packing, width=width)


def packed_boundaries(packed: Packed, device: torch.device | str | None) -> dict[str, torch.Tensor]:
    """The boundaries of ``packed`` rows as code takes them by name, on ``device``."""
    return {
        "position_ids": packed.position_ids.to(device),
        "segment_ids": packed.segment_ids.to(device),
        "cu_seq_lens": packed.cu_seq_lens.to(device),
    }
