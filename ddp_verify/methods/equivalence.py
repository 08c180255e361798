"""Is a method equivalent to single-process full-batch training on a scenario?

``assert_equivalent(world, method, scenario)`` trains the scenario with ``method`` on the
world's ranks while the world's helper process trains the reference (and derives the float32
tolerance), compares the traces here, and raises
:class:`~ddp_verify.engine.outcome.EquivalenceError` at the first divergence. The controller
builds no model and no optimizer, so it never imports what torch's optimizers pull in
(``torch._dynamo``, FSDP, sympy).

A measured bound (float32, bfloat16) is measured as far as the verdict needs: on one run in
the scenario's dtype first, on the reordered variants only when the ranks' result is outside
that run's bound (a bound only grows with the runs it is measured on, so the verdict is the
one all of them give).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from ..engine.compare import compare, prepare_comparison
from ..engine.oracle_terms import oracle_scenario
from ..engine.outcome import EquivalenceError, Outcome
from ..engine.reference import train_reference
from ..engine.scenario import Scenario
from ..engine.tolerances import (
    BRANCHING_VARIANTS,
    FLOAT32_VARIANTS,
    Float64Tolerance,
    MeasuredTolerance,
    Tolerance,
    TrainingOnly,
    TrainingOnlyMeasured,
    rounding_may_branch,
    rounding_variant,
)
from ..engine.trace import RankTrace, Trace
from ..world import RankError
from ..world.backends import DEVICE
from ..world.interface import Ranked
from ..world.naming import public
from .base import (
    DistributedMethod,
    Method,
    judged_by_own,
    train_on_rank,
    train_whole_variants,
)

__all__ = [
    "EquivalenceError",
    "HarnessError",
    "Outcome",
    "assert_equivalent",
    "check_equivalent",
]


@public
class HarnessError(RuntimeError):
    """The harness itself failed (the reference's process, say), not the code under test: never
    an :class:`~ddp_verify.EquivalenceError`, so a test that expects one does not pass on it.

    Example::

        >>> from ddp_verify import EquivalenceError
        >>> issubclass(HarnessError, EquivalenceError), issubclass(HarnessError, AssertionError)
        (False, False)
    """


# How a report names the reference of code judged against itself on one rank.
OWN_REFERENCE = "reference (your code on one rank, the whole batch in one micro-batch)"


def check_equivalent(
    world: Ranked | None,
    method: Method,
    scenario: Scenario,
    *,
    tolerance: Tolerance | None = None,
    measure_all: bool = False,
) -> Outcome:
    """Train ``scenario`` with ``method`` and with the reference; compare them.

    Without a ``tolerance``, a float32 or bfloat16 scenario is held to a bound measured on
    runs of the reference in its dtype: one run first, and the reordered variants only when
    the result is outside that run's bound. The verdict is the one every run gives (a bound
    only grows with its runs); a passing outcome's :meth:`~Outcome.allowance_used` is against
    the bound of the runs it needed. ``measure_all=True`` measures every run whatever the
    result: for a study of the margins themselves.

    Example::

        >>> from ddp_verify import Scenario, VerifyingWorld
        >>> from ddp_verify.methods import ddp, manual_allreduce
        >>> uneven = Scenario(world_size=2, schedule=(((1,), (2,)),))
        >>> with VerifyingWorld(2) as world:
        ...     check_equivalent(world, ddp(), uneven).equivalent
        ...     check_equivalent(world, manual_allreduce(weighting="world"), uneven).equivalent
        True
        False
    """
    if world is not None and world.size != scenario.world_size:
        raise ValueError(
            f"the scenario is for {scenario.world_size} ranks, the world has {world.size}: draw "
            f"scenarios with scenarios(world_size=world.size)"
        )
    finish = _start(world, method, scenario)
    staged = tolerance is None and scenario.dtype != "float64" and not measure_all
    # A staged bound's completion: the bound of every run, for a result outside the first's.
    complete: Callable[[], Tolerance] | None = None
    oracle = _start_oracle(world, method, scenario)
    try:
        # The reference trains beside the ranks, on the world's helper process (or, for
        # code that is its own reference on one rank, on a one-rank world).
        derived: Tolerance | None
        if judged_by_own(method, scenario):
            reference, derived, complete = _own_truth(world, method, scenario, staged=staged)
        elif staged:
            reference, derived, complete = _staged_truth(world, scenario)
        else:
            reference, derived = _truth(world, scenario, tolerance is None)
    except RankError as exc:
        with contextlib.suppress(RankError):
            finish()  # the ranks' job is collected either way: the world stays usable
        if oracle is not None:
            with contextlib.suppress(Exception):
                oracle()  # so is the helper's
        if judged_by_own(method, scenario) or scenario.recipe:
            # The user's code (their step, their loss) raised on the whole batch: its
            # failure, said as theirs, not the harness's.
            raise
        raise HarnessError(f"the reference could not be trained:\n{exc}") from exc
    if oracle is not None:
        try:
            _references_agree(oracle, scenario, reference)
        except BaseException:
            with contextlib.suppress(RankError):
                finish()
            raise
    tolerance = tolerance or derived
    assert tolerance is not None
    try:
        prepare_comparison(reference, tolerance)  # while the ranks train, not after
    finally:
        got = finish()  # the ranks' job is collected either way: the world stays usable
    mismatch = compare(reference, got, scenario, tolerance)
    if mismatch is not None and complete is not None:
        # Outside the first run's bound: judged against the bound of every run, as always.
        try:
            tolerance = derived = complete()
        except RankError as exc:
            raise HarnessError(f"the tolerance could not be measured:\n{exc}") from exc
        mismatch = compare(reference, got, scenario, tolerance)
    if mismatch is not None and derived is not None and rounding_may_branch(scenario):
        # A rare rounding branch, not a divergence, until more runs say otherwise.
        try:
            if judged_by_own(method, scenario):
                _, tolerance, _ = _own_truth(world, method, scenario, variants=BRANCHING_VARIANTS)
            else:
                _, tolerance = _truth(world, scenario, True, variants=BRANCHING_VARIANTS)
        except RankError as exc:
            raise HarnessError(f"the tolerance could not be measured again:\n{exc}") from exc
        assert tolerance is not None
        mismatch = compare(reference, got, scenario, tolerance)
    return Outcome(method.name, scenario, reference, got, mismatch, tolerance)


def reference_and_tolerance(
    scenario: Scenario,
    derive_tolerance: bool = True,
    *,
    device: str = "cpu",
    tf32: bool = False,
    variants: int = FLOAT32_VARIANTS,
) -> tuple[Trace, Tolerance | None]:
    """The float64 reference trace of ``scenario`` (trained on the CPU: the truth is the same
    whatever device the ranks use) and, if asked, the tolerance its dtype calls for: float32's
    and bfloat16's are measured by training runs in that dtype on ``device``, the ranks' kind of
    device, with TF32 as the ranks have it, on ``variants`` reordered runs beside the rounded
    reference (see :mod:`ddp_verify.engine.tolerances`).

    Example::

        reference, tolerance = reference_and_tolerance(scenario)
    """
    reference = train_reference(scenario, "float64")
    if not derive_tolerance:
        return reference, None
    if scenario.dtype == "float64":
        return reference, Float64Tolerance()
    return reference, MeasuredTolerance.derive(
        scenario, reference, device=device, tf32=tf32, variants=variants
    )


def _truth(
    world: Ranked | None,
    scenario: Scenario,
    derive_tolerance: bool,
    variants: int = FLOAT32_VARIANTS,
) -> tuple[Trace, Tolerance | None]:
    if world is None:
        return reference_and_tolerance(scenario, derive_tolerance, variants=variants)
    # The helper process runs on the ranks' kind of device: its current GPU when it has one.
    options = {"device": world.device, "tf32": world.allow_tf32, "variants": variants}
    return world.helper.run_job(
        reference_and_tolerance, (scenario, derive_tolerance), options, name="the reference"
    )[0]


def _staged_truth(
    world: Ranked | None, scenario: Scenario
) -> tuple[Trace, MeasuredTolerance, Callable[[], MeasuredTolerance]]:
    """The float64 reference, the bound of its one run in the scenario's dtype, and how to
    complete that bound with the reordered variants (see :func:`check_equivalent`)."""
    reference, first = _on_helper(world, _first_truth, scenario)

    def complete() -> MeasuredTolerance:
        variants = _on_helper(world, _variant_runs, scenario)
        return _measured(world, scenario, reference, [first, *variants])

    return reference, _measured(world, scenario, reference, [first]), complete


def _first_truth(scenario: Scenario, *, device: str = "cpu") -> tuple[Trace, Trace]:
    """The float64 reference (on the CPU) and the reference trained in the scenario's dtype
    on ``device``: the first run a measured bound is measured on."""
    return train_reference(scenario, "float64"), train_reference(scenario, scenario.dtype, device)


def _variant_runs(scenario: Scenario, *, device: str = "cpu") -> list[Trace]:
    """The reordered runs of ``scenario`` in its dtype that complete a measured bound."""
    return [rounding_variant(scenario, v, device=device) for v in range(FLOAT32_VARIANTS)]


def _on_helper(world: Ranked | None, fn: Callable[..., Any], scenario: Scenario) -> Any:
    """``fn(scenario)`` on the world's helper process, on the ranks' kind of device (in this
    process, on the CPU, without a world)."""
    if world is None:
        return fn(scenario)
    return world.helper.run_job(fn, (scenario,), {"device": world.device}, name="the reference")[0]


def _measured(
    world: Ranked | None, scenario: Scenario, reference: Trace, runs: list[Trace]
) -> MeasuredTolerance:
    """The bound ``runs`` measure, as :meth:`MeasuredTolerance.derive` gives it for them."""
    return MeasuredTolerance.of_runs(scenario, reference, runs, tf32=_tf32(world))


def _tf32(world: Ranked | None) -> bool:
    """Whether the runs a bound is measured on may round float32 matmuls to TF32."""
    return world is not None and world.allow_tf32 and DEVICE[world.device].tf32


def _own_truth(
    world: Ranked | None,
    method: Method,
    scenario: Scenario,
    variants: int = FLOAT32_VARIANTS,
    *,
    staged: bool = False,
) -> tuple[Trace, Tolerance, Callable[[], Tolerance] | None]:
    """The reference of code that is its own on one rank holding the whole batch (a coupled
    loss's; any code trained with the user's own loss, optimizer or scheduler): trained on
    the world's one-rank world, or in this process on a one-rank process group of its own (a
    reproducer's) when there is no world. In float32: trained in float64, and held to how far
    ``variants`` runs of the code in float32 on one rank (the samples in other orders: other
    sums) land from it. ``staged`` (on a world): the bound of the first of those runs, and how
    to complete it with the others."""
    staged = staged and world is not None
    exact = dataclasses.replace(scenario, dtype="float64")
    asked = [(exact, 1)]
    if scenario.dtype != "float64":
        asked.append((scenario, 1 if staged else variants))
    runs = _own_runs(world, method, asked)
    # A coupled loss's result is backpropagated, and may be scaled (times the world size):
    # training is held, the loss is shown. Other code reports the loss it trains.
    training_only = getattr(method, "whole_batch_reference", False)
    # A coupled loss keeps its micro-batches (in-batch negatives come from each).
    label = "reference (your code on one rank, the whole batch)" if training_only else OWN_REFERENCE
    if scenario.recipe:
        label = f"{label[:-1]}, with your {scenario.recipe.describe()})"
    reference = Trace(label, runs[0])
    if scenario.dtype == "float64":
        return reference, TrainingOnly() if training_only else Float64Tolerance(), None
    bound = TrainingOnlyMeasured if training_only else MeasuredTolerance

    def measured(rounded: list[RankTrace]) -> Tolerance:
        traces = [Trace(f"{label}, {scenario.dtype}", [run]) for run in rounded]
        return bound.of_runs(scenario, reference, traces, tf32=_tf32(world))

    def complete() -> Tolerance:
        # The variants after the first: variant k is the same run whichever job trains it.
        (others,) = _own_runs(world, method, [(scenario, variants, 1)])
        return measured([*runs[1], *others])

    return reference, measured(runs[1]), complete if staged else None


def _start_oracle(
    world: Ranked | None, method: Method, scenario: Scenario
) -> Callable[[], Trace | None] | None:
    """Where the scenario has a recipe, the oracle's reference of it (:func:`oracle_truth`)
    started: on the world's helper while the one-rank world trains a step's own reference
    (it is idle then), or after the helper's reference otherwise; how to wait for it."""
    if not scenario.recipe or getattr(method, "whole_batch_reference", False):
        return None
    if world is None:
        return lambda: oracle_truth(scenario)
    submit = getattr(world.helper, "submit", None)
    if judged_by_own(method, scenario) and submit is not None:
        pending = submit(oracle_truth, (scenario,), {"device": world.device}, name="the oracle")
        return lambda: pending.result()[0]
    return lambda: _on_helper(world, oracle_truth, scenario)


def _references_agree(
    oracle: Callable[[], Trace | None], scenario: Scenario, reference: Trace
) -> None:
    """Where the oracle can train what the recipe says (:mod:`~ddp_verify.engine.oracle_terms`),
    the recipe's reference and the oracle's must agree before either judges: a disagreement
    is a :class:`HarnessError`, never a verdict."""
    try:
        truth = oracle()
    except RankError as exc:
        raise HarnessError(f"the oracle's reference could not be trained:\n{exc}") from exc
    if truth is None:
        return
    mismatch = compare(truth, reference, scenario, Float64Tolerance())
    if mismatch is None:
        return
    mismatch = dataclasses.replace(mismatch, expected_label="the oracle")
    raise HarnessError(
        f"the two references disagree, so neither judges: {reference.method} and the "
        f"harness's float64 oracle (its own loss, {truth.method}: what your "
        f"{scenario.recipe.describe()} trains on the scenario's data) differ:\n"
        f"{mismatch.render()}\nEither your code on one rank trains something other than "
        "the loss and optimizer it is handed (check it without the recipe: the oracle then "
        "judges it and says what differs), or this is a bug of ddp_verify's: report it."
    )


def oracle_truth(scenario: Scenario, *, device: str = "cpu") -> Trace | None:
    """The oracle's float64 reference of ``scenario`` said in its own terms, or None where
    the scenario's recipe is not the oracle's (the oracle trains on the CPU: ``device`` is
    the ranks', unused)."""
    oracle = oracle_scenario(scenario)
    if oracle is None:
        return None
    trace = train_reference(oracle, "float64")
    return Trace(f"optimizer {oracle.optimizer.describe()}", trace.ranks)


def _own_runs(world: Ranked | None, method: Method, asked: list[tuple[Any, ...]]) -> list[Any]:
    """:func:`train_whole_variants` for each job ``asked``, on the world's one-rank world."""
    if world is not None:
        shipped = method.shipped()  # type: ignore[attr-defined]
        return [
            world.solo.run_job(train_whole_variants, (shipped, *job), name="the reference")[0]
            for job in asked
        ]
    # All in one process group's life: code may keep the group it first saw (a default
    # argument of torch.distributed.nn's collectives is bound at import). So no world, no
    # staging: a second job would be a second group.
    return _on_one_rank(lambda: [train_whole_variants(method, *job) for job in asked])


def _on_one_rank(run: Callable[[], Any]) -> Any:
    """``run()`` in a one-rank gloo process group of this process's own, made for it."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("this process is a rank of a larger world; the reference needs one")
        return run()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return run()
    finally:
        dist.destroy_process_group()


def assert_equivalent(
    world: Ranked | None, method: Method, scenario: Scenario, *, tolerance: Tolerance | None = None
) -> None:
    """Raise :class:`EquivalenceError` unless ``method`` matches the reference on ``scenario``.

    Example::

        >>> from ddp_verify import EquivalenceError, Scenario, VerifyingWorld
        >>> from ddp_verify.methods import manual_allreduce
        >>> uneven = Scenario(world_size=2, schedule=(((1,), (2,)),))
        >>> with VerifyingWorld(2) as world:
        ...     try:
        ...         assert_equivalent(world, manual_allreduce(weighting="world"), uneven)
        ...     except EquivalenceError as exc:
        ...         print(str(exc).split(" to ")[0])
        manual_allreduce(weighting='world') is not equivalent

    In a test::

        from hypothesis import given
        from ddp_verify import assert_equivalent, methods, strategies

        @given(strategies.scenarios(world_size=2))
        def test_ddp(world, scenario):
            assert_equivalent(world, methods.ddp(), scenario)
    """
    __tracebackhide__ = True
    outcome = check_equivalent(world, method, scenario, tolerance=tolerance)
    if not outcome.equivalent:
        raise EquivalenceError.from_outcome(outcome)


def _start(world: Ranked | None, method: Method, scenario: Scenario) -> Callable[[], Trace]:
    if isinstance(method, DistributedMethod):
        if world is None:
            raise TypeError(f"{method.name} trains on a world: pass a World")
        pending = world.submit(train_on_rank, (method.shipped(), scenario), name=method.name)
        return lambda: method.collect(pending.result())
    return lambda: method.run(scenario, world)
