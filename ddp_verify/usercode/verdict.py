"""The answer of a check, whatever it is: one :class:`Verdict`, its exit code and its JSON.

``check()`` returns the verdict when no counterexample turned up and raises it (inside a
:class:`NotEquivalent` or :class:`CodeFailed`, complete when raised) otherwise; what the
command line does with any other exception is :func:`verdict_for`. The command line only
prints a verdict: its text, or :meth:`Verdict.to_json`, one document of the shape
:data:`JSON_FIELDS` documents.

A verdict carries data (the traces that diverged, the ranks' failure, the causes, the
reproducer's path); its report is rendered from them when read (:attr:`Verdict.report`,
:attr:`Verdict.summary`), by whichever front end shows it. Nothing upstream writes report
text, and nothing reads a verdict back out of it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..engine.outcome import EquivalenceError
from ..world.naming import public

if TYPE_CHECKING:
    from ..engine.outcome import Outcome
    from ..engine.scenario import Scenario
    from ..world.errors import RankError
    from .findings import Cause


class Status(str, enum.Enum):
    """What a check concluded, as ``--json`` spells it."""

    EQUIVALENT = "equivalent"
    NOT_EQUIVALENT = "not-equivalent"
    # The code raised, crashed a rank or hung.
    ERROR = "error"
    USAGE_ERROR = "usage-error"
    HARNESS_ERROR = "harness-error"
    INTERRUPTED = "interrupted"
    # Ended by SIGTERM or SIGHUP (a CI runner's or a scheduler's time-out), cleanly.
    TERMINATED = "terminated"

    @property
    def exit_code(self) -> int:
        """0 equivalent; 1 not equivalent, or the code failed; 2 a usage error; 3 the
        harness or the machine failed; 130 interrupted (SIGINT, as shells report it); 143
        terminated (SIGTERM or SIGHUP)."""
        return _EXIT_CODES[self]


_EXIT_CODES = {
    Status.EQUIVALENT: 0,
    Status.NOT_EQUIVALENT: 1,
    Status.ERROR: 1,
    Status.USAGE_ERROR: 2,
    Status.HARNESS_ERROR: 3,
    Status.INTERRUPTED: 128 + 2,
    Status.TERMINATED: 128 + 15,
}

# The JSON document of every verdict: each key, always present (null where it does not apply).
JSON_FIELDS = {
    "verdict": "the status: " + ", ".join(s.value for s in Status),
    "exit_code": "the command's exit code for it",
    "target": "what was checked (PATH.py:FUNCTION on the command line)",
    "kind": "the plug-in kind it was checked as",
    "world_size": "ranks of the world it ran on",
    "device": "cpu or cuda",
    "call": "how the harness called the code: 'sync(model, num_samples=<...>)'",
    "layout": "where the kind accepts several layouts (logits, labels, a list or a tensor): "
    "which one the code was called in and why, as the probe found it; null otherwise",
    "training": "equivalent where the code trains what one process trains (an equivalent "
    "verdict, or one where only the reported loss differs), not-equivalent where gradients or "
    "parameters differ; null where it did not run to a comparison",
    "examples": "scenarios tried",
    "found_at": "the example (1-based) at which the first counterexample turned up; the "
    "examples after it shrank it. null where none did",
    "precision": "float32 where the code was measured to compute in float32 inside (it was "
    "held to float32's measured bound); null otherwise",
    "precision_words": "what the precision probe measured, as the report's Precision line "
    "says it (a lower format, or float64 times a factor near one: an epsilon in a "
    "denominator); null where there is nothing to say",
    "scenario": "the (shrunk) counterexample, as a Scenario(...) expression",
    "likely_cause": "the first cause's words",
    "likely_causes": (
        "every cause: {cause, subject, pattern, reading, also_fits, evidence, weights, scenario}"
    ),
    "reproducer": "the path of a script that reproduces the counterexample",
    "seconds": "how long the check took",
    "timeline": "when the check reached each milestone, in seconds from its start: layout "
    "(the layout probes done), precision (the precision probe done), first_example, "
    "first_failure, shrunk (the counterexample shrunk), report; a milestone not reached is "
    "left out",
    "notes": "what the search met and left out of its draws, each with why (a known torch "
    "issue that a drawn model feature reaches: the search went on without that feature); "
    "empty where nothing was",
    "report": "the report, as the command prints it",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A check's answer: ``status``, and what backs it.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> import ddp_verify
        >>> def sample_weighted(model, num_samples):
        ...     total = torch.tensor([float(num_samples)], dtype=torch.float64)
        ...     dist.all_reduce(total)
        ...     for p in model.parameters():
        ...         if p.grad is not None:
        ...             p.grad.mul_(num_samples / total.item())
        ...             dist.all_reduce(p.grad)
        >>> verdict = ddp_verify.check(sample_weighted, kind="grad-sync", world_size=2,
        ...                            max_examples=5)
        >>> verdict.equivalent, verdict.examples, verdict.exit_code, verdict.to_json()["verdict"]
        (True, 5, 0, 'equivalent')
    """

    status: Status
    kind: str | None = None
    # The code's name (its qualified name); ``target`` is how the user named it, if otherwise.
    function: str | None = None
    target: str | None = None
    call: str | None = None
    # Which layout the code was called in and why, where its kind accepts several.
    layout: str | None = None
    world_size: int | None = None
    device: str | None = None
    examples: int | None = None
    # The example (1-based) at which the first counterexample turned up.
    found_at: int | None = None
    scenario: Scenario | None = None
    causes: tuple[Cause, ...] = ()
    reproducer: str | None = None
    # The format a lossy comm hook was held to ("float16"), or None for exact equivalence.
    lossy: str | None = None
    # The format the code computes in, measured, where lower than float64 ("float32").
    precision: str | None = None
    # What the precision probe measured, in words, where there is something to say (a lower
    # format, or float64 times a factor near one: an epsilon in a denominator).
    precision_words: str | None = None
    seconds: float | None = None
    # (milestone, seconds from the start) in the order reached: see JSON_FIELDS["timeline"].
    timeline: tuple[tuple[str, float], ...] = ()
    # What a verdict with no traces or failure to render says: a usage error's, the
    # harness's (an exception's own message, as data).
    message: str = ""
    # How reports name the code checked: its kind and name, and where its result is held.
    method: str | None = None
    # Whether training itself matched where the verdict is not equivalent: "equivalent"
    # where only the reported loss differs (see :attr:`training`).
    only_loss_differs: bool = False
    # What the search met and left out of its draws (a known torch issue), each with why.
    notes: tuple[str, ...] = ()
    # Where the world came from, where the caller did not choose it ("the pytest session's
    # world (--world-size 2)"): said at the end of the report.
    world_from: str | None = None
    # The traces of a counterexample, where there are some.
    outcome: Outcome | None = dataclasses.field(default=None, repr=False, compare=False)
    # The ranks' failure, where the code failed to run; its tracebacks keep the harness's
    # frames where ``full_trace`` (pytest's --full-trace).
    failure: RankError | None = dataclasses.field(default=None, repr=False, compare=False)
    full_trace: bool = False

    @property
    def training(self) -> str | None:
        """``equivalent`` where the code trains what one process trains (all of it, or all
        but the loss it reports), ``not-equivalent`` where gradients or parameters differ,
        None where nothing was compared (an error)."""
        if self.status is Status.EQUIVALENT or self.only_loss_differs:
            return "equivalent"
        if self.status is Status.NOT_EQUIVALENT:
            return "not-equivalent"
        return None

    @property
    def equivalent(self) -> bool:
        return self.status is Status.EQUIVALENT

    @property
    def exit_code(self) -> int:
        return self.status.exit_code

    @property
    def called_as(self) -> str:
        """The ``Called as:`` line's text: the call, and the layout's words where probed."""
        return f"{self.call}" + (f"\nLayout: {self.layout}" if self.layout else "")

    @property
    def cause(self) -> str | None:
        """The first cause's words, or None."""
        return self.causes[0].text if self.causes else None

    @property
    def summary(self) -> str:
        """One line: what was checked, how it ended and the first cause (where it was shown,
        if not on the counterexample): pytest's short summary line for a failing check.

        Example::

            >>> from ddp_verify.usercode.findings import Cause
            >>> cause = Cause("gradients averaged by the world size", "gradient", "ranks:world")
            >>> Verdict(Status.NOT_EQUIVALENT, kind="grad-sync", function="sync",
            ...         causes=(cause,)).summary
            'grad-sync sync is not equivalent: gradients averaged by the world size'
        """
        checked = " ".join(w for w in (self.kind, self.function or self.target) if w)
        ended = _ENDED.get(self.status)
        if ended is None or not checked:
            return self.report.strip().partition("\n")[0]
        said = f"{checked} {ended}"
        if self.causes:
            first = self.causes[0]
            said += f": {first.text}" + (f" ({first.scenario})" if first.scenario else "")
        elif self.failure is not None:
            said += f": {self.failure.headline}"
        return said

    @property
    def report(self) -> str:
        said = self._report() + "".join(f"\nNote: {note}" for note in self.notes)
        if self.world_from is None:
            return said
        return f"{said}\nWorld: {self.world_from}"

    def _report(self) -> str:
        if self.status is Status.NOT_EQUIVALENT and self.outcome is not None:
            return self._divergence_report(self.outcome)
        if self.status is Status.ERROR and self.failure is not None:
            return self._failure_report(self.failure)
        if self.message or self.status is not Status.EQUIVALENT:
            return self.message
        lossy = ""
        if self.lossy:
            lossy = (
                " (lossy by design: low rank, exact at the full rank its state gives)"
                if self.lossy.startswith("low rank")
                else f" (lossy by design: within {self.lossy}'s bound)"
            )
        precision = ""
        if self.precision_words:
            precision = f"\nPrecision: {self.precision_words}"
        elif self.precision:
            precision = (
                f"\nPrecision: computes in {self.precision}: held to {self.precision}'s "
                "measured bound"
            )
        return (
            f"{self.target or self.function} ({self.kind}): equivalent on {self.examples} "
            f"generated scenarios at world size {self.world_size}; no counterexample found"
            f"{lossy}\nCalled as: {self.called_as}{precision}"
        )

    def _divergence_report(self, outcome: Outcome) -> str:
        lines = [outcome.headline()]
        if self.only_loss_differs:
            lines.append(
                "Training is equivalent: gradients and parameters match the reference at every "
                "step; only the reported loss differs."
            )
        lines += [f"Called as: {self.called_as}", outcome.divergence()]
        lines += [describe_causes(self.causes), f"Reproducer: python {self.reproducer}"]
        return "\n".join(lines)

    def _failure_report(self, failure: RankError) -> str:
        lines = [
            f"{self.method} failed to run on a world of {self.world_size}:",
            f"Called as: {self.called_as}",
            failure.report(full_trace=self.full_trace),
        ]
        if self.scenario is not None:
            lines += [
                f"Scenario: {self.scenario.describe()}",
                f"Reproduce with: {self.scenario!r}",
            ]
        if self.causes:
            lines.append(f"Likely cause: {self.causes[0].text}")
        return "\n".join(lines)

    def filled(self, **context: Any) -> Verdict:
        """This verdict with the fields it lacks taken from ``context`` (what a front end
        knows beside it: the target as the user named it); its own are kept (the call as the
        check made it, shapes included)."""
        return dataclasses.replace(
            self, **{k: v for k, v in context.items() if getattr(self, k) is None}
        )

    def to_json(self) -> dict[str, Any]:
        """The verdict as one JSON-ready document (keys: :data:`JSON_FIELDS`)."""
        document = {
            "verdict": self.status.value,
            "exit_code": self.exit_code,
            "target": self.target,
            "kind": self.kind,
            "world_size": self.world_size,
            "device": self.device,
            "call": self.call,
            "layout": self.layout,
            "training": self.training,
            "examples": self.examples,
            "found_at": self.found_at,
            "precision": self.precision,
            "precision_words": self.precision_words,
            "scenario": repr(self.scenario) if self.scenario is not None else None,
            "likely_cause": self.cause,
            "likely_causes": [c.as_json() for c in self.causes],
            "reproducer": self.reproducer,
            "seconds": round(self.seconds, 3) if self.seconds is not None else None,
            "timeline": dict(self.timeline),
            "notes": list(self.notes),
            "report": self.report,
        }
        assert document.keys() == JSON_FIELDS.keys()
        return document


def describe_causes(causes: Sequence[Cause]) -> str:
    """The report's lines for ``causes``: the first as ``Likely cause:``, the others after,
    each with its evidence.

    Example::

        >>> from ddp_verify.usercode.findings import Cause
        >>> print(describe_causes([Cause("gradients scaled 2x", "gradient", "scale")]))
        Likely cause: gradients scaled 2x
    """
    lines = []
    for i, cause in enumerate(causes):
        head = "Likely cause: " if i == 0 else f"Also ({cause.subject}): "
        if i == 1:
            lines.append("Other causes found:")
        lines.append(("" if i == 0 else "  ") + head + cause.text)
        if cause.evidence:
            lines.append(("  " if i == 0 else "    ") + "evidence: " + cause.evidence)
        if cause.scenario:
            lines.append(("  " if i == 0 else "    ") + "shown on: " + cause.scenario)
    return "\n".join(lines)


# How a check that did not pass ended, as its one-line summary says it.
_ENDED = {
    Status.NOT_EQUIVALENT: "is not equivalent",
    Status.ERROR: "failed to run",
    Status.EQUIVALENT: "is equivalent",
}

# Said where the evidence was left out of a report.
EVIDENCE_HINT = "(The evidence behind each cause: rerun with --verbose, or --json.)"


def brief(report: str) -> str:
    r"""``report`` without its evidence lines, which a terminal reader rarely needs first: the
    command line's default (``--verbose`` prints them, ``--json`` always carries them).

    Example::

        >>> print(brief("Likely cause: scale\n  evidence: fitted 0.5\nReproducer: x.py"))
        Likely cause: scale
        Reproducer: x.py
        (The evidence behind each cause: rerun with --verbose, or --json.)
    """
    lines = report.splitlines()
    kept = [line for line in lines if not line.lstrip().startswith("evidence:")]
    if len(kept) == len(lines):
        return report
    return "\n".join([*kept, EVIDENCE_HINT])


@public
class CheckFailed(EquivalenceError):
    """A check that did not pass, with its :class:`Verdict` (``error.verdict``), complete
    when raised: ``causes``, ``reproducer`` and ``found_at`` read from it; ``summary`` says
    it in one line.

    Example::

        >>> error = NotEquivalent(Verdict(Status.NOT_EQUIVALENT, kind="step", function="train"))
        >>> isinstance(error, CheckFailed), error.summary
        (True, 'step train is not equivalent')
    """

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.report, scenario=verdict.scenario, outcome=verdict.outcome)
        self.verdict = verdict

    @property
    def cause(self) -> str | None:
        return self.verdict.cause

    @property
    def summary(self) -> str:
        """The verdict in one line (:attr:`Verdict.summary`)."""
        return self.verdict.summary

    @property
    def causes(self) -> tuple[Cause, ...]:
        return self.verdict.causes

    @property
    def reproducer(self) -> str | None:
        return self.verdict.reproducer

    @property
    def found_at(self) -> int | None:
        return self.verdict.found_at

    def __reduce__(self) -> Any:
        return type(self), (self.verdict,)


@public
class NotEquivalent(CheckFailed):
    """A counterexample: the code trains something other than single-process full-batch
    training. An :class:`~ddp_verify.engine.outcome.EquivalenceError`, as the methods'.

    Example::

        >>> import torch.distributed as dist
        >>> import ddp_verify
        >>> def world_average(model):
        ...     for p in model.parameters():
        ...         if p.grad is not None:
        ...             dist.all_reduce(p.grad)
        ...             p.grad /= dist.get_world_size()
        >>> try:
        ...     ddp_verify.check(world_average, kind="grad-sync", world_size=2, seed=0)
        ... except NotEquivalent as error:
        ...     print(error.verdict.causes[0].pattern, error.verdict.exit_code)
        ranks:world 1
    """


@public
class CodeFailed(CheckFailed):
    """The code under check raised, crashed a rank or hung: the verdict ``error``, not
    ``not-equivalent`` (an ``EquivalenceError`` still, so callers that catch those see it).

    Example::

        >>> import ddp_verify
        >>> def gives_up(model):
        ...     raise RuntimeError("not today")
        >>> try:
        ...     ddp_verify.check(gives_up, kind="grad-sync", world_size=2)
        ... except CodeFailed as error:
        ...     print(error.verdict.status.value, error.verdict.exit_code)
        error 1
    """


def verdict_for(exc: BaseException, **context: Any) -> Verdict:
    """The verdict an exception out of a check means (``context``: the verdict's other
    fields, such as ``target`` and ``kind``). A failed check carries its own; the code that
    cannot be used as its kind, or cannot be sent to the ranks, or asks for GPUs that are not
    there is a usage error; a world that cannot start, a backend that is not there, the
    reference failing is the harness's; anything else is an internal error, said as such.

    Example::

        try:
            verdict = check(fn, kind=kind)
        except BaseException as exc:
            verdict = verdict_for(exc, kind=kind)
        sys.exit(verdict.exit_code)
    """
    import traceback

    from ..methods.equivalence import HarnessError
    from ..world import DeviceUnavailable, JobPicklingError, WorldError
    from ..world.cleanup import Terminated
    from .kinds import KindError

    if isinstance(exc, CheckFailed):
        return exc.verdict.filled(**context)
    if isinstance(exc, (KindError, JobPicklingError, DeviceUnavailable)):
        status, text = Status.USAGE_ERROR, f"ddp-verify: error: {exc}"
    elif isinstance(exc, (WorldError, HarnessError)):
        status, text = Status.HARNESS_ERROR, f"ddp-verify: harness error: {exc}"
    elif isinstance(exc, Terminated):
        status, text = Status.TERMINATED, f"ddp-verify: terminated by signal {exc.signum}"
    elif isinstance(exc, KeyboardInterrupt):
        status, text = Status.INTERRUPTED, "ddp-verify: interrupted"
    else:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        status = Status.HARNESS_ERROR
        text = f"ddp-verify: internal error, please report it:\n{trace}"
    return Verdict(status, message=text, **context)
