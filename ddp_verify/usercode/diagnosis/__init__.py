"""Why a run diverged, by one mechanism: hypotheses over axes, predicted, scored, chosen.

:mod:`.axes` holds every choice a data-parallel computation makes, one row each;
:mod:`.evidence` what was observed and the one tolerance table; :mod:`.engine` predicts each
hypothesis, scores it and chooses the cheapest consistent ones; :mod:`.passes` are the ways
of looking (the axes in closed form, structural checks, a clip, the least-squares catch-all
of :mod:`.weights` and :mod:`.readings`, the simulated mistakes of :mod:`.mistakes`), run by
one loop; :mod:`.report` renders the words once; :mod:`.probes` trains the scenarios that
tell alternatives apart and show every mistake, not the first.

Example::

    causes = likely_causes("grad-sync", scenario, reference, got)
    causes[0].pattern  # 'ranks:world'
"""

from __future__ import annotations

from .diagnose import likely_causes

__all__ = ["likely_causes"]
