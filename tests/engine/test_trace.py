"""Traces travel home from the ranks packed flat; they must arrive exactly as they left."""

from __future__ import annotations

import pickle

import cloudpickle
import torch

from ddp_verify.engine.trace import RankTrace


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
