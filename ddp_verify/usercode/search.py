"""The search for a counterexample: generated scenarios, the user's code on a world, the
shrunk divergence explained (likely cause, reproducer script).

The core of ``ddp_verify.check`` and of the ``ddp-verify check`` command, which only choose
the world it runs on.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.errors import FlakyFailure, Unsatisfiable

from ..engine.compare import compare, only_the_loss_differs
from ..engine.compression import CompressionTolerance, along_the_run
from ..engine.lockstep import in_lockstep
from ..engine.objectives import SAMPLE_MEAN, objective
from ..engine.outcome import EquivalenceError, Outcome
from ..engine.scenario import BOUNDARIES, LOSSES, Scenario
from ..engine.strategies import coupled_scenarios, models, optimizers, scenarios
from ..engine.terms import is_term_sum, term_sum
from ..engine.tolerances import Float64Tolerance, Tolerance
from ..methods.base import Method
from ..methods.equivalence import HarnessError, assert_equivalent, check_equivalent
from ..world import RankError, WorldError
from ..world.interface import Ranked
from ..world.naming import option
from . import findings
from .adapters import KindError, adapt
from .coupled import CoupledLoss
from .diagnosis import likely_causes
from .diagnosis.coupled import coupled_bounds, coupled_causes, uneven_cause
from .diagnosis.masked import mask_probe
from .diagnosis.probes import every_mistake, probes, told_apart
from .diagnosis.structural import (
    failure_cause,
    known_issue_cause,
    known_torch_issue,
    low_rank_cause,
)
from .diagnosis.unpacked import packing_probe
from .findings import Cause
from .kinds import STEP_VALUES, Binds, Call, Kind, as_kind, parse_binds
from .layouts import parse_layout
from .precision import diverged_precision, held_to, measured, probe_scenario
from .probe import found_layout
from .reproducer import write_reproducer
from .state import most_calls, replayed
from .verdict import CodeFailed, NotEquivalent, Status, Verdict

__all__ = [
    "CodeFailed",
    "NotEquivalent",
    "Progress",
    "Verdict",
    "bounds_for",
    "preflight",
    "search",
]

# Called with (examples tried, phase): phase is "searching", then "shrinking" once a
# counterexample has been found.
Progress = Callable[[int, str], None]


class _CodeFailed(BaseException):
    """Raised from inside the search to stop it at once: a rank crashed, hung or raised.

    A BaseException, so hypothesis neither catches it nor shrinks it: every shrink attempt
    would cost a world relaunch, and the first failure already says what went wrong."""

    def __init__(self, scenario: Scenario, error: RankError) -> None:
        self.scenario, self.error = scenario, error


class _HarnessFailed(BaseException):
    """Raised from inside the search to stop it at once: the harness failed (the reference's
    process, say); hypothesis must not shrink what is not the code's failure."""

    def __init__(self, error: HarnessError | WorldError) -> None:
        self.error = error


def search(
    fn: Callable[..., Any],
    *,
    kind: Kind | str,
    world: Ranked,
    max_examples: int = 100,
    seed: int | None = None,
    progress: Progress | None = None,
    lossy: str | None = None,
    result_on: str = "all",
    hook_state: Callable[..., Any] | None = None,
    loss_reduction: str = "mean",
    ddp_wrapper: str | None = None,
    bind: Binds = None,
    trainer_divides: bool = False,
    layout: Mapping[str, Any] | str | None = None,
    logits: str | None = None,
    labels: str | None = None,
    full_trace: bool = False,
    **scenario_bounds: Any,
) -> Verdict:
    """Check ``fn`` as a ``kind`` plug-in on scenarios generated for ``world``.

    Returns an equivalent :class:`~ddp_verify.usercode.verdict.Verdict` when no
    counterexample turned up. Raises :class:`~ddp_verify.usercode.verdict.NotEquivalent` (an
    ``EquivalenceError``) with the verdict, its shrunk scenario, the divergence, every likely
    cause and a reproducer script otherwise; :class:`CodeFailed` when ``fn`` raises, crashes a
    rank or hangs; :class:`~ddp_verify.usercode.kinds.KindError` when ``fn`` cannot be a
    ``kind`` plug-in (its signature, or what it returned on the ranks).
    ``scenario_bounds`` go to :func:`ddp_verify.engine.strategies.scenarios`; ``step``
    functions are checked with ``same_micro_batch_counts=True`` unless told otherwise.
    ``lossy="fp16"`` or ``"bf16"`` holds a compressing comm hook to the bound that format's
    rounding allows (:mod:`ddp_verify.engine.compression`, derived for SGD, so scenarios train
    with SGD) instead of to exact equivalence. ``result_on="rank0"``: a ``loss``, ``reduce``
    or ``reduce-dict`` helper's result is held by rank 0 only, and only rank 0's is checked.
    ``hook_state`` makes a comm hook's state on each rank (``factory()`` or
    ``factory(module)``), once the process group exists. ``loss_reduction``: the reduction of
    the ``loss_fn`` a step function gets (``mean``, ``sum`` or ``none``); ``ddp_wrapper``
    (``"module:callable"``) wraps the model a ``wrapped-step`` function gets instead of DDP.
    ``bind`` fills parameters by name (``{"n": "world_size"}`` or ``"n=world_size"``; see
    :func:`~ddp_verify.usercode.kinds.parse_binds`); ``layout`` (``"logits=2d"``, or the
    ``logits`` and ``labels`` shorthands) pins how the code is called where its kind accepts
    several layouts; every axis not pinned is found by probing
    (:mod:`ddp_verify.usercode.layouts`), and the verdict says which and why.
    ``full_trace``: when the code fails, the ranks' tracebacks keep the harness's frames.

    Example::

        with VerifyingWorld(4) as world:
            search(average_gradients, kind="grad-sync", world=world, max_examples=50)
    """
    __tracebackhide__ = True
    timeline = Timeline(time.monotonic())
    kind = as_kind(kind)
    # How the code is called: the adapter's options, the reproducer's too.
    called: dict[str, Any] = dict(
        result_on=result_on,
        hook_state=hook_state,
        loss_reduction=loss_reduction,
        ddp_wrapper=ddp_wrapper,
        bind=parse_binds(bind),
    )
    if trainer_divides:  # said only where given: the reproducer spells what differs
        called["trainer_divides"] = True
    pinned = parse_layout(kind, layout, logits=logits, labels=labels)
    # The signature and the options are checked before anything runs.
    checked = adapt(fn, kind, **called, layout=pinned)
    _check_recipe(checked, kind, scenario_bounds)
    # What the user's criterion logs that adds up wrong across micro-batches and ranks.
    said = _criterion_notes(scenario_bounds)
    world_size = world.size
    fmt = lossy_format(kind, lossy, hook_state)
    bounds = bounds_for(kind, scenario_bounds)
    coupled = kind.coupled
    if coupled:
        # The encoder learns the loss parameters the code asks for by name.
        call = adapt(fn, kind, **called, layout=pinned).call
        assert call is not None  # adapt() says how it calls the code
        bounds = coupled_bounds(fn, call, bounds)
    bounds = taken_bounds(kind, checked.call, bounds)
    chosen = found_layout(fn, kind, world, called, pinned, bounds)
    timeline.mark("layout")
    called["layout"] = chosen.layout
    method = adapt(fn, kind, **called)
    bounds = packed_step_bounds(kind, chosen.layout, scenario_bounds, bounds)
    labels = chosen.layout.get("labels")
    if labels == "unshifted":
        # A loss that shifts its labels is a language model's: token data whose last
        # position never counts.
        bounds["losses"] = scenario_bounds.get("losses", ("tokens",))
        bounds["labels"] = labels
    if fmt is not None and fmt != LOW_RANK:
        bounds.setdefault("optimizers", optimizers(names=("sgd",)))
        # A 16-bit bound can hide a low-rank approximation; what tells one apart is a weight
        # matrix whose gradient lost rank, and a low-rank compressor leaves small matrices
        # exact (PowerSGD compresses one only when rank r saves half: rows x cols > 2r(rows +
        # cols), never at 4 wide): models up to 8 wide have matrices it compresses.
        if bounds.get("model") is None:  # the user's own model is trained as it is
            bounds.setdefault("models", models(max_width=8))
    # Code that computes in a lower precision inside is held to that precision, measured.
    precision = precision_words = None
    # A coupled loss's bound comes from its own runs on one rank (methods.equivalence).
    if fmt is None and not coupled:
        probed = measured(world, method, probe_scenario(world_size, bounds))
        precision, precision_words = probed.format, probed.words()
        timeline.mark("precision")
    strategy = (coupled_scenarios if coupled else scenarios)(world_size=world_size, **bounds)

    def lowered_by(scenario: Scenario, error: EquivalenceError) -> bool:
        """Whether the first example beyond float64's bound is a lower precision's rounding
        that the even probe could not show (counts or weights held in float32 are exact on
        an even split): measured on that scenario, the code is then held to that format's
        bound, and the example passes. Once a mistake is found, never: shrinking goes on."""
        nonlocal precision, precision_words
        if failed or precision is not None or fmt is not None or coupled:
            return False
        if scenario.dtype != "float64" or error.outcome is None:
            return False
        found = diverged_precision(world, scenario, error.outcome)
        if found.format is None:
            return False
        precision, precision_words = found.format, found.words()
        return True

    def tolerance_for(scenario: Scenario) -> Tolerance | None:
        """What an example is held to: the compression bound of a declared lossy format, the
        measured bound of the precision the code computes in, or (None) the scenario's own."""
        if fmt is not None and fmt != LOW_RANK:
            # Derived by training contributions: on the helper, as the reference is.
            return world.helper.run_job(
                CompressionTolerance, (scenario, fmt), name="the compression bound"
            )[0]
        if precision is not None and scenario.dtype == "float64":
            return held_to(world, scenario, precision)
        return None

    tried = 0
    failed = False
    found_at = 0
    # A torch issue that a drawn feature reaches (PowerSGD with a parameter forward never
    # uses): met once, that feature is left out of the draws from then on and the verdict's
    # notes say so; the search goes on to the user's own code.
    met: dict[str, str] = {}
    # The first such failure: the verdict where every draw the bounds allow reaches it.
    first_known: list[_CodeFailed] = []
    first_failure: list[Scenario] = []
    first_error: list[EquivalenceError] = []

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        # Each example trains on every rank and on the helper: seconds, by design.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
        # The report says everything, seed included: hypothesis prints nothing of its own
        # (a "reproduce with @seed" line would break ddp-verify --json's one document).
        verbosity=Verbosity.quiet,
        # The explain phase reruns failing cases to list "lines only failures ran": those are
        # ours, not the user's, and each rerun costs a training run on every rank.
        phases=[p for p in Phase if p is not Phase.explain],
    )
    @given(strategy)
    def search(scenario: Scenario) -> None:
        nonlocal tried, failed, found_at
        # A feature left out: not an example, while searching and shrinking alike; but the
        # first failure itself, if it came first, is replayed as it was (a rejection there
        # would read as an unreliable example).
        left_out = any(getattr(scenario.model, feature, False) for feature in met)
        if left_out and scenario not in first_failure:
            hypothesis.reject()
        tried += 1
        timeline.mark("first_example")
        if progress is not None:
            progress(tried, "shrinking" if failed else "searching")
        try:
            tolerance = tolerance_for(scenario)
            if fmt is None or fmt == LOW_RANK:
                assert_equivalent(world, method, scenario, tolerance=tolerance)
            else:
                _within_rounding(world, method, kind, scenario, tolerance)
        except EquivalenceError as error:
            if lowered_by(scenario, error):
                return
            if not failed:
                failed, found_at = True, tried
                first_failure.append(scenario)
                first_error.append(error)
                timeline.mark("first_failure")
            raise
        except RankError as error:
            known = known_torch_issue(scenario, error)
            if known is not None:
                cause, feature = known
                met[feature] = (
                    f"{cause.text} (met on {scenario!r}); the search went on without that "
                    f"feature ({option('excluded_features', feature)})"
                )
                tried -= 1
                if not first_known:
                    first_known.append(_CodeFailed(scenario, error))
                hypothesis.reject()
            raise _CodeFailed(scenario, error) from None
        except (HarnessError, WorldError) as error:
            # A world that cannot start fails every example the same way: stop at once
            # rather than let hypothesis shrink it (each try would wait out a start).
            raise _HarnessFailed(error) from None

    if seed is not None:
        search = hypothesis.seed(seed)(search)
    # Under a launcher every rank runs this search: in lockstep, with agreed outcomes.
    in_lockstep(search, world, name=f"the search for {method.name}")
    call = method.call
    assert call is not None  # adapt() says how it calls the code
    verdict = Verdict(
        Status.EQUIVALENT,
        kind=kind.name,
        function=call.name,
        call=call.describe(),
        world_size=world_size,
        device=world.device,
        lossy=fmt,
        precision=precision,
        precision_words=precision_words,
        layout=chosen.reason or None,
        method=method.name,
    )
    try:
        try:
            try:
                search()
            except Unsatisfiable:
                if not first_known:
                    raise
            if first_known and tried < max_examples:
                # The draws the bounds allow without the feature ran out before the examples
                # asked for: the torch issue is the verdict, never a short pass.
                met.clear()
                raise first_known[0]
        except FlakyFailure as flaky:
            # Code whose result depends on its earlier calls (a count kept from the last
            # step) fails once and passes when hypothesis replays it: the failure stands, and
            # the state replay of the diagnosis says what was carried.
            # A replay that met the torch issue (timing decides whether it aborts) is
            # rejected: the divergence it showed first stands.
            divergence = _first_divergence(flaky)
            if divergence is flaky and first_error:
                divergence = first_error[0]
            raise divergence from None
    except _HarnessFailed as stop:
        raise stop.error from None
    except EquivalenceError as error:
        timeline.mark("shrunk")
        verdict = _explained(
            dataclasses.replace(
                verdict,
                examples=tried,
                found_at=found_at,
                precision=precision,
                precision_words=precision_words,
                notes=(*met.values(), *said),
            ),
            error,
            fn,
            kind,
            world,
            called,
            method,
            bounds,
            tolerance_for,
        )
        raise NotEquivalent(_timed(verdict, timeline)) from None
    except _CodeFailed as stop:
        misuse = _kind_errors(stop.error)
        if misuse:
            # The code ran but gave the harness something its kind cannot be: a usage error.
            raise KindError(f"{method.name}: {misuse}") from None
        # Only trouble in collectives (a hang, a death, a mismatch) can come from the ranks'
        # micro-batch counts; an exception of the user's own is its own news.
        in_collectives = stop.error.in_collectives
        cause = known_issue_cause(stop.scenario, stop.error)
        if cause is None and coupled:
            cause = uneven_cause(stop.scenario, stop.error)
        if cause is None and in_collectives:
            cause = failure_cause(kind, stop.scenario)
        errored = dataclasses.replace(
            verdict,
            notes=(*met.values(), *said),
            status=Status.ERROR,
            examples=tried,
            scenario=stop.scenario,
            causes=(cause,) if cause else (),
            failure=stop.error,
            full_trace=full_trace,
        )
        raise CodeFailed(_timed(errored, timeline)) from None
    # The precision may have been measured again where an example showed it.
    measured_verdict = dataclasses.replace(
        verdict,
        examples=tried,
        precision=precision,
        precision_words=precision_words,
        notes=(*met.values(), *said),
    )
    return _timed(measured_verdict, timeline)


def _first_divergence(flaky: FlakyFailure) -> BaseException:
    """The divergence inside hypothesis's ``FlakyFailure``, or the failure itself when it
    holds none (what the search cannot explain stays the harness's)."""
    for exc in flaky.exceptions:
        if isinstance(exc, EquivalenceError):
            return exc
    return flaky


def _within_rounding(
    world: Ranked, method: Method, kind: Kind, scenario: Scenario, tolerance: Any
) -> None:
    """``assert_equivalent`` under a 16-bit format's bound, and more: a low-rank approximation
    is not rounding, whatever the bound lets through (the bound pools later steps' errors by
    their largest contribution, so a small element far off can pass it). Such a run is held
    to exact equivalence, so that its divergence is reported and its cause named."""
    outcome = check_equivalent(world, method, scenario, tolerance=tolerance)
    fmt = getattr(tolerance, "fmt", None)
    if fmt is not None and not outcome.equivalent:
        # Judged along the run's own parameters where a rounding moved a unit across its
        # kink (on the helper, as every reference is trained).
        judged = world.helper.run_job(along_the_run, (outcome, fmt), name="the compression bound")
        outcome = judged[0]
    low_rank = low_rank_cause(kind, outcome.reference, outcome.got, fmt=fmt)
    if outcome.equivalent and low_rank is not None:
        exact = Float64Tolerance()
        mismatch = compare(outcome.reference, outcome.got, scenario, exact)
        outcome = dataclasses.replace(outcome, mismatch=mismatch, tolerance=exact)
    if not outcome.equivalent:
        raise EquivalenceError.from_outcome(outcome)


def _generic_causes(
    world: Ranked,
    method: Method,
    kind: Kind,
    outcome: Outcome,
    bounds: dict[str, Any],
    tolerance_for: Callable[[Scenario], Tolerance | None],
    state: Any,
) -> tuple[Cause, ...]:
    """Every likely cause of ``outcome``'s divergence: the diagnosis on the helper, on a
    wider model where the weights are not determined, and the probes that tell readings
    apart and find every mistake (or, where the code keeps state, what it carried)."""
    # Losses the mask excludes, counted: said first, the rest diagnosed where they are 0.
    masked, outcome, method = mask_probe(world, method, outcome, bounds)
    if masked is not None:
        if outcome.equivalent:
            return (masked,)
        rest = _generic_causes(world, method, kind, outcome, bounds, tolerance_for, state)
        # Shown elsewhere: the counterexample's own causes come first.
        return (*rest, masked) if masked.scenario else (masked, *rest)
    # Weights fitted on a model with fewer parameters than micro-batches are not
    # determined: diagnose the same scenario on a wider model where the code diverges
    # there too, and say so.
    diagnosed, wider = outcome, None
    if state is None:
        diagnosed, wider = _determined(world, method, outcome)
    found = world.helper.run_job(
        likely_causes,
        (kind, outcome.scenario, outcome.reference, outcome.got),
        name="the diagnosis",
    )[0]
    if wider is not None:
        # The gradient's causes from the wider model, the loss's from the run itself.
        widened = world.helper.run_job(
            likely_causes,
            (kind, diagnosed.scenario, diagnosed.reference, diagnosed.got),
            name="the diagnosis on a wider model",
        )[0]
        model_changing = ("gradient", "parameters")
        found = [
            dataclasses.replace(c, evidence=f"{c.evidence} ({wider})".lstrip())
            for c in widened
            if c.subject in model_changing and c.pattern not in _NOT_FOUND
        ] + [c for c in found if c.subject not in model_changing] or found
    if state is None:
        # Every mistake, not the first: scenarios that isolate one axis each, which
        # also tell apart readings the counterexample's numbers fit alike.
        tried = probes(
            world,
            method,
            kind,
            outcome.scenario,
            bounds,
            tolerance_for,
            unsettled=found,
        )
        found = told_apart(found, tried)
        found = [*found, *every_mistake(found, tried)]
    # Right padded, wrong packed: said beside what the numbers name.
    disagrees = packing_probe(world, method, outcome)
    if disagrees is not None:
        # What no weighting reproduced is explained: how the code reads the packed rows.
        found = [*(c for c in found if c.pattern not in _NOT_FOUND), disagrees]
    return tuple(_causes_first(found)) if state is None else (state.cause, *found)


class Timeline:
    """When a check reached each of its milestones, in seconds from its start (the first
    time only): what a benchmark reads to say where a check's time went.

    Example::

        >>> timeline = Timeline(time.monotonic())
        >>> timeline.mark("first_example"); timeline.mark("first_example")
        >>> [name for name, _ in timeline.marks]
        ['first_example']
    """

    def __init__(self, started: float) -> None:
        self.started = started
        self.marks: list[tuple[str, float]] = []

    def mark(self, name: str, now: float | None = None) -> None:
        if all(name != seen for seen, _ in self.marks):
            at = (time.monotonic() if now is None else now) - self.started
            self.marks.append((name, round(at, 3)))


def _timed(verdict: Verdict, timeline: Timeline) -> Verdict:
    now = time.monotonic()
    timeline.mark("report", now)
    return dataclasses.replace(
        verdict, seconds=now - timeline.started, timeline=tuple(timeline.marks)
    )


# A low-rank hook (PowerSGD) is exact when its state's rank reaches every matrix's side: it is
# held to exact equivalence, with the state the user gives (--hook-state).
LOSSY = {"fp16": "float16", "bf16": "bfloat16", "lowrank": "low rank at full rank"}
LOW_RANK = LOSSY["lowrank"]


def lossy_format(
    kind: Kind | str, lossy: str | None, hook_state: Callable[..., Any] | None = None
) -> str | None:
    """The format ``lossy`` names (``"fp16"`` → ``"float16"``), once it applies to ``kind``;
    :class:`KindError` otherwise.

    Example::

        >>> lossy_format("comm-hook", "bf16")
        'bfloat16'
    """
    if lossy is None:
        return None
    if lossy not in LOSSY:
        raise KindError(f"lossy must be one of {', '.join(LOSSY)}, got {lossy!r}")
    if not as_kind(kind).lossy:
        raise KindError(
            f"{option('lossy')} applies to comm hooks ({option('kind', 'comm-hook')}), not to "
            f"{kind}"
        )
    if lossy == "lowrank" and hook_state is None:
        raise KindError(
            f"{option('lossy', 'lowrank')} checks a low-rank hook at full rank: give its state "
            f"with {option('hook_state')} (e.g. a PowerSGDState whose "
            "matrix_approximation_rank is at least every weight matrix's smaller side)"
        )
    return LOSSY[lossy]


def _kind_errors(error: RankError) -> str | None:
    """The message of the KindError every failing rank raised, if that is why they failed."""
    primary = [f for f in error.failures if f.is_primary]
    if primary and all(isinstance(f.exception, KindError) for f in primary):
        return str(primary[0].exception)
    return None


def _explained(
    verdict: Verdict,
    error: EquivalenceError,
    fn: Callable[..., Any],
    kind: Kind,
    world: Ranked,
    called: dict[str, Any],
    method: Method,
    bounds: dict[str, Any],
    tolerance_for: Callable[[Scenario], Tolerance | None],
) -> Verdict:
    """The verdict of a counterexample: the divergence, every likely cause and a reproducer
    script. The diagnosis trains simulations, so it runs on the world's helper process, as
    the reference does."""
    outcome = error.outcome
    scenario = error.scenario if outcome is None else outcome.scenario
    causes: tuple[Cause, ...] = ()
    script = None
    state = None
    if outcome is not None:
        # Replayed on a fresh world before anything is said of it: a result that depends on
        # earlier calls is not one call's.
        state = replayed(world, method, outcome, calls=most_calls(verdict.examples or 1))
    if outcome is not None:
        try:
            if kind.coupled:
                # Its own probes: the code re-run on the ranks and on a one-rank world.
                assert isinstance(method, CoupledLoss)
                found = coupled_causes(
                    world, method, outcome.scenario, outcome.reference, outcome.got
                )
                causes = tuple(found) if state is None else (state.cause, *found)
            else:
                causes = _generic_causes(world, method, kind, outcome, bounds, tolerance_for, state)
        except RankError as exc:
            # The counterexample stands; only its explanation is missing.
            causes = (findings.DIAGNOSIS_FAILED.cause(reason=str(exc).splitlines()[0]),)
        try:
            script = str(
                write_reproducer(
                    fn,
                    kind,
                    outcome.scenario,
                    device=world.device,
                    backend=world.backend,
                    # Code that keeps state: the script calls it as often as a fresh
                    # world needed to fail.
                    repeats=1 if state is None else state.calls,
                    **called,
                )
            )
        except OSError as exc:
            script = f"(could not be written: {exc})"
    # Training matched and only the reported loss differs: a logging mistake, said first.
    # (Not for kinds whose result is only ever reported: there the loss is the whole job.)
    only_loss = (
        outcome is not None
        and kind.mistakes != "report"
        and only_the_loss_differs(
            outcome.reference, outcome.got, outcome.scenario.steps, outcome.tolerance
        )
    )
    return dataclasses.replace(
        verdict,
        status=Status.NOT_EQUIVALENT,
        scenario=scenario,
        causes=causes,
        reproducer=script,
        # Where the error carries no traces (it never does from the search), its own words.
        message="" if outcome is not None else str(error),
        outcome=outcome,
        only_loss_differs=only_loss,
    )


# Findings that say nothing was found.
_NOT_FOUND = {findings.UNEXPLAINED.code, findings.DIAGNOSIS_FAILED.code}
# Findings that say what is not known: never the first cause while another names one.
_OPEN = _NOT_FOUND | {finding.code for finding in findings.OPEN_QUESTIONS}


def _causes_first(found: list[Cause]) -> list[Cause]:
    """``found`` with every cause that names a mistake before those that only say what
    could not be explained (the first cause is always a cause), each group in its order.

    Example::

        _causes_first([unexplained, world])  # [world, unexplained]
    """
    return [c for c in found if c.pattern not in _OPEN] + [c for c in found if c.pattern in _OPEN]


def _check_recipe(method: Any, kind: Kind, bounds: dict[str, Any]) -> None:
    """A :class:`KindError` before anything runs for a step that takes the scheduler it
    steps where none is given, and for a step's loss reduction beside the user's own loss."""
    call = getattr(method, "call", None)
    takes = [b.parameter for b in (call.bound if call else ()) if b.source in STEP_VALUES]
    if takes and bounds.get("scheduler") is None:
        raise KindError(
            f"{method.name} takes {takes[0]!r}, the scheduler it steps: give yours, "
            f"{option('scheduler', 'PATH.py:FACTORY')} (FACTORY(optimizer) -> scheduler)"
        )
    if bounds.get("loss_fn") is not None and getattr(method, "loss_reduction", "mean") != "mean":
        raise KindError(
            f"{option('loss_reduction')} asks for the harness's loss in another reduction; "
            f"{option('loss_fn')} gives your own, called as you wrote it: give one of them"
        )


def _criterion_notes(bounds: Mapping[str, Any]) -> tuple[str, ...]:
    """:func:`~ddp_verify.engine.recipes.criterion_notes` for the user's loss, if any."""
    if bounds.get("loss_fn") is None:
        return ()
    from ..engine.recipes import RecipeError, criterion_notes, recipe_of

    try:
        recipe = recipe_of(loss_fn=bounds["loss_fn"])
    except RecipeError:
        return ()  # said by the scenarios' own check, with the fix
    return criterion_notes(recipe, tuple(bounds.get("losses", LOSSES)))


# A model is wide enough for the fitted weights when it has this many parameters per
# micro-batch of a step (the fit's unknowns): fewer, and the gradients of the micro-batches
# are likely dependent. Widening only where needed keeps the fit on the counterexample's own
# model (in bfloat16 a wider model's rounding blurs the weights).
PARAMETERS_PER_GROUP = 2
# The hidden width a diagnosis widens a tiny model to.
WIDE = 16


def _determined(world: Ranked, method: Method, outcome: Outcome) -> tuple[Outcome, str | None]:
    """The outcome to diagnose: ``outcome``, or the same scenario trained again on a wider
    model (same data, schedule, optimizer) when the model has too few parameters for the
    weights of every micro-batch to be determined and the code diverges there too; with the
    words that say so."""
    scenario = outcome.scenario
    groups = max(sum(len(sizes) for sizes in per_rank) for per_rank in scenario.schedule)
    spec = scenario.model
    if spec.kind == "user" or not spec.hidden:
        return outcome, None
    parameters = sum(t.numel() for t in outcome.reference.ranks[0].params[0].values())
    if parameters >= PARAMETERS_PER_GROUP * groups:
        return outcome, None
    hidden = tuple(max(width, WIDE) for width in spec.hidden)
    wide = dataclasses.replace(scenario, model=dataclasses.replace(spec, hidden=hidden))
    try:
        again = check_equivalent(world, method, wide, tolerance=outcome.tolerance)
    except (RankError, WorldError, HarnessError, ValueError):
        return outcome, None
    if again.equivalent:
        return outcome, None
    wider = sum(t.numel() for t in again.reference.ranks[0].params[0].values())
    return again, (
        f"diagnosed on the same scenario with hidden layers {list(hidden)} ({wider} parameters "
        f"for {groups} micro-batches; the shrunk model's {parameters} leave the weights "
        "undetermined)"
    )


def preflight(
    fn: Callable[..., Any], kind: Kind, bind: Binds, scenario_bounds: Mapping[str, Any]
) -> dict[str, Any]:
    """The scenario bounds of a check of ``fn`` as a ``kind`` plug-in (:func:`bounds_for`),
    and a :class:`KindError` for anything that cannot run, asked before any world starts:
    bounds that do not go together, a coupled loss built for one process or taking another
    number of feature tensors than its bounds give it.

    Example::

        preflight(average_gradients, KIND["grad-sync"], None, {"even": True})
    """
    bounds = bounds_for(kind, scenario_bounds)
    if kind.coupled:
        call = adapt(fn, kind, bind=bind).call
        assert call is not None  # adapt() says how it calls the code
        bounds = coupled_bounds(fn, call, bounds)
    if kind.token_losses:
        bounds = taken_bounds(kind, adapt(fn, kind, bind=bind).call, bounds)
    return bounds


# The window a check draws where the code is handed a window's counts or the objective is
# normalised by its window, and the user pinned none: TRL's steps_per_generation of 2 to 4.
DRAWN_WINDOWS = (2, 4)
# The layouts drawn where the code is handed sequence boundaries: padded, and every packer.
DRAWN_PACKINGS = ("", "flat", "rows", "split")
_BOUNDARIES = ("position_ids", "segment_ids", "cu_seq_lens")


def taken_bounds(kind: Kind, call: Call | None, bounds: dict[str, Any]) -> dict[str, Any]:
    """``bounds`` with what the code's parameters ask to be drawn, unless the caller pinned
    it: windows of several steps (:data:`DRAWN_WINDOWS`) where it is handed a window's
    counts (``window_tokens``, by name or bound) or the declared objective normalises by its
    window; packed sequences (:data:`DRAWN_PACKINGS`) where it is handed their boundaries
    (``position_ids``, ``segment_ids``, ``cu_seq_lens``).

    Example::

        taken_bounds(KIND["loss-agg"], call, {"objective": "token-mean@window"})
        # {'objective': 'token-mean@window', 'window_steps': (2, 4)}
    """
    if not kind.packed:
        return bounds
    sources = {b.source or "" for b in call.bound} if call is not None else set()
    drawn = dict(bounds)
    takes_boundaries = bool(sources & set(_BOUNDARIES))
    if not kind.token_losses:
        # A loss handed logits and labels: packed rows where it takes their boundaries, and
        # both labels at a segment's start (code that masks the boundary itself must meet
        # labels that do not); never split, as a row-wise shift would lose a cut's target.
        tokens = "tokens" in tuple(bounds.get("losses", ("tokens",)))
        if takes_boundaries and tokens and "packings" not in bounds:
            # Code that takes the boundaries of packed sequences is a language model's loss.
            drawn["packings"] = tuple(p for p in DRAWN_PACKINGS if p != "split")
            drawn["losses"] = ("tokens",)
        if takes_boundaries and tokens and "boundaries" not in bounds:
            drawn["boundaries"] = BOUNDARIES
        return drawn
    declared = bounds.get("objective") or ""
    if is_term_sum(declared):
        scopes = {t.aggregation.scope for t in term_sum(declared).terms}
    else:
        scopes = {objective(declared).scope} if declared else set()
    windowed = bool(scopes - {"step"})
    if "window_steps" not in bounds and (windowed or any(s.startswith("window_") for s in sources)):
        drawn["window_steps"] = DRAWN_WINDOWS
    if "packings" not in bounds and takes_boundaries:
        drawn["packings"] = DRAWN_PACKINGS
    return drawn


# What only one family of scenarios draws: the encoder of a coupled loss, and the models,
# losses and objectives of every other kind. Said by option, so the advice reads as typed.
_COUPLED_ONLY = ("towers", "negatives")
_NOT_COUPLED = (
    "losses",
    "models",
    "model",
    "labels",
    "objective",
    "token_weights",
)


def _refuse_foreign_bounds(kind: Kind, scenario_bounds: Mapping[str, Any]) -> None:
    """A :class:`KindError` for a bound the kind's scenarios do not draw (the coupled
    encoder's for another kind, a model or loss choice for a coupled loss), and for a name
    no scenario takes: either would reach the strategy as an unknown keyword."""
    coupled = kind.coupled
    strategy = coupled_scenarios if coupled else scenarios
    # The learned parameters are read from the code itself (coupled_bounds).
    taken = set(inspect.signature(strategy).parameters) - {"world_size", "learned"}
    if coupled and not set(scenario_bounds.get("dtypes", ())) <= {"float64", "float32"}:
        raise KindError(
            f"{option('dtypes')}: a coupled loss is checked in float64 or float32 (its bound "
            "in float32 is measured on your code's own run on one rank; a 16-bit one is not "
            "measured yet)"
        )
    if coupled and scenario_bounds.get("same_micro_batch_counts") is False:
        raise KindError(
            f"{option('same_micro_batch_counts', False)}: the ranks of a coupled loss hold "
            "as many micro-batches, since every call gathers from every rank"
        )
    for name in scenario_bounds:
        if name in taken:
            continue
        if not coupled and name in _COUPLED_ONLY:
            raise KindError(
                f"{option(name, scenario_bounds[name])} shapes the encoder whose features a "
                f"coupled-loss function is given; a {kind} plug-in trains the harness's "
                f"models: leave it out, or check a loss with {option('kind', 'coupled-loss')}"
            )
        if coupled and name in _NOT_COUPLED:
            raise KindError(
                f"{option(name)} chooses the models or losses other "
                f"kinds train; a coupled-loss function is given the features of the "
                f"harness's encoder and is its own loss: leave it out (shape the encoder with "
                f"{option('towers', 2)} and {option('negatives', 1)})"
            )
        raise KindError(
            f"{name!r} is not a scenario bound of a {kind} check; the bounds are "
            f"{', '.join(sorted(taken))}"
        )


# What a step's harness-given loss_fn aggregates the same packed or padded: a token mean (the
# default's) and a sum; a sequence mean would take a packed row for a sequence.
_PACKABLE_OBJECTIVES = ("", "token-mean", "sum")


def _packed_steps(kind: Kind, bounds: Mapping[str, Any], packings: tuple[str, ...]) -> None:
    """A :class:`KindError` for packed step micro-batches the harness cannot hand over."""
    if "split" in packings:
        raise KindError(
            f"{option('packings', bounds['packings'])}: split cuts a sequence across rows, "
            f"and the model a {kind} plug-in runs attends within a row, so the second part "
            "of a split sequence loses what came before and trains something else; pack "
            "with none, flat or rows"
        )
    if (bounds.get("objective") or "") not in _PACKABLE_OBJECTIVES:
        raise KindError(
            f"{option('packings', bounds['packings'])} with "
            f"{option('objective', bounds['objective'])}: the loss_fn a {kind} plug-in is "
            "given would take each packed row for a sequence; packed steps are checked "
            "under a token mean or a sum"
        )
    if tuple(bounds.get("losses", ("tokens",))) != ("tokens",) or bounds.get("loss_fn"):
        raise KindError(
            f"{option('packings', bounds['packings'])} packs the built-in token data's "
            "sequences, which the harness's transformer keeps apart by their position_ids: "
            f"draw {option('losses', 'tokens')} and leave out your own loss"
        )


def packed_step_bounds(
    kind: Kind, layout: Mapping[str, str], pinned: Mapping[str, Any], bounds: dict[str, Any]
) -> dict[str, Any]:
    """``bounds`` for a step called in ``layout``: dict micro-batches come from token data,
    padded and packed (flat, rows) unless the caller pinned ``packings``; packings pinned for
    code that takes pairs are a :class:`KindError` (pairs carry no boundaries).

    Example::

        packed_step_bounds(KIND["step"], {"batches": "dicts"}, {}, bounds)["packings"]
        # ('', 'flat', 'rows')
    """
    if "batches" not in kind.layout_axes:
        return bounds
    packings = tuple(pinned.get("packings", ("",)))
    if layout.get("batches") != "dicts":
        if packings != ("",):
            raise KindError(
                f"{option('packings', pinned['packings'])}: packed micro-batches come as "
                "dicts with their position_ids, and the code was called with (inputs, "
                "targets) pairs; pin the dicts it takes "
                f"({option('layout', 'batches=dicts')}) or leave packings out"
            )
        return bounds
    drawn = {**bounds, "losses": ("tokens",)}
    packable = (bounds.get("objective") or "") in _PACKABLE_OBJECTIVES
    if "packings" not in pinned and packable and not bounds.get("loss_fn"):
        drawn["packings"] = ("", "flat", "rows")
    return drawn


def bounds_for(kind: Kind | str, scenario_bounds: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario bounds a check of ``kind`` draws from: the kind's defaults, then the
    caller's, then what a declared objective implies (token data). A :class:`KindError` for
    bounds that do not go together, which ``check()`` asks before any world starts.

    Example::

        bounds_for("loss-agg", {})["objective"]  # 'token-mean'
    """
    kind = as_kind(kind)
    _refuse_foreign_bounds(kind, scenario_bounds)
    bounds = {**kind.bounds, **scenario_bounds}
    if scenario_bounds.get("objective") == SAMPLE_MEAN:
        # The default of losses over samples, declared: nothing changes, token data excepted.
        if "tokens" in tuple(bounds.get("losses", ())):
            other = "" if kind.token_losses else ", or draw other losses"
            raise KindError(
                f"objective={SAMPLE_MEAN!r} averages samples, and {kind} code sees token "
                f"losses here: declare token-mean or seq-mean-token-mean{other}"
            )
        del bounds["objective"]
    elif scenario_bounds.get("objective") == "sum" and not kind.token_losses:
        pass  # a sum adds the items of whatever losses the kind draws
    elif scenario_bounds.get("objective"):
        # A declared objective aggregates token losses: the token data is the one to draw.
        if tuple(scenario_bounds.get("losses", ("tokens",))) != ("tokens",):
            raise KindError(
                f"objective={scenario_bounds['objective']!r} aggregates token losses: draw "
                f"losses=('tokens',) (--losses tokens) with it, not {scenario_bounds['losses']!r}"
            )
        bounds["losses"] = ("tokens",)
    if (
        kind.owns_micro_batches
        and "optimizers" not in bounds
        and bounds.get("optimizer") is None
        and not kind.coupled
    ):
        # Code that steps the optimizer itself meets what a training loop's has: a schedule
        # that moves the rate every step, and biases in a second group at a rate of their own.
        from ..engine.strategies import optimizers

        bounds["optimizers"] = optimizers(schedules=True, groups=True)
    packings = tuple(scenario_bounds.get("packings", ("",)))
    steps = "batches" in kind.layout_axes
    if packings != ("",) and not (kind.packed or steps):
        raise KindError(
            f"{option('packings', scenario_bounds['packings'])} lays out the token logits or "
            f"per-token losses a loss-fn or loss-agg function is handed, or a step's "
            f"micro-batches; a {kind} plug-in is handed none: leave it out"
        )
    if steps and packings != ("",):
        _packed_steps(kind, scenario_bounds, packings)
    elif "split" in packings and not kind.token_losses:
        raise KindError(
            f"{option('packings', scenario_bounds['packings'])}: split cuts a sequence across "
            f"rows, and a {kind} plug-in that shifts its labels within a row would lose the "
            "target at each cut (split packers hand labels shifted already); pack with none, "
            "flat or rows"
        )
    if scenario_bounds.get("window_steps", 1) != 1 and not kind.token_losses:
        raise KindError(
            f"{option('window_steps', scenario_bounds['window_steps'])} spans the counts a "
            f"loss-agg function is handed (window_tokens, ...); a {kind} plug-in is given none: "
            "leave it out"
        )
    declared = scenario_bounds.get("objective") or ""
    if is_term_sum(declared) and not kind.token_losses:
        raise KindError(
            f"{option('objective', declared)} is a sum of terms, each handed to the code by "
            f"name: a loss-agg plug-in is, a {kind} plug-in is handed one loss; declare one "
            f"objective of the table, or check the aggregation with "
            f"{option('kind', 'loss-agg')}"
        )
    windowed = (
        declared
        and declared != SAMPLE_MEAN
        and not is_term_sum(declared)
        and objective(declared).scope != "step"
    )
    if windowed and not kind.token_losses:
        per_step = objective(declared).scoped("step")
        raise KindError(
            f"{option('objective', declared)} normalises each step by its window's "
            f"count, which only code handed the counts can do: a {kind} plug-in is "
            f"checked against per-step objectives (declare {per_step}), or check the "
            f"aggregation with {option('kind', 'loss-agg')}"
        )
    if scenario_bounds.get("token_weights") and not kind.token_losses:
        # Weights only code that is handed the weighted losses can know of.
        raise KindError(
            f"{option('token_weights', True)} weights the per-token loss matrix a loss-agg "
            f"function is given; a {kind} plug-in never sees it"
        )
    return bounds
