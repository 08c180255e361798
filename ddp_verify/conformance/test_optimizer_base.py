"""``torch.optim.Optimizer``'s own contract, which every optimizer inherits: ``state_dict`` packs
the state by parameter index in group order (and names, where the optimizer was given named
parameters), ``load_state_dict`` into an optimizer over other tensors of the same shapes
continues exactly as the uninterrupted one would (its state cast to the parameters' dtype, the
step count kept, never rounded to theirs, in the precision torch gives it), and refuses a state
of other groups or group sizes; ``add_param_group`` fills a new group's settings from the
defaults and trains it by its own; ``zero_grad`` drops or zeroes gradients as asked; every
documented refusal of parameters is made; and its step and state-dict hooks fire in the
documented order (``prepend``) and hand on what they return. A resumed optimizer that continues
differently trains something else, on every rank alike."""

from __future__ import annotations

import io
import re
import warnings
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from ddp_verify.conformance.implementations import IMPLEMENTATIONS

SHAPES = ((3, 2), (2,), (1,))
OPTIMIZERS: dict[str, Any] = {
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=0.1, momentum=0.9, **kw),
    "adam": lambda params, **kw: torch.optim.Adam(params, lr=0.05, **kw),
    "adamw": lambda params, **kw: torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, **kw),
}


def _params(seed: int, dtype: torch.dtype = torch.float64) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=generator, dtype=torch.float64).to(dtype))
            for s in SHAPES]  # fmt: skip


def _groups(params: list[torch.nn.Parameter], split: bool) -> list[dict[str, Any]]:
    """One group, or two (the second with its own learning rate)."""
    if not split:
        return [{"params": params}]
    return [{"params": params[:1]}, {"params": params[1:], "lr": 0.02}]


def _step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, k: int) -> None:
    optimizer.zero_grad()
    loss = sum(((p.double() - 0.1 * k) ** 2).sum() * (i + 1) for i, p in enumerate(params))
    loss.backward()
    optimizer.step()


def test_a_loaded_state_continues_as_the_uninterrupted_optimizer(prove):
    def check(case: tuple[str, bool, int, int, bool]) -> None:
        name, split, before, after, foreach = case
        make = OPTIMIZERS[name]
        kept = _params(0)
        uninterrupted = make(_groups(kept, split), foreach=foreach)
        for k in range(before):
            _step(kept, uninterrupted, k)
        # Through a checkpoint, as a resumed run gets it: state_dict() hands out the state's
        # own tensors, which the uninterrupted optimizer goes on updating in place.
        buffer = io.BytesIO()
        torch.save(uninterrupted.state_dict(), buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
        # Another set of tensors, at the values reached, as a restarted process would build.
        resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in kept]
        resumed = make(_groups(resumed_params, split), foreach=foreach)
        resumed.load_state_dict(saved)
        for k in range(before, before + after):
            _step(kept, uninterrupted, k)
            _step(resumed_params, resumed, k)
        for i, (a, b) in enumerate(zip(kept, resumed_params, strict=True)):
            assert torch.equal(a, b), (
                f"{name} (groups split: {split}, foreach {foreach}) resumed after {before} "
                f"steps: parameter {i} differs after {after} more: {b.tolist()} against the "
                f"uninterrupted {a.tolist()}"
            )

    prove(
        st.tuples(
            st.sampled_from(sorted(OPTIMIZERS)),
            st.booleans(),
            st.integers(1, 3),
            st.integers(1, 3),
            st.booleans(),
        ),
        check,
    )


def test_the_state_dict_is_packed_by_index_in_group_order():
    params = _params(1)
    optimizer = torch.optim.Adam(_groups(params, split=True), lr=0.05)
    _step(params, optimizer, 0)
    saved = optimizer.state_dict()
    assert [g["params"] for g in saved["param_groups"]] == [[0], [1, 2]]
    assert [g["lr"] for g in saved["param_groups"]] == [0.05, 0.02]
    assert sorted(saved["state"]) == [0, 1, 2]
    for index, p in enumerate(params):
        state = saved["state"][index]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}, state
        assert float(state["step"]) == 1.0
        # After one step from zero moments: exp_avg = (1 - beta1) * gradient.
        assert torch.allclose(state["exp_avg"], 0.1 * p.grad, rtol=1e-12, atol=0)


def test_named_parameters_are_kept_by_name_in_the_state_dict():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1)
    saved = optimizer.state_dict()
    if "param_names" not in saved["param_groups"][0]:
        pytest.skip(f"torch {torch.__version__} keeps no parameter names in the state dict")
    names = [name for name, _ in model.named_parameters()]
    assert saved["param_groups"][0]["param_names"] == names, saved["param_groups"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_loaded_state_takes_the_parameters_dtype(dtype):
    source = _params(2)
    optimizer = torch.optim.Adam(source, lr=0.05)
    _step(source, optimizer, 0)
    target = _params(2, dtype)
    loaded = torch.optim.Adam(target, lr=0.05)
    loaded.load_state_dict(optimizer.state_dict())
    for p in target:
        state = loaded.state[p]
        assert state["exp_avg"].dtype == dtype and state["exp_avg_sq"].dtype == dtype, state
        # The step count is kept as it was saved (a float32 tensor on the CPU), not cast.
        assert float(state["step"]) == 1.0


def _adam(params: list[torch.nn.Parameter], implementation: str) -> torch.optim.Adam:
    try:
        return torch.optim.Adam(params, lr=0.05, **IMPLEMENTATIONS[implementation])
    except RuntimeError as error:  # a torch without a fused path for these parameters
        pytest.skip(f"torch {torch.__version__}: {error}")


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_the_step_count_is_kept_in_the_precision_torch_gives_it(default, implementation):
    # The count is a tensor of the default dtype (a float64 run counts in float64), except that
    # the fused kernels take theirs in float32 (the note "special device hosting for step").
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        params = _params(3, default)
        optimizer = _adam(params, implementation)
        _step(params, optimizer, 0)
    finally:
        torch.set_default_dtype(previous)
    expected = torch.float32 if implementation == "fused" else default
    for p in params:
        step = optimizer.state[p]["step"]
        assert (step.dtype, step.shape, float(step)) == (expected, (), 1.0), (default, step)


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_loaded_step_count_is_never_rounded_to_the_parameters_dtype(dtype, implementation):
    # pytorch#74424: a count cast to the parameters' bfloat16 turns 257 into 256 and the bias
    # corrections with it. Kept as saved (float64 here), unless fused, whose kernels take it
    # as float32 on the parameter's device, where loading puts it. (The saved groups' settings
    # are the ones loaded, "fused" among them: the state is saved by the same implementation.)
    source = _params(4)
    optimizer = _adam(source, implementation)
    _step(source, optimizer, 0)
    saved = optimizer.state_dict()
    for state in saved["state"].values():
        state["step"] = torch.tensor(257.0, dtype=torch.float64)
    loaded = _adam(_params(4, dtype), implementation)
    loaded.load_state_dict(saved)
    expected = torch.float32 if implementation == "fused" else torch.float64
    for p, state in loaded.state.items():
        step = state["step"]
        assert (step.dtype, step.device, float(step)) == (expected, p.device, 257.0), step
        assert state["exp_avg"].dtype == dtype, state["exp_avg"].dtype


def test_a_state_of_other_groups_is_refused():
    saved = torch.optim.SGD(_groups(_params(3), split=True), lr=0.1).state_dict()
    one_group = torch.optim.SGD(_groups(_params(3), split=False), lr=0.1)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        one_group.load_state_dict(saved)
    params = _params(3)
    other_sizes = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1)
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        other_sizes.load_state_dict(saved)


def test_an_added_group_takes_the_defaults_and_trains_by_its_own():
    first, second = _params(4)[:1], _params(5)[1:]
    optimizer = torch.optim.SGD(first, lr=0.1, momentum=0.5)
    optimizer.add_param_group({"params": second, "lr": 0.01})
    added = optimizer.param_groups[1]
    assert added["momentum"] == 0.5 and added["lr"] == 0.01, added
    before = [p.detach().clone() for p in second]
    for p in first + second:
        p.grad = torch.ones_like(p)
    optimizer.step()
    for p, was in zip(second, before, strict=True):
        assert torch.allclose(p, was - 0.01, rtol=0, atol=1e-15), (p, was)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_drops_or_zeroes_as_asked(set_to_none):
    params = _params(6)
    optimizer = torch.optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.zero_grad(set_to_none=set_to_none)
    for p in params:
        if set_to_none:
            assert p.grad is None, p.grad
        else:
            assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p)), p.grad


def _refusals() -> list[tuple[str, Any, type[BaseException], str]]:
    p, q = _params(7)[:2]
    leaf = torch.nn.Parameter(torch.ones(2))
    return [
        ("an empty parameter list", lambda: torch.optim.SGD([], lr=0.1), ValueError,
         "optimizer got an empty parameter list"),
        ("a tensor for the parameters", lambda: torch.optim.SGD(p, lr=0.1), TypeError,
         "should be an iterable of Tensors or dicts"),
        ("a group of a set of parameters", lambda: torch.optim.SGD([{"params": {p, q}}], lr=0.1),
         TypeError, "ordered collections"),
        ("a tensor that is not a leaf", lambda: torch.optim.SGD([leaf * 2], lr=0.1), ValueError,
         "can't optimize a non-leaf Tensor"),
        ("a parameter in two groups",
         lambda: torch.optim.SGD([{"params": [p]}, {"params": [p, q]}], lr=0.1), ValueError,
         "some parameters appear in more than one parameter group"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "error", "words"), [pytest.param(*rest, id=what) for what, *rest in _refusals()]
)
def test_every_documented_refusal_of_parameters_is_made(make, error, words):
    with pytest.raises(error, match=re.escape(words)):
        make()


@pytest.mark.parametrize("twice", [True, False])
def test_a_group_holding_a_parameter_twice_is_warned_of_and_no_other(twice):
    # A parameter listed twice in one group is stepped twice a step (pytorch#40967): torch
    # warns of it (an error to come), and of nothing in a group without one.
    p, q = _params(9)[:2]
    params = [p, q, p] if twice else [p, q]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.optim.SGD(params, lr=0.1)
    duplicates = [w for w in caught if "duplicate parameters" in str(w.message)]
    assert len(duplicates) == int(twice), [str(w.message) for w in caught]


# The hooks an optimizer takes with ``prepend``, by the name of their register_ method.
_PREPENDED = ("state_dict_pre", "state_dict_post", "load_state_dict_pre", "load_state_dict_post")


def _documented_order(hooks: list[tuple[bool, bool]]) -> list[int]:
    """The hooks registered in turn as ``(prepend, removed)``, in the order they fire: one
    registered with ``prepend=True`` before every hook registered so far, otherwise after
    them; a removed one not at all."""
    order: list[int] = []
    for index, (prepend, _) in enumerate(hooks):
        order.insert(0 if prepend else len(order), index)
    return [index for index in order if not hooks[index][1]]


def test_the_documented_order_of_hooks_fires_last_first():
    assert _documented_order([(False, False), (True, False), (False, True), (True, False)]) == [
        3,
        1,
        0,
    ]


def test_hooks_fire_in_the_documented_order_and_hand_on_what_they_return(prove):
    # register_{state_dict,load_state_dict}_{pre,post}_hook: prepend=True fires the hook before
    # every hook registered so far, otherwise after them; a removed handle's hook never fires;
    # the state dict a hook returns is what the next hook gets, then state_dict()'s caller or
    # the load. register_step_{pre,post}_hook: in the order registered; a pre hook's returned
    # (args, kwargs) are what the step, the next hooks and the post hooks get. A checkpoint
    # whose hooks run out of order (a rename before the migration it needs) loads another
    # state.
    hooks = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=3)
    steps = st.lists(st.booleans(), max_size=3)
    cases = st.fixed_dictionaries(
        {**{kind: hooks for kind in _PREPENDED}, "step_pre": steps, "step_post": steps}
    )

    def check(case: dict[str, Any]) -> None:
        params = _params(8)
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        fired: list[tuple[str, int]] = []

        def hook_of(kind: str, index: int) -> Any:
            def state_only(_optimizer: Any) -> None:
                fired.append((kind, index))

            def handed_on(_optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
                fired.append((kind, index))
                if kind == "state_dict_post":
                    return {**state, "handed": [*state.get("handed", []), index]}
                # What is loaded tells which hooks' returns it went through, in which order.
                groups = [{**g, "lr": g["lr"] * 10 + index + 1} for g in state["param_groups"]]
                return {**state, "param_groups": groups}

            return handed_on if kind in ("state_dict_post", "load_state_dict_pre") else state_only

        for kind in _PREPENDED:
            register = getattr(optimizer, f"register_{kind}_hook")
            handles = [
                register(hook_of(kind, index), prepend=prepend)
                for index, (prepend, _) in enumerate(case[kind])
            ]
            for handle, (_, removed) in zip(handles, case[kind], strict=True):
                if removed:
                    handle.remove()

        def closure_of(value: float) -> Any:
            return lambda: torch.tensor(value)

        def step_pre(index: int, replaces: bool) -> Any:
            def hook(_optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                fired.append(("step_pre", index))
                # args as the hook is given them (the optimizer first), a new closure.
                return (args, {**kwargs, "closure": closure_of(float(index))}) if replaces else None

            return hook

        def step_post(index: int) -> Any:
            def hook(_optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                fired.append(("step_post", index))
                seen.append(float(kwargs["closure"]()))

            return hook

        seen: list[float] = []
        for index, replaces in enumerate(case["step_pre"]):
            optimizer.register_step_pre_hook(step_pre(index, replaces))
        for index, _ in enumerate(case["step_post"]):
            optimizer.register_step_post_hook(step_post(index))

        for p in params:
            p.grad = torch.ones_like(p)
        loss = optimizer.step(closure=closure_of(-1.0))
        replacing = [i for i, replaces in enumerate(case["step_pre"]) if replaces]
        closure_value = float(replacing[-1]) if replacing else -1.0
        assert loss is not None and float(loss) == closure_value, (
            f"step pre hooks {case['step_pre']} (True: returns a new closure): the step ran "
            f"the closure that returns {float(loss) if loss is not None else None}, not the "
            f"last one returned ({closure_value})"
        )
        assert seen == [closure_value] * len(case["step_post"]), (
            f"the step post hooks were given closures returning {seen}, not the step's "
            f"({closure_value})"
        )

        state = optimizer.state_dict()
        handed = _documented_order(case["state_dict_post"])
        assert state.get("handed", []) == handed, (
            f"state_dict post hooks {case['state_dict_post']} (prepend, removed): the state "
            f"dict went through hooks {state.get('handed', [])}, expected {handed}"
        )
        saved = {**state, "param_groups": [{**g, "lr": 0.0} for g in state["param_groups"]]}
        optimizer.load_state_dict(saved)
        lr = 0.0
        for index in _documented_order(case["load_state_dict_pre"]):
            lr = lr * 10 + index + 1
        assert optimizer.param_groups[0]["lr"] == lr, (
            f"load_state_dict pre hooks {case['load_state_dict_pre']} (prepend, removed): "
            f"loaded lr {optimizer.param_groups[0]['lr']}, which the hooks' returns in their "
            f"documented order make {lr}"
        )

        expected = [("step_pre", i) for i in range(len(case["step_pre"]))]
        expected += [("step_post", i) for i in range(len(case["step_post"]))]
        for kind in _PREPENDED:
            expected += [(kind, i) for i in _documented_order(case[kind])]
        assert fired == expected, (
            f"hooks {case} fired as {fired}, not in the documented order {expected}"
        )

    every_kind = {
        **{kind: [(False, False), (True, False), (False, False)] for kind in _PREPENDED},
        "step_pre": [True, False, True],
        "step_post": [False, False],
    }
    prove(cases, check, examples=[every_kind])
