"""Test-suite configuration: hypothesis profiles and helpers shared by the layers' tests."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# "ci" (the default) keeps the suite inside its time budget on 2 cores; "heavy" is the release
# check, a deeper search wherever a test follows the profile (properties drawn with @given,
# the correct fixtures' checks, the tolerance margins):
#   pytest --hypothesis-profile=heavy      (or HYPOTHESIS_PROFILE=heavy pytest)
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "heavy", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Long matrices (the whole conformance suite as a cluster job, every framework client at
# every layout) are marked ``slow``: CI's ``pytest`` keeps within its time budget without
# them, ``tox -e slow`` (``pytest --slow -m slow``) runs them. Skipped, never deselected, so
# that a run says what it left out.
def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a long matrix CI leaves to `tox -e slow` (run with --slow)"
    )


def pytest_collection_modifyitems(config, items):
    # A default: pytest 9.0.3 (not 9.2.0) also loads this file into the pytester sessions
    # that collect the installed package by --pyargs, without its options.
    if config.getoption("--slow", default=False):
        return
    import pytest

    skip = pytest.mark.skip(reason="slow: a long matrix, run by `tox -e slow` (--slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
