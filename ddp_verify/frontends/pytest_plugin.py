"""pytest front end: run tests on real multi-rank ``torch.distributed`` worlds.

- ``pytest --world-size 4`` (ini ``ddp_world_size``, env ``DDP_VERIFY_WORLD_SIZE``); ``2,3,4``
  runs every distributed test at each size;
- ``@pytest.mark.distributed`` runs the test body on every rank, with fixtures ``rank`` and
  ``world_size``; other fixtures are resolved once here and their values sent to the ranks;
- the session fixture ``world`` gives the running world for ``world.run(...)``, ``@given`` too;
- under ``torchrun`` or ``srun`` (``--ddp-launch auto``, the default; or ``spmd``) the session
  on each launched process *is* that rank: see :mod:`ddp_verify.frontends.pytest_spmd`.

Nothing here imports torch: a session pays for it only when a test asks for a world.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

from ..engine import compat
from ..world.backends import BACKENDS, DEVICES
from ..world.errors import RankError
from ..world.naming import speak_as
from . import options as opts
from .session import SessionWorld

if TYPE_CHECKING:
    from ..world import WorldPool
    from ..world.spmd import SpmdPool
    from .verifying import AnyVerifyingWorld, VerifyingSpmdWorld, VerifyingWorld

    VerifyingPool = WorldPool[VerifyingWorld] | SpmdPool[VerifyingSpmdWorld]

_options_key = pytest.StashKey["opts.WorldOptions"]()
_pool_key = pytest.StashKey["VerifyingPool"]()
_item_world_key = pytest.StashKey["AnyVerifyingWorld"]()
_launched_key = pytest.StashKey[Any]()
_xdist_off_key = pytest.StashKey[bool]()
_unspell_key = pytest.StashKey[Callable[[], None]]()
_outer_session_key = pytest.StashKey[SessionWorld | None]()

_MARKER = "distributed"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp_verify", "distributed worlds (ddp_verify)")
    group.addoption(
        "--world-size",
        dest="ddp_world_size",
        metavar="N[,N...]",
        default=None,
        help="ranks per world; a list such as 2,3,4 runs each distributed test at every size "
        f"(ini ddp_world_size, env {opts.WORLD_SIZE_ENV}; default {opts.DEFAULT_WORLD_SIZE})",
    )
    group.addoption(
        "--ddp-backend",
        dest="ddp_backend",
        default=None,
        choices=BACKENDS,
        help="process group backend: gloo (CPU) or nccl (one GPU per rank); default gloo",
    )
    group.addoption(
        "--ddp-device",
        dest="ddp_device",
        default=None,
        choices=DEVICES,
        help="where the ranks train: cpu, or cuda (cuda:rank, GPUs shared round-robin when "
        f"gloo runs more ranks than GPUs); default cuda for nccl, cpu for gloo (ini "
        f"ddp_device, env {opts.DEVICE_ENV})",
    )
    group.addoption(
        "--ddp-allow-tf32",
        dest="ddp_allow_tf32",
        action="store_true",
        default=None,
        help="let CUDA float32 matmuls and convolutions use TF32 in the ranks (off by default; "
        "float32's tolerance is then measured with TF32 on) (ini ddp_allow_tf32)",
    )
    group.addoption(
        "--ddp-start-timeout",
        dest="ddp_start_timeout",
        metavar="SECONDS",
        default=None,
        help="seconds the ranks of a world may take to join before the start fails with "
        f"where each rank was (ini ddp_start_timeout; default {opts.DEFAULT_START_TIMEOUT_S:g})",
    )
    group.addoption(
        "--ddp-timeout",
        dest="ddp_timeout",
        metavar="SECONDS",
        default=None,
        help="seconds a job may run on the ranks before they are dumped and killed "
        f"(default {opts.DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--ddp-debug",
        dest="ddp_debug",
        action="store_true",
        default=None,
        help="set TORCH_DISTRIBUTED_DEBUG=DETAIL in the ranks, so torch names mismatched "
        "collectives",
    )
    group.addoption(
        "--ddp-wrapper",
        dest="ddp_wrapper",
        metavar="MODULE:CALLABLE",
        default=None,
        help="the DDP-like class or factory the conformance suite (ddp_verify.conformance) "
        "checks in place of torch's DistributedDataParallel, called as DDP is "
        "(ini ddp_wrapper)",
    )
    group.addoption(
        "--ddp-preload",
        dest="ddp_preload",
        metavar="MODULE[,MODULE...]",
        action="append",
        default=None,
        help="modules every rank imports before its first job (a custom backend's "
        "registration, a patch under test); repeatable (ini ddp_preload)",
    )
    group.addoption(
        "--conformance-examples",
        dest="ddp_conformance_examples",
        metavar="N",
        default=None,
        help="generated scenarios per property of the conformance suite "
        f"(ini ddp_conformance_examples; default {opts.DEFAULT_CONFORMANCE_EXAMPLES})",
    )
    group.addoption(
        "--ddp-launch",
        dest="ddp_launch",
        default=None,
        choices=opts.LAUNCH_MODES,
        help="how the ranks come to be: fork (forked here), spmd (this process is one rank of "
        "a torchrun/srun job), auto (spmd under a launcher, else fork; the default) (ini "
        f"ddp_launch, env {opts.LAUNCH_ENV})",
    )
    group.addoption(
        "--ddp-log-dir",
        dest="ddp_log_dir",
        metavar="DIR",
        default=None,
        help="SPMD mode: where ranks other than 0 write their session's output, one "
        "rankN.log each (ini ddp_log_dir; default: they stay quiet)",
    )
    parser.addini("ddp_launch", "how the ranks come to be: auto, fork or spmd", default=None)
    parser.addini("ddp_log_dir", "SPMD mode: directory of the other ranks' logs", default=None)
    parser.addini("ddp_wrapper", "DDP-like MODULE:CALLABLE for the conformance suite", default=None)
    parser.addini("ddp_preload", "modules every rank imports before its first job", type="args")
    parser.addini("ddp_conformance_examples", "scenarios per conformance property", default=None)
    parser.addini("ddp_world_size", "ranks per world, or a comma-separated list", default=None)
    parser.addini("ddp_backend", "process group backend: gloo or nccl", default=None)
    parser.addini("ddp_device", "where the ranks train: cpu or cuda", default=None)
    parser.addini("ddp_allow_tf32", "let CUDA float32 use TF32 in the ranks", type="bool")
    parser.addini("ddp_start_timeout", "seconds a world's ranks may take to join", default=None)
    parser.addini("ddp_timeout", "seconds a job may run on the ranks", default=None)
    parser.addini("ddp_debug", "set TORCH_DISTRIBUTED_DEBUG=DETAIL in the ranks", type="bool")


def _option(config: pytest.Config, name: str) -> tuple[Any, str | None]:
    """Option ``name`` as this session has it, and where from: its flag, environment
    variable, ini key or (None) the default (see :func:`ddp_verify.frontends.options.resolve`).
    Early in the session (initial conftests) the flags are only in the known arguments."""
    setting = opts.SETTINGS[name]
    dest = "ddp_world_size" if name == "world_sizes" else f"ddp_{name}"
    given = config.getoption(dest, None)
    if given is None:
        given = getattr(getattr(config, "known_args_namespace", None), dest, None)
    ini = _ini(config, setting.ini) if setting.ini else None
    return opts.resolve_with_source(name, "pytest", given=given, ini=ini)


def _launch_mode(config: pytest.Config) -> str:
    """The launch mode asked for (auto unless said); a ``ValueError`` for a bad one."""
    return str(_option(config, "launch")[0])


def _ini(config: pytest.Config, name: str) -> Any:
    try:
        return config.getini(name)
    except (ValueError, KeyError):
        return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Generator[None, Any, Any]:
    # Before pytest captures output (the outermost wrapper): a launched rank other than 0
    # sends its terminal to its log, so that only rank 0 prints the report.
    from ..world.launch import LaunchError, resolve

    try:
        launched = resolve(_launch_mode(early_config), os.environ)
    except (ValueError, LaunchError):
        launched = None  # pytest_configure reports it
    if launched is not None and launched.rank != 0:
        from .pytest_spmd import quiet

        quiet(launched.rank, _option(early_config, "log_dir")[0])
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    from ..world import cleanup

    # SIGTERM and SIGHUP end the session as Ctrl-C does: worlds closed, files removed.
    cleanup.ends_cleanly()
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(world_size=None, timeout=None): run the test body on every rank of a real "
        "torch.distributed world; world_size (an int or a list) overrides --world-size for "
        "this test, timeout (seconds) overrides --ddp-timeout.",
    )
    from ..world.launch import LaunchError, resolve

    try:
        launched = resolve(_launch_mode(config), os.environ)
    except (ValueError, LaunchError) as exc:
        raise pytest.UsageError(str(exc)) from None
    options = _resolve_options(config, launched)
    _check_preload(config, options)
    # Advice made below (and on the ranks) spells options as this front end's flags.
    config.stash[_unspell_key] = speak_as(opts.SPELLINGS["pytest"])
    config.stash[_options_key] = options
    _share_session_world(config, launched, options)
    if launched is not None and not hasattr(config, "workerinput"):
        # Under a launcher every process already is one rank: xdist workers would each run a
        # share of the tests, out of step with the other ranks. (A project's addopts often
        # say -n auto: turned off here, and the header says so.)
        if compat.without_xdist(config):
            config.stash[_xdist_off_key] = True
        _join_launched_world(config, launched, options)


def _share_session_world(config: pytest.Config, launched: Any, options: opts.WorldOptions) -> None:
    """``check()`` called from a test runs on this session's world (see frontends.session)."""
    from . import session

    size = launched.world_size if launched is not None else options.world_sizes[0]
    given, source = _option(config, "world_sizes")
    value = ",".join(map(str, given))
    if launched is not None:
        said = f"the launched job's {size} ranks"
    elif source is None:
        said = f"the plugin's default world size, {size}"
    elif source.startswith("ini "):
        said = f"{source.removeprefix('ini ')} = {value} in the ini file"
    elif source.startswith("-"):
        said = f"{source} {value}"
    else:
        said = f"{source}={value}"
    config.stash[_outer_session_key] = session.current()
    session.set_current(
        session.SessionWorld(get=lambda: _pool(config).get(size), size=size, said=said)
    )


def _join_launched_world(config: pytest.Config, launched: Any, options: opts.WorldOptions) -> None:
    """SPMD mode: this process is one rank; form the group and make the ranks one session."""
    from ..world import WorldError
    from ..world.spmd import Member, SpmdPool
    from .pytest_spmd import SpmdSession
    from .verifying import VerifyingSpmdWorld

    world = VerifyingSpmdWorld(Member(launched, **options.world_kwargs()), preload=options.preload)
    try:
        # The store now (the ranks agree on the collected tests); the group at the first
        # test, once collection has imported what it imports (see Member.connect).
        world.connect()
    except WorldError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_launched_key] = launched
    config.stash[_pool_key] = SpmdPool(world)
    config.pluginmanager.register(SpmdSession(config, world), "ddp_verify-spmd")


def _resolve_options(config: pytest.Config, launched: Any = None) -> opts.WorldOptions:
    """Each option from its flag, environment variable, ini key or default; under a launcher,
    the launched world's size unless sizes were asked for (one that differs is a usage
    error)."""
    try:
        chosen = {name: _option(config, name) for name in _WORLD_OPTIONS}
        values = {name: value for name, (value, _) in chosen.items()}
        if launched is not None:
            sizes, source = chosen["world_sizes"]
            values["world_sizes"] = opts.launched_sizes(
                sizes if source else None, launched, source=source or "--world-size"
            )
        return opts.WorldOptions(**values)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


# The options of WorldOptions, each resolved by _option.
_WORLD_OPTIONS = tuple(f.name for f in dataclasses.fields(opts.WorldOptions))


def _check_preload(config: pytest.Config, options: opts.WorldOptions) -> None:
    """A module the ranks cannot import fails here, once, not at every world's start. The
    ranks start after collection, whose import mode may put the tests' directories on sys.path:
    those (the invocation and root directories, the arguments') count too."""
    import importlib.machinery
    import importlib.util

    places = [str(config.invocation_params.dir), str(config.rootpath)]
    for arg in config.args:
        path = config.invocation_params.dir / arg.split("::")[0]
        places.append(str(path if path.is_dir() else path.parent))
    for name in options.preload:
        top = name.split(".")[0]
        found = importlib.machinery.PathFinder.find_spec(top, [*places, *sys.path]) is not None
        if not found and importlib.util.find_spec(top) is None:
            raise pytest.UsageError(
                f"--ddp-preload: no module named {top!r} is importable here (the ranks import "
                "from this process's sys.path: install it, or run from its directory)"
            )


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = config.stash.get(_pool_key, None)
    if pool is not None:
        pool.close()
    config.stash.get(_unspell_key, lambda: None)()
    if _outer_session_key in config.stash:
        from . import session

        # A session run inside another (pytester) hands the outer one its world back.
        session.set_current(config.stash[_outer_session_key])


def pytest_report_header(config: pytest.Config) -> str:
    from importlib.metadata import PackageNotFoundError, version

    options = config.stash[_options_key]
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    sizes = ",".join(map(str, options.world_sizes))
    plural = "s" if len(options.world_sizes) > 1 else ""
    debug = ", debug" if options.debug else ""
    wrapper = f", DDP wrapper {options.wrapper}" if options.wrapper else ""
    if options.preload:
        wrapper += f", ranks preload {','.join(options.preload)}"
    launched = config.stash.get(_launched_key, None)
    if config.stash.get(_xdist_off_key, False):
        wrapper += "; pytest-xdist's -n is off under a launcher (each process is one rank)"
    spawned = _why_spawned() if launched is None else None
    if spawned:
        wrapper += f"; ranks are spawned, not forked ({spawned}): each start takes longer"
    if launched is not None:
        skipped = [n for n in options.world_sizes if n != launched.world_size]
        if skipped:
            sizes = f"{launched.world_size} (the launched one; {','.join(map(str, skipped))} skip)"
    return (
        f"ddp_verify: world size{plural} {sizes}, backend {options.backend}, "
        f"device {_placement(options)}, timeout {options.timeout:g} s{debug}{wrapper}, "
        f"torch {torch_version}"
    )


def _why_spawned() -> str | None:
    from ..world import forkserver

    return forkserver.why_spawned()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # The fork server can fail in the middle of a session: later ranks are then spawned,
    # which is slower; said here, since the header could not know.
    if config.stash.get(_launched_key, None) is not None or _pool_key not in config.stash:
        return
    spawned = _why_spawned()
    if spawned and spawned.startswith("the fork server failed"):
        terminalreporter.write_line(f"ddp_verify: ranks were spawned after {spawned}", yellow=True)


def _placement(options: opts.WorldOptions) -> str:
    """``cpu``, or how the ranks sit on the GPUs this machine shows (torch is imported only
    for cuda, whose tests need it anyway)."""
    from ..world.backends import DEVICE, placement, visible_gpus

    device = str(options.device)  # resolved by WorldOptions: the backend's default at least
    if not DEVICE[device].gpus:
        return device
    gpus = visible_gpus()
    if gpus == 0:
        return f"{device} (no GPU visible: distributed tests skip)"
    tf32 = ", TF32 allowed" if options.allow_tf32 else ""
    return "; ".join(placement(n, device, gpus) for n in options.world_sizes) + tf32


def _pool(config: pytest.Config) -> VerifyingPool:
    pool = config.stash.get(_pool_key, None)
    if pool is None:
        from ..world import WorldPool
        from .verifying import VerifyingWorld

        options = config.stash[_options_key].pool_kwargs()
        pool = WorldPool(VerifyingWorld, **options)
        config.stash[_pool_key] = pool
    return pool


def _marker_sizes(marker: pytest.Mark | None) -> tuple[int, ...] | None:
    if marker is None or marker.kwargs.get("world_size") is None:
        return None
    value = marker.kwargs["world_size"]
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else value
    try:
        return opts.parse_world_sizes(text, source="@pytest.mark.distributed(world_size=...)")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(_MARKER)
    # world_size is in every test's closure (see the autouse fixture), so ask the signature.
    own_args = inspect.signature(metafunc.function).parameters
    if marker is None and "world" not in metafunc.fixturenames and "world_size" not in own_args:
        return
    if any("world_size" in _argnames(m) for m in metafunc.definition.iter_markers("parametrize")):
        return  # The test chose its own sizes.
    default = metafunc.config.stash[_options_key].world_sizes
    sizes = _marker_sizes(marker) or default
    if len(sizes) == 1 and sizes == default:
        return  # One size, the configured one: keep test ids as they are.
    metafunc.parametrize(
        "world_size", sizes, indirect=True, ids=[f"ws{n}" for n in sizes], scope="session"
    )


def _argnames(mark: pytest.Mark) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
    if isinstance(names, str):
        return [n.strip() for n in names.split(",")]
    return list(names)


@pytest.fixture(scope="session")
def world_size(request: pytest.FixtureRequest) -> int:
    """The number of ranks of the world this test runs on."""
    return int(getattr(request, "param", request.config.stash[_options_key].world_sizes[0]))


@pytest.fixture(scope="session")
def world(request: pytest.FixtureRequest, world_size: int) -> AnyVerifyingWorld:
    """The running world of ``world_size`` ranks, shared by every test of that size.

    Besides ``world.run(...)`` it checks methods: ``world.assert_equivalent(method, scenario)``.

    Example::

        def test_sum(world):
            import torch, torch.distributed as dist

            def job():
                t = torch.ones(1)
                dist.all_reduce(t)
                return t.item()

            assert world.run(job) == [float(world.size)] * world.size
    """
    from ..world import BackendUnavailable

    try:
        return _pool(request.config).get(world_size)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def lockstep(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """``lockstep(test)``: a ``@given`` test defined *inside* a test, made to run in lockstep on
    every rank of a launched job (SPMD mode: agreed seed, database and outcomes, as the plugin
    does for test functions themselves); returned unchanged in fork mode.

    Example::

        def test_property(world, lockstep):
            @given(scenarios(world_size=world.size))
            def holds(scenario):
                world.assert_equivalent(ddp(), scenario)

            lockstep(holds)()
    """
    pool = request.config.stash.get(_pool_key, None)
    launched = request.config.stash.get(_launched_key, None)
    if launched is None or pool is None:
        return lambda test: test
    from ..engine.lockstep import in_lockstep

    world = pool.get(launched.world_size)
    return lambda test: in_lockstep(test, world)


@pytest.fixture(scope="session")
def ddp_wrapper(request: pytest.FixtureRequest) -> str | None:
    """``--ddp-wrapper`` (``MODULE:CALLABLE``), or None for torch's DistributedDataParallel."""
    return request.config.stash[_options_key].wrapper


@pytest.fixture(scope="session")
def conformance_examples(request: pytest.FixtureRequest) -> int:
    """``--conformance-examples``: generated scenarios per conformance property."""
    return request.config.stash[_options_key].conformance_examples


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> _RankPlaceholder:
    """This rank's number, inside a ``@pytest.mark.distributed`` test."""
    if request.node.get_closest_marker(_MARKER) is None:
        raise pytest.UsageError(
            f"{request.node.nodeid}: the 'rank' fixture exists only in "
            "@pytest.mark.distributed tests; elsewhere use world.run(...) and "
            "torch.distributed.get_rank() inside the job"
        )
    return _RankPlaceholder()


class _RankPlaceholder:
    """Stands for the rank in the controller; each rank receives its own number instead."""

    def __repr__(self) -> str:
        return "<rank: set on each rank>"


@pytest.fixture(autouse=True)
def _ddp_verify_distributed(request: pytest.FixtureRequest, world_size: int) -> None:
    # Autouse so that world_size is known to every test and distributed tests can be
    # parametrized over sizes without naming a fixture; a no-op for other tests.
    pool = request.config.stash.get(_pool_key, None)
    for started in pool.worlds() if pool is not None else []:
        # A start that failed in an earlier test is tried once more in this one (and within
        # a test, re-raised at once rather than waited out again).
        started.retry_start()
    if request.node.get_closest_marker(_MARKER) is not None:
        request.node.stash[_item_world_key] = request.getfixturevalue("world")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # A failed check's short summary line says the kind, the function and the first cause,
    # under the exception's public name: pytest would show the report's first line, which
    # says neither why nor (cut to the terminal) much else.
    report = yield
    crash = getattr(report.longrepr, "reprcrash", None)
    error = call.excinfo.value if call.excinfo is not None else None
    summary = getattr(error, "summary", None)
    if (
        type(error).__module__ == "ddp_verify"
        and report.failed
        and crash is not None
        and isinstance(summary, str)
    ):
        crash.message = f"{type(error).__module__}.{type(error).__qualname__}: {summary}"
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    from ..world import cleanup

    # A SIGTERM whose exception a test swallowed still ends the session before the next test.
    cleanup.stop_if_asked()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker(_MARKER)
    if marker is None:
        return None
    from ..world import JobPicklingError

    world = pyfuncitem.stash[_item_world_key]
    argnames = compat.fixture_argnames(pyfuncitem)
    if "world" in argnames:
        pytest.fail(
            f"{pyfuncitem.name} is marked distributed, so its body already runs on every rank; "
            "it cannot also take the 'world' fixture, which drives the ranks from the "
            "controller. Use the 'rank' and 'world_size' fixtures, or drop the marker and call "
            "world.run(...).",
            pytrace=False,
        )
    kwargs = {name: pyfuncitem.funcargs[name] for name in argnames if name != "rank"}
    timeout = marker.kwargs.get("timeout")
    if timeout is not None:
        try:
            timeout = opts.parse_timeout(timeout, source="@pytest.mark.distributed(timeout=...)")
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
    try:
        world.run_job(
            _run_test_on_rank,
            (pyfuncitem.obj, kwargs, "rank" in argnames),
            timeout=timeout,
            by_value=[pyfuncitem.module] if pyfuncitem.module else [],
            name=pyfuncitem.name,
        )
    except JobPicklingError as exc:
        message = _unpicklable_fixture_message(pyfuncitem.name, kwargs) or str(exc)
    except RankError as exc:
        _reraise_outcome(pyfuncitem, exc)
        message = exc.report(full_trace=pyfuncitem.config.option.fulltrace)
    else:
        return True
    # Outside the except blocks, so the report is not doubled by exception chaining.
    pytest.fail(message, pytrace=False)


def _unpicklable_fixture_message(test: str, fixtures: dict[str, Any]) -> str | None:
    from ..world.protocol import first_unpicklable

    found = first_unpicklable(fixtures)
    if found is None:
        return None
    name, value, error = found
    return (
        f"fixture {name!r} ({type(value).__name__}) of {test} cannot be sent to the ranks: "
        f"{type(error).__name__}: {error}.\nFixture values are resolved once in the controller "
        "and pickled to every rank; create such an object inside the test instead."
    )


def _run_test_on_rank(test: Any, kwargs: dict[str, Any], wants_rank: bool) -> None:
    __tracebackhide__ = True
    if wants_rank:
        import torch.distributed as dist

        kwargs = {**kwargs, "rank": dist.get_rank()}
    test(**kwargs)


def _reraise_outcome(item: pytest.Function, error: Any) -> None:
    """Let a skip or xfail raised on the ranks act as if raised here."""
    primary = [f for f in error.failures if f.is_primary]
    excs = [f.exception for f in primary]
    if not primary or any(e is None for e in excs):
        return
    outcomes = (pytest.skip.Exception, pytest.xfail.Exception)
    if all(isinstance(e, outcomes) for e in excs) and len({type(e) for e in excs}) == 1:
        if isinstance(excs[0], pytest.skip.Exception):
            compat.at_test_location(excs[0])  # the test's location, not this line
        raise excs[0]
    xfail = item.get_closest_marker("xfail")
    raises = xfail.kwargs.get("raises") if xfail else None
    if raises is not None and all(isinstance(e, raises) for e in excs):
        raise excs[0]


def _reporting_rank_output(when: str) -> Any:
    """A wrapper of the ``pytest_runtest_<when>`` hook that attaches the ranks' output."""

    @pytest.hookimpl(wrapper=True)
    def hook(item: pytest.Item) -> Generator[None, Any, Any]:
        try:
            return (yield)
        except RankError as exc:
            # A world.run() in a test or fixture: its ranks' frames in full, as pytest's own.
            if item.config.option.fulltrace:
                exc.args = (exc.report(full_trace=True),)
            raise
        finally:
            _report_rank_output(item, when)

    hook.__name__ = f"pytest_runtest_{when}"
    return hook


pytest_runtest_setup = _reporting_rank_output("setup")
pytest_runtest_call = _reporting_rank_output("call")
pytest_runtest_teardown = _reporting_rank_output("teardown")


def _report_rank_output(item: pytest.Item, when: str) -> None:
    """Attach what the ranks printed during this phase as one report section per rank."""
    pool = item.config.stash.get(_pool_key, None)
    worlds = pool.worlds() if pool is not None else []
    echo = item.config.getoption("capture") == "no"
    for w in worlds:
        for rank_number, streams in enumerate(w.take_output()):
            for name, text in zip(("stdout", "stderr"), streams, strict=True):
                if not text:
                    continue
                label = f"{name} rank {rank_number}" + (f" of {w.size}" if len(worlds) > 1 else "")
                item.add_report_section(when, label, text)
                if echo:
                    stream = sys.stdout if name == "stdout" else sys.stderr
                    prefix = f"[rank {rank_number}] "
                    stream.write("".join(prefix + line for line in text.splitlines(True)))
