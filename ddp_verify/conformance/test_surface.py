"""The gate's reach, read from the installed torch: every argument and public method of the
data-parallel API (:mod:`ddp_verify.conformance.surface`) has an entry, every entry names
something torch has, and every test an entry claims is in this suite."""

from __future__ import annotations

import importlib

import pytest

from ddp_verify.conformance import surface


@pytest.mark.parametrize("api", list(surface.APIS))
def test_every_member_of_the_api_has_an_entry(api):
    offered = set(surface.members(api))
    listed = {
        entry.member
        for entry in surface.ENTRIES
        if entry.api == api and entry.offered_by(torch_version())
    }
    assert not offered - listed, (
        f"{api} has {sorted(offered - listed)} on torch {torch_version()}, and the surface "
        "table (ddp_verify/conformance/surface.py) has no entry for them: add each, with the "
        "tests that exercise it, or why it is out of scope, or as a gap"
    )
    assert not listed - offered, (
        f"the surface table lists {sorted(listed - offered)} of {api}, which torch "
        f"{torch_version()} does not have: drop the entries, or bound them by version"
    )


def test_every_test_an_entry_claims_is_in_the_suite():
    missing = []
    for entry in surface.ENTRIES:
        for test in entry.tests:
            module, _, name = test.partition("::")
            found = importlib.import_module(f"ddp_verify.conformance.{module}")
            if not callable(getattr(found, name, None)):
                missing.append(f"{entry.api} {entry.member}: {test}")
    assert not missing, "entries name tests the suite does not hold: " + "; ".join(missing)


def test_every_entry_says_how_it_stands():
    for entry in surface.ENTRIES:
        assert entry.status in (surface.COVERED, surface.GAP, surface.OUT), entry
        if entry.status == surface.COVERED:
            assert entry.tests, f"{entry} is covered by no test"
        else:
            assert entry.why and not entry.tests, f"{entry} must say why, and claim no test"
    keys = [(entry.api, entry.member) for entry in surface.ENTRIES]
    assert len(keys) == len(set(keys)), "an entry is listed twice"


def torch_version() -> str:
    import torch

    return torch.__version__
