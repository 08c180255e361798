"""The private internals of pytest, pytest-xdist and hypothesis that ddp_verify relies on: each
checked before use, and a release that moved one fails at once, naming it and the version."""

from __future__ import annotations

import importlib.metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_verify.engine import compat


def test_every_internal_is_where_this_release_keeps_it(request):
    assert "request" in compat.fixture_argnames(request.node)
    assert compat.at_test_location(pytest.skip.Exception("why"))._use_item_location is True

    @settings(max_examples=3, database=None)
    @given(st.integers())
    def drawn(x):
        pass

    assert compat.settings_of(drawn).max_examples == 3
    assert compat.seed_of(drawn) is None
    assert compat.forced_seed() is None or isinstance(compat.forced_seed(), int)


def test_a_release_that_moved_an_internal_fails_loudly_with_its_version():
    version = importlib.metadata.version("pytest")
    with pytest.raises(compat.IncompatibleRelease, match=f"pytest {version} has no Function"):
        compat.fixture_argnames(object())
    with pytest.raises(compat.IncompatibleRelease, match=r"hypothesis .* settings attribute"):
        compat.settings_of(lambda: None)


@pytest.mark.skipif(
    compat.release("hypothesis") < compat.LOCAL_CONSTANTS_SINCE,
    reason="this hypothesis draws no local constants",
)
def test_a_hypothesis_that_draws_local_constants_without_the_hook_fails_loudly(monkeypatch):
    from hypothesis.internal.conjecture import providers

    # As a release that renamed the hook would be: the ranks could draw different examples.
    monkeypatch.delattr(providers, "_get_local_constants")
    with pytest.raises(compat.IncompatibleRelease, match="its local constants hook"):
        compat.without_local_constants()
