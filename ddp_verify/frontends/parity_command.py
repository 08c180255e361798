"""``ddp-verify parity``: the command line of :mod:`ddp_verify.parity` (parsing and printing
only).

    ddp-verify parity [--layouts 1x1,1x4,2x2,4x1] [--reference 1x1] [--steps 3]
        [--global-batch N] [--dtype float64|native] [--launcher NAME|TEMPLATE] [--timeout S]
        [--keep DIR] [--caches-gradients] [--strict-loss] [--json] -- python train.py ARGS (with
        {world_size}, {grad_accum}, {total_grad_accum}, {micro_batch}, {global_batch},
        {nproc_per_node}, {nnodes})
    ddp-verify parity compare REFERENCE_DIR DIR [DIR...] [--steps N] [--variant DIR]
        [--caches-gradients] [--strict-loss] [--json]

Exit codes as ``check``: 0 every layout trains what the reference trains; 1 one does not, or
a layout's run failed; 2 a usage error; 3 the harness failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .usage import Parser, UsageError, add_verbose, require_plotting

__all__ = ["EXAMPLE_GLOBAL_BATCH", "compare_parser", "parser", "run"]

# The bundled example's samples a step: every default layout divides it.
EXAMPLE_GLOBAL_BATCH = 16


def parser() -> argparse.ArgumentParser:
    """The options of ``ddp-verify parity`` (the command follows ``--``)."""
    p = Parser(
        prog="ddp-verify parity",
        description="Run a training script, unmodified, at several data-parallel layouts "
        "(world size x accumulation steps, the global batch fixed) and prove each trains what "
        "one process on the whole batch trains. The script follows --, as one process runs "
        "it; {world_size}, {grad_accum}, {total_grad_accum} (W x A), {micro_batch}, "
        "{global_batch}, {nproc_per_node} and {nnodes} (devices and nodes, as "
        "Trainer(devices=..., num_nodes=...) takes them) fill its flags. The reference "
        "layout runs twice first and must train the same (else: which source is unseeded, "
        "exit 2). "
        "With no script, the bundled example (a correct DDP script) is checked.",
    )
    p.add_argument(
        "--layouts",
        default="1x4,2x2,4x1",
        help="WxA (world size x accumulation) or axes joined by dots, each a degree of dp, "
        "dp_replicate, dp_shard, cp, tp, pp or a (micro-batches): dp2.pp2.a2, "
        "dp_replicate2.dp_shard2, tp2; comma-separated (default 1x4,2x2,4x1)",
    )
    p.add_argument("--reference", default="1x1", help="the reference layout (default 1x1)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps recorded (default 3)")
    p.add_argument(
        "--global-batch", type=int, default=None, help="samples per optimizer step, all ranks"
    )
    p.add_argument(
        "--dtype",
        choices=("float64", "native"),
        default="float64",
        help="run the script in float64 (default), or in the precision it sets itself",
    )
    p.add_argument(
        "--launcher",
        default="torchrun",
        help="how a layout's ranks start: torchrun (the default, on this machine), "
        "accelerate (accelerate launch), fabric (fabric run) or srun, each followed by "
        "options of its own ('accelerate --mixed_precision bf16'); or a template with "
        "{python}, {world_size}, {nnodes}, {nproc_per_node}, {port}, {run_id}",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="nodes each layout of more than one rank spans: torchrun, accelerate and fabric "
        "start one agent per node on this machine (torchrun's joined by the c10d rendezvous "
        "on loopback); srun, or a template of yours, is given them (srun ... torchrun "
        "--nnodes {nnodes} ...)",
    )
    _add_caches_gradients(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per layout's run")
    p.add_argument("--keep", type=Path, default=None, help="keep the recordings in DIR")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="draw each layout's per-step loss and gradient norm against the reference's, "
        "the first divergence marked, to FILE (.png, .svg, .pdf; needs matplotlib)",
    )
    p.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="write one self-contained HTML page: the curves and the report",
    )
    add_verbose(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ddp-verify parity compare",
        description="Compare recordings made by your own launches (DDP_VERIFY_RECORD=DIR "
        "torchrun ... train.py ...): the first directory is the reference layout's.",
    )
    p.add_argument(
        "directories",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="recordings (DDP_VERIFY_RECORD=DIR): the reference layout's first",
    )
    p.add_argument("--steps", type=int, default=3, help="optimizer steps compared (default 3)")
    p.add_argument(
        "--variant",
        type=Path,
        default=None,
        help="a rounding-only variant of the reference's run (DDP_VERIFY_PERTURB=1), where "
        "the script forces its own precision: the bound is derived from it",
    )
    _add_caches_gradients(p)
    add_verbose(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def _add_caches_gradients(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strict-loss",
        action="store_true",
        help="fail a layout whose logged loss differs from the reference's even where it "
        "trains the same (by default that passes with a warning: rank 0 logging its own loss)",
    )
    p.add_argument(
        "--caches-gradients",
        action="store_true",
        help="the script accumulates a loss that couples samples across ranks exactly "
        "(GradCache: the loss on the whole batch's features, then each micro-batch's backward "
        "with their cached gradient): judge the layouts that accumulate too, which are "
        "otherwise left unjudged where the script gathers features that carry gradient",
    )


def run(argv: Sequence[str]) -> Any:
    """The verdict of ``ddp-verify parity ARGV`` (an object with ``report``, ``to_json()`` and
    ``exit_code``), whatever happened."""
    from ..parity.compare import derived_tolerance, perturbation
    from ..parity.layouts import LayoutError, parse_layout, parse_layouts
    from ..parity.recording import Recording, RecordingError
    from ..parity.run import ParityResult, compare_recordings, run_parity
    from ..usercode.verdict import Status, Verdict, verdict_for

    argv = list(argv)
    try:
        if argv[:1] == ["compare"]:
            args = compare_parser().parse_args(argv[1:])
            if len(args.directories) < 2 or args.steps < 1:
                raise UsageError("give the reference's directory, then at least one layout's")
            recordings = [Recording.load(d) for d in args.directories]
            reference = recordings[0]
            tolerance = None
            if args.variant is not None:
                variant = Recording.load(args.variant)
                tolerance = derived_tolerance(reference, variant, args.steps)
            elif not reference.float64:
                raise UsageError(
                    f"{args.directories[0]}: the script computed in {reference.precision}, "
                    "where float64's bound would raise false alarms: record a rounding-only "
                    "variant of the reference run (the same launch with DDP_VERIFY_PERTURB="
                    f"{perturbation(reference)} and another DDP_VERIFY_RECORD) and give it "
                    "with --variant DIR"
                )
            return compare_recordings(
                reference,
                recordings[1:],
                steps=args.steps,
                tolerance=tolerance,
                caches_gradients=args.caches_gradients,
                strict_loss=args.strict_loss,
            )
        split = argv.index("--") if "--" in argv else len(argv)
        args = parser().parse_args(argv[:split])
        command = argv[split + 1 :]
        if not command:
            command, args = _bundled_example(args)
        if args.steps < 1:
            raise UsageError("--steps must be at least 1")
        if args.nnodes < 1:
            raise UsageError("--nnodes must be at least 1")
        if args.plot is not None or args.html is not None:
            require_plotting()
        result = run_parity(
            command,
            layouts=parse_layouts(args.layouts),
            reference=parse_layout(args.reference),
            steps=args.steps,
            global_batch=args.global_batch,
            float64=args.dtype == "float64",
            launcher=args.launcher,
            timeout=args.timeout,
            keep=args.keep,
            progress=_say,
            nnodes=args.nnodes,
            caches_gradients=args.caches_gradients,
            strict_loss=args.strict_loss,
        )
        _draw(result.to_json(), args.plot, args.html)
        return result
    except (UsageError, LayoutError, RecordingError) as exc:
        return ParityResult(Verdict(Status.USAGE_ERROR, message=f"ddp-verify: error: {exc}"))
    except (KeyboardInterrupt, Exception) as exc:  # a signal, or the harness failing: said
        return ParityResult(verdict_for(exc, kind="script"))


def _bundled_example(args: argparse.Namespace) -> tuple[list[str], argparse.Namespace]:
    """With no script after ``--``: the bundled example (a correct DDP script), at its global
    batch unless one was given, so that ``ddp-verify parity`` alone shows what a check is."""
    import importlib.util

    # Found, not imported: importing a script runs it.
    spec = importlib.util.find_spec("ddp_verify.parity.example_script")
    assert spec is not None and spec.origin is not None, "the package ships its example"
    script = Path(spec.origin)
    if args.global_batch is None:
        args.global_batch = EXAMPLE_GLOBAL_BATCH
    command = ["python", str(script), "--grad-accum", "{grad_accum}"]
    command += ["--batch-size", "{micro_batch}"]
    _say(
        f"no script given after --: checking the bundled example, {script.name} (your own: "
        "ddp-verify parity --layouts 1x4,2x2 -- python train.py --grad-accum {grad_accum})"
    )
    return command, args


def _draw(document: dict[str, Any], plot: Path | None, page: Path | None) -> None:
    """The pictures asked for; where there is nothing to draw (a run that failed), why."""
    from ..parity.plot import save_curves, save_html
    from ..usercode.plot import PlotUnavailable

    for path, save in ((plot, save_curves), (page, save_html)):
        if path is None:
            continue
        try:
            _say(f"wrote {save(document, path)}")
        except (PlotUnavailable, OSError) as exc:
            _say(f"no picture written to {path}: {exc}")


def _say(line: str) -> None:
    print(f"[ddp-verify] {line}", file=sys.stderr, flush=True)
