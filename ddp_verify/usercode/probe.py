"""The layout probe: the user's code called in each layout its kind accepts, on the world,
before the search; the layout kept is the one the evidence supports
(:func:`ddp_verify.usercode.layouts.choose`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..engine.tolerances import unit_roundoff_of
from ..engine.trace import Trace
from ..methods.equivalence import reference_and_tolerance
from ..world import RankError, WorldError
from ..world.interface import Ranked
from .adapters import adapt
from .kinds import Kind
from .layouts import (
    Chosen,
    Tried,
    candidates,
    choose,
    compared,
    default_layout,
    equal_items_scenario,
    run_layouts,
)
from .precision import probe_scenario


def found_layout(
    fn: Callable[..., Any],
    kind: Kind,
    world: Ranked,
    called: Mapping[str, Any],
    pinned: Mapping[str, str],
    bounds: Mapping[str, Any],
) -> Chosen:
    """The layout to call ``fn`` in: the pinned axes as given, the others probed on the
    simplest even scenario of ``bounds`` (token data where the bounds allow it, each rank as
    many tokens that count). ``called``: the other options of the call (``bind``, ...).

    Example::

        found_layout(fixed_cross_entropy, "loss-fn", world, {}, {}, {"losses": ("tokens",)})
        # Chosen(layout={'logits': '2d', 'labels': 'aligned'}, reason='called with ...')
    """
    layouts = candidates(kind, pinned, fn, tokens=True)
    scenario = None
    if len(layouts) > 1:
        scenario = _probe(world.size, bounds)
        if scenario is not None and scenario.loss != "tokens":
            layouts = candidates(kind, pinned, fn, tokens=False)
    if len(layouts) == 1 or scenario is None:
        return Chosen({**default_layout(kind, fn), **pinned, **layouts[0]})
    methods = [adapt(fn, kind, **called, layout=layout) for layout in layouts]
    shipped = [method.shipped() for method in methods]
    try:
        pending = world.submit(run_layouts, (shipped, scenario), name="the layout probe")
        reference, _ = world.helper.run_job(
            reference_and_tolerance, (scenario, False), name="the layout probe's reference"
        )[0]
        per_rank = pending.result()
    except (RankError, WorldError):
        # A layout that hangs or kills a rank: the search meets it in the first layout and
        # says how, as it would without a probe.
        return Chosen(layouts[0], settled=False)
    tried = []
    for i, layout in enumerate(layouts):
        results = [rank[i] for rank in per_rank]
        errors = [r for r in results if isinstance(r, str)]
        if errors:
            tried.append(Tried(layout, error=errors[0]))
        else:
            tried.append(compared(layout, reference, Trace("probe", results)))
    return choose(kind, tried)


def _probe(world_size: int, bounds: Mapping[str, Any]) -> Any:
    """The probe scenario: token data laid out so that labels work aligned or unshifted
    (the last position never counts) where the bounds allow tokens, with as many tokens on
    every rank; else the bounds' simplest even scenario. In the most precise dtype the
    bounds allow: float64 where they do, else the next (a check held to float32 only probes
    in float32, whose rounding stays far below what a wrong layout does)."""
    allowed = tuple(bounds.get("dtypes", ("float64",)))
    dtype = min(allowed, key=unit_roundoff_of) if allowed else "float64"
    losses = tuple(bounds.get("losses", ("tokens",)))
    if "tokens" in losses and bounds.get("model") is None:
        token_bounds = {**bounds, "losses": ("tokens",), "labels": "unshifted"}
        scenario = probe_scenario(world_size, token_bounds, dtype=dtype)
        if scenario is not None:
            return equal_items_scenario(scenario)
    return probe_scenario(world_size, dict(bounds), dtype=dtype)
