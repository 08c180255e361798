"""The user's own model: a factory named ``"module:callable"`` (or ``"path/to/file.py:callable"``).

The factory takes no arguments and returns ``(module, make_batch)``: the ``nn.Module`` to train
and a function ``make_batch(n, generator) -> (inputs, targets)`` that draws a batch of ``n``
samples from the ``torch.Generator`` it is given. The harness seeds torch's default generator
before every call of the factory, so the module's initial weights come from the scenario's
seed, on every rank and in the float64 reference alike. The loss follows from the targets:
float targets train with MSE, integer class ids with cross-entropy, and integer targets of
more than one dimension (a sequence per sample, ``-100`` where a token must not count) with the
token-level cross-entropy.

:func:`inspect_user_model` checks all of that once, before anything runs, and says what is
wrong: a factory that cannot be imported, builds different weights from one seed, has no
parameters to train, or a batch maker that ignores its generator.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..world.naming import public
from .importing import import_target
from .scenario import LossName

BatchMaker = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


@public
class UserModelError(ValueError):
    """A model factory that cannot be used; the message names the problem and the fix.

    Example::

        >>> try:
        ...     UserModel("mine.py:factory", lambda: "not a model").built()
        ... except UserModelError as error:
        ...     print(str(error)[:58])
        the model factory mine.py:factory must return (module, mak
    """


@dataclasses.dataclass(frozen=True)
class UserModel:
    """A resolved factory: ``module()`` builds the model (seed it first), ``batch()`` draws."""

    reference: str
    factory: Callable[[], Any]

    def built(self) -> tuple[nn.Module, BatchMaker]:
        made = self.factory()
        if (
            not isinstance(made, tuple)
            or len(made) != 2
            or not isinstance(made[0], nn.Module)
            or not callable(made[1])
        ):
            raise UserModelError(
                f"the model factory {self.reference} must return (module, make_batch): an "
                f"nn.Module and a function make_batch(n, generator) -> (inputs, targets); "
                f"it returned {type(made).__name__}"
            )
        return made

    def module(self) -> nn.Module:
        return self.built()[0]

    def batch(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        made = _batch_maker(self)(n, generator)
        if (
            not isinstance(made, (tuple, list))
            or len(made) != 2
            or not all(isinstance(t, torch.Tensor) for t in made)
        ):
            raise UserModelError(
                f"make_batch of {self.reference} must return (inputs, targets), two tensors; "
                f"it returned {type(made).__name__}"
            )
        inputs, targets = made
        if len(inputs) != n or len(targets) != n:
            raise UserModelError(
                f"make_batch(n={n}, generator) of {self.reference} returned {len(inputs)} "
                f"inputs and {len(targets)} targets; it must return n samples of each (the "
                "first dimension is the batch)"
            )
        return inputs, targets


@functools.lru_cache(maxsize=8)
def _batch_maker(model: UserModel) -> BatchMaker:
    # The factory's module is thrown away here; its draws must not move the global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)
        return model.built()[1]


@functools.lru_cache(maxsize=8)
def user_model(reference: str) -> UserModel:
    """The factory ``reference`` names, imported (a module path, or a file path ending in
    ``.py``); :class:`UserModelError` if it cannot be.

    Example::

        user_model("my_project.models:tiny_gpt").module()
    """
    target, sep, name = reference.rpartition(":")
    if not sep or not target or not name:
        raise UserModelError(
            f"a model factory is given as MODULE:FACTORY or PATH.py:FACTORY, got {reference!r}"
        )
    try:
        module = import_target(target, "_ddp_verify_model")
    except (ImportError, OSError, SyntaxError) as exc:
        raise UserModelError(
            f"cannot import the model factory's module {target!r}: {exc}. Give an importable "
            "module (run from the directory that holds it) or a path to a .py file"
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UserModelError(f"{target} has no callable {name!r} to make the model")
    return UserModel(reference, factory)


def inspect_user_model(reference: str) -> LossName:
    """Check the factory ``reference`` before anything runs, and return the loss its targets
    call for; :class:`UserModelError` names what is wrong and how to fix it.

    Example::

        inspect_user_model("my_project.models:tiny_gpt")  # 'tokens'
    """
    model = user_model(reference)

    def seeded(seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            return model.module()

    first, again = seeded(0), seeded(0)
    params = [p for p in first.parameters() if p.requires_grad]
    if not params:
        raise UserModelError(
            f"the model {reference} builds has no parameters that require gradients: there is "
            "nothing for data-parallel training to synchronise"
        )
    a, b = first.state_dict(), again.state_dict()
    differ = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
    if differ or a.keys() != b.keys():
        raise UserModelError(
            f"the model factory {reference} is not deterministic: built twice from the same "
            f"seed, its {', '.join(differ[:3]) or 'state'} differ. Draw initial weights from "
            "torch's default generator (nn layers do; the harness seeds it) and not from "
            "another generator, numpy or the clock"
        )
    one = model.batch(3, torch.Generator().manual_seed(1))
    same = model.batch(3, torch.Generator().manual_seed(1))
    other = model.batch(3, torch.Generator().manual_seed(2))
    if not all(torch.equal(x, y) for x, y in zip(one, same, strict=True)):
        raise UserModelError(
            f"make_batch of {reference} is not deterministic: two calls with generators of "
            "the same seed made different batches. Draw every random number from the "
            "generator it is given (torch.randn(..., generator=generator))"
        )
    if all(torch.equal(x, y) for x, y in zip(one, other, strict=True)):
        raise UserModelError(
            f"make_batch of {reference} ignores the generator it is given: generators of "
            "different seeds made the same batch, so every step would train on the same "
            "samples. Draw from it (torch.randn(..., generator=generator))"
        )
    inputs, targets = one
    loss: LossName
    if targets.is_floating_point():
        loss = "mse"
    elif targets.dim() == 1:
        loss = "cross_entropy"
    else:
        loss = "tokens"
    with torch.random.fork_rng(devices=[]):
        try:
            output = first.double()(inputs.double() if inputs.is_floating_point() else inputs)
        except Exception as exc:  # the user's forward: any failure is theirs to see
            raise UserModelError(
                f"the model of {reference} failed on a batch from its own make_batch: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(output, torch.Tensor) or len(output) != len(inputs):
        raise UserModelError(
            f"the model of {reference} must return one output tensor with a row per sample"
        )
    return loss
