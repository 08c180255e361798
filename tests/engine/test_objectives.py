"""Declared objectives (ddp_verify/engine/objectives.py): each one's value is the formula the
issue and verl's loss_agg_mode state, computed here by plain Python loops that share no code
with it; the whole batch's objective is its pieces' share-weighted objectives whatever their
padded widths; the gradient each token gets is the formula's weight."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ddp_verify.engine.objectives import (
    OBJECTIVES,
    SCOPES,
    Objective,
    combined,
    objective,
    window_factor,
)

DECLARED = [
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm:7",
    "sum",
]


def _oracle(name: str, sequences: list[list[tuple[float, bool]]]) -> float:
    """The formula, by loops: each sequence a list of (loss, counts)."""
    counted = [[loss for loss, counts in row if counts] for row in sequences]
    present = [row for row in counted if row]
    tokens = sum(len(row) for row in counted)
    if name == "sum":
        return sum(sum(row) for row in counted)
    if name == "token-mean":
        return sum(sum(row) for row in counted) / tokens if tokens else 0.0
    if not present:
        return 0.0
    if name == "seq-mean-token-mean":
        return sum(sum(row) / len(row) for row in present) / len(present)
    if name == "seq-mean-token-sum":
        return sum(sum(row) for row in present) / len(present)
    assert name == "seq-mean-token-sum-norm:7"
    return sum(sum(row) for row in present) / (len(present) * 7)


@st.composite
def batches(draw):
    """Sequences of 0 to 5 positions, each counted or not (prompts, padding): some with no
    counted token on purpose; and a cut of them into consecutive pieces."""
    n = draw(st.integers(1, 6))
    rows = [
        draw(
            st.lists(
                st.tuples(st.floats(-4, 4, allow_nan=False), st.booleans()),
                min_size=0,
                max_size=5,
            )
        )
        for _ in range(n)
    ]
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1)) if n > 1 else set())
    return rows, [0, *cuts, n]


def _padded(rows, mask_dtype=torch.int64):
    """The rows at their own longest width (at least 1), padding not counted."""
    width = max([len(r) for r in rows] + [1])
    losses = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, row in enumerate(rows):
        for j, (loss, counts) in enumerate(row):
            losses[i, j], mask[i, j] = loss, int(counts)
    return losses, mask.to(mask_dtype)


@pytest.mark.parametrize("declared", DECLARED)
@given(batch=batches())
def test_each_objective_is_its_formula(declared, batch):
    rows, _ = batch
    losses, mask = _padded(rows)
    got = float(objective(declared).value(losses, mask))
    assert math.isclose(got, _oracle(declared, rows), rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("declared", DECLARED)
@given(batch=batches())
def test_the_whole_is_its_pieces_share_weighted_at_their_own_widths(declared, batch):
    rows, cuts = batch
    whole = objective(declared)
    pieces = [_padded(rows[a:b]) for a, b in itertools.pairwise(cuts)]
    expected = _oracle(declared, rows)
    assert math.isclose(float(combined(whole, pieces)), expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("declared", DECLARED)
@given(batch=batches())
def test_each_counted_token_gets_the_formulas_weight(declared, batch):
    rows, _ = batch
    losses, mask = _padded(rows)
    losses.requires_grad_(True)
    objective(declared).value(losses, mask).backward()
    present = [sum(c for _, c in row) for row in rows]
    sequences, tokens = sum(1 for k in present if k), sum(present)
    for i, row in enumerate(rows):
        for j, (_, counts) in enumerate(row):
            weight = {
                "sum": 1.0,
                "token-mean": 1 / tokens if tokens else 0.0,
                "seq-mean-token-mean": 1 / (sequences * present[i]) if present[i] else 0.0,
                "seq-mean-token-sum": 1 / sequences if sequences else 0.0,
                "seq-mean-token-sum-norm:7": 1 / (sequences * 7) if sequences else 0.0,
            }[declared]
            assert math.isclose(float(losses.grad[i, j]), weight if counts else 0.0, abs_tol=1e-15)


def test_a_denominator_per_piece_is_not_the_whole_ones():
    # What the mechanism exists to catch: each micro-batch's own token mean, averaged.
    rows = [[(1.0, True)], [(3.0, True), (5.0, True), (7.0, True)]]
    pieces = [_padded(rows[:1]), _padded(rows[1:])]
    token_mean = objective("token-mean")
    per_piece = sum(float(token_mean.value(*p)) for p in pieces) / len(pieces)
    assert float(combined(token_mean, pieces)) == 4.0 != per_piece == 3.0


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float32])
def test_a_mask_is_bool_int_or_float_alike(dtype):
    rows = [[(2.0, True), (9.0, False)], [(4.0, True)]]
    losses, mask = _padded(rows)
    assert float(objective("seq-mean-token-mean").value(losses, mask.to(dtype))) == 3.0


def test_every_objective_reads_back_as_declared():
    for declared in DECLARED:
        assert str(objective(declared)) == declared
    assert set(OBJECTIVES) == {d.partition(":")[0] for d in DECLARED}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mean", "is none of token-mean"),
        ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm:C with C > 0"),
        ("seq-mean-token-sum-norm:0", "C > 0"),
        ("seq-mean-token-sum-norm:wide", "must be a number"),
        ("token-mean:4", "takes no constant"),
        ("token-mean@generation", "one of step, window, window-total"),
        ("sum@window", "sum divides by nothing"),
    ],
)
def test_a_bad_declaration_says_what_to_declare(text, says):
    with pytest.raises(InvalidArgument, match=says):
        objective(text)


def test_a_loss_matrix_and_a_mask_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match=r"must have one shape, \[batch, seq\]"):
        Objective("sum").value(torch.zeros(2, 3), torch.ones(2, 4))


@pytest.mark.parametrize("name", [d for d in DECLARED if d != "sum"])
def test_every_scope_reads_back_as_declared(name):
    for scope in SCOPES:
        declared = objective(f"{name}@{scope}")
        assert declared.scope == scope and declared.scoped("step") == objective(name)
        assert objective(str(declared)) == declared
    assert str(objective(f"{name}@step")) == name  # the default, said by leaving it out


@given(units=st.lists(st.integers(0, 50), min_size=1, max_size=5).filter(any))
def test_a_windows_steps_weigh_as_its_scope_says(units):
    # Against the per-step objective, by plain arithmetic: @window divides each step's sum by
    # the window's units per step, @window-total by the window's units.
    total, k = sum(units), len(units)
    for step, mine in enumerate(units):
        per_step = window_factor(objective("token-mean@window"), units, step)
        whole = window_factor(objective("seq-mean-token-mean@window-total"), units, step)
        assert math.isclose(per_step, mine / (total / k), rel_tol=1e-12)
        assert math.isclose(whole, mine / total, rel_tol=1e-12)
        assert window_factor(objective("token-mean"), units, step) == 1.0
    # A whole window's steps add up to its objective once (@window-total), or k times.
    shares = [window_factor(objective("token-mean@window-total"), units, s) for s in range(k)]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-12)
