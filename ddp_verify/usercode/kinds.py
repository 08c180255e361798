"""The plug-in kinds: what each kind's callable must accept, checked before anything runs.

No torch here: the command line reads these to build its arguments and check a signature
before it pays for importing torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

KINDS = ("grad-sync", "loss", "step", "comm-hook", "wrapper")

# What each kind's callable must accept, for the error that says so.
SIGNATURES = {
    "grad-sync": "fn(model) or fn(model, num_samples)",
    "loss": "fn(local_loss, num_samples) -> tensor or float",
    "step": "fn(model, optimizer, micro_batches, loss_fn) -> tensor or float",
    "comm-hook": "hook(state, bucket) -> torch.futures.Future",
    "wrapper": "fn(module) -> module",
}
# Scenario bounds a kind checks under unless the user says otherwise. A step function owns its
# accumulation loop, and training loops give every rank the same number of accumulation steps;
# code that synchronises per micro-batch would only hang on other schedules.
DEFAULT_BOUNDS: dict[str, dict[str, Any]] = {"step": {"same_micro_batch_counts": True}}

_ARITIES = {"grad-sync": (1, 2), "loss": (2,), "step": (4,), "comm-hook": (2,), "wrapper": (1,)}


class KindError(TypeError):
    """The callable cannot be used as the requested kind; the message says what was expected."""


def check_signature(fn: Callable[..., Any], kind: str) -> int:
    """How many positional arguments ``fn`` will be given; :class:`KindError` if it cannot
    take what ``kind`` passes."""
    if kind not in KINDS:
        raise KindError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not callable(fn):
        raise KindError(f"{fn!r} is not callable; a {kind} plug-in is {SIGNATURES[kind]}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return _ARITIES[kind][-1]  # Builtins and C callables: trust the user.
    for arity in reversed(_ARITIES[kind]):
        try:
            signature.bind(*range(arity))
        except TypeError:
            continue
        return arity
    name = getattr(fn, "__qualname__", repr(fn))
    raise KindError(f"{name}{signature} cannot be a {kind} plug-in: expected {SIGNATURES[kind]}")
