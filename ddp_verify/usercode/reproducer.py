"""A standalone script that reruns one scenario against the user's function and exits
non-zero while the bug is there.

The script starts its own ranks (``torch.multiprocessing``) and a process group of the backend
the check ran on, on its device (no pytest, no warm world): a mistake only nccl shows is
reproduced on nccl. It trains the scenario with the user's code on each rank, trains the
reference in the parent, and prints the comparison.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..engine.scenario import Scenario
from ..world import protocol
from ..world.protocol import modules_ranks_cannot_import, pickled_by_value
from .kinds import Binds, Kind, as_kind, parse_binds

DEFAULT_DIRECTORY = Path(".ddp_verify") / "reproducers"

_TEMPLATE = '''"""Reproducer written by ddp-verify: {kind} plug-in {name}.

    python {filename}

Exit 0 when {name} is equivalent on this scenario, 1 while the bug is there.
Scenario: {description}
"""

import base64
import importlib
import importlib.machinery
import importlib.util
import os
import pickle
import sys

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_verify.usercode.adapters import adapt
from ddp_verify.methods.equivalence import check_equivalent
from ddp_verify.methods import Method
from ddp_verify.engine.scenario import ModelSpec, OptimizerSpec, Recipe, Scenario
from ddp_verify.engine.trace import Trace, stepped_gradients
from ddp_verify.world.backends import BACKEND as BACKENDS, DEVICE as DEVICES
from ddp_verify.world.ports import free_port
from ddp_verify.world.runtime import set_up_device

SCENARIO = {scenario!r}
KIND = {kind!r}
# The process group's backend and where the ranks train, as the check's world had them:
# "cuda" puts rank r on GPU r % (visible GPUs), as the check did.
BACKEND = {backend!r}
DEVICE = {device!r}
RESULT_ON = {result_on!r}
# The reduction of the loss_fn a step function gets, and the wrapper a wrapped step gets.
LOSS_REDUCTION = {loss_reduction!r}
DDP_WRAPPER = {ddp_wrapper!r}
# A loss-agg result divided by the accumulation steps before backward (the Trainer's way).
TRAINER_DIVIDES = {trainer_divides!r}
# Parameters bound by name, and the layout the check called the code in (its logits and
# labels, a list or a tensor).
BIND = {bind!r}
LAYOUT = {layout!r}
# How many times each rank trains the scenario with the same code (its state kept between
# calls): more than once when the check found the code keeps state.
REPEATS = {repeats!r}


def load_function():
{loader}


def load_hook_state():
{state_loader}


def train(rank, port, results):
    torch.set_num_threads(1)
    device_id = set_up_device(DEVICE, allow_tf32=False, index=rank)
    backend = BACKENDS[BACKEND]
    backend.prepare(os.environ)
    dist.init_process_group(
        BACKEND, init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
        world_size=SCENARIO.world_size, **backend.group_options(device_id),
    )
    method = adapt(
        load_function(), KIND, result_on=RESULT_ON, hook_state=load_hook_state(),
        loss_reduction=LOSS_REDUCTION, ddp_wrapper=DDP_WRAPPER, bind=BIND, layout=LAYOUT,
        trainer_divides=TRAINER_DIVIDES,
    )
    for call in range(REPEATS):
        trace = method.train_rank(SCENARIO)
        # Bytes, not tensors: shared-memory tensors die with the rank that made them.
        results.put((rank, call, pickle.dumps(trace)))
    dist.barrier()
    dist.destroy_process_group()


class Recorded(Method):
    """One call's traces, as the spawned ranks recorded them."""

    # A coupled loss is its own reference: the same code on a one-rank process group of
    # this process's own, holding the whole batch (check_equivalent trains it here, as it
    # does a step trained with the user's own loss, optimizer or scheduler).
    whole_batch_reference = KIND == "coupled-loss"
    owns_step = KIND in ("step", "wrapped-step")

    def __init__(self, trace, call):
        self.trace = trace
        repeat = f" (call {{call + 1}} of {{REPEATS}})" if REPEATS > 1 else ""
        self.name = f"{{KIND}} plug-in{{repeat}}"

    def run(self, scenario, world=None):
        return self.trace

    def train_whole(self, scenario, variant=0):
        # The reference of code that is its own (a coupled loss; any code trained with the
        # user's own loss, optimizer or scheduler): here, on one rank of this process.
        return adapt(
            load_function(), KIND, result_on=RESULT_ON, hook_state=load_hook_state(),
            loss_reduction=LOSS_REDUCTION, ddp_wrapper=DDP_WRAPPER, bind=BIND, layout=LAYOUT,
            trainer_divides=TRAINER_DIVIDES,
        ).train_whole(scenario, variant)


class Spawned:
    """The user's code, trained on freshly spawned ranks, REPEATS times each."""

    name = f"{{KIND}} plug-in"

    def run(self, scenario):
        # Below the ephemeral range: no outgoing connection takes it before rank 0 binds it.
        port = free_port()
        # On the CPU the ranks are forked from this process, torch already imported (nothing
        # has run a torch op here yet, so no thread pool is copied): no rank imports torch
        # again. CUDA cannot be forked into: spawned there.
        method = DEVICES[DEVICE].start_method
        if method == "fork":
            # torch's optimizers import torch._dynamo at their first step (seconds of CPU):
            # once here, before the fork, rather than in every rank side by side.
            importlib.import_module("torch._dynamo")
        results = mp.get_context(method).SimpleQueue()
        context = mp.start_processes(
            train, args=(port, results), nprocs=scenario.world_size, join=False,
            start_method=method,
        )
        traces = {{}}
        expected = scenario.world_size * REPEATS

        def receive():
            while not results.empty():
                rank, call, data = results.get()
                traces[rank, call] = pickle.loads(data)

        try:
            # join() raises as soon as a rank fails, so a broken rank never leaves us waiting.
            while len(traces) < expected:
                receive()
                if len(traces) < expected and context.join(timeout=0.2):
                    receive()
                    break
        except (mp.ProcessExitedException, mp.ProcessRaisedException):
            # Every trace arrived before a rank died: gloo can abort a rank as its peers close
            # their connections at exit, after the run is over. That is not the user's bug.
            receive()
            if len(traces) < expected:
                raise
        finally:
            for process in context.processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
        # A step's gradients are those its optimizer stepped on, as the check collects them.
        collect = stepped_gradients if KIND in ("step", "wrapped-step") else list
        return [
            Trace(self.name, collect([traces[r, call] for r in range(scenario.world_size)]))
            for call in range(REPEATS)
        ]


if __name__ == "__main__":
    for call, trace in enumerate(Spawned().run(SCENARIO)):
        outcome = check_equivalent(None, Recorded(trace, call), SCENARIO)
        if not outcome.equivalent:
            break
    print(outcome.report(), flush=True)
    # Ended here, not by tearing down torch's modules one by one (a second or two of CPU):
    # the ranks are gone and the report is out.
    sys.stderr.flush()
    os._exit(0 if outcome.equivalent else 1)
'''


def write_reproducer(
    fn: Callable[..., Any],
    kind: Kind | str,
    scenario: Scenario,
    directory: Path | None = None,
    *,
    device: str = "cpu",
    backend: str = "gloo",
    result_on: str = "all",
    hook_state: Callable[..., Any] | None = None,
    loss_reduction: str = "mean",
    ddp_wrapper: str | None = None,
    bind: Binds = None,
    layout: Mapping[str, str] | None = None,
    repeats: int = 1,
    trainer_divides: bool = False,
) -> Path:
    """Write the script for ``fn`` on ``scenario``, its ranks training on ``device`` in a
    process group of ``backend`` (the check's world's: a mistake one backend shows is
    reproduced on it), called
    as the check called it (``result_on``, ``hook_state``, ``loss_reduction``,
    ``ddp_wrapper``, ``bind``, ``layout``), ``repeats`` times on the same ranks
    (code that keeps state shows it from its second call on); return its path.

    Example::

        path = write_reproducer(average_gradients, "grad-sync", error.scenario)
        # python path  ->  exits 1 while average_gradients is wrong on that scenario
    """
    kind = as_kind(kind).name  # the script names it, and adapt() takes it there
    name = getattr(fn, "__qualname__", type(fn).__name__)
    binds = [bound.text() for bound in parse_binds(bind)]
    called = (
        f"{kind}{name}{scenario!r}{device}{backend}{result_on}{loss_reduction}{ddp_wrapper}{binds}"
        f"{sorted((layout or {}).items())}{repeats}{'divides' if trainer_divides else ''}"
    )
    digest = hashlib.sha1(called.encode()).hexdigest()[:8]
    directory = directory or DEFAULT_DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{_slug(name)}-{digest}.py"
    path.write_text(
        _TEMPLATE.format(
            kind=kind,
            name=name,
            filename=path.name,
            description=scenario.describe().replace("\n", "\n    "),
            scenario=scenario,
            device=device,
            backend=backend,
            result_on=result_on,
            loss_reduction=loss_reduction,
            ddp_wrapper=ddp_wrapper,
            trainer_divides=trainer_divides,
            bind=binds,
            layout=dict(layout or {}),
            repeats=repeats,
            loader=_loader(fn),
            state_loader="    return None" if hook_state is None else _loader(hook_state),
        )
    )
    return path


def _loader(fn: Callable[..., Any]) -> str:
    """The body of load_function(): by module name, by file path, or pickled by value."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    qualname = getattr(fn, "__qualname__", "")
    plain = module is not None and "<" not in qualname and "." not in qualname
    if module is not None and plain and getattr(module, qualname, None) is fn:
        if not modules_ranks_cannot_import(fn):
            root = _import_root(module)
            insert = f"    sys.path.insert(0, {root!r})\n" if root else ""
            return (
                f"{insert}    return getattr(importlib.import_module({module.__name__!r}), "
                f"{qualname!r})"
            )
        path = getattr(module, "__file__", None)
        if path:
            return (
                f"    path = {str(Path(path).resolve())!r}\n"
                "    sys.path.insert(0, os.path.dirname(path))\n"
                "    loader = importlib.machinery.SourceFileLoader('user_code', path)\n"
                "    spec = importlib.util.spec_from_loader('user_code', loader)\n"
                "    module = importlib.util.module_from_spec(spec)\n"
                "    loader.exec_module(module)\n"
                f"    return getattr(module, {qualname!r})"
            )
    # A closure or lambda: it travels inside the script, pickled by value with whatever of
    # its own module it uses (the script may run where that module cannot be imported).
    own = [module] if module is not None and _import_root(module) else []
    with pickled_by_value([*own, *modules_ranks_cannot_import(fn)]):
        # The harness's pickler: the function keeps its file name, so a failure in the script
        # names the user's file and line (cloudpickle 3.1.3 alone would say "<dynamic-code>").
        data = base64.b64encode(protocol.dumps(fn)).decode()
    return f"    return cloudpickle.loads(base64.b64decode({data!r}))"


def _import_root(module: Any) -> str | None:
    """The sys.path entry from which ``module`` was importable (None for installed ones)."""
    file = getattr(module, "__file__", None)
    if not file or "site-packages" in file:
        return None
    path = Path(file).resolve()
    depth = len(module.__name__.split(".")) - (0 if path.name == "__init__.py" else 1)
    return str(path.parents[depth]) if depth < len(path.parents) else None


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:60] or "function"
