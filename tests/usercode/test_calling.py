"""The calling convention: the count goes to a parameter without a default or one named for a
count, never to an optional flag; what cannot be decided is a usage error that says how to
resolve it. No world needed: the signature is read before anything starts."""

from __future__ import annotations

import re

import pytest

from ddp_verify.usercode.kinds import KindError, check_signature, is_count_name


def megatron(model, reduce_after=True, fp32_allreduce=False): ...


def deepspeed(model, grads=None, elements_per_buffer=500_000_000): ...


def deepspeed_unbound(grads=None, elements_per_buffer=500_000_000): ...


def optional_model(model=None): ...


def positional(model, num_samples): ...


def renamed(model, weight): ...


def keyword_only(model, *, num_tokens): ...


def optional_count(model, num_items_in_batch=None, group=None): ...


def ambiguous(model, group, num_samples=None): ...


def two_counts(model, num_samples=None, batch_size=None): ...


def too_many(model, a, b): ...


def timm_reduce_tensor(tensor, n, average=True): ...


def fairseq_all_reduce_dict(data, device, group): ...


def hf_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100): ...


def loss_without_count(loss): ...


def loss_helper(loss, num_tokens=None, average=True): ...


@pytest.mark.parametrize(
    ("fn", "kind", "call", "args", "kwargs"),
    [
        (megatron, "grad-sync", "megatron(model)", ("m",), {}),
        (deepspeed, "grad-sync", "deepspeed(model)", ("m",), {}),
        (positional, "grad-sync", "positional(model, num_samples=<", ("m", 7), {}),
        (keyword_only, "grad-sync", "keyword_only(model, num_tokens=<", ("m",), {"num_tokens": 7}),
        (
            optional_count,
            "grad-sync",
            "optional_count(model, num_items_in_batch=<",
            ("m",),
            {"num_items_in_batch": 7},
        ),
        (loss_without_count, "loss", "loss_without_count(local_loss)", ("m",), {}),
        (loss_helper, "loss", "loss_helper(local_loss, num_tokens=<", ("m",), {"num_tokens": 7}),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_the_count_goes_only_where_the_signature_asks_for_it(fn, kind, call, args, kwargs):
    plan = check_signature(fn, kind)
    assert plan.describe().startswith(call)
    assert plan.arguments(("m",), 7) == (args, kwargs)


def test_an_optional_flag_is_never_filled_by_position():
    # Megatron's allreduce_params(reduce_after=True, ...) got reduce_after=num_samples, and a
    # bucketed helper got the count as its bucket size, so ranks bucketed differently and hung.
    for fn in (megatron, deepspeed):
        args, kwargs = check_signature(fn, "grad-sync").arguments(("model",), 123)
        assert args == ("model",) and kwargs == {}


def test_two_optional_counts_are_a_usage_error_whose_fix_runs():
    with pytest.raises(KindError) as caught:
        check_signature(two_counts, "grad-sync")
    message = str(caught.value)
    assert "could go to any of 'num_samples', 'batch_size'" in message
    fix = message[message.index("lambda model, count:") :]
    resolved = eval(fix)  # the suggested function, as written, takes what the harness passes
    assert check_signature(resolved, "grad-sync").count_positional


@pytest.mark.parametrize("fn", [renamed, too_many, timm_reduce_tensor], ids=lambda f: f.__name__)
def test_a_required_parameter_that_says_nothing_is_never_guessed(fn):
    # timm passes the world size as reduce_tensor(tensor, n): filling n with a count would be
    # a guess, and a wrong one. The error names every such parameter and the bindings that
    # fit, and each suggested binding, as written, makes the signature usable.
    kind = "reduce" if fn is timm_reduce_tensor else "grad-sync"
    with pytest.raises(KindError, match="never guesses") as caught:
        check_signature(fn, kind)
    message = str(caught.value)
    unsaid = [p for p in ("weight", "a", "b", "n") if f"'{p}'" in message]
    assert unsaid, message
    for parameter in unsaid:
        assert f"bind='{parameter}=world_size'" in message
        assert f"bind='{parameter}=count'" in message
    binds = [f"{p}=world_size" for p in unsaid]
    call = check_signature(fn, kind, bind=binds)
    values = {"world_size": 4}
    assert call.arguments(("m",), 7, values=values) == (("m",), {p: 4 for p in unsaid})


def test_what_a_binding_names_reaches_the_parameter():
    call = check_signature(timm_reduce_tensor, "reduce", bind={"n": "world_size", "average": False})
    assert call.describe() == "timm_reduce_tensor(tensor, n=<the number of ranks>, average=False)"
    assert call.arguments(("t",), 7, values={"world_size": 3}) == (
        ("t",),
        {"n": 3, "average": False},
    )
    # From the command line: NAME=VALUE, VALUE a known name or a Python literal.
    text = check_signature(timm_reduce_tensor, "reduce", bind=["n=count", "average='no'"])
    assert text.arguments(("t",), 7) == (("t",), {"n": 7, "average": "no"})


@pytest.mark.parametrize(
    ("bind", "words"),
    [
        (["n"], "a binding is NAME=VALUE"),
        (["n=world size"], "neither a value the harness knows"),
        (["k=world_size"], "has no parameter 'k' to bind; its parameters are tensor, n, average"),
        (["tensor=count"], "'tensor' is what the harness passes as the tensor"),
    ],
)
def test_a_binding_that_cannot_be_is_a_usage_error(bind, words):
    with pytest.raises(KindError, match=re.escape(words)):
        check_signature(timm_reduce_tensor, "reduce", bind=bind)


def test_parameters_whose_names_say_what_they_are_are_bound_without_asking():
    # fairseq's all_reduce_dict(data, device, group); HF's ForCausalLMLoss(logits, labels,
    # vocab_size, num_items_in_batch=None, ...): each parameter's name says what it gets.
    call = check_signature(fairseq_all_reduce_dict, "reduce-dict")
    assert call.describe() == (
        "fairseq_all_reduce_dict(metrics, device=<the rank's device>, "
        "group=<the world's process group>)"
    )
    lm = check_signature(hf_causal_lm_loss, "loss-fn")
    assert lm.count_keyword == "num_items_in_batch"
    values = {"vocab_size": 7, "device": "cpu", "group": None}
    assert lm.arguments(("x", "y"), 9, values=values) == (
        ("x", "y"),
        {"num_items_in_batch": 9, "vocab_size": 7},
    )
    # A group named so, required, is the world's; the count still goes to the named count.
    assert check_signature(ambiguous, "grad-sync").count_keyword == "num_samples"


def test_an_optional_first_parameter_is_not_filled_with_the_model():
    # DeepSpeed's buffered_allreduce_fallback(grads=None, ...) named directly: its first
    # parameter is optional and not a model; one that is called model still is.
    with pytest.raises(KindError, match="its first parameter 'grads' is optional") as caught:
        check_signature(deepspeed_unbound, "grad-sync")
    assert "lambda model: deepspeed_unbound(grads=<from model>)" in str(caught.value)
    assert check_signature(optional_model, "grad-sync").describe() == "optional_model(model)"


def test_count_names():
    for name in (
        "num_samples",
        "num_items_in_batch",
        "num_tokens",
        "batch_size",
        "n_items",
        "token_count",
        "ntokens",
    ):
        assert is_count_name(name), name
    for name in (
        "reduce_after",
        "elements_per_buffer",
        "group",
        "fp32_allreduce",
        "average",
        "n",  # timm's reduce_tensor(tensor, n) takes the world size
        "num_gpus",
        "num_classes",
        "n_replicas",
    ):
        assert not is_count_name(name), name


def test_a_trainer_loss_gets_the_global_count_by_its_name():
    from tests.user_code import load

    losses = load("real_style/trainer_losses")
    call = check_signature(losses.fixed_cross_entropy, "loss-fn")
    assert call.count_keyword == "num_items_in_batch" and call.positional == 2
    assert call.describe() == (
        "fixed_cross_entropy(logits, labels, num_items_in_batch=<the step's loss items, every "
        "micro-batch of every rank>)"
    )
    assert not check_signature(losses.mean_cross_entropy, "loss-fn").takes_count


def test_a_count_of_samples_and_one_of_tokens_each_go_where_named():
    def sync(model, num_samples, num_tokens): ...

    call = check_signature(sync, "grad-sync")
    assert call.arguments(("m",), 7, samples=2) == (("m",), {"num_tokens": 7, "num_samples": 2})


def test_a_loss_fn_that_returns_a_number_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from ddp_verify import check

    with pytest.raises(KindError, match="one-element tensor that backpropagates"):
        check(lambda logits, labels: 1.0, kind="loss-fn", world_size=2, max_examples=2, seed=0)


def _step_told_the_world_size(ddp_model, optimizer, micro_batches, loss_fn, world_size):
    # A step that needs the world size (its name says so): DDP averages over ranks, so the
    # loss is weighted by the step's share times world_size, as accumulate_with_no_sync does.
    import torch
    import torch.distributed as dist

    assert world_size == dist.get_world_size()
    optimizer.zero_grad()
    local = float(sum(len(x) for x, _ in micro_batches))
    total = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(total)
    reported = 0.0
    for x, y in micro_batches:
        loss = loss_fn(ddp_model(x), y)
        (loss * len(x) * world_size / total.item()).backward()
        reported += loss.item() * len(x)
    optimizer.step()
    summed = torch.tensor([reported], dtype=torch.float64)
    dist.all_reduce(summed)
    return summed.item() / total.item()


def test_a_step_gets_what_its_parameters_are_bound_to(tmp_path, monkeypatch):
    # Steps are called with their four arguments; what is bound (by name, or by the user)
    # is added on the rank, and what a step cannot be given is a usage error.
    monkeypatch.chdir(tmp_path)
    from ddp_verify import check

    verdict = check(
        _step_told_the_world_size,
        kind="wrapped-step",
        world_size=2,
        max_examples=5,
        seed=0,
        max_micro_batches=1,
    )
    assert verdict.call.endswith("world_size=<the number of ranks>)")
    with pytest.raises(KindError, match="bound to count, which a wrapped-step plug-in is not"):
        check(_step_told_the_world_size, kind="wrapped-step", world_size=2, bind="world_size=count")
