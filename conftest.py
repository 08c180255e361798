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
