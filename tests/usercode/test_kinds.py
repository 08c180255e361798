"""The plug-in kinds and the diagnosis's findings are data: a registry of Kind objects that the
adapters, the diagnosis and the command line read, and one vocabulary of findings. This walks
both, so that a new kind or finding that misses a piece fails here, not in a user's check."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from ddp_verify.engine.strategies import scenarios
from ddp_verify.engine.tolerances import by_roundoff
from ddp_verify.usercode import findings
from ddp_verify.usercode.adapters import ADAPTERS, adapt
from ddp_verify.usercode.diagnosis.evidence import MEASURED, tolerance
from ddp_verify.usercode.diagnosis.mistakes import FAMILIES, candidates
from ddp_verify.usercode.kinds import KIND, REGISTRY, KindError, check_signature, kinds_read_as


def _taking(n: int, lead: int | None = None):
    """A callable of ``n`` positional parameters, as a plug-in of that arity is: past the
    ``lead`` ones the harness passes first, a count named as one."""
    lead = n if lead is None else lead
    names = ", ".join([f"a{i}" for i in range(min(n, lead))] + ["num_items"] * (n > lead))
    namespace: dict = {}
    exec(f"def code({names}):\n    return None\n", namespace)
    return namespace["code"]


@pytest.mark.parametrize("kind", REGISTRY, ids=lambda k: k.name)
def test_every_kind_has_every_piece_the_harness_reads(kind):
    assert KIND[kind.name] is kind and kind.signature and kind.arities
    assert kind.adapter in ADAPTERS and kind.mistakes in FAMILIES
    # Its default bounds are bounds the scenarios take.
    scenarios(world_size=2, **kind.default_bounds)
    # Every mistake it can make is said in the one vocabulary.
    for mistake in candidates(kind.name):
        assert mistake.findings and all(findings.finding(code) for code in mistake.findings)
    # A callable of each arity it takes is called as the kind says, and adapts.
    lead = kind.lead if kind.counted_after else None
    for arity in kind.arities:
        call = check_signature(_taking(arity, lead), kind.name)
        assert call.kind is kind and call.takes_count == (lead is not None and arity > lead)
        assert call.describe().startswith("code(" + kind.parameters[0])
        method = adapt(_taking(arity, lead), kind.name)
        # The adapter's call is the same, shown with the shapes its options give.
        assert dataclasses.replace(method.call, shown=()) == call
        assert method.name.startswith(kind.name)


@pytest.mark.parametrize("kind", REGISTRY, ids=lambda k: k.name)
def test_an_option_applies_only_to_the_kinds_that_take_it(kind):
    code = _taking(kind.arities[-1], kind.lead if kind.counted_after else None)
    for option, value, takes in (
        ("logits", "2d", kind.adapter == "loss-fn"),
        ("labels", "unshifted", kind.adapter == "loss-fn"),
        ("hook_state", lambda: None, kind.hook_state),
        ("loss_reduction", "sum", kind.owns_micro_batches),
        ("result_on", "rank0", kind.result_on_rank0),
        ("ddp_wrapper", "torch.nn.parallel:DistributedDataParallel", kind.wrapped),
    ):
        if takes:
            adapt(code, kind.name, **{option: value})
        else:
            with pytest.raises(KindError, match="applies to"):
                adapt(code, kind.name, **{option: value})


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(KindError, match="unknown kind 'gradsync'; choose one of grad-sync, loss"):
        check_signature(lambda model: None, "gradsync")


def test_every_finding_has_one_code_and_words_that_fill():
    codes = [f.code for f in findings.every_finding()]
    assert len(codes) == len(set(codes))
    for finding in findings.every_finding():
        fields = {
            name for _, name, _, _ in __import__("string").Formatter().parse(finding.words) if name
        }
        filled = finding.cause(**{name: 1 for name in fields})
        assert (filled.pattern, filled.subject) == (finding.code, finding.subject)
        assert "{" not in filled.text


def test_thresholds_derive_from_the_unit_roundoff_where_none_was_measured():
    for field in ("close", "residual", "loss", "match_rtol", "match_atol"):
        measured = {d: getattr(t, field) for d, t in MEASURED.items()}
        assert {d: getattr(tolerance(d), field) for d in measured} == measured
        # float16 (u = 2^-11) lies between float32 (2^-24) and bfloat16 (2^-8).
        float16 = getattr(tolerance("float16"), field)
        assert measured["float32"] <= float16 <= measured["bfloat16"], field
    assert by_roundoff("float16", {"float32": 1.0, "bfloat16": 1.0}) == pytest.approx(1.0)


def test_the_command_line_offers_every_kind_of_the_registry():
    from ddp_verify.frontends.cli import UsageError, _parser

    for kind in KIND:
        assert _parser().parse_args(["check", "x.py:f", "--kind", kind]).kind == kind
    with pytest.raises(UsageError, match="invalid choice: 'gradsync'"):
        _parser().parse_args(["check", "x.py:f", "--kind", "gradsync"])


def _step(model, optimizer, micro_batches, loss_fn): ...


def _hook(state, bucket): ...


def _sync(model): ...


def _anonymous(a, b): ...


@pytest.mark.parametrize(
    "fn,checked_as,reads_as",
    [
        (_step, "grad-sync", ["step"]),  # its first name is grad-sync's too: more names win
        (_hook, "loss", ["comm-hook"]),
        (_sync, "loss", ["grad-sync"]),
        (_step, "step", []),
        # A wrapped step's model is often "model" (nanoGPT's): names do not tell these apart.
        (_step, "wrapped-step", []),
        (_sync, "grad-sync", []),
        (_anonymous, "comm-hook", []),  # names that say nothing say no kind
    ],
)
def test_a_callable_reads_as_the_kinds_its_parameter_names_say(fn, checked_as, reads_as):
    assert kinds_read_as(fn, checked_as) == reads_as


def test_a_signature_the_kind_cannot_take_names_the_kind_it_reads_as():
    with pytest.raises(KindError) as caught:
        check_signature(_step, "grad-sync")
    assert str(caught.value) == (
        "_step: its parameters (model, optimizer, micro_batches, loss_fn) read as "
        "kind='step' (fn(model, optimizer, micro_batches, loss_fn) -> tensor or float), not "
        "as a grad-sync plug-in (fn(model) or fn(model, num_samples)): check it with "
        "kind='step'"
    )


def _info_nce(features_a, features_b, temperature=0.5): ...
def _scaled(anchors, positives, scale: float = 20.0, loss_scale=None): ...
def _hard(q_reps, p_reps, hard_negatives): ...
def _optional_hard(q_reps, p_reps, hard_negatives=None, temperature=0.05): ...
def _views(*features, logit_scale=None): ...


@pytest.mark.parametrize(
    ("fn", "fewest", "most"),
    [(_info_nce, 2, 3), (_scaled, 2, 4), (_hard, 3, None), (_optional_hard, 2, 4)],
)
def test_a_parameter_with_a_default_is_left_to_it_not_taken_for_a_feature(fn, fewest, most):
    call = check_signature(fn, "coupled-loss")
    assert (call.positional, call.most_positional) == (fewest, most)
    assert call.describe().count("features") + call.describe().count("negatives") == fewest


def test_optional_negatives_are_passed_only_where_the_options_draw_them():
    from ddp_verify.usercode.coupled import check_feature_count

    optional = check_signature(_optional_hard, "coupled-loss")
    check_feature_count(optional, 0)
    check_feature_count(optional, 1)  # hard_negatives by position: it can take one
    with pytest.raises(KindError, match="takes 3 feature tensors"):
        check_feature_count(check_signature(_hard, "coupled-loss"), 0)
    # *features takes any number: as many as the kind passes at most, as before.
    assert check_signature(_views, "coupled-loss").positional == 5


def _sync(model, num_samples, scale): ...


@functools.wraps(_sync)
def _scaled(model, num_samples):
    return _sync(model, num_samples, scale=2)


@functools.wraps(_sync)
def _passing_through(*args, **kwargs):
    return _sync(*args, **kwargs)


def test_a_wrapper_is_read_as_it_will_be_called_never_as_the_function_it_wraps():
    # _scaled supplies scale itself: inspect.signature follows __wrapped__ to _sync's
    # (model, num_samples, scale), which would ask the user to bind scale.
    assert (
        check_signature(_scaled, "grad-sync")
        .describe()
        .endswith("(model, num_samples=<this rank's samples>)")
    )
    # A wrapper that only passes everything through takes what the wrapped function takes.
    with pytest.raises(KindError, match="'scale'"):
        check_signature(_passing_through, "grad-sync")
    # A partial's signature is what is left to fill.
    assert check_signature(functools.partial(_sync, scale=2), "grad-sync").takes_count


def test_a_kind_is_read_as_an_object_outside_the_module_that_defines_kinds():
    # Issue 61: kind travelled as a string, looked up again at each stop (KIND[kind]) and
    # branched on by adapter name (kind.adapter == "coupled-loss"); its rows say it now.
    import ast
    from pathlib import Path

    package = Path(KIND["step"].__class__.__module__.replace(".", "/")).parts[0]
    root = Path(__file__).resolve().parents[2] / package
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "kinds.py" and path.parent.name == "usercode":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            looked_up = (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "KIND"
            )
            branched = isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "adapter"
                for side in (node.left, *node.comparators)
            )
            if looked_up or branched:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, found
