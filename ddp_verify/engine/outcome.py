"""The outcome of training a scenario with a method next to the reference, and the report of
the first divergence that :class:`EquivalenceError` carries."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..world.naming import public

# Types only: the error must import without torch (the command line's usage errors, which
# start nothing, are reported through it).
if TYPE_CHECKING:
    from .compare import Mismatch
    from .scenario import Scenario
    from .tolerances import Tolerance
    from .trace import Trace


@public
class EquivalenceError(AssertionError):
    """Training left single-process full-batch training, or the code under test failed to
    run; the message says where and why. ``scenario`` is the (shrunk) scenario, ``outcome``
    the traces when there are any. A check of user code raises a subclass that also carries
    its verdict, causes and reproducer (``ddp_verify.usercode.verdict.CheckFailed``). An
    ``AssertionError``, so pytest reports it as a test's failure.

    Example::

        >>> error = EquivalenceError("ddp() is not equivalent to single-process training.")
        >>> isinstance(error, AssertionError), error.scenario, error.mismatch
        (True, None, None)
    """

    def __init__(
        self, report: str, *, scenario: Scenario | None = None, outcome: Outcome | None = None
    ) -> None:
        self.outcome = outcome
        self.scenario = scenario if scenario is not None else getattr(outcome, "scenario", None)
        self.mismatch = outcome.mismatch if outcome is not None else None
        super().__init__(report)

    @classmethod
    def from_outcome(cls, outcome: Outcome) -> EquivalenceError:
        return cls(outcome.report(), outcome=outcome)


@dataclasses.dataclass
class Outcome:
    """A method's trace next to the reference's, the tolerance they were compared under, and
    the first divergence (None if none)."""

    method: str
    scenario: Scenario
    reference: Trace
    got: Trace
    mismatch: Mismatch | None
    tolerance: Tolerance

    @property
    def equivalent(self) -> bool:
        return self.mismatch is None

    def allowance_used(self) -> float:
        """The largest difference from the reference as a share of what the tolerance allows
        there (below 1 passes; see :func:`~ddp_verify.engine.compare.allowance_used`)."""
        from .compare import allowance_used

        return allowance_used(self.reference, self.got, self.tolerance)

    def report(self) -> str:
        """The headline, then where and how training diverged (:meth:`divergence`)."""
        if self.mismatch is None:
            return f"{self.method} is equivalent to the reference on this scenario."
        return f"{self.headline()}\n{self.divergence()}"

    def headline(self) -> str:
        """The report's first line: what was checked and that it diverged."""
        return f"{self.method} is not equivalent to single-process full-batch training."

    def divergence(self) -> str:
        """Where training left the reference first, by how much, the losses there and the
        scenario: the lines under a report's headline (none where it did not diverge)."""
        m = self.mismatch
        if m is None:
            return ""
        lines = [m.render()]
        if "your " in self.reference.method:
            # Not the engine's oracle on the harness's own pieces: say which judged.
            lines.insert(0, f"Judged against: the {self.reference.method}")
        if m.note == "" and 0 <= m.step < self.reference.steps:
            expected = self.reference.ranks[0].losses[m.step]
            got = ", ".join(f"{r.losses[m.step]:.6g}" for r in self.got.ranks)
            lines.append(f"Losses at step {m.step}: reference {expected:.6g}, ranks {got}")
        lines.append("Scenario: " + self.scenario.describe())
        if self.scenario.loss == "tokens":
            lines.append(tokens_line(self.scenario))
        lines.append(f"Reproduce with: {self.scenario!r}")
        return "\n".join(lines)


def tokens_line(scenario: Scenario) -> str:
    """Per step and rank, the tokens that count in each micro-batch: what a token-level loss
    averages over, beside the micro-batch sizes in samples (the sequences that count, where
    the declared objective means over sequences); and under a declared objective, where some
    were drawn, the sequences with no token that counts."""
    from .models import blank_sequences, item_counts
    from .objectives import objective

    def per_micro_batch(counts: tuple[tuple[tuple[int, ...], ...], ...]) -> str:
        return "\n".join(
            f"  step {s}: "
            + "  ".join(f"rank {r}: {'+'.join(map(str, n))}" for r, n in enumerate(per_rank))
            for s, per_rank in enumerate(counts)
        )

    steps = per_micro_batch(item_counts(scenario))
    if scenario.objective and objective(scenario.objective).unit == "sequence":
        line = f"sequences with a token that counts, per micro-batch:\n{steps}"
    else:
        line = f"tokens that count per micro-batch:\n{steps}"
    blank = blank_sequences(scenario) if scenario.objective else ()
    if any(n for per_rank in blank for sizes in per_rank for n in sizes):
        # Drawn on purpose (prompts with no response): said, as sequence means leave them out.
        line += (
            "\nsequences with no token that counts (left out of sequence means), per "
            f"micro-batch:\n{per_micro_batch(blank)}"
        )
    return line
