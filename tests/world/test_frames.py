"""What a rank's traceback and a stuck rank's stack show: the user's file, line and source,
the harness's frames cut as pytest cuts its own (all of them in the full report), whatever
cloudpickle release ships code to the ranks."""

from __future__ import annotations

import faulthandler
import gc
import importlib.util
import linecache
import re
import sys
import textwrap
import time
import weakref
from pathlib import Path

import cloudpickle
import pytest
import torch.distributed as dist

import ddp_verify
from ddp_verify.world import RankError, World, frames, protocol

PACKAGE = Path(ddp_verify.__file__).resolve().parent


@pytest.fixture(scope="module")
def world2():
    with World(2, timeout=60) as world:
        yield world


def _module_from(path: Path, source: str, name: str):
    """A module loaded from ``path`` under a name the ranks cannot import: it travels by value."""
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_cloudpickle_names_code_it_pickles_by_value_dynamic_since_3_1_3():
    """The behaviour the harness's pickler exists for: cloudpickle 3.1.3 and later rename the
    code of every function it pickles by value to "<dynamic-code>" (older releases kept the
    file). If a release changes it again, this test says so."""
    plain = cloudpickle.loads(cloudpickle.dumps(lambda: None))
    renamed = plain.__code__.co_filename == "<dynamic-code>"
    assert renamed == (_version(cloudpickle.__version__) >= (3, 1, 3)), cloudpickle.__version__


def test_code_shipped_by_value_keeps_its_file_nested_code_too(tmp_path):
    source = tmp_path / "shipped_helpers_abc.py"
    module = _module_from(
        source,
        """
        def outer(x):
            def inner(y):
                return y + 1
            return inner(x) + (lambda z: z)(x)
        """,
        "shipped_helpers_abc",
    )
    try:
        fn, args, _ = protocol.load_job(protocol.dump_job(module.outer, (1,), {}))
    finally:
        del sys.modules["shipped_helpers_abc"]
    assert fn is not module.outer  # it travelled by value
    assert fn(*args) == 3
    nested = [c for c in fn.__code__.co_consts if hasattr(c, "co_filename")]
    assert {c.co_name for c in nested} == {"inner", "<lambda>"}
    assert {fn.__code__.co_filename, *(c.co_filename for c in nested)} == {str(source)}


def test_a_raising_job_names_the_users_file_line_and_source(world2, tmp_path):
    source = tmp_path / "failing_job_abc.py"
    module = _module_from(
        source,
        """
        import torch.distributed as dist

        def check_rank():
            value = dist.get_rank() * 10
            assert value == 0, f"rank {dist.get_rank()} is unhappy"
        """,
        "failing_job_abc",
    )
    try:
        with pytest.raises(RankError) as info:
            world2.run(module.check_rank)
    finally:
        del sys.modules["failing_job_abc"]
    (failure,) = info.value.failures
    assert failure.details == (
        "Traceback (most recent call last):\n"
        f'  File "{source}", line 6, in check_rank\n'
        '    assert value == 0, f"rank {dist.get_rank()} is unhappy"\n'
        "AssertionError: rank 1 is unhappy\n"
    )
    # The full report adds the frame that delivered the job, and only the report in full.
    assert "ddp_verify/world/runtime.py" in failure.full_details
    assert "in run_job" in info.value.report(full_trace=True)
    assert "in run_job" not in str(info.value)


def test_a_notebook_cells_source_travels_with_its_code(world2):
    # IPython compiles a cell under a file name that is not on disk and keeps its source in
    # linecache: the ranks have neither the file nor that cache.
    cell = "/tmp/ipykernel_4242/1234567890.py"
    text = "def cell_job():\n    raise KeyError('only in the notebook')\n"
    linecache.cache[cell] = (len(text), None, text.splitlines(True), cell)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(text, cell, "exec"), namespace)
        with pytest.raises(RankError) as info:
            world2.run(namespace["cell_job"])
    finally:
        del linecache.cache[cell]
    details = info.value.failures[0].details
    assert f'File "{cell}", line 2, in cell_job' in details
    assert "raise KeyError('only in the notebook')" in details


def stuck_on_rank_1():
    if dist.get_rank() == 1:
        time.sleep(60)  # rank 1 is stuck here


def test_a_stuck_ranks_stack_reads_as_a_traceback_cut_to_the_job(world2):
    with pytest.raises(RankError) as info:
        world2.run_job(stuck_on_rank_1, timeout=3.0)
    (failure,) = info.value.failures
    assert failure.details == (
        "where it waits (most recent call last):\n"
        f'  File "{__file__}", line {stuck_on_rank_1.__code__.co_firstlineno + 2}, '
        "in stuck_on_rank_1\n"
        "    time.sleep(60)  # rank 1 is stuck here"
    )
    # In full: how the job got there, and the rank's own threads.
    for harness in ("ddp_verify/world/rank.py", "in run_job", "in watch"):
        assert harness in failure.full_details, failure.full_details


class _Held:
    """Stands for what a collective's frames hold: the process group."""


def _raise_holding(held: _Held) -> None:
    raise RuntimeError("in a collective")


def test_formatting_a_traceback_keeps_nothing_of_its_frames_alive():
    # A rank formats its traceback, then destroys its process group so that the peers
    # waiting on it fail at once: nothing may keep the failed frames (and the group they
    # hold) alive past that, not even until the next garbage collection.
    held = _Held()
    alive = weakref.ref(held)
    gc.disable()
    try:
        try:
            _raise_holding(held)
        except RuntimeError as exc:
            texts = (frames.format_exception(exc), frames.format_exception(exc, full=True))
        del held
        assert alive() is None, "the traceback's frames outlived the exception"
    finally:
        gc.enable()
    assert all("in _raise_holding" in text for text in texts)


def _frame(where: str, name: str = "f", *, hides: bool = False) -> frames.Frame:
    return frames.Frame(where, 1, name, hides)


USER = "/home/me/train.py"
RANK = str(PACKAGE / "world" / "rank.py")
LOOP = str(PACKAGE / "methods" / "loop.py")
PLUGIN = str(PACKAGE / "frontends" / "pytest_plugin.py")
SUITE = str(PACKAGE / "conformance" / "test_ddp_options.py")
TORCH = "/venv/lib/python3.11/site-packages/torch/_tensor.py"
PYTEST = "/venv/lib/python3.11/site-packages/_pytest/python.py"
THREADING = "/usr/lib/python3.11/threading.py"
SCRIPT = "/home/me/run_check.py"


@pytest.mark.parametrize(
    ("stack", "shown"),
    [
        # The check: the job's delivery and the training loop lead to the user's hook, which
        # torch's backward called; torch's frames after the loop stay.
        ([RANK, LOOP, TORCH, USER], [TORCH, USER]),
        # The plugin's test runner leads to the test; a harness frame the user's code called
        # back into stays.
        ([RANK, PLUGIN, USER, LOOP], [USER, LOOP]),
        # A conformance test is the user's code, though it lives in the package.
        ([PYTEST, PLUGIN, SUITE, LOOP], [SUITE, LOOP]),
        # Under a launcher, the user's script called check(): the harness between the script
        # and the user's function goes.
        ([SCRIPT, PLUGIN, PYTEST, RANK, LOOP, USER, TORCH], [SCRIPT, USER, TORCH]),
        # No user frame at all: the harness failed, and its frames are the evidence.
        ([RANK, PLUGIN, LOOP], [PLUGIN, LOOP]),
        # A thread of nothing but its start and the rank's watchdog: nothing to show.
        ([THREADING, RANK], []),
    ],
    ids=["check", "plugin", "conformance", "script", "harness-only", "watchdog"],
)
def test_frames_are_cut_where_the_users_code_starts(stack, shown):
    assert [f.filename for f in frames.user_frames([_frame(s) for s in stack])] == shown


def test_code_from_python_c_is_the_users_though_a_rank_starts_from_python_c_too():
    stack = [_frame("<string>", "<module>"), _frame(RANK), _frame("<string>", "job")]
    assert [(f.filename, f.name) for f in frames.user_frames(stack)] == [("<string>", "job")]


def test_a_frame_that_sets_tracebackhide_hides_itself():
    stack = [_frame(USER, "test"), _frame(USER, "helper", hides=True), _frame(TORCH)]
    assert [f.name for f in frames.user_frames(stack)] == ["test", "f"]


def _dump_here(into) -> None:
    faulthandler.dump_traceback(into, all_threads=False)  # where this test waits


def test_a_faulthandler_dump_reads_as_a_traceback_with_source_lines(tmp_path):
    with open(tmp_path / "dump", "w+") as into:
        _dump_here(into)
        into.seek(0)
        dump = into.read()
    cut = frames.format_dump(dump)
    # pytest's frames led here: they are cut; this test and the helper remain, oldest first.
    first = cut.splitlines()[0]
    assert first.endswith("in test_a_faulthandler_dump_reads_as_a_traceback_with_source_lines")
    assert cut.splitlines()[-2:] == [
        f'  File "{__file__}", line {_dump_here.__code__.co_firstlineno + 1}, in _dump_here',
        "    faulthandler.dump_traceback(into, all_threads=False)  # where this test waits",
    ]
    assert "_pytest" not in cut
    assert "_pytest" in frames.format_dump(dump, full=True)


def test_a_live_stack_is_cut_the_same_way():
    stack = frames.of_stack(sys._getframe())
    assert [f.name for f in frames.user_frames(stack)] == ["test_a_live_stack_is_cut_the_same_way"]
    assert any("_pytest" in f.filename for f in stack)
