"""Packed batches (ddp_verify/engine/packing.py): every position of every sequence lands in
exactly one place, in order; the boundaries handed to code (position ids, segment ids,
cu_seq_lens) agree with each other and with the layout, checked here by plain loops; a token
mean is the same packed or not, and a sequence mean is one over segments, not rows."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ddp_verify.engine.objectives import objective
from ddp_verify.engine.packing import CAPACITY, pack

lengths_lists = st.lists(st.integers(1, CAPACITY), min_size=1, max_size=6)


@pytest.mark.parametrize("packing", ["flat", "rows", "split"])
@given(lengths=lengths_lists)
def test_every_position_lands_once_in_order_with_its_boundaries(packing, lengths):
    width = CAPACITY
    packed = pack(lengths, packing, width=width)
    source = packed.source.tolist()
    flat = [i for row in source for i in row if i >= 0]
    expected = [s * width + p for s, n in enumerate(lengths) for p in range(n)]
    # Every position once; a row's sequences in the order they came.
    assert sorted(flat) == expected
    for row, positions, segments in zip(
        source, packed.position_ids.tolist(), packed.segment_ids.tolist(), strict=True
    ):
        for index, position, segment in zip(row, positions, segments, strict=True):
            if index < 0:
                assert segment == -1 and position == 0
            else:
                assert (segment, position) == divmod(index, width)
        used = sum(1 for i in row if i >= 0)
        assert all(i >= 0 for i in row[:used]) and all(i < 0 for i in row[used:])
    if packing == "flat":
        assert packed.rows == 1 and min(packed.source.tolist()[0]) >= 0
    else:
        assert all(sum(1 for i in row if i >= 0) <= CAPACITY for row in source)
    # cu_seq_lens: the offsets of the rows read end to end, each segment whole between two,
    # a padded tail its own.
    ends = packed.cu_seq_lens.tolist()
    assert ends[0] == 0 and ends[-1] == packed.source.numel()
    read = packed.segment_ids.reshape(-1).tolist()
    for start, end in itertools.pairwise(ends):
        assert end > start and len(set(read[start:end])) == 1


@given(lengths=lengths_lists, seed=st.integers(0, 2**16))
def test_a_token_mean_is_the_same_packed_and_a_sequence_mean_is_over_segments(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    width = CAPACITY
    losses = torch.rand(len(lengths), width, generator=generator, dtype=torch.float64)
    positions = torch.arange(width).expand(len(lengths), width)
    mask = (positions < torch.tensor(lengths).unsqueeze(1)) & (
        torch.rand(len(lengths), width, generator=generator) < 0.7
    )
    token_mean = objective("token-mean")
    for packing in ("flat", "rows", "split"):
        packed = pack(lengths, packing, width=width)
        rows, counted = packed.of(losses, 0.0), packed.of(mask, False)
        unpacked = float(token_mean.value(losses, mask))
        assert math.isclose(float(token_mean.value(rows, counted)), unpacked, abs_tol=1e-12)
        # By segments, by loops: each sequence's counted losses wherever its tokens went.
        ids = packed.segment_ids.reshape(-1).tolist()
        per_segment: dict[int, list[float]] = {}
        for i, value, keep in zip(ids, rows.reshape(-1).tolist(), counted.reshape(-1).tolist(),
                                  strict=True):  # fmt: skip
            if i >= 0 and keep:
                per_segment.setdefault(i, []).append(value)
        means = [sum(v) / len(v) for v in per_segment.values()]
        expected = sum(means) / len(means) if means else 0.0
        got = float(objective("seq-mean-token-mean").value(losses, mask))
        assert math.isclose(got, expected, abs_tol=1e-12)


def test_a_bad_layout_is_refused_with_what_fits():
    with pytest.raises(ValueError, match="packing must be one of"):
        pack([1, 2], "greedy")
    with pytest.raises(ValueError, match="each sequence holds 1 to 4 positions"):
        pack([5], "rows", width=4)
