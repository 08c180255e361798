"""torch's BatchNorm layers against what their documentation says, written out here: in
training each channel is normalised by its batch mean and biased variance over the batch and
every spatial position, then scaled by ``weight`` and shifted by ``bias`` (``affine``); the
running estimates move by ``momentum`` towards the batch mean and the *unbiased* variance
(with ``momentum=None``, a cumulative average: ``1 / num_batches_tracked``); in evaluation
the running estimates normalise, unless ``track_running_stats=False`` keeps none and the batch
normalises still. Gradients are autograd's through that formula, written with plain tensor
operations. Each class refuses the input shapes it does not document.

``SyncBatchNorm.convert_sync_batchnorm`` must hand every BatchNorm's settings, parameters,
buffers, ``requires_grad`` and training flag to the SyncBatchNorm that replaces it (a model
converted for data-parallel training that lost its running statistics evaluates wrong and
trains on). SyncBatchNorm normalises as BatchNorm where it does not synchronise (evaluation,
no process group) and refuses to train on CPU tensors under a process group.

A BatchNorm that normalises or tracks wrongly does so alike on every rank: no comparison of
ranks, and no DDP equivalence check, sees it."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

from ddp_verify.conformance import refusal_jobs

RTOL, ATOL = 1e-10, 1e-12
# BatchNorm's keyword-only bias (a weight without a bias) is newer than some torch the suite
# runs on: drawn where the installed torch has it.
HAS_BIAS = "bias" in inspect.signature(torch.nn.BatchNorm1d.__init__).parameters
# The classes and the input ranks each documents: (N, C) or (N, C, L); (N, C, H, W);
# (N, C, D, H, W); SyncBatchNorm any of them.
DOCUMENTED_RANKS = {
    "BatchNorm1d": (2, 3),
    "BatchNorm2d": (4,),
    "BatchNorm3d": (5,),
    "SyncBatchNorm": (2, 3, 4, 5),
}


@dataclasses.dataclass(frozen=True)
class Norm:
    """One BatchNorm layer, its documented settings, and the inputs it meets."""

    cls: str
    shape: tuple[int, ...]  # the input's: (N, C, *spatial)
    momentum: float | None
    eps: float
    affine: bool
    track_running_stats: bool
    steps: int  # training forwards before the evaluation one
    seed: int
    bias: bool = True  # with affine: False keeps the weight alone (keyword-only)

    def build(self) -> torch.nn.Module:
        layer = getattr(torch.nn, self.cls)(
            self.shape[1],
            eps=self.eps,
            momentum=self.momentum,
            affine=self.affine,
            track_running_stats=self.track_running_stats,
            dtype=torch.float64,
            **({"bias": self.bias} if HAS_BIAS else {}),
        )
        with torch.no_grad():  # away from the ones and zeros they start at
            if self.affine:
                layer.weight.copy_(self.tensor(self.shape[1], offset=1))
            if self.shifted:
                layer.bias.copy_(self.tensor(self.shape[1], offset=2))
        return layer

    @property
    def shifted(self) -> bool:
        return self.affine and self.bias

    def tensor(self, *shape: int, offset: int = 0) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 7 + offset)
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * 2 + 0.5

    def inputs(self, step: int) -> torch.Tensor:
        return self.tensor(*self.shape, offset=10 + step)


@st.composite
def norms(draw: st.DrawFn, classes: tuple[str, ...] = tuple(DOCUMENTED_RANKS)) -> Norm:
    cls = draw(st.sampled_from(classes))
    rank = draw(st.sampled_from(DOCUMENTED_RANKS[cls]))
    spatial = draw(st.lists(st.integers(1, 3), min_size=rank - 2, max_size=rank - 2))
    # Training needs more than one value per channel: two samples where there is nothing
    # spatial, else one sample may do.
    batch = draw(st.integers(2 if math.prod(spatial) == 1 else 1, 4))
    return Norm(
        cls=cls,
        shape=(batch, draw(st.integers(1, 3)), *spatial),
        momentum=draw(st.sampled_from([0.1, 0.5, 1.0, None])),
        eps=draw(st.sampled_from([1e-5, 0.25])),
        affine=draw(st.booleans()),
        track_running_stats=draw(st.booleans()),
        steps=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**16)),
        bias=not HAS_BIAS or draw(st.booleans()),
    )


def _normalised(
    x: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    norm: Norm,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The documented output: (x - mean) / sqrt(var + eps), then * weight + bias."""
    view = (1, -1) + (1,) * (x.dim() - 2)
    y = (x - mean.view(view)) / torch.sqrt(var.view(view) + norm.eps)
    if weight is not None:
        y = y * weight.view(view)
    if bias is not None:
        y = y + bias.view(view)
    return y


def _batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each channel's mean and biased variance over the batch and every spatial position,
    and how many values that is."""
    per_channel = x.transpose(0, 1).reshape(x.shape[1], -1)
    mean = per_channel.sum(1) / per_channel.shape[1]
    var = ((per_channel - mean[:, None]) ** 2).sum(1) / per_channel.shape[1]
    return mean, var, per_channel.shape[1]


def _documented(norm: Norm) -> dict[str, object]:
    """Outputs, gradients and running estimates after ``norm.steps`` training forwards (each
    followed by a backward of the output's weighted sum) and one evaluation forward."""
    c = norm.shape[1]
    weight = norm.tensor(c, offset=1).requires_grad_() if norm.affine else None
    bias = norm.tensor(c, offset=2).requires_grad_() if norm.shifted else None
    running_mean, running_var, tracked = torch.zeros(c, dtype=torch.float64), None, 0
    running_var = torch.ones(c, dtype=torch.float64)
    outputs, input_grads = [], []
    for step in range(norm.steps):
        x = norm.inputs(step).requires_grad_()
        mean, var, n = _batch_stats(x)
        y = _normalised(x, mean, var, norm, weight, bias)
        (y * _cotangent(norm, step)).sum().backward()
        outputs.append(y.detach())
        input_grads.append(x.grad)
        if norm.track_running_stats:
            tracked += 1
            m = 1.0 / tracked if norm.momentum is None else norm.momentum
            unbiased = var.detach() * n / (n - 1)
            running_mean = (1 - m) * running_mean + m * mean.detach()
            running_var = (1 - m) * running_var + m * unbiased
    x = norm.inputs(norm.steps)
    if norm.track_running_stats:
        evaluated = _normalised(x, running_mean, running_var, norm, weight, bias)
    else:  # nothing tracked: the batch normalises in evaluation too
        mean, var, _ = _batch_stats(x)
        evaluated = _normalised(x, mean, var, norm, weight, bias)
    return {
        "outputs": outputs,
        "input_grads": input_grads,
        "weight_grad": None if weight is None else weight.grad,
        "bias_grad": None if bias is None else bias.grad,
        "running_mean": running_mean if norm.track_running_stats else None,
        "running_var": running_var if norm.track_running_stats else None,
        "num_batches_tracked": tracked if norm.track_running_stats else None,
        "evaluated": evaluated.detach(),
    }


def _cotangent(norm: Norm, step: int) -> torch.Tensor:
    # A weighted sum, not a plain one: a normalised output's plain sum has no gradient.
    return norm.tensor(*norm.shape, offset=100 + step)


def _actual(norm: Norm) -> dict[str, object]:
    layer = norm.build()
    outputs, input_grads = [], []
    layer.train()
    for step in range(norm.steps):
        x = norm.inputs(step).requires_grad_()
        y = layer(x)
        (y * _cotangent(norm, step)).sum().backward()
        outputs.append(y.detach())
        input_grads.append(x.grad)
    layer.eval()
    with torch.no_grad():
        evaluated = layer(norm.inputs(norm.steps))
    tracked = layer.num_batches_tracked
    return {
        "outputs": outputs,
        "input_grads": input_grads,
        "weight_grad": None if layer.weight is None else layer.weight.grad,
        "bias_grad": None if layer.bias is None else layer.bias.grad,
        "running_mean": layer.running_mean,
        "running_var": layer.running_var,
        "num_batches_tracked": None if tracked is None else int(tracked),
        "evaluated": evaluated,
    }


def _assert_same(got: object, want: object, what: str, norm: Norm) -> None:
    if isinstance(want, list):
        assert isinstance(got, list)
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{what} at training step {step}", norm)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: {got!r} where the documented is a tensor"
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"{what} of {norm}: {m}")  # fmt: skip
    else:
        assert got == want, f"{what} of {norm}: {got!r}, documented {want!r}"


def test_batch_norm_normalises_and_tracks_as_documented(prove):
    # SyncBatchNorm normalises as BatchNorm without a process group (it trains on GPUs only
    # under one): under a launcher this process is a rank, so it is left out there.
    classes = tuple(c for c in DOCUMENTED_RANKS if c != "SyncBatchNorm" or not _grouped())

    def check(norm: Norm) -> None:
        got, want = _actual(norm), _documented(norm)
        for key, value in want.items():
            _assert_same(got[key], value, key.replace("_", " "), norm)

    prove(
        norms(classes),
        check,
        # momentum None (a cumulative average) over several steps, nothing spatial; and a
        # layer that tracks nothing, evaluated on its batch.
        examples=[
            Norm("BatchNorm1d", (3, 2), None, 1e-5, True, True, 3, 1),
            Norm("BatchNorm2d", (2, 2, 2, 3), 0.1, 1e-5, False, False, 2, 2),
            Norm("BatchNorm1d", (2, 3, 2), 0.5, 1e-5, True, True, 1, 3, bias=not HAS_BIAS),
            # SyncBatchNorm passes bias on to BatchNorm's constructor (without a group).
            *(
                [Norm("SyncBatchNorm", (2, 2, 3), 0.1, 1e-5, True, True, 1, 4, bias=not HAS_BIAS)]
                if "SyncBatchNorm" in classes
                else []
            ),
        ],
    )


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


UNDOCUMENTED_RANKS = [
    (cls, rank)
    for cls, ranks in DOCUMENTED_RANKS.items()
    for rank in range(1, 6)
    if rank not in ranks
]


@pytest.mark.parametrize(("cls", "rank"), UNDOCUMENTED_RANKS)
def test_batch_norm_refuses_the_input_ranks_it_does_not_document(cls, rank):
    layer = getattr(torch.nn, cls)(2)
    x = torch.ones((2,) * rank)
    with pytest.raises(ValueError, match=rf"expected .*\b(got {rank}D input|at least 2D)"):
        layer(x)


def test_sync_batch_norm_refuses_an_input_without_channels():
    layer = torch.nn.SyncBatchNorm(0)
    with pytest.raises(ValueError, match="number of input channels should be non-zero"):
        layer(torch.ones(2, 0, 3))


def test_reset_restores_the_documented_starting_state(prove):
    def check(norm: Norm) -> None:
        layer = norm.build()
        layer.train()
        layer(norm.inputs(0))
        layer.reset_parameters()
        if norm.affine:
            assert torch.equal(layer.weight, torch.ones_like(layer.weight)), layer.weight
        if norm.shifted:
            assert torch.equal(layer.bias, torch.zeros_like(layer.bias)), layer.bias
        else:
            assert layer.bias is None, f"{norm}: a bias {layer.bias} where none was asked for"
        if norm.track_running_stats:
            assert torch.equal(layer.running_mean, torch.zeros_like(layer.running_mean))
            assert torch.equal(layer.running_var, torch.ones_like(layer.running_var))
            assert int(layer.num_batches_tracked) == 0, layer.num_batches_tracked
        else:
            assert layer.running_mean is None and layer.running_var is None
            assert layer.num_batches_tracked is None

    prove(norms(("BatchNorm1d", "BatchNorm2d")), check)


class _Block(torch.nn.Module):
    """BatchNorms at several depths, one of them frozen and one in evaluation, among
    layers that are not BatchNorm."""

    def __init__(self, affine: bool, track: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 1, dtype=torch.float64)
        self.bn2d = torch.nn.BatchNorm2d(
            3, momentum=None, affine=affine, track_running_stats=track, dtype=torch.float64
        )
        self.inner = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(12, 4, dtype=torch.float64),
            torch.nn.BatchNorm1d(
                4,
                eps=0.25,
                momentum=0.3,
                dtype=torch.float64,
                **({"bias": False} if HAS_BIAS else {}),
            ),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.bn2d(self.conv(x)))


def test_convert_sync_batchnorm_carries_every_setting_parameter_and_buffer(prove):
    def check(case: tuple[bool, bool, int]) -> None:
        affine, track, seed = case
        torch.manual_seed(seed)
        model = _Block(affine, track)
        model.train()
        for step in range(2):  # running statistics away from their start
            model(torch.randn(4, 2, 2, 2, dtype=torch.float64) + step)
        frozen = model.inner[2]
        frozen.weight.requires_grad_(False)
        frozen.eval()
        # Quantization's configuration rides along on the module (convert carries it).
        model.bn2d.qconfig = qconfig = object()
        before = {name: t.clone() for name, t in model.state_dict().items()}
        norms_before = {n: m for n, m in model.named_modules()
                        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}  # fmt: skip
        group = dist.group.WORLD if _grouped() else None
        converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)

        after = dict(converted.named_modules())
        for name, original in norms_before.items():
            sync = after[name]
            assert type(sync) is torch.nn.SyncBatchNorm, f"{name} is {type(sync).__name__}"
            for setting in ("num_features", "eps", "momentum", "affine", "track_running_stats",
                            "training"):  # fmt: skip
                got, want = getattr(sync, setting), getattr(original, setting)
                assert got == want, f"{name}.{setting}: {got!r} after conversion, {want!r} before"
            assert sync.process_group is group, f"{name}'s process group: {sync.process_group}"
            assert (sync.bias is None) == (original.bias is None), f"{name}'s bias: {sync.bias}"
            for pname, p in original.named_parameters():
                q = getattr(sync, pname)
                assert isinstance(q, torch.nn.Parameter), f"{name}.{pname} is no parameter"
                assert q.requires_grad == p.requires_grad, (
                    f"{name}.{pname}.requires_grad: {q.requires_grad}, {p.requires_grad} before"
                )
        state = converted.state_dict()
        assert sorted(state) == sorted(before), (
            f"state dict keys changed by conversion: {sorted(set(state) ^ set(before))}"
        )
        for key, value in before.items():
            assert torch.equal(state[key], value), f"{key} changed by conversion"
        assert getattr(after["bn2d"], "qconfig", None) is qconfig, "the qconfig was dropped"
        # Not BatchNorm: left as it was.
        assert type(after["conv"]) is torch.nn.Conv2d and type(after["inner.1"]) is torch.nn.Linear

        # Evaluation does not synchronise: the converted model computes what the original did.
        model_eval = _Block(affine, track).double()
        model_eval.load_state_dict(before)
        converted.eval()
        model_eval.eval()
        x = torch.randn(3, 2, 2, 2, dtype=torch.float64)
        if track:  # else a batch-normalised evaluation would need more than one value
            torch.testing.assert_close(converted(x), model_eval(x), rtol=RTOL, atol=ATOL)

    prove(st.tuples(st.booleans(), st.booleans(), st.integers(0, 2**16)), check)


def test_convert_sync_batchnorm_of_a_batchnorm_itself_returns_its_replacement():
    layer = torch.nn.BatchNorm1d(3, affine=False, dtype=torch.float64)
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(layer)
    assert type(converted) is torch.nn.SyncBatchNorm and converted.num_features == 3
    linear = torch.nn.Linear(2, 2)
    assert torch.nn.SyncBatchNorm.convert_sync_batchnorm(linear) is linear


def test_sync_batch_norm_refuses_to_train_on_cpu_tensors_under_a_process_group(world):
    # torch documents SyncBatchNorm as GPU-only; on CPU tensors in a process group it must
    # refuse, not train each rank on its own statistics under a name that says synchronised.
    if world.device != "cpu":
        pytest.skip("the refusal is of CPU tensors: this world runs on " + world.device)
    for rank, said in enumerate(world.run(refusal_jobs.sync_batch_norm_on_cpu)):
        assert said is not None and re.search("expected input tensor to be on GPU", said), (
            f"rank {rank}: SyncBatchNorm trained on CPU tensors under a process group ({said!r})"
        )
