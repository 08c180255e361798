"""The recorder: what a training script does at each of its first optimizer steps, recorded in
every rank without an edit to the script, then the run ended cleanly.

Installed before the script runs (at interpreter start by :mod:`.autorecord`, or by
:mod:`.boot`), it records per optimizer step:

- each parameter's gradient as the optimizer sees it (a global optimizer step pre-hook: after
  synchronisation, accumulation and clipping), named as the model names it, wrapper prefixes
  (``module.``, ``_orig_mod.``, ...) removed;
- the parameters after the step (a global step post-hook);
- every loss passed to ``backward``, and whether the gradients had been cleared before it;
- what each backward added to this rank's gradient before any synchronisation (a hook on each
  parameter's gradient, which runs before DDP's reducer sees it): each micro-batch's local
  contribution, for the comparison to weigh;
- a fingerprint of every sample that reached the model's forward (the rows of its input
  tensors, padding left out where an attention mask says what is padding) and, where labels
  carry ``-100``, the tokens that count.

By default the script runs in float64 (the default dtype set before it runs, floating inputs
cast at the model's forward), where a correct layout differs from the reference by rounding
alone. After the last step wanted, the recording is written and every rank leaves together.

Example (what :mod:`.boot` does)::

    Recorder(Path("rec/2x2"), steps=3).install()
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import inspect
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ENV_DIR",
    "ENV_DTYPE",
    "ENV_LAYOUT",
    "ENV_PERTURB",
    "ENV_PIECES",
    "ENV_STEPS",
    "Recorder",
    "normalized",
    "recording_path",
]

# Where a rank writes its recording, how many optimizer steps to record, and in which dtype
# the script runs ("float64", the default, or "native": as the script says).
ENV_DIR = "DDP_VERIFY_RECORD"
ENV_STEPS = "DDP_VERIFY_STEPS"
ENV_DTYPE = "DDP_VERIFY_DTYPE"
# The layout the launch asked for (``dp2.pp2.a2``), recorded with the run.
ENV_LAYOUT = "DDP_VERIFY_LAYOUT"
# A rounding-only variant of the run: every parameter moved by one unit roundoff of its dtype
# (signs drawn from this seed) before the first forward. Where a script forces its own
# precision, how far this lands from the plain run bounds what rounding alone can do.
ENV_PERTURB = "DDP_VERIFY_PERTURB"
# The context-parallel degrees of the layouts a run (the reference) is held against ("2,4"):
# each forward's samples are also fingerprinted as the pieces of their sequences the ranks of
# such a group hold, which is all a context-parallel rank's forward sees of them.
ENV_PIECES = "DDP_VERIFY_PIECES"

# The most gradient elements whose local contributions are kept per backward (a model larger
# than this is compared without them), and in all (later backwards are then not kept: the
# comparison weighs no step it lacks one of).
MAX_SNAPSHOT = 5_000_000
MAX_LOCAL_TOTAL = 25_000_000
# A logged loss: the first number after the word "loss" (not "val_loss") in a write.
LOGGED_LOSS = re.compile(r"\bloss\b\W{0,4}(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
# Draws from torch's global generator noted before the first forward (see _watch_draws):
# torch's functions, and the tensor methods nn.init and samplers fill tensors with.
DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial",
         "rand_like", "randn_like", "randint_like")  # fmt: skip
TENSOR_DRAWS = ("normal_", "uniform_", "random_", "bernoulli_", "exponential_")
MAX_DRAWS = 200
# What wrappers add to parameter names: DDP, torch.compile, Fabric, FSDP, checkpointing.
WRAPPER_PARTS = frozenset(
    {"module", "_orig_mod", "_forward_module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
)


# The collectives noted where a module's forward calls them (see _watch_in_forward).
IN_FORWARD = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
)
# The collectives that send a rank's tensors to other ranks whole (gathers, exchanges): what
# gathers features for a loss that couples samples across ranks. Reductions are left out:
# they add, as a gradient's synchronisation and a logged loss's mean do.
EXCHANGES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "batch_isend_irecv",
    "isend",
    "send",
)

# Frameworks whose documented data or loss handling the report names.
FRAMEWORKS = frozenset({"lightning", "pytorch_lightning", "accelerate", "transformers", "trl"})


def normalized(name: str) -> str:
    """A parameter's name without the parts wrappers add.

    Example::

        >>> normalized("module._orig_mod.layers.0.weight")
        'layers.0.weight'
    """
    parts = [p for p in name.split(".") if p not in WRAPPER_PARTS]
    return ".".join(parts) or name


def recording_path(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its recording in ``directory``."""
    return directory / f"rank{rank}.pt"


class Recorder:
    """One rank's recorder (see the module text): :meth:`install` it before the script runs.

    ``directory``: where the recording goes; ``steps``: how many optimizer steps to record
    before the run ends; ``float64``: run the script in float64.
    """

    def __init__(
        self,
        directory: Path,
        steps: int,
        *,
        float64: bool = True,
        perturb: int | None = None,
        perturb_dtype: str | None = None,
    ) -> None:
        self.directory, self.wanted, self.float64 = directory, steps, float64
        self.perturb, self.perturb_dtype = perturb, perturb_dtype
        # What the launcher says; the process group, once the script has one, says better
        # (srun's ranks, a script that initialises its own group).
        self.rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
        self.world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
        self.steps: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}
        self.params: dict[str, torch.nn.Parameter] = {}
        self.meta: dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            # The node it ran on, as torchrun numbers them (its GROUP_RANK).
            "node": int(os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0"))),
            "float64": float64,
            "autocast": None,
            "param_dtypes": [],
            # Where a float64 run computes in a lower precision inside (see _Lower).
            "lower_inside": None,
            # Where the script sent tensors that carry gradient to other ranks (see
            # _watch_exchanges): "all_gather at train.py:42".
            "exchanged": [],
            # Draws from torch's global generator before the model's first forward, each
            # with its site and a digest of the generator's state before it (see
            # _watch_draws); where a run of the reference is not the same twice, the first
            # draw whose state differed names an unseeded source.
            "draws": [],
            # At the first forward: dropout modules in training mode (name, p), and digests
            # of torch's, Python's and NumPy's global generators.
            "dropout": [],
            "generators": {},
            # The same digests as the recorder was installed: a generator whose state did
            # not move before the first forward was not drawn from.
            "generators_at_start": _generator_digests(),
            # The layout the launch asked for, where it said ("dp2.pp2.a2").
            "layout": os.environ.get(ENV_LAYOUT) or None,
            # This rank's pipeline stages, as torch.distributed.pipelining made them:
            # [stage_index, num_stages] each (empty: not pipelined).
            "stages": [],
            # At the first training forward, each module's output as it returned (inner
            # modules first): [name, shape, sum, norm] (see _output_summary).
            "outputs": [],
            # Collectives the script's own code calls inside a module's forward, in that
            # first forward: [module, "all_reduce at train.py:42"] (see _watch_in_forward).
            "forward_collectives": [],
        }
        self._known_modules: set[int] = set()
        # Whether a forward with autograd on (one that trains) has run.
        self._trained = False
        self._local: dict[str, torch.Tensor] = {}
        self._keep_local = True
        self._kept = 0  # local gradient elements kept so far
        self._depth = 0
        # Parameters per module, and the outermost model's count this forward: a module
        # inside it that holds all of them is the model itself (under a wrapper).
        self._sizes: dict[int, int] = {}
        # Names first given by a wrapper's view, and the model's own (see _inner_forward).
        self._renamed: dict[str, str] = {}
        self._outer = 0
        self._in_backward = False
        self._finished = False
        self._watch: _Lower | None = None
        # Inside a closure's re-evaluation (LBFGS): the step's samples again, not recorded.
        self._again = False
        # Inside a call that is not training (a pipeline stage's shape inference).
        self._aside_depth = 0
        # Each pipeline stage's module on this rank, by id: its stage index; and the stage
        # whose backward runs now (None outside a stage's backward).
        self._stage_of: dict[int, int] = {}
        self._backward_stage: int | None = None
        # Which of the step's micro-batches a pipeline schedule computes the loss of now.
        self._loss_of: int | None = None
        self._in_loss = False
        self._in_draw = False
        self._pieces = [int(d) for d in os.environ.get(ENV_PIECES, "").split(",") if d.strip()]
        # The model's modules by id, named, while the first training forward runs (then None),
        # and the names of those running now, outermost first.
        self._module_names: dict[int, str] | None = None
        self._running: list[str] = []
        self._step = self._fresh()

    @classmethod
    def from_env(cls) -> Recorder | None:
        """The recorder the environment asks for (``DDP_VERIFY_RECORD``), or None."""
        directory = os.environ.get(ENV_DIR)
        if not directory:
            return None
        steps = int(os.environ.get(ENV_STEPS, "3"))
        dtype = os.environ.get(ENV_DTYPE, "float64")
        # "SEED" or "SEED:DTYPE" (the unit roundoff to move by, where not the parameters').
        seed, _, unit = (os.environ.get(ENV_PERTURB) or "").partition(":")
        return cls(
            Path(directory),
            steps,
            float64=dtype == "float64",
            perturb=int(seed) if seed else None,
            perturb_dtype=unit or None,
        )

    @staticmethod
    def _fresh() -> dict[str, Any]:
        return {
            "losses": [],
            "batches": [],
            "tokens": [],
            # Per split ("2": in order, "2z": load-balanced), per forward, the fingerprints of
            # its samples' pieces (see ENV_PIECES and pieces()).
            "pieces": {},
            "cleared": [],
            "local": [],
            # Per entry of "local", the pipeline stage whose backward it was (None: no stage).
            "local_stages": [],
            "drawn": {},
            # What a pipeline schedule divided this rank's gradients by after the step's
            # backwards (its scale_grads: the micro-batches); 1 where nothing did.
            "grad_scale": 1,
        }

    # -- installing --------------------------------------------------------------------------

    def install(self) -> Recorder:
        """Hook into torch: the model's forward, backward, every optimizer's step."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        if self.float64:
            torch.set_default_dtype(torch.float64)
        module_call = torch.nn.Module.__call__
        recorder = self

        def call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # A module run by the autograd engine is activation checkpointing recomputing a
            # forward inside backward: the same samples again, not a micro-batch.
            forward = module.training and torch.is_grad_enabled() and not _in_autograd()
            # A pipeline stage's shape inference trains nothing (see _watch_stages).
            forward = forward and not recorder._aside_depth
            if recorder._depth == 0 and forward:
                args, kwargs = recorder._at_forward(module, args, kwargs)
            elif recorder._depth and forward:
                if not recorder.float64 and not recorder.steps and not recorder.meta["autocast"]:
                    # Autocast entered inside the model's forward (accelerate's mixed
                    # precision wraps the forward in it): seen by the modules it runs. (In
                    # float64 it casts nothing: autocast leaves float64 tensors alone.)
                    recorder.meta["autocast"] = _autocast()
                recorder._inner_forward(module, args, kwargs)
            recorder._depth += 1
            named = recorder._module_names
            name = named.get(id(module)) if named is not None else None
            if name is not None:
                recorder._running.append(name)
            try:
                result = module_call(module, *args, **kwargs)
                if name is not None:
                    with contextlib.suppress(Exception):  # recording never breaks the script
                        summary = _output_summary(result)
                        if summary is not None:
                            recorder.meta["outputs"].append([name, *summary])
                return result
            finally:
                recorder._depth -= 1
                if name is not None:
                    recorder._running.pop()
                if recorder._depth == 0 and recorder._module_names is not None and forward:
                    recorder._module_names = None  # the first forward is over

        torch.nn.Module.__call__ = call
        tensor_backward = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if recorder._in_backward or recorder._aside_depth:
                # Called again from inside itself: a torch function mode (the recorder's own
                # precision watch, or the script's) hands Tensor.backward back to it.
                return tensor_backward(tensor, *args, **kwargs)
            recorder._at_backward(tensor)
            recorder._in_backward = True
            try:
                return tensor_backward(tensor, *args, **kwargs)
            finally:
                recorder._in_backward = False
                recorder._after_backward()

        torch.Tensor.backward = backward
        autograd_backward = torch.autograd.backward

        def autograd(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder._in_backward or recorder._aside_depth:
                return autograd_backward(tensors, *args, **kwargs)
            for tensor in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                recorder._at_backward(tensor)
            # As Tensor.backward: a torch function mode hands the call back to this wrapper.
            recorder._in_backward = True
            try:
                return autograd_backward(tensors, *args, **kwargs)
            finally:
                recorder._in_backward = False
                recorder._after_backward()

        torch.autograd.backward = autograd
        # The tokens that count, where the loss is computed: a script that keeps its labels
        # from the model hands them to the loss function.
        for name in ("cross_entropy", "nll_loss"):
            setattr(torch.nn.functional, name, self._counting(getattr(torch.nn.functional, name)))
        self._watch_exchanges()
        self._watch_in_forward()
        self._watch_draws()
        # torch.distributed.pipelining costs seconds to import: watched once the script does.
        _after_import("torch.distributed.pipelining.stage", self._watch_stages)
        _after_import("torch.distributed.pipelining.schedules", self._watch_schedules)
        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)
        # What the script logs, read as it goes by.
        sys.stdout, sys.stderr = _Tee(sys.stdout, self._logged), _Tee(sys.stderr, self._logged)
        # A script that ends before the steps wanted leaves what it did.
        atexit.register(self.write)
        return self

    def _watch_exchanges(self) -> None:
        """Note each collective that sends another rank a tensor computed from the model (one
        with a gradient history: features gathered for in-batch negatives, by
        ``all_gather`` or through ``torch.distributed.nn``, a neighbour exchange). Such a
        loss couples samples across ranks, and accumulation then changes what it computes.
        Parameters (leaves: FSDP's shards, DDP's broadcasts) and detached values are not
        features, and not noted."""
        recorder = self

        def note(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if any(_carries_gradient(t) for t in _sent(args, kwargs)):
                said = f"{name} at {_caller()}"
                if said not in recorder.meta["exchanged"]:
                    recorder.meta["exchanged"].append(said)

        _watch_collectives(EXCHANGES, note)

    def _watch_in_forward(self) -> None:
        """Note each collective called inside a module's forward during the first training
        forward, with the innermost module running: a reduction the script writes by hand
        in a forward (on top of a tensor-parallel plan's own, which DTensor makes without
        these functions)."""
        recorder = self

        def note(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if recorder._module_names is not None and recorder._running:
                said = [recorder._running[-1], f"{name} at {_caller()}"]
                if said not in recorder.meta["forward_collectives"]:
                    recorder.meta["forward_collectives"].append(said)

        _watch_collectives(IN_FORWARD, note)

    def _watch_stages(self, module: types.ModuleType) -> None:
        """Note each pipeline stage this rank builds (its index of how many: which of its
        forwards see the data, which compute the loss) and what the schedule divides the
        stage's gradients by after each step's backwards (``scale_grads``)."""
        base = getattr(module, "_PipelineStageBase", None)
        if base is None:
            return
        recorder = self
        init, scale = base.__init__, base.scale_grads

        @functools.wraps(init)
        def made(stage: Any, *args: Any, **kwargs: Any) -> None:
            init(stage, *args, **kwargs)
            where = [int(stage.stage_index), int(stage.num_stages)]
            if where not in recorder.meta["stages"]:
                recorder.meta["stages"].append(where)
            recorder._stage_of[id(stage.submod)] = int(stage.stage_index)

        @functools.wraps(scale)
        def scaled(stage: Any, grad_scale_factor: int) -> None:
            scale(stage, grad_scale_factor)
            recorder._step["grad_scale"] = grad_scale_factor

        base.__init__, base.scale_grads = made, scaled
        # Which stage each backward is (a rank of an interleaved schedule runs several): the
        # loss's micro-batches are read from the last stage's.
        for name in ("backward_one_chunk", "backward_weight_one_chunk"):
            method = vars(base).get(name)
            if callable(method):
                setattr(base, name, self._in_stage_backward(method))
        # A stage infers its shapes by a forward (and a backward) of its own before the first
        # step: neither trains, and neither is recorded.
        for cls in vars(module).values():
            if not (isinstance(cls, type) and issubclass(cls, base)):
                continue
            for name in ("_forward_metadata_inference", "_backward_metadata_inference"):
                method = vars(cls).get(name)
                if callable(method):
                    setattr(cls, name, self._aside(method))

    def _watch_schedules(self, module: types.ModuleType) -> None:
        """Note which micro-batch of the step each loss a pipeline schedule computes is (the
        schedule computes them in the micro-batches' order)."""
        base = getattr(module, "_PipelineSchedule", None)
        compute = vars(base).get("_compute_loss") if base is not None else None
        if not callable(compute):
            return
        recorder = self

        @functools.wraps(compute)
        def computed(schedule: Any, *args: Any, **kwargs: Any) -> Any:
            index = recorder._step.get("pipeline_losses", 0)
            recorder._step["pipeline_losses"] = index + 1
            recorder._loss_of = index
            try:
                return compute(schedule, *args, **kwargs)
            finally:
                recorder._loss_of = None

        base._compute_loss = computed  # type: ignore[union-attr]

    def _in_stage_backward(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` (a stage's backward) noting its stage while it runs."""
        recorder = self

        @functools.wraps(method)
        def backward(stage: Any, *args: Any, **kwargs: Any) -> Any:
            before, recorder._backward_stage = recorder._backward_stage, int(stage.stage_index)
            try:
                return method(stage, *args, **kwargs)
            finally:
                recorder._backward_stage = before

        return backward

    def _aside(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` with the recorder looking away while it runs."""
        recorder = self

        @functools.wraps(method)
        def unrecorded(*args: Any, **kwargs: Any) -> Any:
            recorder._aside_depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                recorder._aside_depth -= 1

        return unrecorded

    def _watch_draws(self) -> None:
        """Note each draw from torch's global generator made before the model's first
        forward (the data, the initial weights, a shuffle): its site in the script and a
        digest of the generator's state before it. Two runs of one layout draw alike where
        the generator was seeded; the first draw whose state differs is where it was not.
        Only the first :data:`MAX_DRAWS` are noted, and none once training has begun."""
        recorder = self

        def watched(name: str, draw: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(draw)
            def noted(*args: Any, **kwargs: Any) -> Any:
                if kwargs.get("generator") is not None or recorder._in_draw:
                    return draw(*args, **kwargs)
                draws = recorder.meta["draws"]
                site = _caller(outer=True)
                if not recorder._known_modules and len(draws) < MAX_DRAWS:
                    draws.append((f"{name} at {site.partition(' in ')[0]}", _generator_digest()))
                recorder._in_draw = True
                try:
                    drawn = draw(*args, **kwargs)
                finally:
                    recorder._in_draw = False
                # What this step drew from the global generator, by site: where it differs
                # between layouts, so does everything drawn after it.
                tally = recorder._step["drawn"]
                if f"{name} at {site}" in tally or len(tally) < MAX_DRAWS:
                    count = drawn.numel() if isinstance(drawn, torch.Tensor) else 1
                    key = f"{name} at {site}"
                    tally[key] = tally.get(key, 0) + count
                return drawn

            return noted

        for name in DRAWS:
            draw = getattr(torch, name, None)
            if draw is not None:
                setattr(torch, name, watched(f"torch.{name}", draw))
        for name in TENSOR_DRAWS:
            draw = getattr(torch.Tensor, name, None)
            if draw is not None:
                setattr(torch.Tensor, name, watched(f"Tensor.{name}", draw))

    # -- what the hooks record ---------------------------------------------------------------

    def _at_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        first = next(module.parameters(), None)
        if first is None:
            return args, kwargs  # a loss module, not the model
        if self._again:
            return self._cast(first, args, kwargs)
        if id(module) not in self._known_modules:
            if not self._known_modules:
                self.meta["generators"] = _generator_digests()
                self.meta["start"] = _weights_digest(module)
                if torch.is_grad_enabled() and not self._stage_of:
                    # Where a layout's forward first departs from the reference's, by module.
                    self._module_names = {
                        id(m): normalized(n) or "(the model)" for n, m in module.named_modules()
                    }
            if self.perturb is not None and not self._known_modules:
                _perturbed(module, self.perturb, self.perturb_dtype)
            self._known_modules.add(id(module))
            for name, p in module.named_parameters():
                self.names.setdefault(id(p), normalized(name))
                if normalized(name) not in self.params and p.requires_grad:
                    p.register_hook(functools.partial(self._local_grad, normalized(name)))
                self.params.setdefault(normalized(name), p)
            self._keep_local = (
                sum(p.numel() for p in self.params.values()) <= MAX_SNAPSHOT
                and self._kept <= MAX_LOCAL_TOTAL
                # A DTensor's gradient is a shard or a slice: no rank holds its contribution.
                and not any(_distributed(p) for p in self.params.values())
            )
        autocast = _autocast()
        if autocast is not None:
            self.meta["autocast"] = autocast
        if (
            self.float64
            and first.dtype == torch.float64
            and autocast is None
            and not self.steps
            and self._watch is None
        ):
            # The first step's computation, watched for a lower precision inside.
            self._watch = _Lower(self.meta)
            self._watch.__enter__()
        if self._stage_of and self._stage_of.get(id(module)) != min(self._stage_of.values()):
            # A later stage of the rank's loop (an interleaved schedule's): the same
            # micro-batches again, as the activations of the stages before it.
            self._outer = 0  # nothing inside it names a micro-batch's samples either
            return self._cast(first, args, kwargs)
        if torch.is_grad_enabled():
            # A forward without autograd (an evaluation under no_grad) trains nothing: its
            # samples are not the step's, its modes (eval()) not training's.
            if not self._trained:
                self._trained = True
                self.meta["dropout"] = _dropout(module)
            rows, tokens = fingerprints(args, kwargs)
            self._step["batches"].append(rows)
            self._step["tokens"].append(tokens)
            for split, cut in self._cut(args, kwargs).items():
                self._step["pieces"].setdefault(split, []).append(cut)
        # A pipeline stage's module is the model's part itself, whatever it holds (one layer,
        # held whole by the block inside it): no wrapper, whose inner names would be taken.
        self._outer = 0 if id(module) in self._stage_of else self._size(module)
        return self._cast(first, args, kwargs)

    def _cast(
        self, first: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The model's floating inputs in float64, where the run is (its parameters are)."""
        if self.float64 and first.dtype == torch.float64:
            args = tuple(_to_float64(a) for a in args)
            kwargs = {k: _to_float64(v) for k, v in kwargs.items()}
        return args, kwargs

    def _size(self, module: torch.nn.Module) -> int:
        if id(module) not in self._sizes:
            self._sizes[id(module)] = sum(p.numel() for p in module.parameters())
        return self._sizes[id(module)]

    def _inner_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """A module inside the outermost one that holds all its parameters is the model
        under a wrapper (DDP, a framework's): its inputs are the samples, as the model is
        called without the wrapper (Lightning's wrapper gets ``(batch, batch_idx)``, the
        model only the inputs). The innermost such call names the micro-batch's samples."""
        if self._again or not self._outer or not self._step["batches"]:
            return
        if self._size(module) != self._outer:
            return
        if id(module) not in self._known_modules:
            # The model's own names, as one process calls it without the wrapper.
            self._known_modules.add(id(module))
            for name, p in module.named_parameters():
                old = self.names.get(id(p))
                new = normalized(name)
                if old is None or old == new:
                    continue
                self.names[id(p)] = new
                self._renamed[old] = new
                if old in self.params:
                    self.params[new] = self.params.pop(old)
        rows, tokens = fingerprints(args, kwargs)
        if rows:
            self._step["batches"][-1] = rows
            for split, cut in self._cut(args, kwargs).items():
                if self._step["pieces"].get(split):
                    self._step["pieces"][split][-1] = cut
        if tokens:
            self._step["tokens"][-1] = tokens

    def _cut(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[str]]:
        """The forward's samples as the pieces each context-parallel degree asked for cuts
        them into, in order and load-balanced, where their sequences cut evenly."""
        found = {}
        for degree in self._pieces:
            for balanced in (False, True):
                with contextlib.suppress(Exception):  # recording never breaks the script
                    cut = pieces(args, kwargs, degree, balanced=balanced)
                    if cut is not None:
                        found[f"{degree}{'z' if balanced else ''}"] = cut
        return found

    def _counting(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``loss_fn`` (a class-index loss) that first records the targets that count."""
        signature = inspect.signature(loss_fn)
        recorder = self

        @functools.wraps(loss_fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if recorder._in_loss:
                # Called again from inside itself: a torch function mode hands the loss
                # function back by its name in torch.nn.functional, which is this wrapper.
                return loss_fn(*args, **kwargs)
            with contextlib.suppress(Exception):  # recording never breaks the script
                bound = signature.bind_partial(*args, **kwargs).arguments
                recorder._at_loss(bound.get("target"), bound.get("ignore_index", -100))
            recorder._in_loss = True
            try:
                return loss_fn(*args, **kwargs)
            finally:
                recorder._in_loss = False

        return counted

    def _at_loss(self, target: Any, ignore_index: int) -> None:
        """Tokens a loss counted, for the micro-batch of the last forward when that forward
        showed none (its labels never reached the model)."""
        batches = self._step["tokens"]
        if self._again or self._depth or not batches or not isinstance(target, torch.Tensor):
            return
        if target.is_floating_point() or target.dim() == 0:
            return  # soft targets, or one class: no token to count
        index = len(batches) - 1
        if self._loss_of is not None and self._loss_of < len(batches):
            # A schedule's loss is its micro-batches' in turn, whatever forwards ran between
            # (an interleaved schedule forwards several micro-batches before their losses).
            index = self._loss_of
        filled = self._step.setdefault("tokens_from_loss", [])
        if batches[index] and index not in filled:
            return  # the model saw the labels: counted there
        counts = target != ignore_index
        # Per sample where the targets keep their rows ([batch, seq]), as a forward's labels
        # are counted: a sequence-level mean counts the sequences with a token that counts.
        per_sample = (
            [int(row.sum()) for row in counts] if counts.dim() >= 2 else [int(counts.sum())]
        )
        earlier = batches[index] if index in filled else []
        if not earlier:
            batches[index] = per_sample
        elif len(earlier) == len(per_sample):
            batches[index] = [a + b for a, b in zip(earlier, per_sample, strict=True)]
        else:  # a loss in pieces of other shapes: their total
            batches[index] = [sum(earlier) + sum(per_sample)]
        if index not in filled:
            filled.append(index)

    def _at_backward(self, tensor: torch.Tensor) -> None:
        if self._again:
            return
        if tensor.numel() == 1:
            self._step["losses"].append(float(tensor.detach().double().cpu()))
        # Cleared before a backward that is not the step's first: zero_grad() inside the
        # accumulation loop (said only where some gradient had been there).
        if self._step["losses"][:-1] and self.params:
            cleared = all(p.grad is None or not bool(p.grad.any()) for p in self.params.values())
            self._step["cleared"].append(cleared)

    def _logged(self, text: str) -> None:
        """A logged loss belongs to the step just taken (a script logs after stepping)."""
        if not self.steps or self._finished or "loss" not in text:
            return
        found = LOGGED_LOSS.search(text)
        if found:
            self.steps[-1].setdefault("logged", []).append(found.group(1))

    def _local_grad(self, name: str, grad: torch.Tensor) -> None:
        """A parameter's gradient from this backward, before DDP (or anything) reduces it."""
        if self._finished or not self._keep_local or self._again:
            return
        name = self._renamed.get(name, name)
        # A copy: the tensor given is the one DDP then averages in place.
        local = grad.detach().to("cpu", torch.float64, copy=True)
        # Reentrant checkpointing can deliver a parameter's gradient in parts.
        self._local[name] = self._local[name] + local if name in self._local else local

    def _after_backward(self) -> None:
        """What this backward added to each gradient, as one flat vector in the order of
        ``meta["local_names"]`` (zeros where a parameter got none)."""
        if not self._local:
            return
        names = self.meta.setdefault("local_names", list(self.params))
        flat = [
            self._local[n].reshape(-1)
            if n in self._local
            else torch.zeros(self.params[n].numel(), dtype=torch.float64)
            for n in names
        ]
        self._local = {}
        self._kept += sum(t.numel() for t in flat)
        if self._kept > MAX_LOCAL_TOTAL:
            self._keep_local = False
            return
        self._step["local"].append(torch.cat(flat))
        self._step["local_stages"].append(self._backward_stage)

    def _before_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Before a step: the gradients it will apply. A step given a closure (Lightning's
        Trainer, LBFGS) computes them inside it: they are read once the closure has run."""
        # The hook sees step's own arguments: the optimizer first, then the closure.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._gradients(optimizer)
            return None
        ran = False

        def read_after(*a: Any, **k: Any) -> Any:
            nonlocal ran
            if ran:
                # LBFGS calls it again to re-evaluate at other parameters: the first call is
                # the step's; the others train the same samples, and are not recorded.
                self._again = True
                try:
                    return closure(*a, **k)
                finally:
                    self._again = False
            result = closure(*a, **k)
            ran = True
            self._gradients(optimizer)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": read_after}
        return (args[0], read_after, *args[2:]), kwargs

    def _gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self._where()
        # The settings this step applies them with (lr, momentum, ...), group by group.
        self._step["settings"] = [_settings(group) for group in optimizer.param_groups]
        grads: dict[str, torch.Tensor | None] = {}
        for name, p in self._optimized(optimizer):
            grads[name] = None if p.grad is None else _whole(p.grad).to("cpu", copy=True)
            if not self.steps and str(p.dtype) not in self.meta["param_dtypes"]:
                self.meta["param_dtypes"].append(str(p.dtype))
        self._step["grads"] = grads

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if "grads" not in self._step:
            self._gradients(optimizer)  # a closure the optimizer never called
        self._step["params"] = {
            name: _whole(p).to("cpu", copy=True) for name, p in self._optimized(optimizer)
        }
        self.steps.append(self._step)
        self._step = self._fresh()
        self._unwatch()
        if len(self.steps) >= self.wanted:
            self.finish()

    def _unwatch(self) -> None:
        watch = self._watch
        if watch is None or not watch.active:
            return
        watch.active = False
        # Left on the stack, inert, where the script pushed a mode of its own above it.
        if torch.overrides._get_current_function_mode() is watch:
            watch.__exit__(None, None, None)

    def _optimized(self, optimizer: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
        index = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                yield self.names.get(id(p), f"param{index}"), p
                index += 1

    # -- ending ------------------------------------------------------------------------------

    def _where(self) -> None:
        """This rank's place in the world, from the script's process group where it has one."""
        import torch.distributed as dist

        # The size of the process group the script formed (None: it formed none).
        self.meta["group_size"] = None
        with contextlib.suppress(Exception):
            if dist.is_available() and dist.is_initialized():
                self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
                self.meta.update(rank=self.rank, world_size=self.world_size)
                self.meta["group_size"] = self.world_size

    def write(self) -> None:
        """Write this rank's recording (once), atomically; nothing from a process that never
        trained (torchrun's agent, a data-loading worker)."""
        if self._finished:
            return
        self._finished = True
        self._unwatch()
        if not self.steps and not self._known_modules:
            return
        self._where()
        # The frameworks the script trained with, for the words of their documented ways.
        self.meta["frameworks"] = sorted(FRAMEWORKS.intersection(sys.modules))
        self.directory.mkdir(parents=True, exist_ok=True)
        path = recording_path(self.directory, self.rank)
        partial = path.with_suffix(".partial")
        torch.save({"meta": self.meta, "steps": self.steps}, partial)
        partial.replace(path)

    def finish(self) -> None:
        """The steps wanted are recorded: write, and end the run on every rank together (the
        ranks reach this at the same step; no rank is left in a collective)."""
        self.write()
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            if dist.is_available() and dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def fingerprints(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[str], list[int]]:
    """One fingerprint per sample of a forward's inputs, and per sample the tokens that
    count, from ``labels`` or an integer input that carries ``-100`` (empty otherwise).

    A fingerprint is ``key=forms`` for each input tensor, space-separated. Where an
    ``attention_mask`` says which positions are real, a row is its real positions (one form).
    Otherwise a row of a sequence has three forms: all of it, its last position, and all but
    its trailing run of that last position. Padding appends copies of one pad value, so the
    row with its trailing run of the pad value stripped is the same whatever the padding
    width: which value pads is chosen when layouts are compared
    (:meth:`~ddp_verify.parity.recording.Recording.samples`), where the evidence is.

    Example::

        >>> rows, tokens = fingerprints((torch.tensor([[1.0], [2.0]]),), {})
        >>> len(rows), tokens
        (2, [])
        >>> a, _ = fingerprints((torch.tensor([[5, 3, 0, 0]]),), {})
        >>> b, _ = fingerprints((torch.tensor([[5, 3]]),), {})
        >>> a[0].split("/")[2] == b[0].split("=")[1].split("/")[0]  # stripped, as unpadded
        True
    """
    # Tensors inside lists, tuples and dicts too: a framework hands its wrapped model the
    # whole batch (Lightning's DDP wrapper gets ``(batch, batch_idx)``).
    tensors = [t for i, a in enumerate(args) for t in _tensors(str(i), a)]
    tensors += sorted(t for k, v in kwargs.items() for t in _tensors(k, v))
    tensors = [(k, t) for k, t in tensors if t.dim() >= 1]
    if not tensors:
        return [], []
    # The batch is what the inputs along a sequence are laid out by (a 1-d tensor beside them
    # is flash-attention's cu_seq_lens, say, sorted first by its name): else the first's.
    along = [t for _, t in tensors if t.dim() >= 2]
    batch = (along or [tensors[0][1]])[0].shape[0]
    # A flattened batch says so (flash-attention's cu_seq_lens, a sequence index), also where
    # it holds one sequence and nothing restarts.
    flattened = any(_is_varlen(k) for k, _ in tensors)
    tensors = [(k, t.detach().cpu()) for k, t in tensors if t.shape[0] == batch]
    packed = _packed_samples(tensors, batch, flattened)
    if packed is not None:
        return packed
    mask = next((t for k, t in tensors if k.split(".")[-1] == "attention_mask"), None)
    mask = mask.detach().cpu() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    columns = []
    for key, t in tensors:
        t = t.contiguous()
        if mask is not None and t.dim() >= 2 and t.shape[1] == mask.shape[1]:
            columns.append([f"{key}={_digest(t[i][mask[i].bool()])}" for i in range(batch)])
        else:
            columns.append([f"{key}={form}" for form in _forms(t)])
    rows = [" ".join(parts) for parts in zip(*columns, strict=True)]
    tokens: list[int] = []
    for key, t in tensors:
        # The labels (by name), or any integer input that marks positions with -100.
        named = key.split(".")[-1] == "labels"
        if not t.is_floating_point() and t.dim() >= 2 and (named or bool((t == -100).any())):
            tokens = [int((t[i] != -100).sum()) for i in range(batch)]
            break
    return rows, tokens


def pieces(
    args: tuple[Any, ...], kwargs: dict[str, Any], degree: int, *, balanced: bool = False
) -> list[str] | None:
    """The fingerprints of a forward's samples as the ranks of a context-parallel group of
    ``degree`` hold them: every input along the sequence (the length of the first input of
    two dimensions or more, in its second) cut into ``degree`` pieces, in order or
    ``balanced`` (``2 x degree`` chunks, piece ``i`` the ``i``-th and the ``i``-th from the
    end, as load-balanced context parallelism gives each rank early and late positions
    alike); one row per sample and piece, piece by piece. None where the sequence does not
    cut evenly.

    Example::

        >>> ids = torch.arange(8).reshape(2, 4)
        >>> cut = pieces((ids,), {}, 2)
        >>> cut[2:] == fingerprints((ids[:, 2:],), {})[0]  # the second piece of each row
        True
        >>> pieces((ids,), {}, 3) is None
        True
    """
    along = [t for _, t in [*_tensors("", args), *_tensors("", kwargs)] if t.dim() >= 2]
    if not along:
        return None
    batch, length = along[0].shape[0], along[0].shape[1]
    chunks = 2 * degree if balanced else degree
    if length % chunks or length < chunks:
        return None

    def piece(value: Any, index: int, depth: int = 0) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() < 2 or value.shape[0] != batch or value.shape[1] != length:
                return value
            parts = value.chunk(chunks, dim=1)
            if not balanced:
                return parts[index]
            return torch.cat([parts[index], parts[chunks - 1 - index]], dim=1)
        if depth >= 3:
            return value
        if isinstance(value, (list, tuple)):
            return [piece(v, index, depth + 1) for v in value]  # a list fingerprints alike
        if isinstance(value, dict):
            return {k: piece(v, index, depth + 1) for k, v in value.items()}
        return value

    rows: list[str] = []
    for index in range(degree):
        cut_args = tuple(piece(a, index) for a in args)
        cut_kwargs = {k: piece(v, index) for k, v in kwargs.items()}
        rows += fingerprints(cut_args, cut_kwargs)[0]
    return rows


# What tells a packed row's sequences apart, and is never part of one (a sequence's index in
# its row differs from layout to layout).
_BOUNDARY_KEYS = ("position_ids", "seq_idx", "segment_ids")


def _is_varlen(key: str) -> bool:
    name = key.split(".")[-1]
    return name.startswith("cu_seq_lens") or name == "seq_idx"


def _packed_samples(
    tensors: list[tuple[str, torch.Tensor]], batch: int, flattened: bool = False
) -> tuple[list[str], list[int]] | None:
    """Where the forward gets ``position_ids`` that restart inside a row (packed sequences,
    padding-free: TRL's ``padding_free=True``, ``packing=True``, ``DataCollatorWithFlattening``),
    one fingerprint per packed sequence, each of its tensors' positions between two restarts,
    the boundaries left out, and its tokens that count; None where nothing is packed (unless
    the batch is ``flattened``, a flash-attention varlen batch of one sequence).

    Example::

        >>> ids = torch.tensor([[5, 6, 7, 5, 6]])
        >>> rows, tokens = _packed_samples(
        ...     [("input_ids", ids), ("position_ids", torch.tensor([[0, 1, 2, 0, 1]]))], 1
        ... )
        >>> len(rows), rows[0] == fingerprints((torch.tensor([[5, 6, 7]]),), {})[0][0]
        (2, False)
    """
    positions = next(
        (t for k, t in tensors if k.split(".")[-1] == "position_ids" and t.dim() == 2), None
    )
    if positions is None:
        return None
    restarts = positions.shape[1] > 1 and bool((positions[:, 1:] == 0).any())
    if not (restarts or flattened):
        return None
    width = positions.shape[1]
    kept = [
        (k, t)
        for k, t in tensors
        if k.split(".")[-1] not in _BOUNDARY_KEYS and t.dim() >= 2 and t.shape[1] == width
    ]
    labels = next((t for k, t in kept if k.split(".")[-1] == "labels"), None)
    rows: list[str] = []
    tokens: list[int] = []
    for i in range(batch):
        starts = sorted({0, *(positions[i] == 0).nonzero().flatten().tolist()})
        for start, end in zip(starts, [*starts[1:], width], strict=True):
            rows.append(" ".join(f"{k}={_digest(t[i, start:end])}" for k, t in kept))
            if labels is not None:
                tokens.append(int((labels[i, start:end] != -100).sum()))
    return rows, tokens


def _tensors(key: str, value: Any, depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``value`` with its path (``0.1``, ``batch.input_ids``)."""
    if isinstance(value, torch.Tensor):
        return [(key, value)]
    if depth >= 3:
        return []
    if isinstance(value, (list, tuple)):
        return [t for i, v in enumerate(value) for t in _tensors(f"{key}.{i}", v, depth + 1)]
    if isinstance(value, dict):
        return [
            t
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            for t in _tensors(f"{key}.{k}", v, depth + 1)
        ]
    return []


def _watch_collectives(
    names: Sequence[str], note: Callable[[str, tuple[Any, ...], dict[str, Any]], None]
) -> None:
    """Each of c10d's collectives ``names``, wherever the script reaches it
    (``torch.distributed`` or ``distributed_c10d``), calling ``note(name, args, kwargs)``
    before it runs; nothing where torch has no distributed package."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d

    def watched(name: str, collective: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(collective)
        def called(*args: Any, **kwargs: Any) -> Any:
            note(name, args, kwargs)
            return collective(*args, **kwargs)

        return called

    for name in names:
        collective = getattr(dist, name, None)
        if collective is None:
            continue
        wrapped = watched(name, collective)
        for module in (dist, distributed_c10d):
            if getattr(module, name, None) is collective:
                setattr(module, name, wrapped)


def _output_summary(result: Any) -> tuple[list[int], float, float] | None:
    """A module's output as the comparison reads it: its (first) tensor's shape, sum and
    norm, in float64; None where it holds no floating tensor, or a DTensor that no rank holds
    whole (a shard: the rank's piece says nothing of the whole)."""
    found = _tensors("", result)
    if not found:
        return None
    tensor = found[0][1]
    if _distributed(tensor):
        placements = getattr(tensor, "placements", ())
        if not all(type(p).__name__ == "Replicate" for p in placements):
            return None
        tensor = tensor.to_local()
    if not tensor.is_floating_point():
        return None
    value = tensor.detach().double()
    return list(value.shape), float(value.sum()), float(value.norm())


def _digest(row: torch.Tensor) -> str:
    digest = hashlib.blake2b(digest_size=12)
    digest.update(str(row.dtype).encode())
    digest.update(_bytes(row))
    return digest.hexdigest()


def _forms(batch: torch.Tensor) -> list[str]:
    """Per row of ``batch``: ``full/last/stripped`` for a row along a sequence, ``full`` for a
    0-d one. The trailing runs of every row are measured at once."""
    if batch.dim() == 1 or batch.shape[1] == 0:
        return [_digest(row) for row in batch]
    length = batch.shape[1]
    same = (batch == batch[:, -1:]).reshape(batch.shape[0], length, -1).all(dim=2)
    # Per row, the length of the trailing run of positions equal to its last.
    runs = same.flip(1).cumprod(1).sum(1).tolist()
    return [
        f"{_digest(row)}/{_digest(row[-1])}/{_digest(row[: length - run])}"
        for row, run in zip(batch, runs, strict=True)
    ]


def _bytes(row: torch.Tensor) -> bytes:
    """The row's bytes, read at its address in one call (no numpy; iterating a storage reads
    one byte per Python call: 6 ms a step on a 16-row batch)."""
    if not row.numel():
        return b""
    dense = row.detach().to("cpu").contiguous()
    return ctypes.string_at(dense.data_ptr(), dense.numel() * dense.element_size())


def _perturbed(module: torch.nn.Module, seed: int, dtype: str | None = None) -> None:
    """Move every floating parameter of ``module`` by one unit roundoff (of its own dtype, or
    of ``dtype``: the precision the script computes in inside), up or down."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                unit = torch.finfo(getattr(torch, dtype) if dtype else p.dtype).eps / 2
                sign = torch.randint(0, 2, p.shape, generator=generator).to(p.dtype) * 2 - 1
                p.mul_(1 + sign * unit)


class _Lower(torch.overrides.TorchFunctionMode):
    """Watches a float64 run for a lower precision inside: the first call whose result takes
    part in the gradient (requires grad) in a floating dtype coarser than float64, such as a
    log-prob kernel that computes in float32 whatever the model's dtype, or a loss that casts
    its logits with ``.float()``. Counts and masks made in float32 take no part: not seen.
    Sets ``meta["lower_inside"]`` to the dtype, the call and where the script made it."""

    def __init__(self, meta: dict[str, Any]) -> None:
        super().__init__()
        self.meta, self.active = meta, True

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if self.active and self.meta["lower_inside"] is None:
            found = _coarser(result)
            if found is not None:
                self.meta["lower_inside"] = {
                    "dtype": found,
                    "call": _named(func),
                    "where": _caller(),
                }
        return result


def _sent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensors a collective's call holds: its arguments, lists of them, and the tensors
    of point-to-point operations (``P2POp``)."""
    found = []
    for value in [*args, *kwargs.values()]:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            found.append(getattr(item, "tensor", item))
    return found


def _carries_gradient(value: Any) -> bool:
    """A tensor computed from parameters (it has a gradient history): not a parameter, not
    a detached value, not a buffer."""
    return isinstance(value, torch.Tensor) and value.requires_grad and value.grad_fn is not None


def _named(func: Any) -> str:
    """A torch function as users write it (``Tensor.float``, not ``TensorBase.float``)."""
    name = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    if name.startswith("TensorBase."):
        return "Tensor." + name.removeprefix("TensorBase.")
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch") and "." not in name:
        return f"{module.replace('torch._C._nn', 'torch.nn.functional')}.{name}"
    return name


def _coarser(result: Any) -> str | None:
    """The dtype of the first tensor in ``result`` that takes part in the gradient in a
    floating dtype coarser than float64."""
    for leaf in torch.utils._pytree.tree_leaves(result):
        if (
            isinstance(leaf, torch.Tensor)
            and leaf.requires_grad
            and leaf.is_floating_point()
            and leaf.dtype.itemsize < 8
        ):
            return str(leaf.dtype).replace("torch.", "")
    return None


def _caller(outer: bool = False) -> str:
    """The innermost frame of the script's (or a library's) code, not torch's or ours
    (``file:line``); ``outer``: with its function and the frame that called it, where that
    is the script's too (``file:60 in get_batch, from file:120 in estimate_loss``), which
    tells one helper's callers apart."""
    frame: types.FrameType | None = sys._getframe(1)
    found: list[str] = []
    while frame is not None and len(found) < (2 if outer else 1):
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/" not in path and "/ddp_verify/" not in path and not path.startswith("<"):
            # A library's file by its package path (transformers/models/...), as users know it.
            where = f"{path.rpartition('-packages/')[2]}:{frame.f_lineno}"
            found.append(f"{where} in {frame.f_code.co_name}" if outer else where)
        frame = frame.f_back
    if not found:
        return "unknown"
    return ", from ".join(found) if outer else found[0]


def _generator_digest() -> str:
    """A short digest of torch's global CPU generator's state."""
    return hashlib.sha1(torch.default_generator.get_state().numpy().tobytes()).hexdigest()[:12]


def _generator_digests() -> dict[str, str]:
    """Digests of the global generators a script draws from: torch's, Python's ``random``
    and NumPy's (where the script imported it)."""
    import random

    found = {
        "torch": _generator_digest(),
        "random": hashlib.sha1(repr(random.getstate()).encode()).hexdigest()[:12],
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            state = repr(numpy.random.get_state()).encode()
            found["numpy"] = hashlib.sha1(state).hexdigest()[:12]
    return found


def _weights_digest(module: torch.nn.Module) -> list[tuple[list[int], str]]:
    """Each parameter's shape and a digest of its values as training starts (in float64),
    sorted: by value, not by name (a wrapper's names are not the model's); empty for a
    sharded model, whose shards are not the weights."""
    found = []
    with torch.no_grad():
        for p in module.parameters():
            value = p.detach()
            if _distributed(value):
                return []
            data = value.to("cpu", torch.float64).contiguous().numpy().tobytes()
            found.append((list(value.shape), hashlib.sha1(data).hexdigest()[:16]))
    return sorted(found)


def _distributed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (sharded or sliced over a mesh)."""
    return callable(getattr(tensor, "full_tensor", None))


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, and whole where it is a DTensor (an FSDP2 shard, a tensor-parallel
    slice): gathered from every rank of its mesh, which all reach the same step together."""
    value = tensor.detach()
    return value.full_tensor() if _distributed(value) else value


def _after_import(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """Call ``then(module)`` once module ``name`` is imported: now where it is, else as its
    import ends (a finder ahead of the others that wraps the module's loader)."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    import importlib.abc
    import importlib.machinery

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            execute = loader.exec_module

            def exec_module(module: types.ModuleType) -> None:
                execute(module)
                then(module)

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Watch())


def _dropout(module: torch.nn.Module) -> list[tuple[str, float]]:
    """The dropout modules of ``module`` in training mode that drop anything: (name, p)."""
    found = []
    for name, inner in module.named_modules():
        p = getattr(inner, "p", None)
        dropping = isinstance(inner, torch.nn.modules.dropout._DropoutNd) or (
            type(inner).__name__.lower().endswith("dropout") and isinstance(p, float)
        )
        if dropping and inner.training and isinstance(p, (int, float)) and p > 0:
            found.append((normalized(name), float(p)))
    return found


def _settings(group: dict[str, Any]) -> dict[str, float]:
    """A parameter group's numeric settings (``lr``, ``momentum``, ``weight_decay``...)."""
    found: dict[str, float] = {}
    for key, value in group.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()  # a capturable optimizer's lr
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[key] = float(value)
    return found


def _in_autograd() -> bool:
    """Whether the autograd engine is running a backward on this thread now."""
    return bool(torch._C._current_graph_task_id() != -1)


def _to_float64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    return value


def _autocast() -> str | None:
    for device in ("cpu", "cuda"):
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device):
                return f"{device}:{str(torch.get_autocast_dtype(device)).replace('torch.', '')}"
    return None


class _Tee:
    """A stream that hands what is written to ``sink`` too; everything else is the stream's."""

    def __init__(self, stream: Any, sink: Any) -> None:
        self._stream, self._sink = stream, sink

    def write(self, text: str) -> int:
        with contextlib.suppress(Exception):
            self._sink(text)
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
