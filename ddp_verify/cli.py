"""``ddp-verify``: check aggregation code from the command line.

    ddp-verify check PATH.py:FUNCTION --kind KIND [--world-size N] [--max-examples N]
        [--seed N] [--dtype float64|float32] [--even-batches] [--max-micro-batches N]
        [--max-steps N] [--micro-batch-counts same|varied] [--timeout S] [--json]

    ddp-verify conformance [--world-size N] [--ddp-wrapper MODULE:CALLABLE] [--examples N]
        [--backend gloo|nccl] [--timeout S] [-- PYTEST ARGS...]

check: exit 0: no counterexample. Exit 1: a counterexample, or the code raised, crashed a rank
or hung. Exit 2: a usage error (bad path, unknown function, wrong signature for the kind).
conformance: runs ``pytest --pyargs ddp_verify.conformance`` with these options and exits as
pytest does (0 all passed, 1 some failed, ...).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# torch warns at import when numpy is missing; ddp_verify needs none (tests/adapters/test_cli.py).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from .kinds import KINDS, SIGNATURES, KindError, check_signature  # noqa: E402

EXIT_EQUIVALENT, EXIT_NOT_EQUIVALENT, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """What the user asked for cannot be run; exit 2 with this message."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "conformance":
        return _run_conformance(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command != "check":
        parser.print_help()
        return EXIT_USAGE
    _prestart(args.world_size)
    try:
        fn, label = load_function(args.target)
        check_signature(fn, args.kind)
    except (UsageError, KindError) as exc:
        return _finish(args, EXIT_USAGE, f"ddp-verify: error: {exc}", label=args.target)
    return _run_check(args, fn, label)


def _prestart(world_size: int) -> None:
    """Have the ranks' fork server import torch while this process imports the user's file
    and torch itself: on a small machine that halves the wait for the first example."""
    from .options import VERIFYING_PRELOAD
    from .world import World

    World(world_size, preload=VERIFYING_PRELOAD).prestart()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-verify",
        description="Check that distributed training code computes what single-process "
        "training computes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="search generated scenarios for one where FUNCTION is not equivalent",
        description="\n".join(f"  {k:10} {v}" for k, v in SIGNATURES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("target", metavar="PATH.py:FUNCTION")
    check.add_argument("--kind", required=True, choices=KINDS)
    check.add_argument("--world-size", type=_positive, default=4)
    check.add_argument("--max-examples", type=_positive, default=100)
    check.add_argument("--seed", type=int, default=None)
    check.add_argument("--dtype", choices=("float64", "float32"), default=None)
    check.add_argument("--even-batches", action="store_true")
    check.add_argument("--max-micro-batches", type=_positive, default=3)
    check.add_argument("--max-steps", type=_positive, default=3)
    check.add_argument(
        "--micro-batch-counts",
        choices=("same", "varied"),
        default=None,
        help="whether every rank of a step holds as many micro-batches (default: same for "
        "--kind step, whose loop owns accumulation; varied for the other kinds)",
    )
    check.add_argument("--timeout", type=float, default=60.0, help="seconds per example")
    check.add_argument("--json", action="store_true", help="print one JSON verdict")
    conformance = commands.add_parser(
        "conformance",
        help="run the packaged conformance suite (pytest --pyargs ddp_verify.conformance)",
        description="Check torch's data-parallel machinery (or --ddp-wrapper) against "
        "single-process training. Arguments after the options go to pytest (-k, -x, ...).",
    )
    conformance.add_argument("--world-size", default="4", help="ranks, or a list such as 2,4")
    conformance.add_argument("--ddp-wrapper", metavar="MODULE:CALLABLE", default=None)
    conformance.add_argument(
        "--examples", type=_positive, default=None, help="scenarios per property"
    )
    conformance.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    conformance.add_argument("--timeout", default=None, help="seconds per job on the ranks")
    return parser


def conformance_args(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The pytest command line ``ddp-verify conformance`` stands for.

    Example::

        >>> conformance_args(_parser().parse_args(["conformance", "--world-size", "2"]), [])
        ['--pyargs', 'ddp_verify.conformance', '--world-size', '2']
    """
    command = ["--pyargs", "ddp_verify.conformance", "--world-size", str(args.world_size)]
    for flag, value in (
        ("--ddp-wrapper", args.ddp_wrapper),
        ("--conformance-examples", args.examples),
        ("--ddp-backend", args.backend),
        ("--ddp-timeout", args.timeout),
    ):
        if value is not None:
            command += [flag, str(value)]
    return command + [a for a in extra if a != "--"]


def _run_conformance(args: argparse.Namespace, extra: Sequence[str]) -> int:
    import pytest

    return int(pytest.main(conformance_args(args, extra)))


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def load_function(target: str) -> tuple[Callable[..., Any], str]:
    """``path/to/file.py:name`` → the callable, from any file; the name may be imported."""
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise UsageError(f"expected PATH.py:FUNCTION, got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such file: {path_text}")
    module_name = f"ddp_verify_user_{abs(hash(str(path.resolve())))}"
    loader = importlib.machinery.SourceFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_loader(module_name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.resolve().parent))  # its own imports of neighbouring files
    try:
        loader.exec_module(module)
    except Exception:
        raise UsageError(f"importing {path_text} failed:\n{traceback.format_exc()}") from None
    if not hasattr(module, name):
        defined = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise UsageError(
            f"{path_text} has no {name!r}; callables it defines or imports: "
            + (", ".join(defined) or "none")
        )
    return getattr(module, name), f"{path_text}:{name}"


def _run_check(args: argparse.Namespace, fn: Callable[..., Any], label: str) -> int:
    from .equivalence import EquivalenceError
    from .search import check

    bounds: dict[str, Any] = {
        "max_micro_batches": args.max_micro_batches,
        "max_steps": args.max_steps,
        "even": args.even_batches,
    }
    if args.dtype:
        bounds["dtypes"] = (args.dtype,)
    if args.micro_batch_counts:
        bounds["same_micro_batch_counts"] = args.micro_batch_counts == "same"
    started = time.monotonic()
    progress = _Progress()
    try:
        verdict = check(
            fn,
            kind=args.kind,
            world_size=args.world_size,
            max_examples=args.max_examples,
            seed=args.seed,
            timeout=args.timeout,
            progress=progress,
            **bounds,
        )
    except EquivalenceError as exc:
        # hypothesis's notes repeat the scenario in its own words: the report has it already.
        report = str(exc)
        return _finish(
            args,
            EXIT_NOT_EQUIVALENT,
            report,
            label=label,
            started=started,
            scenario=exc.scenario,
            examples=progress.tried,
            cause=exc.cause,
            reproducer=exc.reproducer,
        )
    summary = (
        f"{label} ({args.kind}): equivalent on {verdict.examples} generated scenarios at world "
        f"size {args.world_size}; no counterexample found"
    )
    return _finish(
        args, EXIT_EQUIVALENT, summary, label=label, started=started, examples=verdict.examples
    )


def _finish(
    args: argparse.Namespace,
    code: int,
    text: str,
    *,
    label: str,
    started: float | None = None,
    examples: int | None = None,
    scenario: Any = None,
    cause: str | None = None,
    reproducer: str | None = None,
) -> int:
    if getattr(args, "json", False):
        verdict = {EXIT_EQUIVALENT: "equivalent", EXIT_NOT_EQUIVALENT: "not equivalent"}
        print(
            json.dumps(
                {
                    "verdict": verdict.get(code, "usage error"),
                    "exit_code": code,
                    "target": label,
                    "kind": getattr(args, "kind", None),
                    "world_size": getattr(args, "world_size", None),
                    "examples": examples,
                    "scenario": repr(scenario) if scenario is not None else None,
                    "likely_cause": cause,
                    "reproducer": reproducer,
                    "seconds": round(time.monotonic() - started, 3) if started else None,
                    "report": text,
                }
            )
        )
    else:
        print(text, file=sys.stderr if code == EXIT_USAGE else sys.stdout)
    return code


class _Progress:
    """Examples tried and the phase, on stderr: rewritten in place on a terminal, a line every
    few seconds otherwise (CI logs)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        self.last = 0.0
        self.tried = 0

    def __call__(self, tried: int, phase: str) -> None:
        self.tried = tried
        now = time.monotonic()
        if self.tty:
            sys.stderr.write(f"\r[ddp-verify] {phase}: {tried} examples tried ")
            sys.stderr.flush()
        elif now - self.last >= 5.0:
            print(f"[ddp-verify] {phase}: {tried} examples tried", file=sys.stderr, flush=True)
            self.last = now


if __name__ == "__main__":
    sys.exit(main())
