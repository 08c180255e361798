"""Places where the installed torch is known not to be equivalent, kept as failing checks.

A property that fails because of a torch bug stays in the suite, marked with
:func:`known_torch_issue`: it runs, and its failure reads as an expected failure naming the
issue. When torch fixes it the test passes and pytest reports XPASS, the signal to drop the
mark. A wrapper under ``--ddp-wrapper`` is held to the same property: the mark says what torch
gets wrong, not what the wrapper may.
"""

from __future__ import annotations

from typing import Any

import pytest


def known_torch_issue(
    what: str,
    *,
    raises: type[BaseException] | tuple[type[BaseException], ...],
    url: str | None = None,
    repro: str | None = None,
) -> Any:
    """Mark a conformance test whose property the installed torch is known to break.

    Example::

        @known_torch_issue("static_graph with no_sync() asserts", raises=RankError, url="...")
        def test_static_graph_with_no_sync_accumulation(world, data_parallel, prove): ...
    """
    where = url or "not found in torch's tracker"
    if repro:
        where += f"; standalone reproducer: {repro}"
    # ``raises``: a failure of any other kind is a failure, not the known issue.
    return pytest.mark.xfail(
        reason=f"known torch issue: {what} ({where})", raises=raises, strict=False
    )
