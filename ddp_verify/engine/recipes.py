"""What the user trains with: their loss, optimizer and scheduler, named by reference.

A :class:`~ddp_verify.engine.scenario.Recipe` names each as ``"module:callable"`` or
``"path/to/file.py:callable"`` (a picklable string: every rank, the reference's process and a
reproducer import the same callable from it):

- loss: ``loss(outputs, targets)``, on each micro-batch, as the harness's own would be;
- optimizer: ``factory(params) -> torch.optim.Optimizer``, once per run;
- scheduler: ``factory(optimizer) -> scheduler``, stepped once per optimizer step.

A loss returns the mean over its batch's loss items (torch's default), unless it says
otherwise: a ``reduction`` attribute of ``"sum"`` (the summed loss) or ``"none"`` (one loss
per item), or a tuple whose second element is its count: fairseq's criteria return
``(loss, sample_size, logging_output)`` with the loss summed over ``sample_size`` items, and
``(loss, count)`` reads the same way. :func:`mean_loss` turns each into the mean the harness's
loops weight. A training step of the user's gets the loss as written, tuple and all.

Where a recipe names any part, the engine's oracle (which trains the harness's own losses and
optimizers only) does not judge: a training step is judged against its own run on one rank
holding the whole batch in one micro-batch
(:meth:`~ddp_verify.engine.scenario.Scenario.whole`), other code against the engine's loop
trained with the recipe.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..world.naming import public
from .importing import import_target, resolve_reference
from .scenario import Recipe

__all__ = [
    "RecipeError",
    "criterion_notes",
    "load",
    "losses_it_takes",
    "mean_loss",
    "recipe_of",
    "reference_of",
    "resolve_reference",
]


@public
class RecipeError(ValueError):
    """A loss, optimizer or scheduler of the user's that cannot be used; the message names
    the problem and the fix.

    Example::

        >>> try:
        ...     load("no_colon_here", "loss")
        ... except RecipeError as error:
        ...     print(str(error)[:60])
        a loss is given as MODULE:CALLABLE or PATH.py:CALLABLE, got
    """


def reference_of(value: Any, what: str) -> str:
    """The reference a recipe keeps for ``value``: a reference string as given (a path made
    absolute), or a callable's module (or source file) and name, which every rank imports.
    :class:`RecipeError` for a callable no process could import (a lambda, a closure).

    Example::

        >>> import torch.nn.functional as F
        >>> reference_of(F.cross_entropy, "loss")
        'torch.nn.functional:cross_entropy'
    """
    if isinstance(value, str):
        return resolve_reference(value)
    if not callable(value):
        raise RecipeError(
            f"a {what} is a callable or its MODULE:CALLABLE reference, got {type(value).__name__}"
        )
    name = getattr(value, "__qualname__", "")
    module = getattr(value, "__module__", None)
    if not name or "<" in name or "." in name or module is None:
        raise RecipeError(
            f"the {what} {value!r} cannot be imported by the ranks (a lambda, a closure or a "
            f"bound method): define it at the top level of a module and pass it, or pass "
            f"'PATH.py:NAME'"
        )
    if module == "__main__" or module not in sys.modules or _unimportable(module):
        try:
            path = inspect.getfile(value)
        except TypeError:
            path = ""
        if not path.endswith(".py"):
            raise RecipeError(
                f"the {what} {name} lives in {module!r}, which the ranks cannot import: pass "
                f"'PATH.py:{name}'"
            )
        return f"{os.path.abspath(path)}:{name}"
    return f"{module}:{name}"


def _unimportable(module: str) -> bool:
    """Whether ``module`` was loaded from a file by path, under a name no import on the path
    finds (a test file pytest imported by its path, a file loaded here): looked up on
    ``sys.path`` itself, not in ``sys.modules``, where such a module sits under its name."""
    if module.startswith("_ddp_verify_"):
        return True
    top = module.partition(".")[0]
    if top in sys.builtin_module_names:
        return False
    return importlib.machinery.PathFinder.find_spec(top) is None


@functools.lru_cache(maxsize=32)
def load(reference: str, what: str) -> Callable[..., Any]:
    """The callable ``reference`` names (``MODULE:CALLABLE`` or ``PATH.py:CALLABLE``);
    :class:`RecipeError` if it cannot be imported.

    Example::

        >>> load("torch.nn.functional:mse_loss", "loss").__name__
        'mse_loss'
    """
    target, sep, name = reference.rpartition(":")
    if not sep or not target or not name:
        raise RecipeError(
            f"a {what} is given as MODULE:CALLABLE or PATH.py:CALLABLE, got {reference!r}"
        )
    try:
        module = import_target(target, "_ddp_verify_recipe")
    except (ImportError, OSError, SyntaxError) as exc:
        raise RecipeError(
            f"cannot import the {what}'s module {target!r}: {exc}. Give an importable module "
            "(run from the directory that holds it) or a path to a .py file"
        ) from None
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise RecipeError(f"{target} has no callable {name!r} to use as the {what}")
    return found


def user_loss(recipe: Recipe) -> Callable[..., Any]:
    """The recipe's loss as the user wrote it: an ``nn.Module`` class is instantiated with
    no arguments (``torch.nn.CrossEntropyLoss``), anything else is called as it is."""
    loss = load(recipe.loss, "loss")
    if isinstance(loss, type) and issubclass(loss, nn.Module):
        return loss()
    return loss


class MeanLoss(nn.Module):
    """The user's loss as the mean over a batch's ``count(targets)`` loss items, whatever
    it returns (see :func:`mean_loss`)."""

    def __init__(self, loss: Callable[..., Any], count: Callable[[torch.Tensor], int]) -> None:
        super().__init__()
        self.loss, self.count = loss, count
        self.reduction = getattr(loss, "reduction", "mean")

    def forward(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        got = self.loss(outputs, targets)
        if isinstance(got, (tuple, list)):
            if len(got) < 2 or not isinstance(got[0], torch.Tensor):
                raise RecipeError(
                    f"the loss returned a {type(got).__name__} of {len(got)}: a loss returns "
                    "a tensor, or (loss, count[, logging]) with the loss summed over count "
                    "items (fairseq's criteria)"
                )
            # (summed loss, its count, ...): the mean is the one divided by the other.
            count = got[1]
            return got[0].reshape(()) / (float(count) if not torch.is_tensor(count) else count)
        if not isinstance(got, torch.Tensor):
            raise RecipeError(f"the loss must return a tensor, got {type(got).__name__}")
        if self.reduction == "sum":
            return got.reshape(()) / max(self.count(targets), 1)
        if self.reduction == "none" or got.numel() > 1:
            # One loss per item: items that do not count (padding) are already 0 in it.
            return got.sum() / max(self.count(targets), 1)
        return got.reshape(())


def mean_loss(recipe: Recipe, count: Callable[[torch.Tensor], int]) -> MeanLoss:
    """The recipe's loss as the mean over each batch's loss items (``count(targets)`` of
    them): a tensor it returns is its mean, unless its ``reduction`` is ``"sum"`` or it
    returns one loss per item; a tuple ``(loss, count, ...)`` is the summed loss and its
    count.

    Example::

        >>> from ddp_verify.engine.scenario import Recipe
        >>> loss = mean_loss(Recipe(loss="torch.nn:MSELoss"), len)
        >>> float(loss(torch.ones(2, 1), torch.zeros(2, 1)))
        1.0
    """
    return MeanLoss(user_loss(recipe), count)


def user_optimizer(recipe: Recipe, params: Any) -> torch.optim.Optimizer:
    """The optimizer the recipe's factory builds on ``params``; :class:`RecipeError` for a
    factory that returns something else."""
    made = load(recipe.optimizer, "optimizer")(params)
    if not isinstance(made, torch.optim.Optimizer):
        raise RecipeError(
            f"the optimizer factory {recipe.optimizer} must return a torch.optim.Optimizer "
            f"built on the parameters it is given, got {type(made).__name__}"
        )
    return made


def user_scheduler(recipe: Recipe, optimizer: torch.optim.Optimizer) -> Any:
    """The scheduler the recipe's factory builds on ``optimizer``; :class:`RecipeError` for
    one without ``step()``."""
    made = load(recipe.scheduler, "scheduler")(optimizer)
    if not callable(getattr(made, "step", None)):
        raise RecipeError(
            f"the scheduler factory {recipe.scheduler} must return a scheduler (an object "
            f"with step(), as torch.optim.lr_scheduler's are), got {type(made).__name__}"
        )
    return made


def ticked(
    recipe: Recipe, optimizer: torch.optim.Optimizer, *, by_loop: bool = True
) -> tuple[torch.optim.Optimizer, Any]:
    """``optimizer`` and the recipe's scheduler on it (None without one). ``by_loop``: the
    scheduler steps after each of the optimizer's steps, as a training loop's
    ``scheduler.step()`` does; otherwise the code it is handed to steps it itself."""
    if not recipe.scheduler:
        return optimizer, None
    scheduler = user_scheduler(recipe, optimizer)
    if by_loop:

        def advance(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
            scheduler.step()

        optimizer.register_step_post_hook(advance)
    return optimizer, scheduler


def recipe_of(*, loss_fn: Any = None, optimizer: Any = None, scheduler: Any = None) -> Recipe:
    """The :class:`Recipe` of what the user hands in (callables, or their references), each
    imported once here so that a mistake is said before any rank starts.

    Example::

        >>> recipe_of(loss_fn="torch.nn:SmoothL1Loss").loss
        'torch.nn:SmoothL1Loss'
    """
    recipe = Recipe(
        loss="" if loss_fn is None else reference_of(loss_fn, "loss"),
        optimizer="" if optimizer is None else reference_of(optimizer, "optimizer"),
        scheduler="" if scheduler is None else reference_of(scheduler, "scheduler"),
    )
    for what, reference in recipe.parts():
        load(reference, what)
    if recipe.optimizer or recipe.scheduler:
        probe = nn.Linear(2, 1)
        try:
            optimizer_made = (
                user_optimizer(recipe, probe.parameters())
                if recipe.optimizer
                else torch.optim.SGD(probe.parameters(), lr=0.1)
            )
            if recipe.scheduler:
                user_scheduler(recipe, optimizer_made)
        except RecipeError:
            raise
        except Exception as exc:  # the user's factory: its failure is what to say
            what, reference = (
                ("scheduler", recipe.scheduler)
                if recipe.optimizer == "" or "optimizer_made" in locals()
                else ("optimizer", recipe.optimizer)
            )
            raise RecipeError(
                f"the {what} factory {reference} failed on a small model's "
                f"{'parameters' if what == 'optimizer' else 'optimizer'}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    return recipe


# A batch of each built-in target form, as the models give outputs for them: (outputs,
# targets) of 3 samples.
def _forms() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5, (3, 6), generator=generator)
    tokens[0, 2:] = -100
    # As many classes or outputs as no other dimension, so that a loss which broadcasts
    # one form's targets against another's outputs fails here as it would in training.
    return {
        "cross_entropy": (
            torch.randn(3, 4, generator=generator, dtype=torch.float64),
            torch.randint(0, 4, (3,), generator=generator),
        ),
        "mse": (
            torch.randn(3, 2, generator=generator, dtype=torch.float64),
            torch.randn(3, 2, generator=generator, dtype=torch.float64),
        ),
        "tokens": (torch.randn(3, 6, 5, generator=generator, dtype=torch.float64), tokens),
    }


def _items(targets: torch.Tensor) -> int:
    """The loss items of a probe batch: its tokens that count, or its samples."""
    if targets.dim() > 1 and not targets.is_floating_point():
        return int((targets != -100).sum())
    return len(targets)


def losses_it_takes(recipe: Recipe, losses: tuple[str, ...]) -> tuple[str, ...]:
    """Of the built-in target forms ``losses`` (``mse``: float targets, ``cross_entropy``:
    class ids, ``tokens``: sequences of token ids with ``-100``), those the recipe's loss
    runs on: called on a small batch of each, it returns a finite loss that backpropagates
    into the outputs. :class:`RecipeError` where it runs on none, with what it raised.

    Example::

        >>> losses_it_takes(Recipe(loss="torch.nn:MSELoss"), ("mse", "cross_entropy"))
        ('mse',)
    """
    failures = []
    taken = []
    for form in losses:
        outputs, targets = _forms()[form]
        outputs.requires_grad_(True)
        try:
            with warnings.catch_warnings():
                # A loss that broadcasts targets of the wrong shape warns: not this form.
                warnings.simplefilter("error")
                value = mean_loss(recipe, _items)(outputs, targets)
                value.backward()
            if not torch.isfinite(value) or outputs.grad is None:
                raise ValueError(f"returned {float(value)!r}, no gradient into the outputs")
        except Exception as exc:  # the user's loss: any failure says this form is not its
            failures.append(f"{form}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        taken.append(form)
    if not taken:
        raise RecipeError(
            f"the loss {recipe.loss} runs on none of the target forms asked for "
            f"({'; '.join(failures)}): say which targets it takes with --losses "
            "(mse: float targets, cross_entropy: class ids, tokens: token sequences with -100)"
        )
    return tuple(taken)


def criterion_notes(recipe: Recipe, losses: tuple[str, ...]) -> tuple[str, ...]:
    """What a criterion returning a tuple says that adds up wrong across micro-batches and
    ranks. fairseq's ``reduce_metrics`` sums every logging output (and the loss, and the
    sample size) over the micro-batches and workers of a step: each must be a sum over its
    batch's items, so that the sums of the parts are the whole batch's. Checked on a batch of
    each target form the loss takes, split in two: an entry whose parts do not add up to
    the whole (a mean, an accuracy) is named, as is a loss that is not the sum over its count
    (read as one, the harness would train another objective than the criterion means).

    Example::

        >>> criterion_notes(Recipe(loss="torch.nn:MSELoss"), ("mse",))
        ()
    """
    if not recipe.loss:
        return ()
    loss = user_loss(recipe)
    notes: list[str] = []
    for form in losses:
        outputs, targets = _logged_batch(form)
        parts = [(outputs[:3], targets[:3]), (outputs[3:], targets[3:]), (outputs, targets)]
        try:
            with torch.no_grad():
                got = [loss(o, t) for o, t in parts]
        except Exception:  # a form the loss does not take: losses_it_takes says which
            continue
        if not all(isinstance(g, (tuple, list)) and len(g) >= 2 for g in got):
            return ()
        named = [_numbers(g) for g in got]
        wrong = [
            key
            for key in named[2]
            if key in named[0]
            and key in named[1]
            and not _adds_up(named[0][key] + named[1][key], named[2][key])
        ]
        if "the loss" in wrong:
            notes.append(
                f"your loss {recipe.loss} returns a tuple whose first element is not a sum "
                "over its items (its two halves of a batch do not add up to the whole): it is "
                "read as fairseq's (summed loss, sample size), so return the sum, not the mean"
            )
        if "the count" in wrong:
            notes.append(
                f"your loss {recipe.loss} returns a count that does not add up over a "
                "batch's parts: the sample size must count the items its loss sums"
            )
        logged = [k for k in wrong if k not in ("the loss", "the count")]
        if logged:
            said = ", ".join(repr(k) for k in logged)
            notes.append(
                f"your loss {recipe.loss} logs {said} as other than a sum over the batch's "
                "items: summed over the micro-batches and ranks of a step (fairseq's "
                "reduce_metrics sums every logging output), it is not the step's value; log "
                "sums (and the counts to divide them by)"
            )
        return tuple(notes)
    return ()


def _logged_batch(form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of 8 of ``form`` whose outputs are right on every other item (a class's
    logit raised): so that a mean logged (an accuracy) differs between a batch's parts."""
    generator = torch.Generator().manual_seed(1)
    if form == "cross_entropy":
        outputs = torch.randn(8, 4, generator=generator, dtype=torch.float64)
        targets = torch.randint(0, 4, (8,), generator=generator)
        outputs[::2].scatter_add_(1, targets[::2, None], torch.full((4, 1), 5.0).double())
        return outputs, targets
    if form == "mse":
        outputs = torch.randn(8, 2, generator=generator, dtype=torch.float64)
        return outputs, torch.randn(8, 2, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 5, (8, 6), generator=generator)
    targets[0, 2:] = -100
    outputs = torch.randn(8, 6, 5, generator=generator, dtype=torch.float64)
    return outputs, targets


def _adds_up(parts: float, whole: float) -> bool:
    return math.isclose(parts, whole, rel_tol=1e-6, abs_tol=1e-9)


def _numbers(returned: tuple[Any, ...] | list[Any]) -> dict[str, float]:
    """The loss, the count and each numeric logging output of a criterion's tuple."""
    found: dict[str, float] = {}
    for key, value in (("the loss", returned[0]), ("the count", returned[1])):
        if (torch.is_tensor(value) and value.numel() == 1) or isinstance(value, (int, float)):
            found[key] = float(value)
    logging = returned[2] if len(returned) > 2 and isinstance(returned[2], dict) else {}
    for key, value in logging.items():
        if (torch.is_tensor(value) and value.numel() == 1) or isinstance(value, (int, float)):
            found[str(key)] = float(value)
    return found
