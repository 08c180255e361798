"""Places where the installed torch is known not to be equivalent, kept as failing checks.

A property that fails because of a torch bug stays in the suite, marked with
:func:`known_torch_issue`. The mark names the issue by its signature: the kind of failure, a
pattern its message must match (searched in the report, and in every rank's summary, details
and output when a rank failed), and the torch versions it is known on. A failure that matches
reads as an expected failure naming the issue; one that does not (a wrapper's own bug, another
crash) is a failure, with a note saying what the mark expected. On a version the mark covers, a
pass is reported as a failure that says to drop the mark (or bound it with ``fixed_in``),
unless the issue is ``flaky`` (it depends on timing). Outside its versions the mark is inert:
the test gates as any other. A wrapper under ``--ddp-wrapper`` is held to the same property:
the mark says what torch gets wrong, not what the wrapper may.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from ..world.errors import failure_text

MARKER = "known_torch_issue"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the release numbers, local and pre-release labels
    dropped.

    Example::

        >>> version_tuple("2.14.1+cu128") >= version_tuple("2.14")
        True
    """
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


@dataclasses.dataclass(frozen=True)
class KnownIssue:
    """A torch issue by its signature: ``raises`` (the failure's kinds), ``match`` (a regular
    expression its text must contain), ``since`` and ``fixed_in`` (the torch versions it is
    known on: ``since <= version < fixed_in``, either open), ``backends`` (the process-group
    backends it is known on; None: every one), ``world_sizes`` (the world sizes it shows at;
    None: every one)."""

    what: str
    raises: tuple[type[BaseException], ...]
    match: str
    since: str | None = None
    fixed_in: str | None = None
    flaky: bool = False
    url: str | None = None
    repro: str | None = None
    backends: tuple[str, ...] | None = None
    world_sizes: tuple[int, ...] | None = None

    @property
    def reason(self) -> str:
        where = self.url or "not found in torch's tracker"
        if self.repro:
            where += f"; standalone reproducer: {self.repro}"
        return f"known torch issue: {self.what} ({where})"

    def applies_to(
        self, version: str, backend: str | None = None, world_size: int | None = None
    ) -> bool:
        """Whether torch ``version`` (and ``backend`` and ``world_size``, where given) is one
        the issue is known on."""
        if self.backends is not None and backend is not None and backend not in self.backends:
            return False
        if (
            self.world_sizes is not None
            and world_size is not None
            and world_size not in self.world_sizes
        ):
            return False
        mine = version_tuple(version)
        if self.since is not None and mine < version_tuple(self.since):
            return False
        return self.fixed_in is None or mine < version_tuple(self.fixed_in)

    def matches(self, error: BaseException, output: str = "") -> bool:
        """Whether ``error`` is this issue: of one of its kinds, its pattern in its text or in
        ``output`` (what the ranks printed during the test)."""
        text = failure_text(error) + "\n" + output
        return isinstance(error, self.raises) and re.search(self.match, text) is not None


def known_torch_issue(
    what: str,
    *,
    raises: type[BaseException] | tuple[type[BaseException], ...],
    match: str,
    since: str | None = None,
    fixed_in: str | None = None,
    flaky: bool = False,
    url: str | None = None,
    repro: str | None = None,
    backends: tuple[str, ...] | None = None,
    world_sizes: tuple[int, ...] | None = None,
) -> Any:
    """Mark a conformance test whose property the installed torch is known to break.

    Example::

        @known_torch_issue(
            "static_graph with no_sync() asserts",
            raises=RankError,
            match=r"expect_autograd_hooks_",
            since="2.0",
            url="https://github.com/pytorch/pytorch/issues/143580",
        )
        def test_static_graph_with_no_sync_accumulation(world, data_parallel, prove): ...
    """
    kinds = raises if isinstance(raises, tuple) else (raises,)
    issue = KnownIssue(
        what, kinds, match, since, fixed_in, flaky, url, repro, backends, world_sizes
    )
    return pytest.mark.known_torch_issue(issue)


def issues_of(item: pytest.Item) -> list[KnownIssue]:
    """The known issues a test is marked with (a test may meet more than one), closest first."""
    return [marker.args[0] for marker in item.iter_markers(MARKER)]


def judge(
    issues: list[KnownIssue],
    report: pytest.TestReport,
    error: BaseException | None,
    version: str,
    *,
    searched: int | None = None,
    enough: int = 0,
    backend: str | None = None,
    world_size: int | None = None,
) -> None:
    """Turn a marked test's call report into what its marks say it is (in place): a failure
    that matches one issue known on ``version`` is that issue; another failure stays one, with
    a note; a pass where a steady (not flaky) issue is known fails, saying to drop its mark,
    unless fewer than ``enough`` scenarios were ``searched`` (a short search that misses the
    issue shows nothing about a fix: the pass stands, with a note)."""
    issues = [i for i in issues if i.applies_to(version, backend, world_size)]
    if not issues:
        return
    # The ranks' output as the report shows it: a rank that aborted while its peer hung may have
    # printed the abort after the failure was put together, and the report still has it.
    output = "\n".join(body for title, body in report.sections if " rank " in title)
    matched = next((i for i in issues if error is not None and i.matches(error, output)), None)
    if report.failed and matched is not None:
        report.outcome = "skipped"
        report.wasxfail = matched.reason
    elif report.failed:
        expected = "; or ".join(
            f"{', '.join(k.__name__ for k in i.raises)} matching {i.match!r}: {i.what}"
            for i in issues
        )
        report.sections.append(
            (
                "known torch issue",
                f"this failure is not the known torch issue the test is marked with, which "
                f"is {expected}",
            )
        )
    elif report.passed:
        steady = [i for i in issues if not i.flaky]
        if steady and searched is not None and searched < enough:
            report.sections.append(
                (
                    "known torch issue",
                    f"not reproduced in {searched} scenarios (fewer than {enough}): "
                    f"{steady[0].what}",
                )
            )
        elif steady:
            report.outcome = "failed"
            report.longrepr = (
                f"[XPASS(strict)] the known torch issue no longer reproduces on torch "
                f"{version}: {steady[0].what}. Drop the mark, or bound it with "
                f"fixed_in={version!r}"
            )
