"""``ddp_verify.check()``: the library's front door to the search for a counterexample.

It holds no logic of its own: it keeps one warm world per size for the process (started on
first use, closed at exit) and hands the search to :func:`ddp_verify.usercode.search.search`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..usercode.kinds import Binds, Kind, as_kind, check_signature, term_binds
from ..usercode.search import Progress, preflight, search
from ..usercode.verdict import CheckFailed, Verdict
from ..world import WorldPool
from ..world.backends import check_device, require_devices
from ..world.launch import Launched, resolve
from ..world.naming import current, public, spelled_as
from ..world.spmd import Member
from . import session
from .options import SPELLINGS, launched_sizes, resolve_with_source
from .options import resolve as resolve_option
from .verifying import VerifyingSpmdWorld, VerifyingWorld

if TYPE_CHECKING:
    from ..world.interface import Ranked

# One pool per way of starting worlds (backend, device, TF32), each world kept for the process.
_pools: dict[tuple[str, str | None, bool, bool], WorldPool[VerifyingWorld]] = {}
# Under a launcher: the launched job, joined on the first check and kept for the process.
_launched: VerifyingSpmdWorld | None = None


def check(
    fn: Callable[..., Any],
    *,
    kind: Kind | str,
    world_size: int | None = None,
    max_examples: int = 100,
    seed: int | None = None,
    timeout: float | None = None,
    backend: str | None = None,
    device: str | None = None,
    allow_tf32: bool = False,
    debug: bool = False,
    lossy: str | None = None,
    result_on: str = "all",
    hook_state: Callable[..., Any] | None = None,
    loss_reduction: str = "mean",
    ddp_wrapper: str | None = None,
    bind: Binds = None,
    trainer_divides: bool = False,
    layout: Mapping[str, str] | str | None = None,
    logits: str | None = None,
    labels: str | None = None,
    progress: Progress | None = None,
    world: Ranked | None = None,
    launch: str | None = None,
    full_trace: bool = False,
    **scenario_bounds: Any,
) -> Verdict:
    """Check ``fn`` as a ``kind`` plug-in on generated scenarios; return if it is equivalent.

    Returns the :class:`~ddp_verify.usercode.verdict.Verdict` (equivalent, with the examples
    tried). Raises :class:`~ddp_verify.EquivalenceError` otherwise (``NotEquivalent``, or
    ``CodeFailed`` when ``fn`` raises, crashes a rank or hangs), complete: its ``verdict`` has
    the shrunk scenario, every likely cause with its evidence, the reproducer, the exit code
    and ``to_json()``, the document ``ddp-verify check --json`` prints.

    ``scenario_bounds`` go to :func:`ddp_verify.strategies.scenarios`
    (``max_micro_batches=3``, ``even=True``, ``losses=("tokens",)``,
    ``objective="seq-mean-token-mean"``, ``model="my_models.py:tiny_lm"``, ...); ``step``
    functions are checked with ``same_micro_batch_counts=True`` unless you pass ``False``.
    ``world`` runs the check on a world you already have (its size wins over
    ``world_size``); otherwise a shared one of ``world_size`` ranks is started and kept for
    later checks. Called from a pytest test, it
    runs on the session's world (``pytest --world-size N``; its backend, device and time-out)
    unless ``world_size``, ``backend``, ``device``, ``launch``, ``allow_tf32`` or ``debug`` is
    given, and the report's last line says so. ``full_trace``: when ``fn``
    fails, the ranks' tracebacks keep the harness's frames (as pytest's ``--full-trace``).
    ``bind`` fills parameters by name: ``{"n": "world_size"}`` (or ``"n=world_size"``), to
    one of world_size, rank, count, global_count, vocab_size, device, group, or any value.
    Where a kind accepts several layouts (a ``loss-fn``'s logits ``(batch, seq, vocab)`` or
    flattened, its labels aligned or unshifted; a ``reduce`` helper's tensor or list), the
    code is called in each on the simplest even scenario and the layout that runs and agrees
    is kept; the verdict's ``layout`` says which and why. ``layout="logits=2d"`` (or
    ``logits="2d"``, ``labels="unshifted"``) pins an axis instead.

    Example::

        >>> import torch.distributed as dist
        >>> def summed(model):
        ...     for p in model.parameters():
        ...         if p.grad is not None:
        ...             dist.all_reduce(p.grad)
        >>> try:
        ...     check(summed, kind="grad-sync", world_size=2, seed=0)
        ... except AssertionError as error:
        ...     print(error.verdict.cause.split(":")[0])
        gradients summed across ranks but not divided
    """
    __tracebackhide__ = True
    kind = as_kind(kind)  # the object from here on (a KindError naming the kinds otherwise)
    # An objective of several terms hands each one's values by name: bound before anything.
    bind = term_binds(fn, kind, bind, scenario_bounds.get("objective") or "")
    check_signature(fn, kind, bind=bind)  # before a device is looked for
    # Advice reads as check()'s arguments are spelled, unless the command line, whose flags
    # these arguments are, is the one calling (a pytest session's flags are not check()'s).
    spellings = SPELLINGS["cli"] if current() is SPELLINGS["cli"] else SPELLINGS["python"]
    with spelled_as(spellings):
        # Bounds that do not go together, a call the kind cannot make: before any world.
        preflight(fn, kind, bind, scenario_bounds)
    # Arguments not given come from the environment (DDP_VERIFY_WORLD_SIZE, ..._DEVICE,
    # ..._LAUNCH), then the defaults, as on the command line.
    given_backend, given_device = backend, device
    timeout = resolve_option("timeout", "python", given=timeout)
    backend = resolve_option("backend", "python", given=backend)
    device = resolve_option("device", "python", given=device)
    sizes, source = resolve_with_source("world_sizes", "python", given=world_size)
    if len(sizes) != 1:
        raise ValueError(f"{source} asks for world sizes {sizes}: a check runs at one size")
    world_from = None
    in_session = session.current()
    chose = (world_size, launch, given_backend, given_device, allow_tf32, debug)
    # An environment variable set since the session began (a size of its own) wins too.
    env_agrees = source is None or sizes[0] == (in_session.size if in_session else None)
    unchosen = chose == (None, None, None, None, False, False) and env_agrees
    if world is None and in_session is not None and unchosen:
        # Called from a test: the session's world, as its --world-size and backend say.
        world = in_session.get()
        world_from = (
            f"the pytest session's, {in_session.size} ranks ({in_session.said}); "
            "check(world_size=N) runs on a world of its own"
        )
    if world is None:
        launched = resolve(resolve_option("launch", "python", given=launch), os.environ)
        if launched is not None:
            # A size asked for must be the launched one (a ValueError that says so otherwise).
            launched_sizes(sizes if source else None, launched, source=source or "-")
            world = _launched_world(launched, timeout, backend, device, allow_tf32, debug)
        else:
            device = check_device(backend, device)
            require_devices(backend, sizes[0], device)
            world = _world(sizes[0], timeout, backend, device, allow_tf32, debug)
    try:
        with spelled_as(spellings):
            verdict = search(
                fn,
                kind=kind,
                world=world,
                max_examples=max_examples,
                seed=seed,
                progress=progress,
                lossy=lossy,
                result_on=result_on,
                hook_state=hook_state,
                loss_reduction=loss_reduction,
                ddp_wrapper=ddp_wrapper,
                bind=bind,
                trainer_divides=trainer_divides,
                layout=layout,
                logits=logits,
                labels=labels,
                full_trace=full_trace,
                **scenario_bounds,
            )
    except CheckFailed as exc:
        if world_from is None:
            raise
        failed = dataclasses.replace(exc.verdict, world_from=world_from)
        raise type(exc)(failed).with_traceback(exc.__traceback__) from None
    except BaseException:
        if isinstance(world, VerifyingSpmdWorld):
            # Rank 0 then leaves the launched job first, so the launcher names it.
            world.member.failed = True
        raise
    return dataclasses.replace(verdict, world_from=world_from) if world_from else verdict


def _world(
    size: int, timeout: float, backend: str, device: str, allow_tf32: bool, debug: bool
) -> VerifyingWorld:
    key = (backend, device, allow_tf32, debug)
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = WorldPool(
            VerifyingWorld,
            timeout=timeout,
            backend=backend,
            device=device,
            allow_tf32=allow_tf32,
            debug=debug,
        )
        atexit.register(pool.close)
    for known in pool.worlds():
        known.retry_start()  # a new check tries a world that failed to start once more
    # Not started here: the search checks the code and its options first, and its first
    # example starts the world, so a usage error never waits for one.
    world = pool.get(size, start=False)
    world.timeout = timeout
    return world


def _launched_world(
    launched: Launched,
    timeout: float,
    backend: str,
    device: str | None,
    allow_tf32: bool,
    debug: bool,
) -> VerifyingSpmdWorld:
    global _launched
    if _launched is None:
        member = Member(
            launched,
            backend=backend,
            device=device,
            allow_tf32=allow_tf32,
            timeout=timeout,
            debug=debug,
        )
        _launched = VerifyingSpmdWorld(member)
        atexit.register(_launched.close)
    _launched.timeout = _launched.member.timeout = timeout
    return _launched


@public
class ParityFailed(AssertionError):
    """``assert_parity()`` found a layout that trains something else, or a layout's run failed:
    the report is the message, the result (``check``'s verdict and each layout's figures) is
    ``error.result``.

    Example (the repository's fixture script, with ``zero_grad()`` inside its loop)::

        >>> from pathlib import Path
        >>> import ddp_verify
        >>> script = Path(ddp_verify.__file__).parents[1] / "fixtures" / "scripts" / "plain_ddp.py"
        >>> command = ["python", str(script), "--grad-accum", "{grad_accum}",
        ...            "--batch-size", "{micro_batch}", "--variant", "zero-grad-inside"]
        >>> try:
        ...     assert_parity(command, layouts="1x2", global_batch=16, steps=1)
        ... except ParityFailed as error:
        ...     print(error.result.layouts[0]["causes"][0], error.result.exit_code)
        micro:cleared 1
    """

    def __init__(self, result: Any) -> None:
        super().__init__(result.report)
        self.result = result

    @property
    def summary(self) -> str:
        """The verdict in one line: the script, how it ended and the first cause with its
        layout (pytest's short summary line)."""
        return str(self.result.summary)


def assert_parity(
    command: Sequence[str],
    *,
    layouts: str | Sequence[Any] = "1x4,2x2,4x1",
    reference: str = "1x1",
    steps: int = 3,
    global_batch: int | None = None,
    dtype: str = "float64",
    launcher: str | None = None,
    timeout: float = 600.0,
    keep: str | os.PathLike[str] | None = None,
    caches_gradients: bool = False,
    strict_loss: bool = False,
) -> Any:
    """Run the training script ``command`` (as one process runs it, with ``{world_size}``,
    ``{grad_accum}``, ``{micro_batch}``, ``{global_batch}`` in its flags) at each of
    ``layouts`` and hold it to the ``reference`` layout, as ``ddp-verify parity`` does; return
    the result when every layout trains the same, raise :class:`ParityFailed` (an
    ``AssertionError``, so pytest shows the report) otherwise. A script whose loss couples
    samples across ranks is judged at layouts that do not accumulate, unless
    ``caches_gradients=True`` says it accumulates exactly (GradCache). A layout that trains
    the same but logs another loss passes with a warning (``result.warnings``), unless
    ``strict_loss=True``.

    A command that cannot run is a ``ValueError`` before anything starts:

        >>> assert_parity(["python", "missing.py"])
        Traceback (most recent call last):
        ...
        ddp_verify.LayoutError: missing.py: no such script

    Example (a test)::

        def test_train_py_is_layout_independent():
            ddp_verify.assert_parity(["python", "train.py", "--grad-accum", "{grad_accum}",
                               "--batch-size", "{micro_batch}"], global_batch=16)
    """
    from ..parity.launch import DEFAULT_LAUNCHER
    from ..parity.layouts import parse_layout, parse_layouts
    from ..parity.run import run_parity

    if dtype not in ("float64", "native"):
        raise ValueError(f"dtype must be 'float64' or 'native', got {dtype!r}")
    chosen = parse_layouts(layouts) if isinstance(layouts, str) else list(layouts)
    result = run_parity(
        list(command),
        layouts=chosen,
        reference=parse_layout(reference),
        steps=steps,
        global_batch=global_batch,
        float64=dtype == "float64",
        launcher=launcher or DEFAULT_LAUNCHER,
        timeout=timeout,
        keep=None if keep is None else Path(keep),
        caches_gradients=caches_gradients,
        strict_loss=strict_loss,
    )
    if result.exit_code != 0:
        raise ParityFailed(result)
    return result
