"""The messages between the controller and its ranks, and how jobs and results are pickled.

Messages are small tuples pickled with the standard pickle; a job's callable and arguments are
pickled once with cloudpickle and the same bytes go to every rank.

Functions whose module the ranks cannot import (``__main__``, a test module that pytest imported
from its own path, a module the ranks' ``sys.path`` cannot reach) are pickled *by value*, so
closures, lambdas and test functions all work.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import importlib
import importlib.machinery
import io
import linecache
import os
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import cloudpickle

from .errors import JobPicklingError

# Message tags.
RUN = "run"
EXIT = "exit"
READY = "ready"
START_FAILED = "start-failed"
DONE = "done"


@dataclasses.dataclass(frozen=True)
class Launch:
    """Everything a freshly started rank needs to join its world."""

    rank: int
    world_size: int
    backend: str
    # The rendezvous: a FileStore in the world's private directory (nothing listens on a
    # network for it), and the prefix of this launch's keys.
    store_path: str
    store_prefix: str
    collective_timeout_s: float
    threads: int
    stack_file: str
    sys_path: tuple[str, ...]
    cwd: str
    preload: tuple[str, ...] = ()
    # False for a helper process: no store, no process group.
    process_group: bool = True
    # "cpu" or "cuda": where the rank trains (its GPU is rank % visible GPUs).
    device: str = "cpu"
    # TF32 matmuls and convolutions on CUDA: off unless the world asks for them.
    allow_tf32: bool = False


@dataclasses.dataclass
class Outcome:
    """What one rank sends back after a job."""

    job_id: int
    ok: bool
    # The cloudpickled result when ok; otherwise None.
    result: bytes | None = None
    # When not ok: how it failed.
    error_kind: str = ""
    error_summary: str = ""
    error_traceback: str = ""
    # The same traceback with the harness's frames (``--full-trace``).
    error_traceback_full: str = ""
    # The code the job passed to sys.exit(), where it did (a forked rank then ends with it).
    exit_code: int | None = None
    # The exception object, cloudpickled, when it could be (pytest's skip/xfail need it).
    exception: bytes | None = None
    # False when the job destroyed the default process group.
    process_group_alive: bool = True


def encode(message: Any) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)


def dump_job(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    by_value: Sequence[types.ModuleType] = (),
) -> bytes:
    """Pickle a job once for every rank; a clear :class:`JobPicklingError` names what failed."""
    modules = [*by_value, *modules_ranks_cannot_import(fn)]
    with pickled_by_value(modules):
        try:
            return dumps((fn, tuple(args), dict(kwargs)))
        except Exception as exc:
            raise JobPicklingError(_locate_unpicklable(fn, args, kwargs, exc)) from exc


class Shipped:
    """An object pickled once in the controller and unpickled once per rank process, however
    many jobs carry it: a method holding the user's code goes out with every example, and
    pickling functions by value is the slow part of a job.

    The rank keeps the object it unpickled, so state the object keeps persists from job to
    job, as it would in one process.

    Example::

        shipped = Shipped(method, by_value=method.by_value)
        for scenario in scenarios:
            world.run(train_on_rank, shipped, scenario)
    """

    def __init__(self, obj: Any, *, by_value: Sequence[types.ModuleType] = ()) -> None:
        with pickled_by_value(list(by_value)):
            try:
                self.data = dumps(obj)
            except Exception as exc:
                raise JobPicklingError(
                    f"{type(obj).__name__} {obj!r} cannot be pickled: {type(exc).__name__}: "
                    f"{exc}. It is sent to every rank process, so it must be picklable."
                ) from exc
        self.digest = hashlib.blake2b(self.data, digest_size=16).hexdigest()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unshipped, (self.digest, self.data))


# On a rank: the objects shipped most recently, by digest.
_unshipped_cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
_UNSHIPPED_KEPT = 8


def _unshipped(digest: str, data: bytes) -> Any:
    if digest in _unshipped_cache:
        _unshipped_cache.move_to_end(digest)
        return _unshipped_cache[digest]
    obj = pickle.loads(data)
    _unshipped_cache[digest] = obj
    while len(_unshipped_cache) > _UNSHIPPED_KEPT:
        _unshipped_cache.popitem(last=False)
    return obj


def load_job(payload: bytes) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    return pickle.loads(payload)


def dump_result(value: Any) -> bytes:
    return dumps(value)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps``, also for modules of a subclass of the module type, and with the
    code of every file the ranks cannot import by name shipped by value wherever the object
    reaches it (see :class:`_Pickler`)."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, protocol=5)
    try:
        pickler.dump(obj)
    finally:
        pickler.unregister()
    return buffer.getvalue()


# What holds code a rank may need a user's file for: checked once per object pickled.
_CODE_HOLDERS = (types.FunctionType, type)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with two differences.

    Code pickled by value keeps its file name. cloudpickle 3.1.3 and later name every such
    code object ``"<dynamic-code>"`` (so that payloads do not depend on where code lives), and
    a rank's traceback or stack dump could then not say which file and line failed. Where the
    file is not on disk (a notebook cell, which IPython keeps in ``linecache``), its source
    travels too, so the ranks can still print the line.

    Modules that replace themselves in ``sys.modules`` with an instance of a ``ModuleType``
    subclass (``torch.backends.cudnn`` is a ``CudnnModule``) are imported by name on the other
    side, as plain modules are: cloudpickle refuses them, so a test that reads
    ``torch.backends.cudnn.allow_tf32`` could not be sent to the ranks.

    And a function or class of a file the ranks cannot import by name (a user's file loaded by
    path) is pickled by value wherever the object reaches it: inside a library's closure
    (``fp16_compress_wrapper(my_hook)``), a ``functools.partial``, a decorator's wrapper, an
    object's attribute. Which functions an object reaches is what pickling it finds out, so the
    pickler decides as it meets each one; a list of modules made beforehand from the outermost
    function alone misses every one reached through another module's code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sources: dict[str, tuple[str, ...] | None] = {}
        self._modules_seen: set[str] = set()
        self._registered: list[types.ModuleType] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            return self._reduce_code(obj)
        if isinstance(obj, _CODE_HOLDERS):
            self._ship_by_value(getattr(obj, "__module__", None))
        if (
            isinstance(obj, types.ModuleType)
            and type(obj) is not types.ModuleType
            and sys.modules.get(obj.__name__) is obj
        ):
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)

    def _ship_by_value(self, name: Any) -> None:
        """Register module ``name`` for pickling by value while this pickler runs, when it is
        a file the ranks cannot import by name and is not registered already."""
        if not isinstance(name, str) or name in self._modules_seen:
            return
        self._modules_seen.add(name)
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if (
            module is None
            or name == "__main__"
            or not isinstance(file, str)
            or not file.endswith(".py")
        ):
            # cloudpickle pickles __main__'s by value; an extension's submodules
            # (torch._C._distributed_c10d) are made by their parent, never found on a path.
            return
        if not ranks_cannot_import(module):
            return
        with _registry_lock:
            if name not in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.register_pickle_by_value(module)
                self._registered.append(module)

    def unregister(self) -> None:
        """Undo what :meth:`_ship_by_value` registered (the registry is cloudpickle's, for
        the whole process)."""
        with _registry_lock:
            for module in self._registered:
                cloudpickle.unregister_pickle_by_value(module)
        self._registered.clear()

    def _reduce_code(self, code: types.CodeType) -> Any:
        # cloudpickle's own reduction (it follows each Python's code constructor); the file
        # name is put back after it.
        reduce = self.dispatch_table.get(types.CodeType)
        if reduce is None:  # pragma: no cover - a cloudpickle whose table lacks code objects
            return NotImplemented
        constructor, args = reduce(code)
        filename = code.co_filename
        if filename not in self._sources:
            self._sources[filename] = _source_off_disk(filename)
        return _code_in_file, (constructor, args, filename, self._sources[filename])


def _source_off_disk(filename: str) -> tuple[str, ...] | None:
    """The source lines of a file that is not on disk but in ``linecache`` (a notebook cell,
    code from ``exec`` whose author registered it), else None: a file on disk is read where
    it is needed."""
    if os.path.exists(filename):
        return None
    lines = linecache.getlines(filename)
    return tuple(lines) if lines else None


def _code_in_file(
    constructor: Callable[..., types.CodeType],
    args: tuple[Any, ...],
    filename: str,
    source: tuple[str, ...] | None,
) -> types.CodeType:
    """On the receiving side: the code object, named for its file again."""
    code = constructor(*args)
    if source is not None and filename not in linecache.cache:
        # mtime None: linecache.checkcache() keeps it (there is no file to compare with).
        linecache.cache[filename] = (sum(map(len, source)), None, list(source), filename)
    return code if code.co_filename == filename else code.replace(co_filename=filename)


def load_result(payload: bytes) -> Any:
    return pickle.loads(payload)


def dump_exception(exc: BaseException) -> bytes | None:
    """The exception pickled, or None when it cannot be (its traceback text still travels)."""
    try:
        buffer = io.BytesIO()
        pickler = _ExceptionPickler(buffer, protocol=5)
        try:
            pickler.dump(exc)
        finally:
            pickler.unregister()
        data = buffer.getvalue()
        pickle.loads(data)  # Exceptions with custom __init__ often pickle but fail to load.
    except Exception:
        return None
    return data


class _ExceptionPickler(_Pickler):
    """Pickles exception classes that hide their module by reference to where they live.

    pytest's Skipped and XFailed say ``__module__ = "builtins"``; cloudpickle would rebuild them
    by value as new classes, which pytest would no longer recognise (and whose ``super()`` fails).
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and issubclass(obj, BaseException):
            home = _module_holding(obj)
            if home is not None:
                return _import_attribute, (home, obj.__qualname__)
        return super().reducer_override(obj)


def _module_holding(cls: type) -> str | None:
    """The module that holds ``cls`` when its ``__module__`` does not (None if it does)."""
    declared = sys.modules.get(cls.__module__)
    if declared is not None and getattr(declared, cls.__qualname__, None) is cls:
        return None
    for name, module in list(sys.modules.items()):
        if getattr(module, "__dict__", {}).get(cls.__qualname__) is cls:
            return name
    return None


def _import_attribute(module: str, qualname: str) -> Any:
    return getattr(importlib.import_module(module), qualname)


def load_exception(payload: bytes | None) -> BaseException | None:
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:
        return None


def callable_name(fn: Callable[..., Any]) -> str:
    """A short human name for a callable, looking through ``functools.partial``."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(target, "__qualname__", None) or type(target).__name__


def job_name(fn: Callable[..., Any]) -> str:
    """How reports name a job: ``world.run(test_allreduce)``."""
    return f"world.run({callable_name(fn)})"


# Reentrant: a pickler registers the modules it meets while pickled_by_value may hold it.
_registry_lock = threading.RLock()
_importable: dict[str, bool] = {}


@contextmanager
def pickled_by_value(modules: Sequence[types.ModuleType]) -> Iterator[None]:
    """Within the block, cloudpickle pickles these modules' functions and classes by value."""
    if not modules:
        yield
        return
    with _registry_lock:
        already = set(cloudpickle.list_registry_pickle_by_value())
        added = []
        for module in modules:
            if module.__name__ not in already and module.__name__ in sys.modules:
                cloudpickle.register_pickle_by_value(module)
                added.append(module)
                already.add(module.__name__)
        try:
            yield
        finally:
            for module in added:
                cloudpickle.unregister_pickle_by_value(module)


def modules_ranks_cannot_import(fn: Callable[..., Any]) -> list[types.ModuleType]:
    """``fn``'s module, when the ranks could not import it by name (so it must travel)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__module__", None)
    if not name or name == "__main__" or name not in sys.modules:
        return []  # cloudpickle already pickles these by value.
    module = sys.modules[name]
    return [module] if ranks_cannot_import(module) else []


def ranks_cannot_import(module: types.ModuleType) -> bool:
    """Whether importing ``module`` by its name on a rank would not find this very file
    (remembered per name: the answer costs a search of the import path)."""
    name = module.__name__
    if name not in _importable:
        _importable[name] = _importable_from_sys_path(module)
    return not _importable[name]


def _importable_from_sys_path(module: types.ModuleType) -> bool:
    """Whether importing the module by name from ``sys.path`` finds this very file."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or spec.name != module.__name__:
        return False
    if origin in ("built-in", "frozen"):
        return True
    parts = module.__name__.split(".")
    path: list[str] | None = None
    found = None
    for depth in range(len(parts)):
        found = _find_spec(".".join(parts[: depth + 1]), path)
        if found is None:
            return False
        path = list(found.submodule_search_locations or [])
    return found is not None and found.origin == origin


def _find_spec(name: str, path: list[str] | None) -> importlib.machinery.ModuleSpec | None:
    """What an import of ``name`` would find now, ignoring ``sys.modules``: the meta path's
    finders in order, as the ranks have them (an editable install's finder among them, which
    ``PathFinder`` alone does not see)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, path)
        except Exception:
            continue
        if spec is not None:
            return spec
    return None


def first_unpicklable(named: Mapping[str, Any]) -> tuple[str, Any, Exception] | None:
    """The first ``(name, value, error)`` among ``named`` that cloudpickle refuses, if any."""
    for label, value in named.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            return label, value, exc
    return None


def _locate_unpicklable(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], exc: Exception
) -> str:
    named: dict[str, Any] = {f"the function {callable_name(fn)!r}": fn}
    named.update({f"positional argument {i}": a for i, a in enumerate(args)})
    named.update({f"argument {k!r}": v for k, v in kwargs.items()})
    found = first_unpicklable(named)
    culprit = f"{found[0]} ({type(found[1]).__name__})" if found else "the job"
    return (
        f"{culprit} of {job_name(fn)} cannot be pickled: {type(exc).__name__}: {exc}. "
        "A job and its arguments are sent to every rank process, so they must be picklable; "
        "create objects such as locks, open files or sockets inside the job instead."
    )
