"""Whether a script's reference layout trains the same twice, and where not, from which
source: the preflight every parity run starts with (a layout can only be held to a reference
that is the same at every run).

Two runs of the reference layout are compared on the samples each step trained and on the
gradients, parameters and losses recorded (float64's bound). Where they differ, the sources
the recordings show are named, with the fix: a draw from torch's global generator made
before it was seeded (the first draw whose generator state differed between the runs, by
file and line), Python's or NumPy's global generator left unseeded, dropout in training
mode; otherwise what is left (data-loader workers, nondeterministic kernels, a source
outside the process).

Example::

    causes = unreproduced(Recording.load(first), Recording.load(again), steps=3)
"""

from __future__ import annotations

import collections
from typing import Any

from ..engine.compare import compare_traces
from ..engine.tolerances import Float64Tolerance
from ..usercode import findings as f
from ..usercode.findings import Cause
from .layouts import LayoutError, parse_layout
from .recording import Recording

__all__ = [
    "asked_layout",
    "dropout_cause",
    "launch_causes",
    "start_cause",
    "trains_nothing",
    "unreproduced",
]


def unreproduced(first: Recording, again: Recording, steps: int) -> list[Cause]:
    """Nothing where ``again`` (a second run of the reference layout) trains what ``first``
    did; else the cause that says what differs and the sources found."""
    n = min(steps, first.steps, again.steps)
    what = []
    for step in range(n):
        if first.samples(step) != again.samples(step):
            what.append(f"the samples of step {step}")
            break
    mismatch = compare_traces(first.trace(n), again.trace(n), n, Float64Tolerance())
    if mismatch is not None:
        what.append(
            f"{mismatch.quantity} {mismatch.name!r} at step {mismatch.step}"
            if mismatch.name
            else f"the {mismatch.quantity} at step {mismatch.step}"
        )
    if not what:
        return []
    cause = f.REFERENCE_UNREPRODUCED.cause(
        layout=first.label, what="; ".join(what), source=_sources(first, again)
    )
    return [cause]


def _sources(first: Recording, again: Recording) -> str:
    """What the recordings show made the two runs differ, each with its fix."""
    said = []
    mine, theirs = first.meta.get("draws", []), again.meta.get("draws", [])
    for (site, state), (_, other) in zip(mine, theirs, strict=False):
        if state != other:
            said.append(
                f"{site} drew from torch's global generator before it was seeded (its state "
                "there differed between the runs): call torch.manual_seed(...) before it, or "
                "draw from a seeded torch.Generator"
            )
            break
    generators = first.meta.get("generators", {})
    others = again.meta.get("generators", {})
    start = first.meta.get("generators_at_start", {})
    for name, words in (("random", "Python's random"), ("numpy", "NumPy's global generator")):
        # Drawn from before the first forward (its state moved), and not alike at both runs.
        drawn = name not in start or start[name] != generators.get(name)
        if name in generators and drawn and generators.get(name) != others.get(name):
            said.append(
                f"{words} was drawn from unseeded (its state at the first forward differed "
                f"between the runs): seed it "
                f"({'random.seed' if name == 'random' else 'np.random.seed'})"
            )
    if not said and generators.get("torch") != others.get("torch"):
        said.append(
            "torch's global generator was in another state at the first forward (drawn from "
            "unseeded, or seeded from the clock): seed it with a constant"
        )
    dropout = dropout_cause(first)
    if dropout is not None and not said:
        said.append(dropout.text)
    if not said:
        said.append(
            "no unseeded generator was seen: look for data-loader workers with unseeded "
            "state (worker_init_fn), nondeterministic kernels "
            "(torch.use_deterministic_algorithms(True)), or a source outside the process "
            "(a file or data set that changes, the clock)"
        )
    return "; ".join(said)


def dropout_cause(recording: Recording) -> Cause | None:
    """The dropout the model trained with, where it has any in training mode."""
    modules = recording.meta.get("dropout") or []
    if not modules:
        return None
    shown = ", ".join(f"{name!r} p={p:g}" for name, p in modules[:4])
    more = f" and {len(modules) - 4} more" if len(modules) > 4 else ""
    return f.MODEL_DROPOUT.cause(modules=shown + more)


def start_cause(reference: Recording, other: Recording) -> Cause | None:
    """Where ``other``'s ranks started from weights other than the reference's, which. Each
    run records its model's parameters at the first forward, by shape and value; a rank
    whose parameters of some shape hold none of the reference's values (or the other way)
    started elsewhere. Runs whose parameters do not share their shapes (one sharded or
    flattened, the other not) are not compared."""
    expected = _weights(reference.meta)
    if not expected:
        return None  # not recorded (an older recording, a sharded model)
    differing = []
    for rank, record in enumerate(other.ranks):
        got = _weights(record["meta"])
        if not got or not _same_shapes(expected, got):
            continue
        mine, theirs = set(expected), set(got)
        if not (mine <= theirs or theirs <= mine):
            differing.append(rank)
    if not differing:
        return None
    ranks = ", ".join(map(str, differing[:8])) + (" ..." if len(differing) > 8 else "")
    plural = "s" if len(differing) > 1 else ""
    return f.WEIGHTS_START.cause(where=f"rank{plural} {ranks} of layout {other.label}")


def _weights(meta: dict[str, Any]) -> list[tuple[tuple[int, ...], str]]:
    """A run's recorded starting weights: (shape, digest of the values) per parameter."""
    return [(tuple(shape), str(digest)) for shape, digest in meta.get("start") or []]


def _same_shapes(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Whether one run's parameter shapes are among the other's (a wrapper's first forward
    may hold parameters the model's does not)."""
    shapes_a, shapes_b = collections.Counter(s for s, _ in a), collections.Counter(s for s, _ in b)
    return not (shapes_a - shapes_b) or not (shapes_b - shapes_a)


def asked_layout(recording: Recording) -> tuple[int, int] | None:
    """The (world size, accumulation steps) a recording's label asks for (``2x2``,
    ``dp2.pp2.a2``), or None for a label that names no layout (a directory of the user's
    own)."""
    try:
        layout = parse_layout(recording.label)
    except LayoutError:
        return None
    return layout.world_size, layout.grad_accum


def launch_causes(recording: Recording) -> list[Cause]:
    """Where a layout's run did not run as asked: ranks that formed no process group (always
    a failure: the layout never ran), or another number of micro-batches a step."""
    asked = asked_layout(recording)
    if asked is None:
        return []
    world, accum = asked
    sizes = [r["meta"].get("group_size", "unknown") for r in recording.ranks]
    causes = []
    if world > 1 and all(size is None for size in sizes):
        causes.append(
            f.LAUNCH_NO_GROUP.cause(
                layout=recording.label,
                what=f"{len(sizes)} process(es) started, none called init_process_group",
            )
        )
    elif world > 1 and any(isinstance(s, int) and s != world for s in sizes):
        formed = sorted({s for s in sizes if isinstance(s, int)})
        causes.append(
            f.LAUNCH_NO_GROUP.cause(
                layout=recording.label, what=f"they formed groups of {formed}, not one of {world}"
            )
        )
    if recording.steps and recording.grad_accum != accum:
        causes.append(
            f.LAUNCH_MICRO.cause(layout=recording.label, got=recording.grad_accum, asked=accum)
        )
    return causes


def trains_nothing(recording: Recording, steps: int) -> Cause | None:
    """Where every gradient the reference's optimizer saw is exactly 0 at every step."""
    n = min(steps, recording.steps)
    if not n:
        return None
    grads = recording.trace(n).ranks[0].grads
    if not grads:
        return None
    for step in grads[:n]:
        if any(g is not None and bool(g.any()) for g in step.values()):
            return None
    return f.TRAINS_NOTHING.cause(layout=recording.label, steps=n)
