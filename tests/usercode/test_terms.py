"""Objectives of several terms from the front door: each term's values handed to a loss-agg
plug-in by the parameter its name says (or ``--bind PARAM=term:NAME``); code that weighs
every term as declared is equivalent; code that does not is named term by term, with the
factor it counts at; what cannot run is refused before any world."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_verify import EquivalenceError, check
from ddp_verify.usercode.kinds import KindError, check_signature, term_binds
from tests.frontends.in_process import ddp_verify_here
from tests.user_code import load

ROOT = Path(__file__).resolve().parents[2]
TERMS = load("term_aggregations")
DECLARED = TERMS.DECLARED
RUN = {"kind": "loss-agg", "world_size": 2, "max_examples": 20, "seed": 0}


def test_term_values_are_bound_by_the_parameters_their_names_say():
    bound = term_binds(TERMS.right, "loss-agg", None, DECLARED)
    assert [b.text() for b in bound] == ["kl=term:kl", "aux=term:aux", "routed=term:routed"]
    call = check_signature(TERMS.right, "loss-agg", bind=bound)
    assert "kl=<the objective's kl>" in call.describe()
    # A binding the user gave wins; one objective binds nothing.
    given = term_binds(TERMS.right, "loss-agg", ["kl=term:kl", "world_size=2"], DECLARED)
    assert [b.text() for b in given] == [
        "kl=term:kl", "world_size=2", "aux=term:aux", "routed=term:routed",
    ]  # fmt: skip
    assert term_binds(TERMS.right, "loss-agg", None, "token-mean") is None


def test_a_term_per_micro_batch_may_come_as_its_value_there():
    # A router's auxiliary loss as the model returns it: one value per micro-batch, its
    # routed mask then not needed.
    def moe(loss_mat, loss_mask, aux_loss, global_tokens):
        return loss_mat.sum()

    declared = "token-mean(loss) + 0.01*token-mean@micro(aux[routed])"
    bound = term_binds(moe, "loss-agg", ["aux_loss=term:aux.value"], declared)
    assert [b.text() for b in bound] == ["aux_loss=term:aux.value"]
    described = check_signature(moe, "loss-agg", bind=bound).describe()
    assert "aux_loss=<the objective's aux's value on the micro-batch>" in described
    with pytest.raises(KindError, match="which kl is not in"):
        term_binds(TERMS.right, "loss-agg", ["kl=term:kl.value"], DECLARED)


def test_code_without_a_terms_parameter_is_told_how_to_bind_it():
    with pytest.raises(KindError, match=r"takes no parameter 'kl'.*PARAMETER=term:kl"):
        term_binds(TERMS.takes_no_kl, "loss-agg", None, DECLARED)
    with pytest.raises(KindError, match="global_tokens, which the code is handed already"):
        term_binds(TERMS.right, "loss-agg", None, "token-mean(loss) + sum(global_tokens)")
    with pytest.raises(KindError, match="a loss-fn plug-in is handed one loss"):
        term_binds(TERMS.right, "loss-fn", None, DECLARED)


def test_code_weighing_every_term_as_declared_is_equivalent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check(TERMS.right, objective=DECLARED, **RUN).examples == 20
    renamed = {"kl_values": "term:kl", "aux_values": "term:aux", "routed_mask": "term:routed"}
    verdict = check(TERMS.right_under_other_names, objective=DECLARED, bind=renamed, **RUN)
    assert verdict.examples == 20


@pytest.mark.parametrize(
    ("name", "says", "factor"),
    [
        ("penalty_sign_flipped", "the kl term counts -1x its declared weight 0.1", -1.0),
        ("penalty_left_out", "the kl term is left out", 0.0),
    ],
)
def test_a_term_weighed_otherwise_is_named_with_its_factor(
    name, says, factor, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivalenceError) as caught:
        check(getattr(TERMS, name), objective=DECLARED, **RUN)
    first = caught.value.causes[0]
    assert first.pattern == "objective:term", caught.value.cause
    assert says in first.text
    # Only the term that is wrong is named: the others count as declared.
    assert "the aux term" not in first.text and "the loss term" not in first.text
    assert "reproduces every rank's gradients and parameters" in first.evidence
    reproducer = (tmp_path / caught.value.reproducer).read_text()
    assert DECLARED in reproducer


def test_the_command_line_takes_terms_and_refuses_what_cannot_run():
    target = "fixtures/term_aggregations.py"
    run = ddp_verify_here(
        "check", f"{target}:penalty_sign_flipped", "--kind", "loss-agg", "--objective", DECLARED,
        "--world-size", "2", "--max-examples", "20", "--seed", "0", "--json", cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    document = json.loads(run.stdout)
    assert document["likely_causes"][0]["pattern"] == "objective:term"
    missing = ddp_verify_here(
        "check", f"{target}:takes_no_kl", "--kind", "loss-agg", "--objective", DECLARED,
        "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert missing.returncode == 2 and "--bind PARAMETER=term:kl" in missing.stderr
    bad = ddp_verify_here(
        "check", f"{target}:right", "--kind", "loss-agg", "--objective", "token-mean(loss) + kl",
        "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == 2 and "cannot read a term" in bad.stderr
    other_kind = ddp_verify_here(
        "check", "fixtures/grad_sync.py:average_gradients", "--kind", "grad-sync",
        "--objective", DECLARED, "--world-size", "2", cwd=ROOT,
    )  # fmt: skip
    assert other_kind.returncode == 2 and "loss-agg" in other_kind.stderr
