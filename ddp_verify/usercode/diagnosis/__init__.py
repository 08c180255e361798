"""Why a run diverged, by one mechanism: hypotheses over axes, predicted, scored, chosen.

:mod:`.axes` holds every choice a data-parallel computation makes, one row each;
:mod:`.evidence` what was observed and the one tolerance table; :mod:`.engine` predicts each
hypothesis, scores it and chooses the cheapest consistent ones; :mod:`.passes` are the ways
of looking (the axes in closed form, structural checks, a clip, simulated mistakes), run by
one loop; :mod:`.report` renders the words once.

Example::

    causes = likely_causes("grad-sync", scenario, reference, got)
    causes[0].pattern  # 'ranks:world'
"""

from __future__ import annotations

from ...engine.models import one_thread
from ...engine.scenario import Scenario
from ...engine.trace import Trace
from ..findings import Cause
from . import passes
from .engine import choose
from .evidence import Evidence
from .report import render

__all__ = ["likely_causes"]


def likely_causes(kind: str, scenario: Scenario, reference: Trace, got: Trace) -> list[Cause]:
    """Every cause of ``got``'s divergence from ``reference``, most important first; never
    empty.

    Example::

        for cause in likely_causes("step", scenario, reference, got):
            print(cause.pattern, cause.text)
    """
    evidence = Evidence(kind, scenario, reference, got)
    with one_thread():
        found = passes.run(evidence)
        chosen, open_subjects = choose(found)
        return render(evidence, chosen, open_subjects)
