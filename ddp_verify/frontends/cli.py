"""``ddp-verify``: check aggregation code from the command line.

    ddp-verify check PATH.py:FUNCTION --kind KIND [--world-size N] [--max-examples N]
        [--seed N] [--dtype float64|float32|bfloat16] [--even-batches] [--max-micro-batches N]
        [--max-steps N] [--micro-batch-counts same|varied] [--backend gloo|nccl]
        [--device cpu|cuda] [--allow-tf32] [--ddp-debug] [--lossy fp16|bf16]
        [--result-on all|rank0] [--hook-state PATH.py:FACTORY] [--loss-reduction R]
        [--ddp-wrapper MODULE:CALLABLE] [--bind NAME=VALUE ...] [--logits 3d|2d]
        [--labels aligned|unshifted] [--layout AXIS=VALUE[,...]] [--exclude-features F,...]
        [--model-kinds K,...] [--losses L,...] [--model MODULE:FACTORY|PATH.py:FACTORY]
        [--loss-fn PATH.py:FN] [--optimizer PATH.py:FACTORY] [--scheduler PATH.py:FACTORY]
        [--empty-ranks]
        [--timeout S] [--full-trace] [--json]

    ddp-verify conformance [--world-size N] [--ddp-wrapper MODULE:CALLABLE] [--examples N]
        [--backend gloo|nccl] [--device cpu|cuda] [--allow-tf32] [--timeout S]
        [-- PYTEST ARGS...]

check exits 0: no counterexample. 1: a counterexample, or the code raised, crashed a rank or
hung. 2: a usage error (bad arguments, path or function; a signature or a result the kind
cannot take; --device cuda, or nccl's one GPU per rank, where the GPUs are not there). 3: the
harness or the machine failed (a world could not start, the backend is unavailable, an internal
error). With ``--json`` it prints one JSON document in every case.
conformance: runs ``pytest --pyargs ddp_verify.conformance`` with these options and exits as
pytest does (0 all passed, 1 some failed, ...). parity: see
:mod:`ddp_verify.frontends.parity_command` (``ddp-verify parity --help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# torch warns at import when numpy is missing; ddp_verify needs none (tests/frontends/test_cli.py).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from ..engine.scenario import ALL_LOSSES, DTYPES, FEATURES, MODEL_KINDS  # noqa: E402
from ..usercode.kinds import (  # noqa: E402
    KINDS,
    SIGNATURES,
    KindError,
    check_signature,
    kind_named,
    term_binds,
)
from ..world import cleanup  # noqa: E402
from ..world.backends import BACKENDS, DEVICES, default_device  # noqa: E402
from ..world.naming import spelled_as  # noqa: E402
from . import options as opts  # noqa: E402
from .options import (  # noqa: E402
    LAUNCH_ENV,
    LAUNCH_MODES,
    launched_sizes,
    parse_timeout,
    parse_wrapper,
)
from .usage import Parser as _Parser  # noqa: E402
from .usage import UsageError, add_verbose, require_plotting  # noqa: E402

# A launched rank other than 0: it reports nothing (rank 0 reports the same verdict).
_QUIET = False


def console() -> NoReturn:
    """The ``ddp-verify`` command: :func:`main` on ``sys.argv``, its result the exit code,
    the process ended without tearing torch's modules down one by one (a second and more)."""
    cleanup.exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM and SIGHUP (a CI runner's time-out) end the command as SIGINT does: through its
    # clean-up, with a verdict, leaving no process and no temporary file behind.
    cleanup.ends_cleanly()
    with spelled_as(opts.SPELLINGS["cli"]):
        return _main(argv)


def _main(argv: list[str]) -> int:
    wants_json = "--json" in argv
    if argv[:1] == ["parity"]:
        from . import parity_command

        # Its own options, and the script's after "--": parsed there.
        command = argv.index("--") if "--" in argv else len(argv)
        own = argv[:command]
        verbose = "--verbose" in own or "-v" in own
        return _finish(parity_command.run(argv[1:]), "--json" in own, verbose)
    try:
        args, extra = _parser().parse_known_args(argv)
        parse_error = None
    except UsageError as exc:
        args, extra, parse_error = None, [], exc
    launched, launch_error = _launched(getattr(args, "launch", None))
    # Under a launcher every rank runs the command and reaches the same verdict: rank 0 says
    # it, the others only exit with the same code (their stderr stays, for crashes).
    if launched is not None and launched.rank != 0:
        _quiet()
    if parse_error is not None or args is None:
        return _finish(_usage_error(parse_error or UsageError("no arguments")), wants_json)
    if args.command == "conformance":
        return _run_conformance(args, extra)
    try:
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        path, name = parse_target(args.target)
        # The kind is the object from here on (argparse has checked the name).
        args.kind = kind_named(args.kind)
        if launch_error is not None:
            raise launch_error
        _resolve_world_options(args, launched)
        if args.plot is not None:
            require_plotting()
    except UsageError as exc:
        return _finish(_usage_error(exc), wants_json)
    args.launched = launched
    if launched is None:
        # The arguments hold: the ranks' fork server imports torch while this process
        # imports the user's file (and torch with it).
        _prestart(args)
    context: dict[str, Any] = {
        "target": args.target,
        "kind": args.kind.name,
        "world_size": args.world_size,
        "device": args.device,
    }
    try:
        fn = load_function(path, name)
        args.bind = term_binds(fn, args.kind, args.bind, args.objective or "")
        context["call"] = check_signature(fn, args.kind, bind=args.bind).describe()
        args.hook_state_factory = load_factory(args.hook_state) if args.hook_state else None
        args.model = _user_model(args)
        args.recipe = _recipe(args)
    except (UsageError, KindError) as exc:
        return _finish(_usage_error(exc, **context), wants_json)
    verdict = _run_check(args, fn, context)
    if args.plot is not None and not _QUIET:
        _draw(verdict, args.plot)
    return _finish(verdict, args.json, args.verbose)


def _draw(verdict: Any, path: Path) -> None:
    """The weights picture, or on stderr why there is none (an equivalent verdict)."""
    from ..usercode.plot import PlotUnavailable, save_weights_plot

    try:
        written = save_weights_plot(verdict.to_json(), path)
        print(f"[ddp-verify] wrote {written}", file=sys.stderr)
    except (PlotUnavailable, OSError) as exc:
        print(f"[ddp-verify] no picture written to {path}: {exc}", file=sys.stderr)


def _resolve_world_options(args: argparse.Namespace, launched: Any) -> None:
    """The world's options, each from its flag, environment variable or the command's
    default (:func:`ddp_verify.frontends.options.resolve`), into ``args``; a usage error for a
    bad one, or for GPUs this machine does not have."""
    try:
        sizes, source = opts.resolve_with_source("world_sizes", "cli", given=args.world_size)
        if launched is not None:
            sizes = launched_sizes(sizes if source else None, launched, source=source or "-")
        if len(sizes) != 1:
            raise UsageError(
                f"{source} asks for world sizes {','.join(map(str, sizes))}: a check runs at "
                "one world size (run it once per size)"
            )
        args.world_size = sizes[0]
        for name in ("backend", "device", "timeout", "debug", "allow_tf32"):
            setattr(args, name, opts.resolve(name, "cli", given=getattr(args, name)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if launched is None:
        args.device = _devices_here(args.backend, args.device, args.world_size)
    else:
        args.device = args.device or default_device(args.backend)


def _recipe(args: argparse.Namespace) -> dict[str, str]:
    """``--loss-fn``, ``--optimizer`` and ``--scheduler``, each imported and checked before
    any rank starts (paths made absolute), as ``scenarios()`` takes them."""
    given = {
        "loss_fn": args.loss_fn,
        "optimizer": args.optimizer,
        "scheduler": args.scheduler,
    }
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return {}
    from ..engine.recipes import RecipeError, recipe_of

    try:
        recipe = recipe_of(**given)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    return {
        name: reference
        for name, reference in zip(
            ("loss_fn", "optimizer", "scheduler"),
            (recipe.loss, recipe.optimizer, recipe.scheduler),
            strict=True,
        )
        if reference
    }


def _user_model(args: argparse.Namespace) -> str | None:
    """``--model``, checked before any rank trains it (the reference made absolute)."""
    if args.model is None:
        return None
    if args.losses or args.exclude_features or tuple(args.model_kinds) != MODEL_KINDS:
        raise UsageError(
            "--model trains your model: --model-kinds, --exclude-features and --losses "
            "choose among the built-in ones (the loss follows from your targets)"
        )
    from ..engine.importing import resolve_reference
    from ..engine.user_models import UserModelError, inspect_user_model

    reference = resolve_reference(args.model)
    try:
        inspect_user_model(reference)
    except UserModelError as exc:
        raise UsageError(f"--model {args.model}: {exc}") from None
    return reference


def _launched(asked: str | None) -> tuple[Any, UsageError | None]:
    """The launched job this process is a rank of (SPMD mode; None to fork the ranks), from
    ``--launch``, else ``DDP_VERIFY_LAUNCH``, else ``auto``; or the usage error that a bad
    setting is (said once the others ranks have been quietened)."""
    from ..world.launch import LaunchError, resolve

    try:
        return resolve(opts.resolve("launch", "cli", given=asked), os.environ), None
    except (ValueError, LaunchError) as exc:
        return None, UsageError(str(exc))


def _quiet() -> None:
    global _QUIET
    _QUIET = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush()
    os.dup2(devnull, 1)
    os.close(devnull)


def _devices_here(backend: str, device: str | None, world_size: int) -> str:
    """The device the check trains on, once this machine can hold it: asking for GPUs that
    are not here is a usage error, said before anything starts (never a wait)."""
    from ..world import DeviceUnavailable
    from ..world.backends import check_device, require_devices

    try:
        device = check_device(backend, device)
        require_devices(backend, world_size, device)
    except (ValueError, DeviceUnavailable) as exc:
        raise UsageError(str(exc)) from None
    return device


def _prestart(args: argparse.Namespace) -> None:
    """Have the ranks' fork server import torch while this process imports the user's file
    and torch itself: on a small machine that halves the wait for the first example."""
    from ..world import World
    from .preloads import RANK_PRELOAD

    World(args.world_size, preload=RANK_PRELOAD, **_world_options(args)).prestart()


def _world_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "backend": args.backend,
        "device": args.device,
        "allow_tf32": args.allow_tf32,
        "debug": args.debug,
    }


def _version() -> str:
    """What ``ddp-verify --version`` prints: its own version, and the Python and torch it runs
    with (torch's read from its installed metadata: the flag imports nothing heavy).

    >>> _version().startswith("ddp-verify ")
    True
    """
    import platform
    from importlib import metadata

    from .. import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"ddp-verify {__version__} (Python {platform.python_version()}, torch {torch})"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ddp-verify",
        description="Check that distributed training code computes what single-process "
        "training computes.",
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="search generated scenarios for one where FUNCTION is not equivalent",
        description="\n".join(f"  {k:10} {v}" for k, v in SIGNATURES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "target",
        metavar="PATH.py:FUNCTION",
        help="the function to check: a file and a name in it (one the file imports too)",
    )
    check.add_argument(
        "--kind",
        required=True,
        choices=KINDS,
        help="what the function is, which says how the harness calls it (the list above)",
    )
    check.add_argument(
        "--world-size",
        metavar="N",
        type=_positive,
        default=None,
        help="ranks (default 4; under torchrun or srun, the launched size)",
    )
    check.add_argument(
        "--max-examples",
        metavar="N",
        type=_positive,
        default=100,
        help="scenarios to try before calling the function equivalent (default 100)",
    )
    check.add_argument(
        "--seed",
        metavar="N",
        type=int,
        default=None,
        help="hypothesis's seed, to draw the same scenarios again (default: random)",
    )
    check.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="train every scenario in this dtype (default float64)",
    )
    check.add_argument(
        "--even-batches",
        action="store_true",
        help="give every rank as many samples (code that assumes even batches)",
    )
    check.add_argument(
        "--exclude-features",
        type=_features,
        default=(),
        metavar="F[,F...]",
        help="model features your code does not support, left out of every drawn model: "
        + ", ".join(FEATURES)
        + " (e.g. unused, for code that assumes every parameter gets a gradient)",
    )
    check.add_argument(
        "--model-kinds",
        type=_model_kinds,
        default=MODEL_KINDS,
        metavar="K[,K...]",
        help=f"model kinds to draw: {', '.join(MODEL_KINDS)} (default: all)",
    )
    check.add_argument(
        "--losses",
        type=_losses,
        default=None,
        metavar="L[,L...]",
        help="losses to draw: mse, cross_entropy, tokens (token-level cross-entropy over padded "
        "sequences with -100 targets, averaged over the tokens that count; the count your "
        "code gets is then tokens). Default: mse,cross_entropy (tokens,cross_entropy for "
        "--kind loss-fn)",
    )
    check.add_argument(
        "--objective",
        metavar="OBJECTIVE",
        type=_objective,
        default=None,
        help="what the loss aggregates to on the whole global batch. Token losses (--losses "
        "tokens): token-mean (the default), seq-mean-token-mean, seq-mean-token-sum, "
        "seq-mean-token-sum-norm:C (C declared, a maximum generation length); the count your "
        "code gets is then in the objective's unit (tokens, or sequences with a counted token). "
        "sample-mean is the default of the other losses. sum (any loss, any kind): the losses "
        "added, no normaliser, so the code must add over micro-batches and ranks. A mean "
        "followed by @window (token-mean@window) divides each step by its window's count per "
        "step, @window-total by the window's whole count (see --window-steps). --kind "
        "loss-agg takes a weighted sum of terms, each AGGREGATION(TENSOR[MASK]): "
        "'token-mean(loss) + 0.1*seq-mean-token-mean(kl) + 0.01*token-mean@micro(aux)'; the "
        "first term's values are the loss matrix, each other's come by the parameter TENSOR "
        "names (or --bind PARAM=term:TENSOR), @micro computes a term within each micro-batch",
    )
    check.add_argument(
        "--packing",
        metavar="LIST",
        type=_packings,
        default=None,
        help="how each micro-batch's sequences are laid out for a loss-agg or loss-fn "
        "function, or a step that takes dict micro-batches: none (padded, a sequence a row), "
        "flat (all in one row, as DataCollatorWithFlattening does), rows (packed into rows, "
        "never split), split (cut into rows wherever a row ends, a sequence split across two; "
        "loss-agg only), comma-separated to draw among them. Default: all where the code "
        "takes position_ids, segment_ids or cu_seq_lens, none, flat and rows for a dict "
        "step; else none",
    )
    check.add_argument(
        "--boundary-labels",
        metavar="LIST",
        type=_boundaries,
        default=None,
        help="for a loss-fn that shifts its labels, over packed rows: the label of each "
        "sequence's first position, which the previous sequence's last position would "
        "predict: dropped (-100, as packing collators leave it) or kept (the sequence's first "
        "token: code must mask the boundary from position_ids itself), comma-separated to draw "
        "both. Default: both where the code takes the boundaries; else dropped",
    )
    check.add_argument(
        "--window-steps",
        metavar="N",
        type=_positive,
        default=None,
        help="the optimizer steps that share one generation batch (TRL's "
        "steps_per_generation): what window_tokens, window_sequences and window_steps count "
        "over and what an @window objective normalises by. Default: 2 to 4, drawn, where the "
        "code takes a window count or the objective is @window; else 1",
    )
    check.add_argument(
        "--model",
        metavar="MODULE:FACTORY|PATH.py:FACTORY",
        default=None,
        help="train your own model: FACTORY() returns (module, make_batch), make_batch(n, "
        "generator) -> (inputs, targets) drawn from that generator; the loss follows from the "
        "targets (float: mse, class ids: cross_entropy, sequences with -100: tokens)",
    )
    check.add_argument(
        "--empty-ranks",
        action="store_true",
        help="let a rank hold no sample in a step (its count 0, its gradient 0): what code "
        "that divides by its own count meets at the end of an epoch or with all-padding "
        "batches",
    )
    check.add_argument(
        "--loss-fn",
        metavar="MODULE:FN|PATH.py:FN",
        default=None,
        help="train with your own loss, called as FN(outputs, targets) on every micro-batch: "
        "a mean (torch's default), or a sum where its reduction attribute says so, or a tuple "
        "(loss summed over count items, count[, logging]) as fairseq's criteria return; on the "
        "target forms of --losses it runs on. A step gets it as written, and is then judged "
        "against its own run on one rank holding the whole batch in one micro-batch; other "
        "kinds against the engine's loop trained with it",
    )
    check.add_argument(
        "--optimizer",
        metavar="MODULE:FACTORY|PATH.py:FACTORY",
        default=None,
        help="train with your own optimizer: FACTORY(params) -> torch.optim.Optimizer (a step "
        "is then judged against its own run on one rank, the whole batch)",
    )
    check.add_argument(
        "--scheduler",
        metavar="MODULE:FACTORY|PATH.py:FACTORY",
        default=None,
        help="train with your own learning-rate schedule: FACTORY(optimizer) -> scheduler, "
        "stepped once after each optimizer step (a step function that takes a 'scheduler' "
        "parameter gets it and steps it itself)",
    )
    check.add_argument(
        "--max-micro-batches",
        metavar="N",
        type=_positive,
        default=None,
        help="most micro-batches a rank accumulates in one step (default 3; 1 for "
        "coupled-loss, whose in-batch negatives come from each micro-batch)",
    )
    check.add_argument(
        "--max-steps",
        metavar="N",
        type=_positive,
        default=3,
        help="most optimizer steps a scenario trains (default 3)",
    )
    check.add_argument(
        "--micro-batch-counts",
        choices=("same", "varied"),
        default=None,
        help="whether every rank of a step holds as many micro-batches (default: same for "
        "--kind step, whose loop owns accumulation; varied for the other kinds)",
    )
    _add_device_options(check, backend_default=None)
    check.add_argument(
        "--result-on",
        choices=("all", "rank0"),
        default="all",
        help="where a loss, reduce or reduce-dict helper's result is meant to be: on every "
        "rank (default), or on rank 0 only (a reduce onto rank 0), which is then all that is "
        "checked",
    )
    check.add_argument(
        "--loss-reduction",
        choices=("mean", "sum", "none"),
        default="mean",
        help="the reduction of the loss_fn a step function receives (default mean)",
    )
    check.add_argument(
        "--trainer-divides",
        choices=("on", "off"),
        default="off",
        help="loss-agg: divide what the function returns by the accumulation steps before "
        "backward, as the Hugging Face Trainer does for a loss without num_items_in_batch "
        "(default off)",
    )
    check.add_argument(
        "--towers",
        type=int,
        choices=(1, 2),
        default=None,
        help="coupled-loss: one tower encodes both views (1, SimCLR) or one each (2, CLIP; "
        "the default)",
    )
    check.add_argument(
        "--negatives",
        metavar="K",
        type=int,
        default=None,
        help="coupled-loss: hard-negative feature tensors passed after the two views (as DPR, "
        "Tevatron and sentence-transformers pass them); default 0",
    )
    check.add_argument(
        "--token-weights",
        action="store_true",
        help="loss-agg: hand the function the per-token losses multiplied by signed weights, "
        "as advantages weight an RL policy loss (the same token's weight in the reference "
        "and on every rank)",
    )
    check.add_argument(
        "--ddp-wrapper",
        type=_wrapper,
        metavar="MODULE:CALLABLE",
        default=None,
        help="for --kind wrapped-step: your DDP-like wrapper around the model, called as DDP "
        "is, instead of torch's DistributedDataParallel",
    )
    check.add_argument(
        "--bind",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="fill your function's parameter NAME with VALUE: world_size, rank, count (this "
        "rank's loss items), global_count (the step's, every rank's), vocab_size, device, "
        "group (the world's process group), or a Python literal; repeat for several "
        "(e.g. --bind n=world_size for timm's reduce_tensor(tensor, n))",
    )
    check.add_argument(
        "--logits",
        choices=("3d", "2d"),
        default=None,
        help="--kind loss-fn: pin a token loss's logits to (batch, seq, vocab) with labels "
        "(batch, seq) (3d), or flattened to (positions, vocab) and (positions,) (2d, as "
        "Hugging Face's fixed_cross_entropy takes them); unpinned, each is tried on the "
        "simplest even scenario and the one that runs and agrees is kept",
    )
    check.add_argument(
        "--labels",
        choices=("aligned", "unshifted"),
        default=None,
        help="--kind loss-fn: pin labels aligned with the logits, or unshifted (the input "
        "ids, as Hugging Face's ForCausalLMLoss takes them and shifts them itself); "
        "unpinned, found by probing as --logits is",
    )
    check.add_argument(
        "--layout",
        metavar="AXIS=VALUE[,...]",
        default=None,
        help="pin any layout axis of the kind: logits=3d|2d, labels=aligned|unshifted "
        "(loss-fn), tensors=tensor|list (reduce: a tensor, or a list of one tensor)",
    )
    check.add_argument(
        "--hook-state",
        metavar="PATH.py:FACTORY|MODULE:FACTORY",
        default=None,
        help="a comm hook's state, made on each rank once the process group exists: "
        "FACTORY() or FACTORY(module) (e.g. one returning PowerSGDState(None, 1))",
    )
    check.add_argument(
        "--lossy",
        choices=("fp16", "bf16", "lowrank"),
        default=None,
        help="a comm hook that compresses on purpose: fp16/bf16 hold it to the bound that "
        "format's rounding allows (on SGD scenarios) instead of to exact equivalence; lowrank "
        "checks a low-rank hook (PowerSGD) at the full rank its --hook-state gives, where it "
        "must be exact",
    )
    check.add_argument(
        "--ddp-debug",
        dest="debug",
        action="store_true",
        help="set TORCH_DISTRIBUTED_DEBUG=DETAIL in the ranks, so torch names mismatched "
        "collectives (what a hang or a gloo abort report suggests)",
    )
    check.add_argument(
        "--timeout",
        metavar="S",
        type=_positive_seconds,
        default=None,
        help=f"seconds per example (default {opts.DEFAULT_TIMEOUT_S:g})",
    )
    check.add_argument(
        "--full-trace",
        action="store_true",
        help="when the code fails, show the harness's frames in the ranks' tracebacks too",
    )
    check.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="for a not-equivalent verdict, draw the weights fitted to each rank's "
        "micro-batches against single-process training's, to FILE (.png, .svg, .pdf; needs "
        "matplotlib)",
    )
    add_verbose(check)
    check.add_argument("--json", action="store_true", help="print one JSON verdict")
    commands.add_parser(
        "parity",
        help="run a training script at several data-parallel layouts and prove each trains "
        "what one process on the whole batch trains (ddp-verify parity --help)",
        add_help=False,
    )
    conformance = commands.add_parser(
        "conformance",
        help="run the packaged conformance suite (pytest --pyargs ddp_verify.conformance)",
        description="Check torch's data-parallel machinery (or --ddp-wrapper) against "
        "single-process training. Arguments after the options go to pytest (-k, -x, ...).",
    )
    conformance.add_argument(
        "--world-size",
        default=None,
        help="ranks, or a list such as 2,4 (default 4; under torchrun or srun, the launched size)",
    )
    conformance.add_argument(
        "--ddp-wrapper",
        metavar="MODULE:CALLABLE",
        default=None,
        help="gate your own DDP-like wrapper instead of torch's DDP",
    )
    conformance.add_argument(
        "--examples", type=_positive, default=None, help="scenarios per property"
    )
    _add_device_options(conformance, backend_default=None)
    conformance.add_argument("--timeout", default=None, help="seconds per job on the ranks")
    return parser


def _add_device_options(parser: argparse.ArgumentParser, backend_default: str | None) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=backend_default,
        help="process group backend (nccl needs one GPU per rank); default gloo",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="where the ranks train: cpu, or cuda (cuda:rank, shared round-robin when gloo "
        "runs more ranks than there are GPUs); default cuda for nccl, cpu for gloo",
    )
    parser.add_argument(
        "--launch",
        choices=LAUNCH_MODES,
        default=None,
        help="how the ranks come to be: fork (here), spmd (this process is one rank of a "
        "torchrun/srun job), auto (spmd under a launcher, else fork; the default; env "
        f"{LAUNCH_ENV})",
    )
    parser.add_argument(
        "--allow-tf32",
        action="store_true",
        help="let CUDA float32 matmuls and convolutions use TF32 (float32's tolerance is then "
        "measured with TF32 on)",
    )


def conformance_args(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The pytest command line ``ddp-verify conformance`` stands for: the command's own world
    size default (4, or the launched size under a launcher) unless one was asked for.

    Example::

        >>> conformance_args(_parser().parse_args(["conformance", "--world-size", "2"]), [])
        ['--pyargs', 'ddp_verify.conformance', '--world-size', '2']
    """
    command = ["--pyargs", "ddp_verify.conformance"]
    sizes, source = opts.resolve_with_source("world_sizes", "cli", given=args.world_size)
    # A bad launch setting is pytest's to report.
    if source or _launched(args.launch)[0] is None:
        command += ["--world-size", ",".join(map(str, sizes))]
    for flag, value in (
        ("--ddp-launch", args.launch),
        ("--ddp-wrapper", args.ddp_wrapper),
        ("--conformance-examples", args.examples),
        ("--ddp-backend", args.backend),
        ("--ddp-device", args.device),
        ("--ddp-timeout", args.timeout),
    ):
        if value is not None:
            command += [flag, str(value)]
    if args.allow_tf32:
        command.append("--ddp-allow-tf32")
    return command + [a for a in extra if a != "--"]


def _run_conformance(args: argparse.Namespace, extra: Sequence[str]) -> int:
    import pytest

    return int(pytest.main(conformance_args(args, extra)))


def _choices_list(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [c for c in chosen if c not in allowed]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"expected {what} from {', '.join(allowed)} (comma-separated), got {text!r}"
        )
    return chosen


def _wrapper(text: str) -> str:
    try:
        return parse_wrapper(text, source="--ddp-wrapper")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _features(text: str) -> tuple[str, ...]:
    return _choices_list(text, FEATURES, "model features")


def _losses(text: str) -> tuple[str, ...]:
    return _choices_list(text, ALL_LOSSES, "losses")


def _packings(text: str) -> tuple[str, ...]:
    """``none,flat,rows,split`` as the packings drawn (none, the padded layout, kept as "")."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("none", "flat", "rows", "split")]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: packings are none, flat, rows and split, comma-separated (flat,rows)"
        )
    return tuple("" if name == "none" else name for name in names)


def _boundaries(text: str) -> tuple[str, ...]:
    """``dropped,kept`` as the labels drawn at a packed segment's start."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in ("dropped", "kept") for name in names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: boundary labels are dropped and kept, comma-separated (dropped,kept)"
        )
    return tuple(names)


def _objective(text: str) -> str:
    """A declared objective, checked as the parser reads it (a bad one is a usage error)."""
    from hypothesis.errors import InvalidArgument

    from ..engine.objectives import SAMPLE_MEAN, objective
    from ..engine.terms import is_term_sum, term_sum

    try:
        if is_term_sum(text):
            return str(term_sum(text))
        return text if text == SAMPLE_MEAN else str(objective(text))
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _model_kinds(text: str) -> tuple[str, ...]:
    return _choices_list(text, MODEL_KINDS, "model kinds")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _positive_seconds(text: str) -> float:
    try:
        return parse_timeout(text, source="--timeout")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_target(target: str) -> tuple[Path, str]:
    """``path/to/file.py:name`` → the file (which must exist) and the name, without importing.

    Example::

        >>> parse_target("grad_sync.py")
        Traceback (most recent call last):
        ...
        ddp_verify.UsageError: expected PATH.py:FUNCTION, got 'grad_sync.py'
    """
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise UsageError(f"expected PATH.py:FUNCTION, got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such file: {path_text}")
    names = _top_level_names(path)
    if names is not None and name not in names:
        # Said before the file is imported (its torch import alone takes seconds).
        public = sorted(n for n in names if not n.startswith("_"))
        raise UsageError(
            f"{path_text} has no {name!r}; names it defines or imports: "
            + (", ".join(public) or "none")
        )
    return path, name


def _top_level_names(path: Path) -> set[str] | None:
    """The names the file binds at module level, read without running it; None where that
    cannot be known so (a star import, a module ``__getattr__``, source that does not parse:
    the import then says what it says)."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> bool:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.With):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if not isinstance(node, ast.With)
                    else [i.optional_vars for i in node.items if i.optional_vars is not None]
                )
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            # Module-level blocks bind names too (an import under try, a def under if).
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, block, None)
                if (
                    isinstance(inner, list)
                    and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and not visit([n for n in inner if isinstance(n, ast.stmt)])
                ):
                    return False
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    if not visit(handler.body):
                        return False
        # Walrus targets and globals set elsewhere are rare at module level; a function that
        # assigns a global makes the answer unknowable statically.
        return True

    if not visit(tree.body):
        return None
    if "__getattr__" in names or any(isinstance(n, ast.Global) for n in ast.walk(tree)):
        return None
    return names


def load_function(path: Path, name: str) -> Callable[..., Any]:
    """The callable ``name`` of the file at ``path``, which may import it from elsewhere."""
    path_text = str(path)
    # Named for its path by a digest, the same in every process (hash() of a string is not:
    # each rank of an SPMD job would give the same file another name).
    digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    module_name = f"ddp_verify_user_{digest}"
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
    return getattr(module, name)


def load_factory(target: str) -> Callable[..., Any]:
    """``PATH.py:NAME`` (a file, as for the checked function) or ``MODULE:NAME`` (imported)."""
    location, sep, name = target.rpartition(":")
    if not sep or not location or not name:
        raise UsageError(f"expected PATH.py:FACTORY or MODULE:FACTORY, got {target!r}")
    if location.endswith(".py") or Path(location).is_file():
        path, name = parse_target(target)
        return load_function(path, name)
    try:
        module = importlib.import_module(location)
    except ImportError as exc:
        raise UsageError(f"cannot import {location!r} for --hook-state: {exc}") from None
    if not hasattr(module, name):
        raise UsageError(f"{location!r} has no {name!r} (--hook-state {target})")
    return getattr(module, name)


def _run_check(args: argparse.Namespace, fn: Callable[..., Any], context: dict[str, Any]) -> Any:
    """The verdict of ``check()`` on the parsed arguments, whatever it raised."""
    from ..usercode.verdict import verdict_for
    from .api import check

    # Unless given: the kind's own (a coupled loss's single micro-batch), else 3.
    kind_default = args.kind.bounds.get("max_micro_batches", 3)
    bounds: dict[str, Any] = {
        "max_micro_batches": args.max_micro_batches or kind_default,
        "max_steps": args.max_steps,
        "even": args.even_batches,
    }
    for name in ("towers", "negatives"):
        if getattr(args, name) is not None:
            bounds[name] = getattr(args, name)
    if args.dtype:
        bounds["dtypes"] = (args.dtype,)
    if args.exclude_features or tuple(args.model_kinds) != MODEL_KINDS:
        from ..engine.strategies import models

        bounds["models"] = models(kinds=args.model_kinds, excluded_features=args.exclude_features)
    if args.micro_batch_counts:
        bounds["same_micro_batch_counts"] = args.micro_batch_counts == "same"
    if args.losses:
        bounds["losses"] = args.losses
    if args.objective:
        bounds["objective"] = args.objective
    if args.window_steps is not None:
        bounds["window_steps"] = args.window_steps
    if args.packing is not None:
        bounds["packings"] = args.packing
    if args.boundary_labels is not None:
        bounds["boundaries"] = args.boundary_labels
    if args.token_weights:
        bounds["token_weights"] = True
    if args.model:
        bounds["model"] = args.model
    if args.empty_ranks:
        bounds["empty_ranks"] = True
    bounds.update(args.recipe)
    started = time.monotonic()
    progress = _Progress(
        total=args.max_examples, quiet=args.launched is not None and args.launched.rank != 0
    )
    try:
        verdict = check(
            fn,
            kind=args.kind,
            world_size=args.world_size,
            launch="spmd" if args.launched is not None else "fork",
            max_examples=args.max_examples,
            seed=args.seed,
            timeout=args.timeout,
            progress=progress,
            lossy=args.lossy,
            result_on=args.result_on,
            hook_state=args.hook_state_factory,
            loss_reduction=args.loss_reduction,
            trainer_divides=args.trainer_divides == "on",
            ddp_wrapper=args.ddp_wrapper,
            bind=args.bind,
            layout=args.layout,
            logits=args.logits,
            labels=args.labels,
            full_trace=args.full_trace,
            **_world_options(args),
            **bounds,
        )
    except BaseException as exc:
        return verdict_for(exc, seconds=time.monotonic() - started, **context)
    finally:
        progress.end()
    return dataclasses.replace(verdict, seconds=time.monotonic() - started).filled(**context)


def _usage_error(exc: Exception, **context: Any) -> Any:
    from ..usercode.verdict import Status, Verdict

    return Verdict(Status.USAGE_ERROR, message=f"ddp-verify: error: {exc}", **context)


def _finish(verdict: Any, wants_json: bool, verbose: bool = True) -> int:
    """Say the verdict (one JSON document with ``--json``; without ``--verbose``, the report
    without its evidence lines) and give its exit code. A launched rank other than 0 says
    nothing: rank 0 says the same verdict."""
    from ..usercode.verdict import brief

    if not _QUIET:
        if wants_json:
            print(json.dumps(verdict.to_json()))
        else:
            said_on = sys.stdout if verdict.exit_code in (0, 1) else sys.stderr
            print(verdict.report if verbose else brief(verdict.report), file=said_on)
    return int(verdict.exit_code)


class _Progress:
    """Examples tried of how many, the phase and the time, on stderr: a bar rewritten in place
    on a terminal, a plain line every few seconds otherwise (CI logs).

    Example::

        >>> _Progress(total=100).line(37, "searching", 12.4)
        'searching: 37/100 examples, 12 s'
        >>> _Progress(total=100).line(5, "shrinking", 20.0)
        'shrinking: 5 tries, 20 s'
    """

    BAR = 20

    def __init__(self, *, total: int, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        self.total = total
        self.started = time.monotonic()
        self.last = 0.0
        self.tried = 0
        self.shrinking_from = 0
        self.quiet = quiet

    def line(self, tried: int, phase: str, seconds: float) -> str:
        if phase == "shrinking":
            # Shrinking has no known end: its tries and the time, no bar.
            return f"shrinking: {tried} tries, {seconds:.0f} s"
        return f"{phase}: {min(tried, self.total)}/{self.total} examples, {seconds:.0f} s"

    def __call__(self, tried: int, phase: str) -> None:
        self.tried = tried
        if self.quiet:
            return
        if phase == "shrinking" and not self.shrinking_from:
            self.shrinking_from = tried
        count = tried - self.shrinking_from + 1 if phase == "shrinking" else tried
        now = time.monotonic()
        text = self.line(count, phase, now - self.started)
        if self.tty:
            done = self.BAR * min(tried, self.total) // self.total
            bar = "" if phase == "shrinking" else f"[{'#' * done}{'.' * (self.BAR - done)}] "
            sys.stderr.write(f"\r\033[K[ddp-verify] {bar}{text}")
            sys.stderr.flush()
        elif now - self.last >= 5.0:
            print(f"[ddp-verify] {text}", file=sys.stderr, flush=True)
            self.last = now

    def end(self) -> None:
        """Clear the bar on a terminal, so the report starts on a line of its own."""
        if self.tty and not self.quiet and self.tried:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


if __name__ == "__main__":
    console()
