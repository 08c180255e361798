"""The options every front end has, resolved one way: the front end's flag (or argument),
then the environment variable, then the ini key, then the front end's default
(:func:`resolve`); validated once, so that the pytest plugin, the command line and ``check()``
accept and reject the same things with the same words. Each front end's spelling of each
option is here too (:data:`SPELLINGS`): the lower layers name parameters, and messages spell
them as the front end in use does (:mod:`ddp_verify.world.naming`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..world.backends import BACKENDS, DEVICES, check_device
from ..world.naming import Spelling

WORLD_SIZE_ENV = "DDP_VERIFY_WORLD_SIZE"
DEVICE_ENV = "DDP_VERIFY_DEVICE"
LAUNCH_ENV = "DDP_VERIFY_LAUNCH"
# How worlds come to be: forked here, or the launched job itself (see ddp_verify.world.launch).
LAUNCH_MODES = ("auto", "fork", "spmd")
DEFAULT_WORLD_SIZE = 2
# A check of one function (ddp-verify check, check()) forks 4 ranks unless told otherwise.
DEFAULT_CHECK_SIZE = 4
DEFAULT_TIMEOUT_S = 60.0
# How long the ranks of a world may take to join: a torch import, an NCCL communicator.
DEFAULT_START_TIMEOUT_S = 120.0
# Scenarios per property of the conformance suite: a few seconds per property at world size 4
# on two cores; CI that gates a release raises it.
DEFAULT_CONFORMANCE_EXAMPLES = 10


@dataclasses.dataclass(frozen=True)
class WorldOptions:
    """How worlds are started: sizes to run at, backend, device, TF32, time-outs, debug mode.
    ``device`` None means the backend's default (cuda for nccl, cpu for gloo)."""

    world_sizes: tuple[int, ...] = (DEFAULT_WORLD_SIZE,)
    backend: str = "gloo"
    device: str | None = None
    allow_tf32: bool = False
    timeout: float = DEFAULT_TIMEOUT_S
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    debug: bool = False
    wrapper: str | None = None
    conformance_examples: int = DEFAULT_CONFORMANCE_EXAMPLES
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # nccl with device cpu is refused here, with the words every front end shows.
        object.__setattr__(self, "device", check_device(self.backend, self.device))

    def world_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`ddp_verify.world.World` and ``WorldPool``."""
        return {
            "backend": self.backend,
            "device": self.device,
            "allow_tf32": self.allow_tf32,
            "timeout": self.timeout,
            "start_timeout": self.start_timeout,
            "debug": self.debug,
        }

    def pool_kwargs(self) -> dict[str, Any]:
        """:meth:`world_kwargs` and the modules every rank imports first (``--ddp-preload``)."""
        return {**self.world_kwargs(), "preload": self.preload}


def parse_world_sizes(text: str | int, *, source: str = "--world-size") -> tuple[int, ...]:
    """``"4"`` → ``(4,)``; ``"2,3,4"`` → ``(2, 3, 4)``; anything else is a ``ValueError``.

    Example::

        >>> parse_world_sizes("2, 4")
        (2, 4)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        items: list[str] = [str(text)]
    else:
        items = [part.strip() for part in str(text).split(",")]
    sizes: list[int] = []
    for item in items:
        if not item.isdigit() or int(item) < 1:
            raise ValueError(
                f"{source} expects a positive integer or a comma-separated list such as 2,4; "
                f"got {text!r}"
            )
        if int(item) not in sizes:
            sizes.append(int(item))
    return tuple(sizes)


def parse_timeout(text: str | float, *, source: str = "--ddp-timeout") -> float:
    """Seconds as a positive number; a ``ValueError`` that names ``source`` otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise ValueError(f"{source} expects a positive number of seconds, got {text!r}")
    return value


def parse_backend(text: str, *, source: str = "--ddp-backend") -> str:
    if text not in BACKENDS:
        raise ValueError(f"{source} expects one of {', '.join(BACKENDS)}, got {text!r}")
    return text


def parse_device(text: str, *, source: str = "--ddp-device") -> str:
    """``cpu`` or ``cuda``; a ``ValueError`` that names ``source`` otherwise.

    Example::

        >>> parse_device("cuda")
        'cuda'
    """
    value = str(text).strip().lower()
    if value not in DEVICES:
        raise ValueError(f"{source} expects one of {', '.join(DEVICES)}, got {text!r}")
    return value


def launched_sizes(sizes: tuple[int, ...] | None, launched: Any, *, source: str) -> tuple[int, ...]:
    """The world sizes to run under a launcher: the launched size when none was asked for;
    those asked for when the launched one is among them (the others skip); a ``ValueError``
    that names both otherwise.

    Example::

        >>> from ddp_verify.world.launch import Launched
        >>> launched_sizes(None, Launched("torchrun", 0, 4, 0, "127.0.0.1", 29500), source="-")
        (4,)
    """
    size = launched.world_size
    if not sizes:
        return (size,)
    if size not in sizes:
        asked_for = ",".join(map(str, sizes))
        raise ValueError(
            f"{source} asks for world size {asked_for}, but {launched.launcher} launched "
            f"{size} processes: drop {source} (the launched size is the world size), or launch "
            f"{sizes[0]} processes"
        )
    return sizes


def parse_launch(text: str, *, source: str = "--ddp-launch") -> str:
    """``auto``, ``fork`` or ``spmd``; a ``ValueError`` that names ``source`` otherwise.

    Example::

        >>> parse_launch("SPMD")
        'spmd'
    """
    value = str(text).strip().lower()
    if value not in LAUNCH_MODES:
        raise ValueError(f"{source} expects one of {', '.join(LAUNCH_MODES)}, got {text!r}")
    return value


def parse_wrapper(text: str, *, source: str = "--ddp-wrapper") -> str:
    """``"package.module:Callable"`` as given, once its shape is right (it is imported where
    it is used, so that naming it costs no import).

    Example::

        >>> parse_wrapper("torch.nn.parallel:DistributedDataParallel")
        'torch.nn.parallel:DistributedDataParallel'
    """
    module, sep, name = str(text).strip().partition(":")
    if not sep or not module or not name or "/" in module or module.endswith(".py"):
        raise ValueError(
            f"{source} expects an importable MODULE:CALLABLE such as "
            f"my_team.parallel:MyDDP, got {text!r}"
        )
    return f"{module}:{name}"


def parse_modules(text: str | Sequence[str], *, source: str = "--ddp-preload") -> tuple[str, ...]:
    """``"a.b, c"`` (or a list of such) → ``("a.b", "c")``: dotted module names, checked for
    shape only (the ranks import them).

    Example::

        >>> parse_modules("my_team.backend, my_team.patches")
        ('my_team.backend', 'my_team.patches')
    """
    items = [text] if isinstance(text, str) else list(text)
    names = [n.strip() for item in items for n in str(item).replace(",", " ").split() if n.strip()]
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(
                f"{source} expects importable module names such as my_team.backend "
                f"(comma-separated), got {name!r}"
            )
    return tuple(dict.fromkeys(names))


def parse_count(text: str | int, *, source: str) -> int:
    """A positive integer; a ``ValueError`` that names ``source`` otherwise."""
    if not str(text).strip().isdigit() or int(text) < 1:
        raise ValueError(f"{source} expects a positive integer, got {text!r}")
    return int(text)


# -- one precedence chain ------------------------------------------------------------------------

FRONT_ENDS = ("pytest", "cli", "python")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One option: the parameter it sets, how a given value is parsed (``parse(value,
    source=...)``, a ``ValueError`` naming the source otherwise), its environment variable and
    ini key where it has them."""

    name: str
    parse: Callable[..., Any]
    env: str | None = None
    ini: str | None = None


def _flag(value: Any, *, source: str) -> bool:
    return bool(value)


def _text(value: Any, *, source: str) -> str:
    return str(value)


SETTINGS = {
    s.name: s
    for s in (
        Setting("world_sizes", parse_world_sizes, env=WORLD_SIZE_ENV, ini="ddp_world_size"),
        Setting("backend", parse_backend, ini="ddp_backend"),
        Setting("device", parse_device, env=DEVICE_ENV, ini="ddp_device"),
        Setting("allow_tf32", _flag, ini="ddp_allow_tf32"),
        Setting("timeout", parse_timeout, ini="ddp_timeout"),
        Setting("start_timeout", parse_timeout, ini="ddp_start_timeout"),
        Setting("debug", _flag, ini="ddp_debug"),
        Setting("launch", parse_launch, env=LAUNCH_ENV, ini="ddp_launch"),
        Setting("wrapper", parse_wrapper, ini="ddp_wrapper"),
        Setting("conformance_examples", parse_count, ini="ddp_conformance_examples"),
        Setting("preload", parse_modules, ini="ddp_preload"),
        Setting("log_dir", _text, ini="ddp_log_dir"),
    )
}

# What each front end does when nothing was given: a pytest session runs small worlds next to
# other tests; a check of one function runs the world size its scenarios are drawn for.
DEFAULTS: dict[str, dict[str, Any]] = {
    front_end: {
        "world_sizes": (DEFAULT_WORLD_SIZE if front_end == "pytest" else DEFAULT_CHECK_SIZE,),
        "backend": "gloo",
        "device": None,
        "allow_tf32": False,
        "timeout": DEFAULT_TIMEOUT_S,
        "start_timeout": DEFAULT_START_TIMEOUT_S,
        "debug": False,
        "launch": "auto",
        "wrapper": None,
        "conformance_examples": DEFAULT_CONFORMANCE_EXAMPLES,
        "preload": (),
        "log_dir": None,
    }
    for front_end in FRONT_ENDS
}


def _models_excluding(value: object) -> str:
    # check() takes the models strategy itself (ddp_verify.strategies.models).
    return f"models=models(excluded_features=({value!r},))"


def _micro_batch_counts(value: Any) -> str:
    return f"--micro-batch-counts {'same' if value else 'varied'}"


def _trainer_divides(value: Any) -> str:
    return f"--trainer-divides {'on' if value else 'off'}"


# How each front end's users set each parameter (see ddp_verify.world.naming): a flag, or a
# function of the value. Python's spelling is name=value but where check() takes it otherwise.
SPELLINGS: dict[str, Mapping[str, Spelling]] = {
    "pytest": {
        "world_sizes": "--world-size",
        "world_size": "--world-size",
        "backend": "--ddp-backend",
        "device": "--ddp-device",
        "allow_tf32": "--ddp-allow-tf32",
        "timeout": "--ddp-timeout",
        "start_timeout": "--ddp-start-timeout",
        "debug": "--ddp-debug",
        "launch": "--ddp-launch",
        "wrapper": "--ddp-wrapper",
        "conformance_examples": "--conformance-examples",
        "preload": "--ddp-preload",
        "log_dir": "--ddp-log-dir",
    },
    "cli": {
        "world_sizes": "--world-size",
        "world_size": "--world-size",
        "backend": "--backend",
        "device": "--device",
        "allow_tf32": "--allow-tf32",
        "timeout": "--timeout",
        "debug": "--ddp-debug",
        "launch": "--launch",
        "kind": "--kind",
        "lossy": "--lossy",
        "result_on": "--result-on",
        "hook_state": "--hook-state",
        "loss_reduction": "--loss-reduction",
        "trainer_divides": _trainer_divides,
        "token_weights": "--token-weights",
        "towers": "--towers",
        "negatives": "--negatives",
        "even": "--even-batches",
        "max_micro_batches": "--max-micro-batches",
        "ddp_wrapper": "--ddp-wrapper",
        "bind": "--bind",
        "logits": "--logits",
        "labels": "--labels",
        "layout": "--layout",
        "same_micro_batch_counts": _micro_batch_counts,
        "full_trace": "--full-trace",
        "excluded_features": "--exclude-features",
        "models": "--model-kinds/--exclude-features",
        "losses": "--losses",
        "objective": "--objective",
        "window_steps": "--window-steps",
        "packings": "--packing",
        "boundaries": "--boundary-labels",
        "model": "--model",
        "loss_fn": "--loss-fn",
        "empty_ranks": "--empty-ranks",
        "optimizer": "--optimizer",
        "scheduler": "--scheduler",
        "dtypes": "--dtype",
        "strict_loss": "--strict-loss",
    },
    "python": {
        # check() takes the models strategy itself: ddp_verify.strategies.models.
        "excluded_features": _models_excluding,
    },
}


def source_name(name: str, front_end: str) -> str:
    """How errors name the given value's source: ``--ddp-timeout``, ``timeout=``."""
    spelling = SPELLINGS[front_end].get(name)
    return spelling if isinstance(spelling, str) else f"{name}="


def resolve(
    name: str,
    front_end: str,
    *,
    given: Any = None,
    ini: Any = None,
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Option ``name`` for ``front_end``: ``given`` (its flag or argument), else the
    environment variable, else ``ini``, else the front end's default; given values are parsed,
    and a bad one is a ``ValueError`` that names where it came from.

    Example::

        >>> resolve("world_sizes", "cli", environ={})
        (4,)
        >>> resolve("world_sizes", "pytest", given="2,4", environ={})
        (2, 4)
    """
    return resolve_with_source(name, front_end, given=given, ini=ini, environ=environ)[0]


def resolve_with_source(
    name: str,
    front_end: str,
    *,
    given: Any = None,
    ini: Any = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Any, str | None]:
    """:func:`resolve`, and where the value came from (None: the front end's default).

    Example::

        >>> resolve_with_source("device", "cli", environ={DEVICE_ENV: "cpu"})
        ('cpu', 'DDP_VERIFY_DEVICE')
    """
    setting = SETTINGS[name]
    environ = os.environ if environ is None else environ
    candidates = (
        (source_name(name, front_end), given),
        (setting.env, environ.get(setting.env) if setting.env else None),
        (f"ini {setting.ini}", ini),
    )
    for source, value in candidates:
        if source is not None and value is not None and value != "" and value != []:
            return setting.parse(value, source=source), source
    return DEFAULTS[front_end][name], None
