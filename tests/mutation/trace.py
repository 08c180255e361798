"""The modules, and their lines, that small real data-parallel trainings execute in torch:
where the mutation tool draws its regressions (:mod:`tests.mutation.generated`), so that what
it measures is what training runs, not a list chosen beside the gate.

Each training runs on a real world of 2 ranks (gloo, forked), every rank tracing the lines
of torch's Python files it executes; their union is the trace. The trainings:

- DDP over a model with BatchNorm (its conversion to SyncBatchNorm too, which trains on GPUs
  only), a ``DistributedSampler``, gradient accumulation under ``no_sync``,
  ``clip_grad_norm_``, a learning-rate scheduler, ``torch.amp.GradScaler``, with SGD
  (momentum), Adam and AdamW;
- ``ZeroRedundancyOptimizer`` over Adam;
- FSDP2 (``fully_shard`` layer by layer, then the root) with a distributed checkpoint round
  trip (``get_state_dict`` / ``dcp.save`` / ``dcp.load`` / ``set_state_dict``);
- DDP's comm hooks (allreduce, fp16 compression and its wrapper, PowerSGD, post-local SGD;
  bf16 compression needs NCCL) and the
  model averagers, and ``torch.distributed.nn``'s differentiable collectives;
- pipeline parallelism: a chain cut into stages (``PipelineStage``), one a rank under GPipe
  and 1F1B, two a rank under interleaved 1F1B, each micro-batch's mean loss scaled by the
  schedule (``scale_grads``, the default) and the step's token sum not, a few optimizer steps;
- tensor parallelism: a transformer-style block (a norm, an MLP) under ``parallelize_module``
  with the plans training code writes (column-wise up and row-wise down, sequence-parallel
  norm, ``PrepareModuleInput``), trained with AdamW.

Only modules within :data:`SCOPE` count: the packages data-parallel training is made of
(``torch.distributed``, ``torch.nn.parallel``, ``torch.optim``, the norms, the gradient
utilities, the scaler, the samplers), not the tensor and module machinery every program
runs.

    python -m tests.mutation.trace [--json traced.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# The packages and modules a regression of data-parallel training lives in.
SCOPE = (
    "torch.distributed.",
    "torch.nn.parallel.",
    "torch.optim.",
    "torch.nn.utils.clip_grad",
    "torch.nn.modules.batchnorm",
    "torch.nn.modules._functions",
    "torch.amp.grad_scaler",
    "torch.utils.data.distributed",
    "torch.utils.data.sampler",
)
# Not regressions of training: tracing, logging, debugging, elastic agents, RPC.
EXCLUDED = (
    "torch.distributed.elastic.",
    "torch.distributed.rpc",
    "torch.distributed.logging_handlers",
    "torch.distributed._logging",
    "torch.distributed.utils",  # _verify_param_shape_across_processes and the like: checks
    "torch.distributed.run",
    "torch.distributed.launcher",
    "torch.distributed.argparse_util",
    "torch.distributed.constants",
    "torch.distributed.rendezvous",
)
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def module_of(path: str) -> str | None:
    """The module a torch source file is, where it is within :data:`SCOPE`.

    Example::

        >>> module_of(TORCH_DIR + "optim/sgd.py")
        'torch.optim.sgd'
        >>> module_of(TORCH_DIR + "nn/modules/linear.py") is None
        True
    """
    if not path.startswith(TORCH_DIR) or not path.endswith(".py"):
        return None
    relative = path[len(TORCH_DIR) : -3].replace(os.sep, ".")
    name = "torch." + relative.removesuffix(".__init__")
    within = any(name.startswith(s) or name == s.rstrip(".") for s in SCOPE)
    if not within or any(name.startswith(e) for e in EXCLUDED):
        return None
    return name


def traced(job: Callable[[], Any]) -> dict[str, set[int]]:
    """Run ``job`` with every line of a function it executes in torch's in-scope files
    noted."""
    seen: dict[str, set[int]] = {}
    names: dict[str, str | None] = {}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            seen[names[frame.f_code.co_filename]].add(frame.f_lineno)
        return local

    def call(frame: Any, event: str, arg: Any) -> Any:
        # A function's body only: a module's or a class's body runs at import, which says
        # nothing of training (a default argument's line is the def's).
        if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            return None
        path = frame.f_code.co_filename
        if path not in names:
            names[path] = module_of(path)
        module = names[path]
        if module is None:
            return None
        seen.setdefault(module, set()).add(frame.f_lineno)
        return local

    sys.settrace(call)
    try:
        job()
    finally:
        sys.settrace(None)
    return seen


def _ddp_training() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(40, 4, generator=generator), torch.randn(40, 1, generator=generator)
    )
    for make in (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 1)
        )
        model = DDP(model)
        optimizer = make(model.parameters())
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
        sampler = DistributedSampler(data, world, rank, shuffle=True, seed=0)
        sampler.set_epoch(1)
        batches = iter(DataLoader(data, batch_size=4, sampler=sampler))
        for _ in range(2):
            optimizer.zero_grad()
            with model.no_sync():
                x, y = next(batches)
                scaler.scale(torch.nn.functional.mse_loss(model(x), y) / 2).backward()
            x, y = next(batches)
            scaler.scale(torch.nn.functional.mse_loss(model(x), y) / 2).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
    # SyncBatchNorm trains on GPUs only (DDP refuses it on CPU): its conversion, and its
    # forward in eval mode, run here.
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model.module).eval()
    synced(torch.randn(3, 4))


def _zero_training() -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    optimizer.consolidate_state_dict(0)
    if dist.get_rank() == 0:
        optimizer.load_state_dict(optimizer.state_dict())


def _fsdp_training() -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # One directory for both ranks: rank 0 makes it, every rank is told its name.
    where = [tempfile.mkdtemp(prefix="ddp_verify-trace-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=where[0])
    loaded = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(loaded, checkpoint_id=where[0])
    set_state_dict(
        model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"]
    )
    # Every rank has read its shards before rank 0 removes what it made: no trace is left.
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(where[0], ignore_errors=True)


def _hooks_and_averagers() -> None:
    import torch.distributed.nn.functional as dnn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager,
    )
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    hooks: list[tuple[Any, Any]] = [
        (None, default_hooks.allreduce_hook),
        (None, default_hooks.fp16_compress_hook),
        # bf16 compression (the hook and its wrapper) needs NCCL: DDP refuses it on gloo.
        (None, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)),
        (powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2),
         powerSGD_hook.powerSGD_hook),
        (PostLocalSGDState(None, dist.new_subgroups(group_size=1)[0], start_localSGD_iter=2),
         post_localSGD_hook),
    ]  # fmt: skip
    for state, hook in hooks:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)))
        model.register_comm_hook(state, hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]
    optimizer = PostLocalSGDOptimizer(
        torch.optim.SGD(params, lr=0.1), PeriodicModelAverager(period=2, warmup_steps=1)
    )
    from collections import OrderedDict

    hierarchical = HierarchicalModelAverager(OrderedDict([(1, 1), (2, 2)]), warmup_steps=1)
    for _ in range(3):
        for p in params:
            p.grad = torch.ones(3)
        optimizer.step()
        hierarchical.average_parameters(iter(params))
    x = torch.randn(3, requires_grad=True)
    for collective in (
        lambda t: dnn.all_reduce(t),
        lambda t: torch.stack(dnn.all_gather(t)).sum(0),
        lambda t: dnn.broadcast(t, src=0),
    ):
        collective(x * 2).sum().backward()


def _pipeline_training() -> None:
    from torch.distributed import pipelining

    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8, 4, generator=generator)
    labels = torch.randint(0, 3, (8,), generator=generator)
    labels[1] = -100  # micro-batches of uneven token counts, as padded sequences make them
    tokens = int((labels != -100).sum())

    def mean(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target, ignore_index=-100)

    def step_sum(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        summed = torch.nn.functional.cross_entropy(
            output, target, ignore_index=-100, reduction="sum"
        )
        return summed / tokens

    for name, per_rank, loss, scale in (
        ("ScheduleGPipe", 1, mean, True),
        ("Schedule1F1B", 1, step_sum, False),
        ("ScheduleInterleaved1F1B", 2, mean, True),
    ):
        count = world * per_rank
        torch.manual_seed(0)
        chain = [
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
            if i < count - 1
            else torch.nn.Linear(4, 3)
            for i in range(count)
        ]
        mine = [i for i in range(count) if i % world == rank]
        stages = [pipelining.PipelineStage(chain[i], i, count, torch.device("cpu")) for i in mine]
        schedule = getattr(pipelining, name)(
            stages[0] if per_rank == 1 else stages,
            n_microbatches=2 * world,
            loss_fn=loss,
            scale_grads=scale,
        )
        params = [p for i in mine for p in chain[i].parameters()]
        optimizer = torch.optim.SGD(params, lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            losses: list[torch.Tensor] = []
            args = (inputs,) if 0 in mine else ()
            kwargs: dict[str, Any] = (
                {"target": labels, "losses": losses} if count - 1 in mine else {}
            )
            schedule.step(*args, **kwargs)
            optimizer.step()


def _tensor_parallel_training() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)
            self.up = torch.nn.Linear(4, 8)
            self.down = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(self.norm(x))))

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    plans: list[tuple[dict[str, Any], bool]] = [
        ({"up": ColwiseParallel(), "down": RowwiseParallel()}, False),
        (
            {
                "norm": SequenceParallel(),
                "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1)),
            },
            True,
        ),
        (
            {
                "norm": PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_output=True,
                ),
                "up": ColwiseParallel(),
                "down": RowwiseParallel(output_layouts=Shard(1)),
            },
            True,
        ),
    ]
    for plan, pieces in plans:
        torch.manual_seed(0)
        block = parallelize_module(Block(), mesh, plan)
        optimizer = torch.optim.AdamW(block.parameters(), lr=0.01)
        for _ in range(2):
            x = torch.randn(2, 2 * world, 4, generator=torch.Generator().manual_seed(1))
            if pieces:
                x = x.chunk(world, dim=1)[rank]
            optimizer.zero_grad()
            out = block(x)
            if callable(getattr(out, "full_tensor", None)):
                out = out.full_tensor()
            out.pow(2).mean().backward()
            optimizer.step()


TRAININGS: dict[str, Callable[[], None]] = {
    "ddp": _ddp_training,
    "zero": _zero_training,
    "fsdp": _fsdp_training,
    "hooks": _hooks_and_averagers,
    "pipeline": _pipeline_training,
    "tensor_parallel": _tensor_parallel_training,
}


def _rank(name: str) -> dict[str, list[int]]:
    torch.set_num_threads(1)
    return {m: sorted(lines) for m, lines in traced(TRAININGS[name]).items()}


def trace(world_size: int = 2) -> dict[str, list[int]]:
    """Every in-scope module the trainings execute, with the lines they execute in it."""
    from ddp_verify.world import World

    union: dict[str, set[int]] = {}
    for name in TRAININGS:
        with World(world_size, timeout=300) as world:
            for found in world.run(_rank, name):
                for module, lines in found.items():
                    union.setdefault(module, set()).update(lines)
    return {module: sorted(lines) for module, lines in sorted(union.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write {module: [lines]} here")
    args = parser.parse_args(argv)
    found = trace()
    for module, lines in found.items():
        print(f"{module}: {len(lines)} lines")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
