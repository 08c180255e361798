"""Packed batches (padding-free training): a micro-batch's sequences laid end to end in rows,
with the boundaries code is handed to tell them apart.

Two packers, as training code meets them:

- ``flat``: every sequence of the micro-batch in one row, no padding (Hugging Face's
  ``DataCollatorWithFlattening``, TRL's ``padding_free=True``);
- ``rows``: sequences placed in order into the first row of :data:`CAPACITY` positions with
  room, never split; each row padded at its end to the longest (TRL's ``packing=True`` with
  best-fit packing);
- ``split``: sequences laid end to end and cut into rows of :data:`CAPACITY` positions, a
  sequence split across two rows where the cut falls (torchtune's ``PackedDataset`` with
  ``split_across_pack=True``, a pretraining packer); only the last row is padded.

A token keeps its own loss wherever it is packed (as attention that respects the boundaries
gives it), so only the layout changes: a token mean is the same packed or not, and a
sequence mean is a mean over *segments*, the packed sequences. The boundaries:

- ``position_ids`` ``[rows, width]``: each segment's positions from 0 (a split sequence's
  go on in the next row); padding 0;
- ``segment_ids`` ``[rows, width]``: the segment's index in the micro-batch (one index on
  both sides of a split), -1 on padding;
- ``cu_seq_lens`` ``[segments + 1]`` (int32): where each segment starts in the rows read
  end to end (row-major), flash-attention's varlen form (a split sequence is contiguous
  there); a row's padded tail is a segment of its own, with nothing that counts, so that the
  offsets cover every position.

Example::

    >>> packed = pack([3, 1, 2], "rows")
    >>> packed.segment_ids.tolist()
    [[0, 0, 0, 1], [2, 2, -1, -1]]
    >>> packed.cu_seq_lens.tolist()
    [0, 3, 4, 6, 8]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

__all__ = ["CAPACITY", "PACKINGS", "Packed", "pack"]

# The packers (see the module's docstring); "" leaves a micro-batch padded, a sequence a row.
PACKINGS = ("", "flat", "rows", "split")
# The positions of a packed row: the token data's longest sequence (models.TOKENS), so that
# any sequence fits and short ones share a row.
CAPACITY = 4


@dataclasses.dataclass(frozen=True)
class Packed:
    """Where each position of the packed rows comes from: ``source[r, j]`` is the flat index
    ``sequence * width + position`` of the unpacked ``[sequences, width]`` batch, -1 on
    padding; and the boundaries handed to code."""

    source: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    cu_seq_lens: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.source.shape[0])

    def of(self, values: torch.Tensor, fill: float | bool = 0) -> torch.Tensor:
        """``values`` (``[sequences, width, ...]``: a token's logits too) laid out as the
        packed rows, ``fill`` on padding; differentiable in ``values``.

        Example::

            >>> pack([1, 2], "flat").of(torch.tensor([[5, 0], [6, 7]])).tolist()
            [[5, 6, 7]]
        """
        trailing = tuple(values.shape[2:])
        flat = values.reshape(-1, *trailing)
        taken = flat[self.source.clamp(min=0).reshape(-1)]
        taken = taken.reshape(*self.source.shape, *trailing)
        kept = (self.source >= 0).reshape(*self.source.shape, *(1,) * len(trailing))
        return torch.where(kept, taken, torch.full_like(taken, fill))


def pack(lengths: Sequence[int], packing: str, width: int | None = None) -> Packed:
    """How the sequences of ``lengths`` (each at least 1) pack under ``packing`` (``flat``,
    ``rows`` or ``split``), from an unpacked batch ``width`` wide (default: the longest).

    Example::

        >>> pack([2, 2], "flat").position_ids.tolist()
        [[0, 1, 0, 1]]
        >>> pack([3, 3], "split").position_ids.tolist()
        [[0, 1, 2, 0], [1, 2, 0, 0]]
    """
    if packing not in PACKINGS[1:]:
        raise ValueError(f"packing must be one of {PACKINGS[1:]}, got {packing!r}")
    width = max(lengths) if width is None else width
    if any(not 1 <= n <= width for n in lengths):
        raise ValueError(f"each sequence holds 1 to {width} positions, got {list(lengths)}")
    if packing == "split":
        return _split(lengths, width)
    rows: list[list[int]] = []  # the sequences of each row, in order
    fill: list[int] = []
    for index, n in enumerate(lengths):
        if packing == "rows":
            at = next((r for r, used in enumerate(fill) if used + n <= CAPACITY), None)
        else:
            at = 0 if rows else None
        if at is None:
            rows.append([])
            fill.append(0)
            at = len(rows) - 1
        rows[at].append(index)
        fill[at] += n
    longest = max(fill)
    source = torch.full((len(rows), longest), -1, dtype=torch.long)
    positions = torch.zeros((len(rows), longest), dtype=torch.long)
    segments = torch.full((len(rows), longest), -1, dtype=torch.long)
    starts = [0]
    for r, members in enumerate(rows):
        at = 0
        for index in members:
            n = lengths[index]
            source[r, at : at + n] = index * width + torch.arange(n)
            positions[r, at : at + n] = torch.arange(n)
            segments[r, at : at + n] = index
            at += n
            starts.append(r * longest + at)
        if at < longest:  # the padded tail: a segment of its own, so the offsets cover it
            starts.append((r + 1) * longest)
    return Packed(source, positions, segments, torch.tensor(starts, dtype=torch.int32))


def _split(lengths: Sequence[int], width: int) -> Packed:
    """Every sequence end to end, cut into rows of :data:`CAPACITY` positions."""
    total = sum(lengths)
    rows = -(-total // CAPACITY)
    source = torch.full((rows * CAPACITY,), -1, dtype=torch.long)
    positions = torch.zeros(rows * CAPACITY, dtype=torch.long)
    segments = torch.full((rows * CAPACITY,), -1, dtype=torch.long)
    starts, at = [0], 0
    for index, n in enumerate(lengths):
        source[at : at + n] = index * width + torch.arange(n)
        positions[at : at + n] = torch.arange(n)
        segments[at : at + n] = index
        at += n
        starts.append(at)
    if at < rows * CAPACITY:  # the last row's padded tail
        starts.append(rows * CAPACITY)
    shape = (rows, CAPACITY)
    return Packed(
        source.view(shape),
        positions.view(shape),
        segments.view(shape),
        torch.tensor(starts, dtype=torch.int32),
    )
