"""Every fixture gets the verdict it expects, through check() on a real world."""

from __future__ import annotations

import pytest
from hypothesis import settings

from ddp_verify import EquivalenceError, check
from ddp_verify.usercode.findings import finding
from tests.user_code import FIXTURES, load
from tests.usercode.patterns import NUMERIC, weights_show

KINDS = {
    "grad_sync": "grad-sync",
    "loss": "loss",
    "step": "step",
    "comm_hook": "comm-hook",
    "wrapper": "wrapper",
}


# fixtures/real_style/: code in the styles of real training codebases, one kind per file.
REAL_STYLE = sorted(p.stem for p in (FIXTURES / "real_style").glob("*.py"))

CASES = [
    pytest.param(KINDS[stem], getattr(module, name), verdict, cause, id=f"{stem}.{name}")
    for stem in KINDS
    for module in [load(stem)]
    for name, (verdict, cause) in module.EXPECTED.items()
] + [
    pytest.param(module.KIND, getattr(module, name), verdict, cause, id=f"real_style.{name}")
    for stem in REAL_STYLE
    for module in [load(f"real_style/{stem}")]
    for name, (verdict, cause) in module.EXPECTED.items()
]
# A file's HOOK_STATE (a comm hook's state factory), LOSS_REDUCTION (the loss_fn its step
# functions are written for) and BIND (parameters bound by name) are check() options for its
# fixtures; SCENARIO_BOUNDS are the scenarios it is written for (token-level losses, say).
# LOGITS, LABELS, TENSORS and BATCHES say the layout its functions are written for: never
# passed, the probe must find it (and the verdict's layout must say it).
FILE_OPTIONS = (
    ("hook_state", "HOOK_STATE"),
    ("loss_reduction", "LOSS_REDUCTION"),
    ("bind", "BIND"),
)
LAYOUT_AXES = (
    ("logits", "LOGITS"),
    ("labels", "LABELS"),
    ("tensors", "TENSORS"),
    ("batches", "BATCHES"),
)


def _attributes(module, pairs) -> dict:
    """``{key: module.ATTRIBUTE}`` for each ``(key, ATTRIBUTE)`` of ``pairs`` it has."""
    return {key: getattr(module, attr) for key, attr in pairs if hasattr(module, attr)}


def _per_function(values) -> dict:
    """``values(module)`` for each real-style fixture function, by its id."""
    return {
        id(getattr(module, name)): values(module)
        for stem in REAL_STYLE
        for module in [load(f"real_style/{stem}")]
        for name in module.EXPECTED
    }


LAYOUTS = _per_function(lambda module: _attributes(module, LAYOUT_AXES))
OPTIONS = _per_function(
    lambda module: {
        **_attributes(module, FILE_OPTIONS),
        **getattr(module, "SCENARIO_BOUNDS", {}),
    }
)


# What the fitted weights must show, per buggy fixture that says (EXPECTED_PATTERNS).
def _by_function(attribute: str) -> dict:
    """Each real-style file's ``attribute`` (a dict keyed by function name), by function."""
    return {
        id(getattr(module, name)): value
        for stem in REAL_STYLE
        for module in [load(f"real_style/{stem}")]
        for name, value in getattr(module, attribute, {}).items()
    }


PATTERNS = _by_function("EXPECTED_PATTERNS")


def assert_patterns(fn, error) -> None:
    """Every finding the fixture expects is among the causes, and where a pattern has a
    numeric meaning, the cause's own fitted weights show it."""
    found = {c.pattern: c for c in error.causes}
    # Every cause speaks the one vocabulary, whether a fit or a simulation found it.
    for code in found:
        finding(code)
    for wanted in PATTERNS.get(id(fn), ()):
        present = [p for p in wanted.split("|") if p in found]
        assert present, f"none of {wanted} among the causes {[c.pattern for c in error.causes]}"
        cause = found[present[0]]
        if cause.pattern in NUMERIC and cause.weights:
            scenario = error.scenario
            assert weights_show(
                cause.pattern, list(cause.weights), scenario.world_size, scenario.dtype
            ), (
                cause.pattern,
                cause.weights,
            )


# A layout pinned per function (PINNED): code whose mistake is a layout only the user can
# declare (a loss that forgets to shift labels it is told come unshifted).
PINNED = {fn: {"layout": layout} for fn, layout in _by_function("PINNED").items()}
# check() options declared per function (DECLARED): the objective a loss aggregation is
# written for, the trainer's division it runs under, a literal bound (a constant).
DECLARED = _by_function("DECLARED")


def options(fn) -> dict:
    return {**OPTIONS.get(id(fn), {}), **PINNED.get(id(fn), {}), **DECLARED.get(id(fn), {})}


def assert_layout_found(fn, verdict) -> None:
    """The layout the fixture's file says its code is written for is the one the probe
    chose (no layout option was passed), as the verdict's pins say."""
    expected = LAYOUTS.get(id(fn), {})
    if not expected or id(fn) in PINNED:
        return
    assert verdict.layout, f"no layout was probed for {fn.__name__}"
    pinned = verdict.layout.splitlines()[0].rpartition("(pin it: ")[2]
    for axis, value in expected.items():
        said = f"{axis}={value!r}" if axis in ("logits", "labels") else f"{axis}={value}"
        assert said in pinned, f"{fn.__name__} written for {axis}={value}: {verdict.layout}"


# Correct code is tried on twice the active hypothesis profile's examples (50 under "ci", the
# default; 1000 under "heavy", for release checks): a false alarm needs many tries to show.
EXAMPLES = 2 * settings.default.max_examples
BUGGY = [case for case in CASES if case.values[2] == "not equivalent"]
# The file each fixture comes from.
FILE_OF = {
    id(getattr(module, name)): stem
    for stem, module in [(s, load(s)) for s in KINDS]
    + [(f"real_style/{s}", load(f"real_style/{s}")) for s in REAL_STYLE]
    for name in module.EXPECTED
}


def _marked(case, *marks):
    """``case`` with ``marks`` added to its own."""
    return pytest.param(*case.values, id=case.id, marks=[*case.marks, *marks])


# The kinds whose float32 bound is measured in a way of its own: runs of the ranks' method
# (grad-sync), over token-level losses (loss-agg), of the code on one rank holding the whole
# batch (coupled-loss). The other kinds' re-checks take grad-sync's path.
FLOAT32_PATHS = ("grad-sync", "loss-agg", "coupled-loss")


def first_of_each_file(cases: list, ci_kinds: tuple[str, ...] | None = None) -> list:
    """Under the "heavy" profile every case; under "ci" the first of each fixture file, so
    every file's style is re-checked, and of those only the first of each kind (of each of
    ``ci_kinds``, when given) runs in a plain ``pytest`` (CI's time budget): the others are
    marked ``slow`` (``tox -e slow``)."""
    if settings.default.max_examples >= 100:
        return cases
    files: set[str] = set()
    kinds: set[str] = set()
    chosen = []
    for case in cases:
        stem, kind = FILE_OF[id(case.values[1])], case.values[0]
        if stem in files:
            continue
        files.add(stem)
        if kind in kinds or (ci_kinds is not None and kind not in ci_kinds):
            case = _marked(case, pytest.mark.slow)
        kinds.add(kind)
        chosen.append(case)
    return chosen


def one_per_path(cases: list) -> list:
    """Under the "heavy" profile every case runs; under "ci" a case runs in a plain ``pytest``
    when it is the first of its kind with its verdict, the first to expect its cause (each of
    the diagnosis's causes once) or the first written for its layout (each layout probed
    once); the others, the same paths in other codebases' styles, are marked ``slow`` (``tox
    -e slow``): CI's time budget."""
    if settings.default.max_examples >= 100:
        return cases
    seen: set[tuple] = set()
    chosen = []
    for case in cases:
        kind, fn, verdict, cause = case.values
        paths = {
            (kind, verdict),
            ("layout", tuple(sorted(LAYOUTS.get(id(fn), {}).items()))),
            *([("cause", cause)] if verdict != "equivalent" else []),
        }
        if paths <= seen:
            case = _marked(case, pytest.mark.slow)
        seen |= paths
        chosen.append(case)
    return chosen


@pytest.mark.parametrize(("kind", "fn", "verdict", "cause"), one_per_path(CASES))
def test_fixture_verdict_and_cause(kind, fn, verdict, cause, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # reproducers are written under the working directory
    if verdict == "equivalent":
        result = check(fn, kind=kind, world_size=2, max_examples=EXAMPLES, seed=0, **options(fn))
        assert result.examples == EXAMPLES  # every example tried, none a counterexample
        assert_layout_found(fn, result)
        return
    with pytest.raises(EquivalenceError) as info:
        check(fn, kind=kind, world_size=2, max_examples=25, seed=0, **options(fn))
    error = info.value
    assert error.scenario is not None
    assert error.found_at is not None and error.found_at <= 25
    report = str(error)
    assert "is not equivalent to single-process full-batch training" in report
    if cause is not None:
        assert cause in error.cause, f"likely cause {error.cause!r} does not name {cause!r}"
    assert_patterns(fn, error)
    assert_layout_found(fn, error.verdict)
    assert f"Likely cause: {error.cause}" in report
    assert (tmp_path / error.reproducer).is_file()
    assert f"Reproducer: python {error.reproducer}" in report


# Known gaps of the diagnosis in float32, found by `tox -e slow` on 2026-11-29 (the verdict
# is right in each; what it says is not yet): strict, so a fix shows as an unexpected pass.
# None now: two were weights the float32 run's rounding left undetermined, one a layout left
# unprobed where the check allowed no float64.
FLOAT32_GAPS: dict[str, str] = {}


def _known_gaps(cases: list) -> list:
    return [
        _marked(case, pytest.mark.xfail(strict=True, reason=FLOAT32_GAPS[case.id]))
        if case.id in FLOAT32_GAPS
        else case
        for case in cases
    ]


@pytest.mark.parametrize(
    ("kind", "fn", "verdict", "cause"), _known_gaps(first_of_each_file(BUGGY, FLOAT32_PATHS))
)
def test_buggy_fixtures_are_caught_in_float32_too(kind, fn, verdict, cause, tmp_path, monkeypatch):
    # float32's bound is measured per scenario: it must stay far below what bugs do.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as info:
        check(
            fn, kind=kind, world_size=2, max_examples=25, seed=0, dtypes=("float32",), **options(fn)
        )
    assert info.value.scenario.dtype == "float32"
    if cause is not None:
        assert cause in info.value.cause, f"cause {info.value.cause!r} does not name {cause!r}"
    assert_patterns(fn, info.value)


@pytest.mark.parametrize(
    ("kind", "fn", "verdict", "cause"),
    first_of_each_file([c for c in BUGGY if c.values[0] == "grad-sync"]),
)
def test_grad_sync_bugs_are_caught_in_bfloat16_with_their_cause(
    kind, fn, verdict, cause, tmp_path, monkeypatch
):
    # bfloat16 keeps 8 bits: its bound is wide, and the diagnosis matches at its precision
    # (benchmarks/float32_sweep.py --dtype bfloat16 runs every buggy fixture).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as info:
        check(
            fn,
            kind=kind,
            world_size=2,
            max_examples=50,
            seed=0,
            dtypes=("bfloat16",),
            **options(fn),
        )
    assert info.value.scenario.dtype == "bfloat16"
    if cause is not None:
        assert cause in info.value.cause, f"cause {info.value.cause!r} does not name {cause!r}"
    assert_patterns(fn, info.value)


def test_there_are_fixtures_of_every_kind_both_correct_and_buggy():
    by_kind: dict[str, set[str]] = {}
    for param in CASES:
        kind, _, verdict, _ = param.values
        by_kind.setdefault(kind, set()).add(verdict)
    from ddp_verify.usercode.kinds import KINDS as ALL_KINDS

    assert set(by_kind) == set(ALL_KINDS)  # every kind has correct and buggy fixtures
    assert all(v == {"equivalent", "not equivalent"} for v in by_kind.values())
    assert len([c for c in CASES if c.id.startswith("real_style.")]) >= 4
