"""torch's SGD, Adam and AdamW in every setting their documentation gives, against update
rules written out here from that documentation (nothing of ``torch.optim`` is imported to
compute them): SGD's momentum, dampening, Nesterov momentum and ``maximize``; Adam's and
AdamW's betas, eps, AMSGrad and ``maximize``; weight decay in both, and Adam's decoupled
from the gradient (``decoupled_weight_decay``, AdamW's rule); the learning rate (and
the betas) given as one-element tensors, as the documentation allows. Each implementation
torch has (the for-loop, foreach and, where it exists, fused paths), chosen as users choose
it (the other switch left out or given as False), must follow them. And
every refusal the documentation and the constructors give for an impossible setting must
still be made: a regression that stops refusing lets a wrong run start.

The common settings (momentum, weight decay, schedules, groups) are held to the reference in
``test_optimizers``; these are the rest of the surface, which no training in the suite uses
otherwise."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance.implementations import IMPLEMENTATIONS
from ddp_verify.conformance.known import known_torch_issue

# Parameter shapes: a matrix, a vector, a scalar-like one, as a model's layers give them.
SHAPES = ((3, 4), (4,), (1,))
STEPS = 4
RTOL, ATOL = 1e-10, 1e-13


@dataclasses.dataclass(frozen=True)
class Setting:
    """One optimizer and the documented options it is built with."""

    name: str  # "sgd", "adam", "adamw"
    lr: float = 0.05
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    maximize: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    amsgrad: bool = False
    decoupled: bool = False  # Adam's decoupled_weight_decay: AdamW's rule
    tensor_lr: bool = False
    tensor_betas: bool = False
    # The shape of a hyperparameter given as a tensor: () a scalar, (1,) one element (both
    # documented: "Tensor lr must be 1-element").
    tensor_shape: tuple[int, ...] = ()
    # The implementation switch not chosen given as False rather than left at its default None
    # (``fused=False`` beside ``foreach``): documented the same, a form users write.
    outright: bool = False

    def implementation(self, name: str) -> dict[str, Any]:
        """The keyword arguments that choose implementation ``name``."""
        chosen = dict(IMPLEMENTATIONS[name])
        if self.outright:
            chosen.setdefault("foreach" if "fused" in chosen else "fused", False)
        return chosen

    def _tensor(self, value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float64).reshape(self.tensor_shape)

    def kwargs(self) -> dict[str, Any]:
        lr: Any = self._tensor(self.lr) if self.tensor_lr else self.lr
        common = {"lr": lr, "weight_decay": self.weight_decay, "maximize": self.maximize}
        if self.name == "sgd":
            return {**common, "momentum": self.momentum, "dampening": self.dampening,
                    "nesterov": self.nesterov}  # fmt: skip
        betas: Any = self.betas
        if self.tensor_betas:
            betas = tuple(self._tensor(b) for b in self.betas)
        adam = {"decoupled_weight_decay": True} if self.decoupled else {}
        return {**common, "betas": betas, "eps": self.eps, "amsgrad": self.amsgrad, **adam}


def sgd_rule(setting: Setting, params: list[torch.Tensor], grads: list[list[Any]]) -> None:
    """SGD as torch documents it, in place, over every step's gradients (a parameter with no
    gradient at a step is left as it is, its momentum too)."""
    lr = setting.lr
    buffers: dict[int, torch.Tensor] = {}
    for step_grads in grads:
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            if g is None:
                continue
            g = -g if setting.maximize else g.clone()
            if setting.weight_decay:
                g = g + setting.weight_decay * p
            if setting.momentum:
                if i in buffers:
                    buffers[i] = setting.momentum * buffers[i] + (1 - setting.dampening) * g
                else:
                    buffers[i] = g.clone()
                g = g + setting.momentum * buffers[i] if setting.nesterov else buffers[i]
            p -= lr * g


def adam_rule(setting: Setting, params: list[torch.Tensor], grads: list[list[Any]]) -> None:
    """Adam (and AdamW, whose weight decay is decoupled) as torch documents them, in place; a
    parameter's step count moves only at the steps that give it a gradient."""
    lr = setting.lr
    beta1, beta2 = setting.betas
    state: dict[int, dict[str, Any]] = {}
    for step_grads in grads:
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            if g is None:
                continue
            s = state.setdefault(i, {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p),
                                     "v_max": torch.zeros_like(p)})  # fmt: skip
            s["t"] += 1
            t = s["t"]
            g = -g if setting.maximize else g.clone()
            if setting.name == "adamw" or setting.decoupled:
                p *= 1 - lr * setting.weight_decay
            elif setting.weight_decay:
                g = g + setting.weight_decay * p
            s["m"] = beta1 * s["m"] + (1 - beta1) * g
            s["v"] = beta2 * s["v"] + (1 - beta2) * g * g
            m_hat = s["m"] / (1 - beta1**t)
            if setting.amsgrad:
                s["v_max"] = torch.maximum(s["v_max"], s["v"])
                v_hat = s["v_max"] / (1 - beta2**t)
            else:
                v_hat = s["v"] / (1 - beta2**t)
            p -= lr * m_hat / (v_hat.sqrt() + setting.eps)


def _data(seed: int) -> tuple[list[torch.Tensor], list[list[Any]]]:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=generator, dtype=torch.float64) for s in SHAPES]
    grads = [
        [None if i == len(SHAPES) - 1 and step % 2 else
         torch.randn(s, generator=generator, dtype=torch.float64) for i, s in enumerate(SHAPES)]
        for step in range(STEPS)
    ]  # fmt: skip
    return params, grads


@st.composite
def settings(draw: st.DrawFn) -> Setting:
    name = draw(st.sampled_from(["sgd", "adam", "adamw"]))
    maximize = draw(st.booleans())
    lr = draw(st.sampled_from([0.01, 0.05, 0.3]))
    weight_decay = draw(st.sampled_from([0.0, 0.01, 0.1]))
    tensor_lr = draw(st.booleans())
    tensor_shape = draw(st.sampled_from([(), (1,)]))
    outright = draw(st.booleans())
    if name == "sgd":
        momentum = draw(st.sampled_from([0.0, 0.5, 0.9]))
        nesterov = momentum > 0 and draw(st.booleans())
        dampening = 0.0 if nesterov else draw(st.sampled_from([0.0, 0.3]))
        return Setting(
            name,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=weight_decay,
            maximize=maximize,
            tensor_lr=tensor_lr,
            tensor_shape=tensor_shape,
            outright=outright,
        )
    return Setting(
        name,
        betas=(draw(st.sampled_from([0.0, 0.5, 0.9])), draw(st.sampled_from([0.5, 0.99]))),
        eps=draw(st.sampled_from([1e-8, 1e-3])),
        amsgrad=draw(st.booleans()),
        decoupled=name == "adam" and draw(st.booleans()),
        tensor_betas=draw(st.booleans()),
        lr=lr,
        weight_decay=weight_decay,
        maximize=maximize,
        tensor_lr=tensor_lr,
        tensor_shape=tensor_shape,
        outright=outright,
    )


# Every option at least once, never left to the draw.
EVERY_OPTION = [
    (Setting("sgd", momentum=0.9, nesterov=True, weight_decay=0.01), 0),
    (Setting("sgd", momentum=0.9, dampening=0.3, weight_decay=0.01), 1),
    (Setting("sgd", momentum=0.5, maximize=True, tensor_lr=True), 2),
    (Setting("adam", betas=(0.5, 0.9), eps=1e-3, amsgrad=True, weight_decay=0.1), 3),
    (Setting("adam", maximize=True, tensor_lr=True, tensor_betas=True), 4),
    (Setting("adam", weight_decay=0.1, decoupled=True, amsgrad=True), 7),
    (Setting("adamw", betas=(0.0, 0.5), amsgrad=True, weight_decay=0.1, maximize=True), 5),
    (Setting("adamw", weight_decay=0.1, tensor_lr=True), 6),
    (Setting("sgd", momentum=0.9, weight_decay=0.01, tensor_lr=True, tensor_shape=(1,)), 8),
    (Setting("adam", amsgrad=True, tensor_lr=True, tensor_betas=True, tensor_shape=(1,)), 9),
    (Setting("adamw", weight_decay=0.1, tensor_lr=True, tensor_shape=(1,)), 10),
    (Setting("sgd", momentum=0.9, dampening=0.3, outright=True), 11),
    (Setting("adam", amsgrad=True, weight_decay=0.1, outright=True), 12),
]
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_every_documented_option_follows_its_published_rule(prove, implementation):
    def check(case: tuple[Setting, int]) -> None:
        setting, seed = case
        params, grads = _data(seed)
        expected = [p.clone() for p in params]
        (sgd_rule if setting.name == "sgd" else adam_rule)(setting, expected, grads)
        theirs = [torch.nn.Parameter(p.clone()) for p in params]
        cls = getattr(torch.optim, OPTIMIZERS[setting.name])
        try:
            optimizer = cls(theirs, **setting.kwargs(), **setting.implementation(implementation))
        except (RuntimeError, ValueError) as exc:
            # A combination this implementation documents it refuses (a tensor lr on the
            # foreach path without capturable; no fused path here): its refusal is checked
            # below, the others of the draw here.
            if _refused(setting, implementation):
                return
            raise AssertionError(f"{cls.__name__}({setting}) ({implementation}): {exc}") from exc
        for step_grads in grads:
            for p, g in zip(theirs, step_grads, strict=True):
                p.grad = None if g is None else g.clone()
            optimizer.step()
        for i, (got, want) in enumerate(zip(theirs, expected, strict=True)):
            torch.testing.assert_close(
                got.detach(),
                want,
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, i=i: (
                    f"{cls.__name__} ({implementation}) {setting}: parameter {i} (shape "
                    f"{SHAPES[i]}) after {STEPS} steps is not what its documented rule gives."
                    f"\n{m}"
                ),
            )

    prove(st.tuples(settings(), st.integers(0, 2**16)), check, examples=EVERY_OPTION)


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_sparse_gradients_follow_sgds_rule_or_are_refused(prove, implementation):
    # nn.Embedding(sparse=True) gives sparse gradients, and SGD is documented among the
    # optimizers that take them: the update is the rule's on the dense gradient. The fused
    # path refuses them, as it says. Weight decay is left out: it adds the dense parameter to
    # the sparse gradient, which torch refuses (add(sparse, dense)).
    rows, width = 6, 3

    def sparse(generator: torch.Generator) -> torch.Tensor:
        index = torch.randint(0, rows, (4,), generator=generator)  # repeats add up
        values = torch.randn(4, width, generator=generator, dtype=torch.float64)
        return torch.sparse_coo_tensor(index[None], values, (rows, width))

    def check(case: tuple[Setting, int]) -> None:
        setting, seed = dataclasses.replace(case[0], weight_decay=0.0), case[1]
        generator = torch.Generator().manual_seed(seed)
        start = torch.randn(rows, width, generator=generator, dtype=torch.float64)
        grads = [sparse(generator) for _ in range(STEPS)]
        expected = [start.clone()]
        sgd_rule(setting, expected, [[g.to_dense()] for g in grads])
        theirs = torch.nn.Parameter(start.clone())
        optimizer = torch.optim.SGD([theirs], **setting.kwargs(),
                                    **setting.implementation(implementation))  # fmt: skip
        for g in grads:
            theirs.grad = g.clone()
            if implementation == "fused":
                with pytest.raises(RuntimeError, match="sparse"):
                    optimizer.step()
                return
            optimizer.step()
        torch.testing.assert_close(
            theirs.detach(), expected[0], rtol=RTOL, atol=ATOL,
            msg=lambda m: f"SGD ({implementation}) {setting}, sparse gradients:\n{m}",
        )  # fmt: skip

    prove(
        st.tuples(settings().filter(lambda s: s.name == "sgd"), st.integers(0, 2**16)),
        check,
        examples=[(Setting("sgd", momentum=0.9, nesterov=True, outright=True), 0),
                  (Setting("sgd", momentum=0.5, dampening=0.3, maximize=True), 1)],
    )  # fmt: skip


def test_a_differentiable_optimizer_gives_the_derivative_by_its_learning_rate(prove):
    # differentiable=True keeps the step in autograd's graph (learned optimizers,
    # meta-learning): the final parameters' derivative by a learning rate that requires grad
    # must be the documented rule's, taken by autograd through the rule's plain operations.
    # By the learning rate alone: the gradients are given, so the first momentum buffer (a
    # detached copy of the first gradient in torch) carries no derivative by it either way.
    def check(case: tuple[Setting, int]) -> None:
        setting, seed = case
        params, grads = _data(seed)
        weights = [torch.linspace(-1, 1, p.numel(), dtype=torch.float64).view(p.shape)
                   for p in params]  # fmt: skip

        def derivative(step: Any) -> torch.Tensor:
            lr = torch.tensor(setting.lr, dtype=torch.float64, requires_grad=True)
            final = step(dataclasses.replace(setting, tensor_lr=False), lr)
            total = sum((f * w).sum() for f, w in zip(final, weights, strict=True))
            (got,) = torch.autograd.grad(total, lr)
            return got

        def by_rule(plain: Setting, lr: torch.Tensor) -> list[torch.Tensor]:
            moved = [p.clone() for p in params]
            rule = sgd_rule if plain.name == "sgd" else adam_rule
            rule(dataclasses.replace(plain, lr=lr), moved, grads)
            return moved

        def by_torch(plain: Setting, lr: torch.Tensor) -> list[torch.Tensor]:
            theirs = [p.clone() for p in params]
            cls = getattr(torch.optim, OPTIMIZERS[plain.name])
            optimizer = cls(theirs, **{**plain.kwargs(), "lr": lr}, differentiable=True,
                            foreach=False)  # fmt: skip
            for step_grads in grads:
                for p, g in zip(theirs, step_grads, strict=True):
                    p.grad = None if g is None else g.clone()
                optimizer.step()
            return theirs

        want, got = derivative(by_rule), derivative(by_torch)
        # Adam's differentiable path takes its bias corrections from the step count as a
        # tensor, which torch keeps in float32 (_get_scalar_dtype): about 1e-7 of each, some
        # 1e-6 of each parameter's derivative after 4 steps. The weighted sum of those
        # derivatives can cancel to far less than its terms, so the bound is on the terms:
        # 1e-5 of the sum of their sizes, each |weight * d(final)/d(lr)| (forward-mode, by the
        # rule). A derivative that loses a term is off by far more (the decay's, the moments').
        with torch.autograd.forward_ad.dual_level():
            one = torch.tensor(1.0, dtype=torch.float64)
            dual = torch.autograd.forward_ad.make_dual(one * setting.lr, one)
            final = by_rule(dataclasses.replace(setting, tensor_lr=False), dual)
            sizes = sum(
                (w * torch.autograd.forward_ad.unpack_dual(f).tangent).abs().sum()
                for f, w in zip(final, weights, strict=True)
            )
        torch.testing.assert_close(
            got, want, rtol=0, atol=1e-5 * float(sizes) + 1e-12,
            msg=lambda m: f"{OPTIMIZERS[setting.name]}({setting}, differentiable=True): the "
            f"derivative by the learning rate after {STEPS} steps is not the rule's.\n{m}",
        )  # fmt: skip

    prove(
        st.tuples(
            settings().filter(_differentiable_case),
            st.integers(0, 2**16),
        ),
        check,
        examples=[
            (s, seed)
            for s, seed in EVERY_OPTION
            if not s.tensor_betas and not _known_differentiable(s)
        ],
    )


def _differentiable_case(setting: Setting) -> bool:
    return not setting.tensor_betas and not _known_differentiable(setting)


def _known_differentiable(setting: Setting) -> bool:
    """The settings the two known issues below meet: SGD's momentum, and AMSGrad with Adam's
    weight decay in the gradient (the second moments then depend on the learning rate)."""
    if setting.name == "sgd":
        return bool(setting.momentum)
    return setting.amsgrad and setting.name == "adam" and bool(setting.weight_decay)


@known_torch_issue(
    "SGD(differentiable=True, momentum>0) with a learning rate that requires grad: backward "
    "fails after a second step, the momentum buffer addcmul_ saved for the learning rate's "
    "derivative being updated in place by the next step's mul_ ('modified by an inplace "
    "operation'); its first buffer is also a detached copy of the first gradient",
    raises=RuntimeError,
    match=r"modified by an inplace operation",
    repro="findings/differentiable_sgd_momentum_inplace.py",
)
def test_a_differentiable_sgd_with_momentum_gives_the_derivative_by_its_learning_rate():
    got, want = _derivatives_by_the_learning_rate(Setting("sgd", momentum=0.5), seed=2)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def _derivatives_by_the_learning_rate(setting: Setting, seed: int) -> tuple[Any, Any]:
    """torch's differentiable optimizer's derivative of the final parameters' sum by the
    learning rate, and the rule's."""
    params, grads = _data(seed)
    lr = torch.tensor(setting.lr, dtype=torch.float64, requires_grad=True)
    theirs = [p.clone() for p in params]
    cls = getattr(torch.optim, OPTIMIZERS[setting.name])
    optimizer = cls(theirs, **{**setting.kwargs(), "lr": lr}, differentiable=True, foreach=False)
    for step_grads in grads:
        for p, g in zip(theirs, step_grads, strict=True):
            p.grad = None if g is None else g.clone()
        optimizer.step()
    (got,) = torch.autograd.grad(sum(t.sum() for t in theirs), lr)
    moved = [p.clone() for p in params]
    rule = sgd_rule if setting.name == "sgd" else adam_rule
    rule(dataclasses.replace(setting, lr=lr), moved, grads)
    (want,) = torch.autograd.grad(sum(t.sum() for t in moved), lr)
    return got, want


@known_torch_issue(
    "Adam(differentiable=True, amsgrad=True): once the second moments depend on what is "
    "differentiated (here through weight_decay; in meta-learning through every gradient), "
    "backward fails: the running maximum is updated in place with copy_ after "
    "torch.maximum saved it ('one of the variables needed for gradient computation has "
    "been modified by an inplace operation')",
    raises=RuntimeError,
    match=r"modified by an inplace operation",
    repro="findings/differentiable_adam_amsgrad_inplace.py",
)
def test_a_differentiable_adam_with_amsgrad_gives_the_derivative_by_its_learning_rate():
    setting = Setting("adam", betas=(0.5, 0.9), eps=1e-3, amsgrad=True, weight_decay=0.1)
    got, want = _derivatives_by_the_learning_rate(setting, seed=3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)


def _refused(setting: Setting, implementation: str) -> bool:
    """Whether torch documents refusing ``setting`` on ``implementation``: a tensor lr (or
    betas) on the foreach path without capturable for Adam/AdamW; the fused path where this
    build has none for the CPU."""
    if implementation == "fused":
        return True  # whether it exists is the build's; where it does, it must follow
    tensors = setting.tensor_lr or setting.tensor_betas
    return implementation == "foreach" and setting.name != "sgd" and tensors


# (optimizer, arguments, the error, words of its message): what the constructors refuse.
REFUSALS = [
    ("SGD", {"lr": -0.1}, ValueError, "Invalid learning rate"),
    ("SGD", {"lr": 0.1, "momentum": -0.1}, ValueError, "Invalid momentum value"),
    ("SGD", {"lr": 0.1, "weight_decay": -0.1}, ValueError, "Invalid weight_decay value"),
    ("SGD", {"lr": 0.1, "nesterov": True}, ValueError, "Nesterov momentum requires"),
    ("SGD", {"lr": 0.1, "nesterov": True, "momentum": 0.9, "dampening": 0.1}, ValueError,
     "Nesterov momentum requires"),
    ("SGD", {"lr": torch.tensor([0.1, 0.2])}, ValueError, "Tensor lr must be 1-element"),
    ("Adam", {"lr": -1.0}, ValueError, "Invalid learning rate"),
    ("Adam", {"eps": -1.0}, ValueError, "Invalid epsilon value"),
    ("Adam", {"betas": (1.0, 0.9)}, ValueError, "Invalid beta parameter at index 0"),
    ("Adam", {"betas": (0.9, 1.0)}, ValueError, "Invalid beta parameter at index 1"),
    ("Adam", {"weight_decay": -1.0}, ValueError, "Invalid weight_decay value"),
    ("Adam", {"foreach": True, "fused": True}, RuntimeError, "cannot be `True` together"),
    ("Adam", {"lr": torch.tensor(0.01), "foreach": True}, ValueError,
     "lr as a Tensor is not supported for capturable=False and foreach=True"),
    ("Adam", {"betas": (torch.tensor(0.9), 0.99)}, ValueError,
     "betas must be either both floats or both Tensors"),
    ("AdamW", {"lr": torch.tensor(0.01), "foreach": True}, ValueError,
     "lr as a Tensor is not supported for capturable=False and foreach=True"),
    # capturable (CUDA graphs) on parameters of the CPU: refused at the first step.
    ("Adam", {"capturable": True}, AssertionError,
     "If capturable=True, params and state_steps must be on supported devices"),
    ("AdamW", {"capturable": True, "foreach": True}, AssertionError,
     "If capturable=True, params and state_steps must be on supported devices"),
    ("AdamW", {"lr": -1.0}, ValueError, "Invalid learning rate"),
    ("AdamW", {"eps": -1.0}, ValueError, "Invalid epsilon value"),
    ("AdamW", {"betas": (-0.1, 0.9)}, ValueError, "Invalid beta parameter at index 0"),
    ("AdamW", {"weight_decay": -1.0}, ValueError, "Invalid weight_decay value"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "kwargs", "error", "words"),
    REFUSALS,
    ids=[f"{n}-{'-'.join(k)}-{i}" for i, (n, k, _, _) in enumerate(REFUSALS)],
)
def test_every_documented_refusal_is_made(name, kwargs, error, words):
    params = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    with pytest.raises(error, match=re.escape(words)):
        optimizer = getattr(torch.optim, name)(params, **kwargs)
        # Some refusals come at the first step (the implementation is chosen there).
        params[0].grad = torch.ones(3, dtype=torch.float64)
        optimizer.step()


# The edge of each refusal, which must still be accepted (and followed): a learning rate, eps,
# momentum or weight decay of 0, betas of 0, Nesterov momentum with momentum and no dampening.
ACCEPTED = [
    Setting("sgd", lr=0.0, momentum=0.9),
    Setting("sgd", momentum=0.0, weight_decay=0.0),
    Setting("sgd", momentum=0.5, nesterov=True, dampening=0.0),
    Setting("adam", lr=0.0),
    Setting("adam", eps=0.0, betas=(0.0, 0.0)),
    Setting("adamw", lr=0.0, weight_decay=0.5),
]


@pytest.mark.parametrize("setting", ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_the_edge_of_every_refusal_is_accepted_and_followed(setting):
    params, grads = _data(11)
    expected = [p.clone() for p in params]
    (sgd_rule if setting.name == "sgd" else adam_rule)(setting, expected, grads)
    theirs = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = getattr(torch.optim, OPTIMIZERS[setting.name])(theirs, **setting.kwargs())
    for step_grads in grads:
        for p, g in zip(theirs, step_grads, strict=True):
            p.grad = None if g is None else g.clone()
        optimizer.step()
    for got, want in zip(theirs, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("implementation", ["for_loop", "foreach"])
@pytest.mark.parametrize(
    "setting", [s for s, _ in EVERY_OPTION], ids=[str(i) for i in range(len(EVERY_OPTION))]
)
def test_a_complex_parameter_follows_the_rule_on_its_real_view(setting, implementation):
    # torch documents complex parameters as optimised through their real views (real and
    # imaginary parts as two real numbers each): the rule on the view is what they must get.
    if implementation == "foreach" and _refused(setting, implementation):
        pytest.skip("a tensor lr or betas on foreach without capturable: refused, above")
    generator = torch.Generator().manual_seed(17)
    start = torch.randn(3, dtype=torch.complex128, generator=generator)
    grads = [[torch.randn(3, dtype=torch.complex128, generator=generator)] for _ in range(STEPS)]
    expected = [torch.view_as_real(start.clone())]
    rule = sgd_rule if setting.name == "sgd" else adam_rule
    rule(setting, expected, [[torch.view_as_real(g)] for (g,) in grads])
    theirs = [torch.nn.Parameter(start.clone())]
    optimizer = getattr(torch.optim, OPTIMIZERS[setting.name])(
        theirs, **setting.kwargs(), **setting.implementation(implementation)
    )
    for (g,) in grads:
        theirs[0].grad = g.clone()
        optimizer.step()
    torch.testing.assert_close(torch.view_as_real(theirs[0].detach()), expected[0],
                               rtol=RTOL, atol=ATOL)  # fmt: skip
