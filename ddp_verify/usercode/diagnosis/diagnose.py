"""The diagnosis's entry: the evidence of a run, every pass, one choice, one rendering.

Example::

    causes = likely_causes("grad-sync", scenario, reference, got)
    causes[0].pattern  # 'ranks:world'
"""

from __future__ import annotations

from ...engine.models import one_thread
from ...engine.scenario import Scenario
from ...engine.trace import Trace
from ..findings import Cause
from ..kinds import Kind, as_kind
from . import passes
from .engine import choose
from .evidence import Evidence
from .groups import with_groups
from .report import render

__all__ = ["likely_causes"]


def likely_causes(
    kind: Kind | str, scenario: Scenario, reference: Trace, got: Trace
) -> list[Cause]:
    """Every cause of ``got``'s divergence from ``reference``, most important first; never
    empty.

    Example::

        for cause in likely_causes("step", scenario, reference, got):
            print(cause.pattern, cause.text)
    """
    evidence = Evidence(as_kind(kind), scenario, reference, got)
    with one_thread():
        found = passes.run(evidence)
        chosen, open_subjects = choose(found)
        return with_groups(render(evidence, chosen, open_subjects), scenario, got)
