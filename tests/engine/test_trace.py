"""Traces travel home from the ranks packed flat; they must arrive exactly as they left."""

from __future__ import annotations

import pickle

import cloudpickle
import torch

from ddp_verify.engine.trace import (
    RankTrace,
    gradients,
    named_gradients,
    named_parameters,
    parameters,
)


def test_a_rank_trace_round_trips_exactly_with_dtypes_shapes_and_missing_gradients():
    trace = RankTrace(
        losses=[0.5, 0.25],
        grads=[
            {"w": torch.randn(2, 3, dtype=torch.float32), "b": None},
            {"w": torch.randn(2, 3, dtype=torch.float32), "b": torch.randn(1).double()},
        ],
        params=[
            {"w": torch.randn(2, 3), "scalar": torch.tensor(1.5, dtype=torch.float64)},
            {"w": torch.randn(2, 3), "scalar": torch.tensor(2.5, dtype=torch.float64)},
        ],
    )
    back = pickle.loads(cloudpickle.dumps(trace))
    assert back.losses == trace.losses
    assert back.grads[0]["b"] is None
    for sent, got in ((trace.grads, back.grads), (trace.params, back.params)):
        for step_sent, step_got in zip(sent, got, strict=True):
            assert list(step_sent) == list(step_got)
            for name, tensor in step_sent.items():
                if tensor is None:
                    continue
                assert step_got[name].dtype == tensor.dtype
                assert step_got[name].shape == tensor.shape
                assert torch.equal(step_got[name], tensor)


def test_a_trace_without_gradients_stays_without():
    back = pickle.loads(pickle.dumps(RankTrace([1.0], None, [{"w": torch.ones(2)}])))
    assert back.grads is None and torch.equal(back.params[0]["w"], torch.ones(2))


def _sample_trace() -> RankTrace:
    return RankTrace(
        losses=[0.5],
        grads=[{"w": torch.randn(2, 3), "b": torch.randn(3)}],
        params=[{"w": torch.randn(2, 3), "b": torch.randn(3)}],
    )


def test_a_received_trace_is_compared_in_the_flat_form_it_arrived_in_without_unpacking():
    trace = _sample_trace()
    back = pickle.loads(pickle.dumps(trace))
    assert "params" not in back.__dict__ and back.recorded("params") == 1
    layout, flat = back.packed("params")
    assert "params" not in back.__dict__  # the flat form served the comparison
    assert torch.equal(flat, trace.packed("params")[1])
    assert [name for name, _, _ in layout[0]] == ["w", "b"]
    assert torch.equal(back.params[0]["w"], trace.params[0]["w"])  # unpacked on first use
    assert torch.equal(back.packed("params")[1], flat)


def test_a_received_field_that_is_replaced_is_packed_afresh():
    back = pickle.loads(pickle.dumps(_sample_trace()))
    back.params = [{"w": torch.zeros(2, 3), "b": torch.zeros(3)}]
    assert torch.equal(back.packed("params")[1], torch.zeros(9, dtype=torch.float64))
    assert back.recorded("grads") == 1 and "grads" not in back.__dict__  # the other field


def test_a_received_tensor_replaced_in_place_of_its_step_is_seen_by_packed():
    back = pickle.loads(pickle.dumps(_sample_trace()))
    back.grads[0]["w"] = back.grads[0]["w"] * 0
    assert torch.equal(back.packed("grads")[1][:6], torch.zeros(6, dtype=torch.float64))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
    model[2].bias.requires_grad_(False)  # a parameter that takes no gradient
    return model


def _one_step(model: torch.nn.Module) -> None:
    model.zero_grad(set_to_none=True)
    model(torch.randn(4, 3)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad


def test_steps_recorded_flat_hold_what_copies_per_tensor_hold_here_and_after_the_trip():
    model, flat, copied = _model(), RankTrace(), RankTrace()
    for step in range(3):
        _one_step(model)
        flat.record("grads", named_gradients(model))
        copied.grads.append(gradients(model))
        flat.record("params", named_parameters(model))
        copied.params.append(parameters(model))
        flat.losses.append(float(step))
        copied.losses.append(float(step))
    assert flat.recorded("params") == flat.recorded("grads") == 3
    assert "params" not in flat.__dict__  # kept flat until read
    for field in ("grads", "params"):
        assert flat.packed(field)[0] == copied.packed(field)[0]
        assert torch.equal(flat.packed(field)[1], copied.packed(field)[1])
    back = pickle.loads(cloudpickle.dumps(flat))
    for got in (back, flat):  # received, and read back here
        assert got.losses == copied.losses
        for field in ("grads", "params"):
            for step_got, step_copied in zip(
                getattr(got, field), getattr(copied, field), strict=True
            ):
                assert list(step_got) == list(step_copied)
                for name, tensor in step_copied.items():
                    assert step_got[name].dtype == tensor.dtype
                    assert torch.equal(step_got[name], tensor)
    assert sorted(copied.grads[0]) == ["0.bias", "0.weight", "2.weight"]


def test_a_recorded_step_is_a_copy_of_the_model_not_a_view_of_it():
    model, trace = _model(), RankTrace()
    _one_step(model)
    trace.record("params", named_parameters(model))
    trace.record("grads", named_gradients(model))
    before = parameters(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
            if p.grad is not None:
                p.grad.add_(1.0)
    assert all(torch.equal(trace.params[0][n], before[n]) for n in before)
    assert not torch.equal(trace.grads[0]["0.weight"], model[0].weight.grad)
    alone, one = RankTrace(), torch.zeros(3)
    alone.record("params", [("only", one)])  # a step of one tensor is copied too
    one.add_(1.0)
    assert torch.equal(alone.params[0]["only"], torch.zeros(3))


def test_mixed_dtypes_and_missing_gradients_are_recorded_exactly():
    trace = RankTrace()
    half = torch.randn(2, 2).to(torch.bfloat16)
    wide = torch.randn(3, dtype=torch.float64)
    trace.record("grads", [("h", half), ("none", None), ("w", wide)])
    got = pickle.loads(pickle.dumps(trace)).grads[0]
    assert got["none"] is None
    assert got["h"].dtype == torch.bfloat16 and torch.equal(got["h"], half)
    assert got["w"].dtype == torch.float64 and torch.equal(got["w"], wide)


def test_steps_read_before_more_are_recorded_stay_in_order():
    trace = RankTrace()
    trace.record("params", [("w", torch.zeros(2))])
    assert torch.equal(trace.params[0]["w"], torch.zeros(2))  # read: unpacked here
    trace.record("params", [("w", torch.ones(2))])
    received = pickle.loads(pickle.dumps(trace))
    received.record("params", [("w", torch.full((2,), 2.0))])
    assert [float(s["w"][0]) for s in received.params] == [0.0, 1.0, 2.0]


def test_a_field_set_anew_replaces_the_steps_recorded_flat():
    trace = RankTrace()
    trace.record("grads", [("w", torch.ones(2))])
    trace.grads = None
    assert trace.grads is None and trace.recorded("grads") is None
    assert pickle.loads(pickle.dumps(trace)).grads is None
    try:
        trace.record("grads", [("w", torch.ones(2))])
    except ValueError as exc:
        assert "no gradients" in str(exc)
    else:
        raise AssertionError("a trace without gradients recorded one")
