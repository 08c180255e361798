"""A parity run, start to verdict: the reference layout and every other layout launched and
recorded (:mod:`.launch`), the recordings compared (:mod:`.compare`), one verdict with
``check``'s shape (:class:`~ddp_verify.usercode.verdict.Verdict`) and each layout's figures.

Example::

    result = run_parity(["python", "train.py", "--grad-accum", "{grad_accum}"],
                        layouts=parse_layouts("1x4,2x2"), steps=3)
    result.verdict.status, result.layouts
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..engine.tolerances import Tolerance
from ..usercode.findings import Cause
from ..usercode.verdict import Status, Verdict, describe_causes
from ..world import cleanup
from ..world.naming import option
from .compare import Comparison, compare_layouts, derived_tolerance, rounding_dtype, told_apart
from .curves import curves
from .launch import DEFAULT_LAUNCHER, Run, launch, script_of
from .launchers import Launcher, parse_launcher
from .layouts import Layout, LayoutError, check_placeholders, fill, per_node
from .recording import Recording, RecordingError
from .reproducible import trains_nothing, unreproduced

__all__ = ["ParityResult", "compare_recordings", "run_parity"]

# The seed of the rounding-only variant of the reference run (see recorder.ENV_PERTURB).
VARIANT_SEED = 1


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What a parity report says where layouts were compared: the reference recording, each
    judged layout's comparison, the layouts left unjudged and why, what each run took. Data;
    :attr:`ParityResult.report` renders it."""

    target: str | None
    reference: Recording = dataclasses.field(repr=False)
    comparisons: tuple[Comparison, ...]
    steps: int
    strict_loss: bool = False
    unjudged: tuple[str, ...] = ()
    why_unjudged: str = ""
    # (layout, seconds) of each run of the script, the reference's first.
    timing: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class RunFailure:
    """A layout's run of the script that failed: which, why, its command and its output's
    last lines. Data; :attr:`ParityResult.report` renders it."""

    target: str
    layout: str
    why: str
    command: str
    output: str


@dataclasses.dataclass(frozen=True)
class ParityResult:
    """A parity run's verdict (``check``'s keys) and each layout's figures; the report is
    rendered from them when read.

    Example::

        document = result.to_json()   # check's keys, plus "layouts"
    """

    verdict: Verdict
    layouts: tuple[dict[str, Any], ...] = ()
    # The reference layout's label and curves (see curves.py); each row has its own.
    reference: dict[str, Any] | None = None
    # What passed with a warning: layouts that train what the reference trains but log
    # another loss (a failure under strict_loss, and then not a warning).
    warnings: tuple[str, ...] = ()
    strict_loss: bool = False
    # What the report is rendered from: the layouts judged, or the run that failed; the
    # verdict's own report otherwise (a usage error, the harness's).
    judgement: Judgement | None = dataclasses.field(default=None, repr=False)
    failure: RunFailure | None = None

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def summary(self) -> str:
        """The verdict in one line: the script, how it ended, and the first cause with its
        layout, or the layout whose run failed and why."""
        said = self.verdict.summary
        if self.failure is not None:
            said += f": layout {self.failure.layout} {self.failure.why}"
        return said

    @property
    def report(self) -> str:
        if self.judgement is not None:
            return _report(self.judgement)
        if self.failure is not None:
            f = self.failure
            return (
                f"ddp-verify parity: {f.target}\nLayout {f.layout} {f.why}.\nCommand: "
                f"{f.command}\nIts output:\n{f.output}"
            )
        return self.verdict.report

    def to_json(self) -> dict[str, Any]:
        return {
            **self.verdict.to_json(),
            "report": self.report,
            "layouts": list(self.layouts),
            "reference_layout": self.reference,
            "warnings": list(self.warnings),
            "strict_loss": self.strict_loss,
        }


def run_parity(
    command: Sequence[str],
    *,
    layouts: Sequence[Layout],
    reference: Layout | None = None,
    steps: int = 3,
    global_batch: int | None = None,
    float64: bool = True,
    launcher: str | Launcher = DEFAULT_LAUNCHER,
    timeout: float = 600.0,
    keep: Path | None = None,
    progress: Callable[[str], None] | None = None,
    nnodes: int = 1,
    caches_gradients: bool = False,
    strict_loss: bool = False,
) -> ParityResult:
    """Run ``command`` (the script as one process runs it, placeholders included) at the
    ``reference`` layout and at each of ``layouts``, ``steps`` optimizer steps each, and
    compare. ``keep``: the directory the recordings stay in (a temporary one otherwise);
    ``progress`` is told what runs; ``nnodes``: the nodes each layout of more than one rank
    spans (see :func:`~.launch.launch`).

    A script whose loss couples samples across ranks (it gathers features that carry
    gradient) is judged at layouts that do not accumulate: accumulating takes in-batch
    negatives from each micro-batch. Layouts of several ranks without accumulation run
    first, so that the ones that accumulate need not run once it is seen;
    ``caches_gradients=True`` says the script accumulates exactly (GradCache) and has every
    layout judged. A layout that trains what the reference trains but logs another loss (rank
    0's own, say) passes with a warning, unless ``strict_loss``.

    Example::

        run_parity(["python", "train.py", "--bs", "{micro_batch}"], global_batch=16,
                   layouts=[Layout(1, 4), Layout(2, 2)])
    """
    started = time.monotonic()
    reference = reference or Layout(1, 1)
    target = " ".join(command)
    asked = [layout for layout in layouts if layout != reference]
    # Several ranks and no accumulation first: a gather of features shows there first.
    order = [reference, *sorted(asked, key=lambda layout: not _shows_gathers(layout))]
    _check_command(command, order, global_batch, nnodes)
    if not isinstance(launcher, Launcher):
        launcher = parse_launcher(launcher)
    work = keep or Path(tempfile.mkdtemp(prefix=cleanup.owned("ddp_verify-parity-")))
    # Every run of this parity run: the same script, steps, batch, dtype and launcher.
    run_at = functools.partial(
        launch,
        command=command,
        steps=steps,
        global_batch=global_batch,
        float64=float64,
        launcher=launcher,
        timeout=timeout,
        nnodes=nnodes,
    )
    # The preflight: the reference layout run a second time beside the first (its first
    # step), which it must reproduce before any layout is held to it.
    again = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    second = again.submit(run_at, reference, directory=work / f"{reference}-again", steps=1)
    again.shutdown(wait=False)
    try:
        runs: dict[Layout, Run] = {}
        recordings: dict[Layout, Recording] = {}
        for layout in order:
            if layout != reference and _not_judged(
                layout, [r.exchanged for r in recordings.values()], caches_gradients
            ):
                if progress is not None:
                    progress(f"layout {layout}: not run (the loss couples samples across ranks)")
                continue
            if progress is not None:
                progress(f"layout {layout}: running {steps} step(s)")
            # The reference records its samples as the context-parallel layouts' ranks see
            # them too: each its pieces of the sequences.
            cut = sorted({a.cp for a in asked if a.cp > 1}) if layout == reference else []
            run = run_at(layout, directory=work / str(layout), pieces=cut)
            runs[layout] = run
            failed = _failed(run, target, started)
            if failed is not None:
                return failed
            try:
                recordings[layout] = Recording.load(run.directory)
            except RecordingError as exc:
                # A rank of the script's run left no recording: the run's failure, not a usage
                # error.
                return _error(run, target, started, f"left an incomplete recording ({exc})")
            if layout == reference:
                unsettled = _reproduced(second.result(), recordings[layout], target, started)
                if unsettled is not None:
                    return unsettled
                nothing = trains_nothing(recordings[layout], steps)
                if nothing is not None:
                    return _unjudgeable([nothing], target, started)
        tolerance = None
        base = recordings[reference]
        if not base.float64:
            # The script forces its own precision, or computes in a lower one inside: a
            # rounding-only variant of the reference run (moved by that precision's unit
            # roundoff) bounds what rounding alone does to it.
            if progress is not None:
                progress(f"layout {reference}: a rounding-only variant ({base.precision})")
            variant = run_at(
                reference,
                directory=work / f"{reference}-variant",
                perturb=VARIANT_SEED,
                perturb_dtype=rounding_dtype(base) if base.lower_inside else None,
            )
            failed = _failed(variant, target, started)
            if failed is not None:
                return failed
            tolerance = derived_tolerance(base, Recording.load(variant.directory), steps)
        # Reported in the order asked; a layout not run is reported as not judged.
        others = [
            recordings.get(layout) or _unrun(layout, command, global_batch, nnodes)
            for layout in asked
        ]
        result = compare_recordings(
            base,
            others,
            steps=steps,
            tolerance=tolerance,
            target=target,
            started=started,
            caches_gradients=caches_gradients,
            strict_loss=strict_loss,
        )
        by_label = {str(layout): run for layout, run in runs.items()}
        for row in result.layouts:
            if row["layout"] in by_label:
                row["seconds"] = round(by_label[row["layout"]].seconds, 3)
                row["command"] = shlex.join(by_label[row["layout"]].command)
        failing = [row for row in result.layouts if row["verdict"] == NOT_EQUIVALENT]
        verdict = result.verdict
        if failing:
            verdict = dataclasses.replace(verdict, reproducer=failing[0]["command"])
        judgement = result.judgement
        if judgement is not None:
            # What each layout's run of the script took, recorded (the reference's first).
            timing = tuple((str(layout), run.seconds) for layout, run in runs.items())
            judgement = dataclasses.replace(judgement, timing=timing)
        return dataclasses.replace(result, verdict=verdict, judgement=judgement)
    finally:
        with contextlib.suppress(Exception):
            second.result()  # bounded by the run's own time-out; nothing left running
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _reproduced(again: Run, first: Recording, target: str, started: float) -> ParityResult | None:
    """None where the second run of the reference trains what the first did; else the
    result that says it does not, and why (:func:`~.reproducible.unreproduced`), a usage
    error: no layout is judged against a reference that is not the same twice."""
    failed = _failed(again, target, started)
    if failed is not None:
        return failed
    try:
        second = Recording.load(again.directory, label=first.label)
    except RecordingError as exc:
        return _error(again, target, started, f"left an incomplete recording ({exc})")
    causes = unreproduced(first, second, steps=1)
    return _unjudgeable(causes, target, started) if causes else None


def _unjudgeable(causes: list[Cause], target: str, started: float) -> ParityResult:
    """A usage error that says why no layout can be judged against the reference."""
    verdict = Verdict(
        Status.USAGE_ERROR,
        kind="script",
        target=target,
        causes=tuple(causes),
        message=f"ddp-verify parity: error: {causes[0].text}",
        seconds=time.monotonic() - started,
    )
    return ParityResult(verdict, ())


def _check_command(
    command: Sequence[str], layouts: Sequence[Layout], global_batch: int | None, nnodes: int
) -> None:
    """Every layout's command can be made, its ranks divide over the nodes, and the script is
    there: said before anything starts (a :class:`~.layouts.LayoutError`)."""
    script = script_of(command)
    if script[0] != "-m" and not Path(script[0]).is_file():
        raise LayoutError(f"{script[0]}: no such script")
    check_placeholders(script, layouts, global_batch=global_batch)
    for layout in layouts:
        fill(script, layout, global_batch=global_batch, nnodes=nnodes)
        if layout.world_size > 1:
            per_node(layout, nnodes)


def _shows_gathers(layout: Layout) -> bool:
    """Whether a layout's run shows a loss that couples samples across ranks before any
    layout that accumulates must run: several ranks, one micro-batch each."""
    return layout.world_size > 1 and layout.grad_accum == 1


def _not_judged(layout: Layout, exchanged: Sequence[Sequence[str]], caches: bool) -> bool:
    """Whether ``layout`` is left unjudged: it accumulates, and some run gathered features
    that carry gradient (``exchanged``: each run's), and the script does not say it caches
    gradients across micro-batches."""
    return layout.grad_accum > 1 and not caches and any(exchanged)


@dataclasses.dataclass
class _Unrun:
    """A layout left unjudged before it ran: what the report and its row say of it."""

    layout: Layout
    command: str

    @property
    def label(self) -> str:
        return str(self.layout)


def _unrun(layout: Layout, command: Sequence[str], global_batch: int | None, nnodes: int) -> _Unrun:
    script = fill(script_of(command), layout, global_batch=global_batch, nnodes=nnodes)
    return _Unrun(layout, shlex.join(script))


NOT_EQUIVALENT = Status.NOT_EQUIVALENT.value
NOT_JUDGED = "not-judged"


def compare_recordings(
    reference: Recording,
    others: Sequence[Recording | _Unrun],
    *,
    steps: int,
    tolerance: Tolerance | None = None,
    target: str | None = None,
    started: float | None = None,
    caches_gradients: bool = False,
    strict_loss: bool = False,
) -> ParityResult:
    """The verdict on ``others`` held to ``reference`` (recordings made by the user's own
    launches, or by :func:`run_parity`). Where a run gathered features that carry gradient
    (a loss that couples samples across ranks), the layouts that accumulate are not judged,
    and the report says why, unless ``caches_gradients``. Where training is equivalent and
    only the logged loss differs, the layout passes with a warning (the training verdict
    decides), unless ``strict_loss`` makes the logged loss count too.

    Example::

        compare_recordings(Recording.load(Path("rec/1x1")), [Recording.load(Path("rec/2x2"))],
                           steps=3)
    """
    started = time.monotonic() if started is None else started
    if not others:
        raise RecordingError("nothing to compare: give the reference and at least one layout")
    ran = [other for other in others if isinstance(other, Recording)]
    exchanged = [where for r in [reference, *ran] for where in r.exchanged]
    gathers = list(dict.fromkeys(exchanged))
    unjudged = [
        other
        for other in others
        if not isinstance(other, Recording)
        or _not_judged(Layout(other.world_size, other.grad_accum), [gathers], caches_gradients)
    ]
    if gathers and not caches_gradients and reference.grad_accum > 1:
        raise RecordingError(
            f"the reference layout {reference.label} accumulates {reference.grad_accum} "
            f"micro-batches, and your script's loss couples samples across ranks "
            f"({_gathered(gathers)}): its in-batch negatives then come from each micro-batch. "
            "Hold the layouts to one that does not accumulate (--reference 1x1), or say that "
            "the script caches gradients across micro-batches (--caches-gradients)"
        )
    judged = [other for other in ran if other not in unjudged]
    if not judged:
        raise RecordingError(
            f"no layout left to judge: your script's loss couples samples across ranks "
            f"({_gathered(gathers)}), so layouts that accumulate are not judged: give layouts "
            "of one micro-batch (--layouts 2x1,4x1), or say that the script caches gradients "
            "across micro-batches (--caches-gradients)"
        )
    comparisons = told_apart(
        [compare_layouts(reference, other, steps=steps, tolerance=tolerance) for other in judged]
    )
    result = _verdict(reference, judged, comparisons, steps, target, started, strict_loss)
    if not unjudged:
        return result
    why = _why_not_judged(gathers)
    rows = [
        {
            "layout": other.label,
            "verdict": NOT_JUDGED,
            "why": why,
            **({"command": other.command} if isinstance(other, _Unrun) else {}),
        }
        for other in unjudged
    ]
    assert result.judgement is not None  # layouts were compared
    judgement = dataclasses.replace(
        result.judgement, unjudged=tuple(other.label for other in unjudged), why_unjudged=why
    )
    return dataclasses.replace(result, judgement=judgement, layouts=(*result.layouts, *rows))


def _gathered(gathers: Sequence[str]) -> str:
    shown = "; ".join(gathers[:3]) + ("; ..." if len(gathers) > 3 else "")
    return f"it sends other ranks tensors computed from the model: {shown}"


def _why_not_judged(gathers: Sequence[str]) -> str:
    return (
        f"Your script's loss couples samples across ranks ({_gathered(gathers)}), as in-batch "
        "negatives do: each micro-batch's loss then takes its negatives from that micro-batch "
        "alone, so accumulating changes the objective, and no layout that accumulates trains "
        "what one process on the whole batch trains, right or wrong. Layouts of one "
        "micro-batch are judged. A script that caches gradients across micro-batches "
        "(GradCache: every micro-batch's features first, the loss on the whole batch, then "
        "each micro-batch's backward with its features' cached gradient) accumulates "
        "exactly: say so with --caches-gradients and every layout is judged (so too where "
        "what is gathered only logs: detach it)."
    )


def _verdict(
    reference: Recording,
    others: Sequence[Recording],
    comparisons: list[Comparison],
    steps: int,
    target: str | None,
    started: float,
    strict_loss: bool = False,
) -> ParityResult:
    """The verdict and rows of the layouts compared: training decides, and a layout whose
    logged loss alone differs passes with a warning, unless ``strict_loss``."""
    rows = []
    causes = []
    for comparison, recording in zip(comparisons, others, strict=True):
        rows.append(
            {
                **comparison.figures,
                "verdict": (
                    Status.EQUIVALENT if _passes(comparison, strict_loss) else Status.NOT_EQUIVALENT
                ).value,
                "training": (
                    "equivalent"
                    if comparison.equivalent or comparison.only_log_differs
                    else "not-equivalent"
                ),
                "logged_loss_differs": _log_only(comparison),
                "causes": [c.key for c in comparison.causes],
                "first_divergence_step": (
                    comparison.mismatch.step if comparison.mismatch is not None else None
                ),
                "curves": curves(recording, steps),
            }
        )
        causes += [
            dataclasses.replace(c, scenario=f"layout {comparison.label}") for c in comparison.causes
        ]
    passed = all(_passes(c, strict_loss) for c in comparisons)
    status = Status.EQUIVALENT if passed else Status.NOT_EQUIVALENT
    verdict = Verdict(
        status,
        kind="script",
        target=target,
        world_size=max(r.world_size for r in [reference, *others]),
        device="cpu",
        examples=len(others),
        causes=tuple(causes),
        seconds=time.monotonic() - started,
        only_loss_differs=status is Status.NOT_EQUIVALENT
        and all(c.equivalent or c.only_log_differs for c in comparisons),
    )
    shown = {"layout": reference.label, "curves": curves(reference, steps)}
    warnings = tuple(_warning(c) for c in comparisons if _log_only(c) and not strict_loss)
    judgement = Judgement(target, reference, tuple(comparisons), steps, strict_loss)
    return ParityResult(verdict, tuple(rows), shown, warnings, strict_loss, judgement)


def _log_only(comparison: Comparison) -> bool:
    """Whether the layout trains what the reference trains and only the loss it logs differs."""
    return not comparison.equivalent and comparison.only_log_differs


def _passes(comparison: Comparison, strict_loss: bool) -> bool:
    return comparison.equivalent or (_log_only(comparison) and not strict_loss)


def _warning(comparison: Comparison) -> str:
    """What a layout whose logged loss alone differs is warned of: the finding, and the fix."""
    said = comparison.causes[0].text if comparison.causes else "the logged loss differs"
    return (
        f"layout {comparison.label}: training is equivalent, but the loss it logs is not the "
        f"reference's: {said}. Log the loss all-reduced over ranks (dist.all_reduce(loss) / "
        f"world size, weighted by samples where they differ); {option('strict_loss')} makes "
        "this a failure"
    )


def _report(judged: Judgement) -> str:
    """The report of the layouts compared, as the command prints it."""
    lines = _compared(
        judged.reference, judged.comparisons, judged.steps, judged.target, judged.strict_loss
    )
    if judged.unjudged:
        lines += ["", f"Not judged: layouts {', '.join(judged.unjudged)}. {judged.why_unjudged}"]
    if judged.timing:
        timing = ", ".join(f"{layout} {seconds:.1f} s" for layout, seconds in judged.timing)
        lines.append(f"Time per layout: {timing}")
    return "\n".join(lines)


def _compared(
    reference: Recording,
    comparisons: Sequence[Comparison],
    steps: int,
    target: str | None,
    strict_loss: bool = False,
) -> list[str]:
    samples = sum(reference.samples(0).values()) if reference.steps else 0
    wanted = min(steps, reference.steps)
    lines = [
        f"ddp-verify parity: {target or 'recordings'}",
        f"Reference: layout {reference.label} ({reference.world_size} process(es), "
        f"{reference.grad_accum} micro-batch(es), {samples} samples a step), {wanted} "
        f"optimizer step(s), computed in {reference.precision}",
    ]
    for c in comparisons:
        if c.equivalent:
            lines.append(
                f"  {c.label}: equivalent (largest difference, of its tensor's largest "
                f"value: gradients {_g(c.figures.get('gradient_difference'))}, parameters "
                f"{_g(c.figures.get('parameter_difference'))})"
            )
        elif not _passes(c, strict_loss):
            first = c.causes[0].text if c.causes else "see below"
            if c.only_log_differs:
                first = f"training is equivalent; only the logged loss differs: {first}"
            lines.append(f"  {c.label}: NOT equivalent: {first}")
        else:
            lines.append(
                f"  {c.label}: equivalent training; warning: only the logged loss differs "
                f"(largest difference, of its tensor's largest value: gradients "
                f"{_g(c.figures.get('gradient_difference'))}, parameters "
                f"{_g(c.figures.get('parameter_difference'))})"
            )
    failing = [c for c in comparisons if not _passes(c, strict_loss)]
    if not failing:
        tolerance = comparisons[0].figures.get("tolerance", "")
        lines.append(f"Every layout trains what the reference trains (held to {tolerance}).")
        lines += [f"Warning: {_warning(c)}" for c in comparisons if _log_only(c)]
        return lines
    for c in failing:
        lines.append(f"\nLayout {c.label} is not equivalent to the reference:")
        if c.mismatch is not None:
            lines.append(c.mismatch.render())
        lines.append(describe_causes(c.causes))
    return lines


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2g}"


def _failed(run: Run, target: str, started: float) -> ParityResult | None:
    """The verdict of a layout whose run failed (exit status, time-out, no recording)."""
    if run.returncode == 0 and (run.directory / "rank0.pt").exists():
        return None
    if run.returncode is None:
        why = f"outlasted its time ({run.seconds:.0f} s) and was ended"
    elif run.returncode != 0:
        why = f"exited with status {run.returncode}"
    else:
        why = "left no recording (did the script never step an optimizer?)"
    return _error(run, target, started, why)


def _error(run: Run, target: str, started: float, why: str) -> ParityResult:
    failure = RunFailure(target, str(run.layout), why, shlex.join(run.command), run.output)
    verdict = Verdict(
        Status.ERROR,
        kind="script",
        target=target,
        world_size=run.layout.world_size,
        device="cpu",
        seconds=time.monotonic() - started,
        reproducer=shlex.join(run.command),
    )
    rows = ({"layout": str(run.layout), "verdict": "error"},)
    return ParityResult(verdict, rows, failure=failure)
