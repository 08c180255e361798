"""The ground-truth table's corpus: call shapes users write times mistake operators.

A shape is the correct form of one kind of aggregation code with the real signature users
write (a per-parameter grad-sync loop, a flat bucketed one, a loss reducer, a Megatron-style
list helper, a dict of metrics, three token losses, a step, a DDP step with ``no_sync``, two
comm hooks, a wrapper), as source text with named slots. A mistake operator fills slots to
make one mistake users make (world-size averaging, no division, a stale count, ...). Each
case's truth is the operator's own: correct code is ``equivalent``; a mistake is
``not-equivalent`` with the findings that name it. The diagnosis never decides the truth.

``benchmarks/diagnosis_table.py`` runs every case; ``tests/groundtruth/test_table.py`` runs a
fixed sample in CI and fails when a case that was right turns wrong.
"""

from __future__ import annotations

import importlib.util
import string
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_verify.engine.strategies import models

_HEADER = "import contextlib\nimport torch\nimport torch.distributed as dist\n"
_HEADER += "import torch.nn.functional as F\n"


@dataclass(frozen=True)
class Shape:
    """The correct form of a kind's code: ``source`` with ``$slots``, ``defaults`` for
    them, the check options it needs (``options``) and the function's name."""

    name: str
    kind: str
    function: str
    source: str
    defaults: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)
    # Families of operators that make sense on it.
    families: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Operator:
    """One mistake: slot values per family, and the findings that name it (any of them,
    as the first cause, is right)."""

    name: str
    words: str
    edits: dict[str, dict[str, str]]
    truth: frozenset[str]


@dataclass(frozen=True)
class Case:
    shape: Shape
    operator: Operator | None

    @property
    def name(self) -> str:
        return f"{self.shape.name}.{self.operator.name if self.operator else 'correct'}"

    @property
    def expected(self) -> str:
        return "equivalent" if self.operator is None else "not-equivalent"

    @property
    def truth(self) -> frozenset[str]:
        return frozenset() if self.operator is None else self.operator.truth

    def source(self) -> str:
        slots = dict(self.shape.defaults)
        if self.operator is not None:
            family = next(f for f in self.operator.edits if f in self.shape.families)
            slots.update(self.operator.edits[family])
        body = textwrap.dedent(self.shape.source)
        for _ in range(3):  # a slot's value may hold a slot of its own ($divide)
            body = string.Template(body).safe_substitute(slots)
        return _HEADER + string.Template(body).substitute({})

    def load(self, directory: Path) -> Any:
        """The case's function, from a module written under ``directory`` (its state, the
        hook state factory, with it)."""
        name = "groundtruth_" + self.name.replace(".", "_").replace("-", "_")
        path = directory / f"{name}.py"
        path.write_text(self.source())
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


# Multi-line slot values are indented for the slot's own column by _lines.
def _lines(*lines: str, indent: int) -> str:
    return ("\n" + " " * indent).join(lines)


_GATHER_WITH_GRAD = _lines(
    "all_a = torch.cat(torch.distributed.nn.all_gather(features_a))",
    "all_b = torch.cat(torch.distributed.nn.all_gather(features_b))",
    indent=8,
)
_GATHER_COPIES = _lines(
    "copies_a = [torch.zeros_like(features_a) for _ in range(dist.get_world_size())]",
    "copies_b = [torch.zeros_like(features_b) for _ in range(dist.get_world_size())]",
    "dist.all_gather(copies_a, features_a)",
    "dist.all_gather(copies_b, features_b)",
    "$substitute",
    "all_a, all_b = torch.cat(copies_a), torch.cat(copies_b)",
    indent=8,
)
_GATHER_B_WITHOUT_GRAD = _lines(
    "all_a = torch.cat(torch.distributed.nn.all_gather(features_a))",
    "copies_b = [torch.zeros_like(features_b) for _ in range(dist.get_world_size())]",
    "dist.all_gather(copies_b, features_b)",
    "copies_b[dist.get_rank()] = features_b",
    "all_b = torch.cat(copies_b)",
    indent=8,
)
_SUBSTITUTE = _lines(
    "copies_a[dist.get_rank()] = features_a",
    "copies_b[dist.get_rank()] = features_b",
    indent=8,
)

# Models whose output head is their embedding: one weight reached by two names.
_TIED_MODELS = models(kinds=("embedding",), required_features=("tied",))

SHAPES = (
    Shape(
        "grad-sync-loop",
        "grad-sync",
        "sync",
        """\
        $state
        def sync(model, num_samples):
            $pre
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = $total
            for index, p in enumerate(model.parameters()):
                if p.grad is None:
                    $unused
                $skip
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(
            state="",
            pre="",
            total="total.item()",
            unused="continue",
            skip="",
            weight="num_samples",
            divide="total",
        ),
        families=frozenset({"grad", "grad-loop", "count"}),
    ),
    Shape(
        "grad-sync-flat",
        "grad-sync",
        "sync_flat",
        """\
        $state
        def sync_flat(model, num_samples):
            $pre
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = $total
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads]) * $weight
            dist.all_reduce(flat)
            flat = flat / ($divide)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        """,
        dict(state="", pre="", total="total.item()", weight="num_samples", divide="total"),
        families=frozenset({"grad", "count"}),
    ),
    # Tied weights (an output head that is the embedding), every parameter visited by name
    # with duplicates kept (named_parameters(remove_duplicate=False)): the tied one is
    # synchronised twice, which a weighted average leaves as it is.
    Shape(
        "grad-sync-tied",
        "grad-sync",
        "sync_by_name",
        """\
        def sync_by_name(model, num_samples):
            $pre
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = total.item()
            for name, p in model.named_parameters(remove_duplicate=False):
                if p.grad is None:
                    continue
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(pre="", weight="num_samples", divide="total"),
        options={"models": _TIED_MODELS},
        families=frozenset({"grad"}),
    ),
    # Counts made as torch makes them by default, float32, the gradients float64: each
    # rank's share rounds to float32 where it is not exact (1/3), which is correct code.
    Shape(
        "grad-sync-float32-counts",
        "grad-sync",
        "sync32",
        """\
        def sync32(model, num_samples):
            $pre
            count = torch.tensor(float(num_samples))
            total = count.clone()
            dist.all_reduce(total)
            for p in model.parameters():
                if p.grad is None:
                    continue
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(pre="", weight="count / total", divide="1"),
        families=frozenset({"grad32"}),
    ),
    Shape(
        "loss",
        "loss",
        "global_loss",
        """\
        $state
        def global_loss(local_loss, num_samples):
            pair = torch.stack(
                [local_loss.detach().double() * $weight, torch.tensor(float(num_samples)).double()]
            )
            $allreduce
            total = $total
            return (pair[0] / ($divide)).item()
        """,
        dict(
            state="",
            weight="num_samples",
            allreduce="dist.all_reduce(pair)",
            total="pair[1].item()",
            divide="total",
        ),
        families=frozenset({"report", "count"}),
    ),
    Shape(
        "reduce-tensor",
        "reduce",
        "reduce_mean",
        """\
        $state
        def reduce_mean(tensor, num_samples):
            count = torch.tensor(float(num_samples)).to(tensor)
            pair = torch.stack([tensor.detach() * $weight, count])
            $allreduce
            total = $total
            return (pair[0] / ($divide)).reshape(tensor.shape)
        """,
        dict(
            state="",
            weight="num_samples",
            allreduce="dist.all_reduce(pair)",
            total="pair[1].item()",
            divide="total",
        ),
        families=frozenset({"report", "count"}),
    ),
    Shape(
        "reduce-list",
        "reduce",
        "average_losses",
        """\
        $state
        def average_losses(losses, num_samples):
            values = torch.cat([loss.clone().detach().view(1) for loss in losses])
            pair = torch.cat([values * $weight, torch.tensor([float(num_samples)]).to(values)])
            $allreduce
            total = $total
            return [pair[0] / ($divide)]
        """,
        dict(
            state="",
            weight="num_samples",
            allreduce="dist.all_reduce(pair)",
            total="pair[1].item()",
            divide="total",
        ),
        families=frozenset({"report", "count"}),
    ),
    Shape(
        "reduce-dict",
        "reduce-dict",
        "reduce_metrics",
        """\
        $state
        def reduce_metrics(metrics, num_samples):
            names = sorted(metrics)
            values = torch.stack([metrics[k].detach() * $weight for k in names])
            values = torch.cat([values, torch.tensor([float(num_samples)]).to(values)])
            pair = values
            $allreduce
            total = $total
            return {k: pair[i] / ($divide) for i, k in enumerate(names)}
        """,
        dict(
            state="",
            weight="num_samples",
            allreduce="dist.all_reduce(pair)",
            total="pair[-1].item()",
            divide="total",
        ),
        families=frozenset({"report", "count"}),
    ),
    Shape(
        "loss-fn-flat",
        "loss-fn",
        "fixed_cross_entropy",
        """\
        def fixed_cross_entropy($signature, ignore_index=-100, **kwargs):
            summed = F.cross_entropy(source, target, ignore_index=ignore_index, reduction="sum")
            return summed / ($divide)
        """,
        dict(signature="source, target, num_items_in_batch=None", divide="num_items_in_batch"),
        options={"losses": ("tokens",), "max_micro_batches": 3},
        families=frozenset({"token-loss-flat"}),
    ),
    Shape(
        "loss-fn-3d",
        "loss-fn",
        "cross_entropy_loss",
        """\
        def cross_entropy_loss($signature):
            summed = F.cross_entropy(
                pred.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=-100, reduction="sum"
            )
            return summed / ($divide)
        """,
        dict(signature="pred, labels, num_tokens", divide="num_tokens"),
        options={"losses": ("tokens",), "max_micro_batches": 3},
        families=frozenset({"token-loss-3d"}),
    ),
    # A token loss that builds its own mask from the labels (issue 62).
    Shape(
        "loss-fn-masked",
        "loss-fn",
        "masked_token_loss",
        """\
        def masked_token_loss(logits, labels, num_items_in_batch):
            mask = ($mask).flatten().to(logits.dtype)
            per_token = F.cross_entropy(
                logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none"
            )
            return (per_token * mask).sum() / num_items_in_batch
        """,
        dict(mask="labels != -100"),
        options={"losses": ("tokens",), "max_micro_batches": 3},
        families=frozenset({"token-loss-mask"}),
    ),
    Shape(
        "loss-fn-causal",
        "loss-fn",
        "causal_lm_loss",
        """\
        def causal_lm_loss($signature, ignore_index=-100, **kwargs):
            scores = logits[:, :-1, :].float().reshape(-1, vocab_size)
            targets = labels[:, 1:].reshape(-1)
            summed = F.cross_entropy(scores, targets, ignore_index=ignore_index, reduction="sum")
            return summed / ($divide)
        """,
        dict(
            signature="logits, labels, vocab_size, num_items_in_batch=None",
            divide="num_items_in_batch",
        ),
        options={"losses": ("tokens",), "max_micro_batches": 3},
        families=frozenset({"token-loss-causal"}),
    ),
    # A causal-LM loss over packed rows (padding-free): it shifts its labels within each row
    # and masks every position whose next one starts a sequence, from position_ids.
    Shape(
        "loss-fn-packed",
        "loss-fn",
        "packed_causal_loss",
        """\
        def packed_causal_loss($signature, ignore_index=-100, **kwargs):
            scores = logits[:, :-1, :].float().reshape(-1, logits.shape[-1])
            targets = labels[:, 1:]
            targets = torch.where($keep, targets, torch.full_like(targets, -100)).reshape(-1)
            summed = F.cross_entropy(scores, targets, ignore_index=ignore_index, reduction="sum")
            return summed / ($divide)
        """,
        dict(
            signature="logits, labels, position_ids, num_items_in_batch=None",
            keep="position_ids[:, 1:] != 0",
            divide="num_items_in_batch",
        ),
        options={"losses": ("tokens",), "max_micro_batches": 3},
        families=frozenset({"token-loss-packed"}),
    ),
    Shape(
        "step",
        "step",
        "train_step",
        """\
        def train_step(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for i, (x, y) in enumerate(micro_batches):
                $zero_inside
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
                $sync_inside
            $pre
            $sync_after
            $report
            optimizer.step()
            return reported / ($report_divide)
        """,
        dict(
            zero_inside="",
            mb_weight="len(y)",
            sync_inside="",
            pre="",
            sync_after=_lines(
                "for p in model.parameters():",
                "    if p.grad is not None:",
                "        dist.all_reduce(p.grad)",
                "        p.grad.div_($divide)",
                indent=4,
            ),
            divide="total.item()",
            report="dist.all_reduce(reported)",
            report_divide="total.item()",
        ),
        families=frozenset({"step"}),
    ),
    # A step over padding-free micro-batches (dicts, sequences packed into rows, as
    # DataCollatorWithFlattening gives them): the model told each sequence's positions,
    # each micro-batch's token mean weighted by its tokens, the sum over every rank's.
    Shape(
        "step-packed",
        "step",
        "train_step",
        """\
        def train_step(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(int((b["labels"] != -100).sum()) for b in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for b in micro_batches:
                $zero_inside
                n = int((b["labels"] != -100).sum())
                loss = loss_fn(model($forward), b["labels"]) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_($divide)
            dist.all_reduce(reported)
            optimizer.step()
            return reported / total.item()
        """,
        dict(
            zero_inside="",
            forward='b["input_ids"], position_ids=b["position_ids"]',
            mb_weight="n",
            divide="total.item()",
        ),
        options={"losses": ("tokens",)},
        families=frozenset({"step-packed"}),
    ),
    # A distillation loss of the user's (a teacher's logits as the targets, a temperature),
    # synced by a plain weighted loop.
    Shape(
        "grad-sync-distill",
        "grad-sync",
        "sync",
        """\
        def distill(outputs, targets, temperature=2.0):
            student = F.log_softmax(outputs / temperature, dim=-1)
            teacher = F.softmax(targets / temperature, dim=-1)
            return F.kl_div(student, teacher, reduction="batchmean") * temperature**2


        $state
        def sync(model, num_samples):
            $pre
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = $total
            for index, p in enumerate(model.parameters()):
                if p.grad is None:
                    $unused
                $skip
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(
            state="",
            pre="",
            total="total.item()",
            unused="continue",
            skip="",
            weight="num_samples",
            divide="total",
        ),
        options={"loss_fn": "distill", "losses": ("mse",)},
        families=frozenset({"grad", "count"}),
    ),
    # Functional collectives (torch.distributed._functional_collectives): a new tensor back.
    Shape(
        "grad-sync-funcol",
        "grad-sync",
        "sync_funcol",
        """\
        import torch.distributed._functional_collectives as funcol


        $state
        def sync_funcol(model, num_samples):
            $pre
            total = funcol.all_reduce(
                torch.tensor([float(num_samples)], dtype=torch.float64), "sum", dist.group.WORLD
            )
            total = $total
            for p in model.parameters():
                if p.grad is None:
                    continue
                summed = funcol.all_reduce(p.grad * $weight, "sum", dist.group.WORLD)
                p.grad.copy_(summed / ($divide))
        """,
        dict(state="", pre="", total="total.item()", weight="num_samples", divide="total"),
        families=frozenset({"grad", "count"}),
    ),
    # A metric object of the user's (torchmetrics' update/compute, its sum states reduced
    # across ranks at compute), for the logged loss.
    Shape(
        "loss-metric",
        "loss",
        "logged_loss",
        """\
        $state
        class MeanMetric:
            def __init__(self):
                self.total = torch.zeros((), dtype=torch.float64)
                self.count = torch.zeros((), dtype=torch.float64)

            def update(self, value, weight):
                self.total += value.detach().double() * $weight
                self.count += weight

            def compute(self):
                states = torch.stack([self.total, self.count])
                $allreduce
                total = $total
                return states[0] / ($divide)


        def logged_loss(local_loss, num_samples):
            metric = MeanMetric()
            metric.update(local_loss, num_samples)
            return metric.compute().item()
        """,
        dict(
            state="",
            weight="weight",
            allreduce="dist.all_reduce(states)",
            total="states[1].item()",
            divide="total",
        ),
        families=frozenset({"metric"}),
    ),
    # A wrapped hook: a decorator of the user's around it (timing, logging).
    Shape(
        "comm-hook-wrapped",
        "comm-hook",
        "allreduce_hook",
        """\
        import functools


        def _timed(hook):
            @functools.wraps(hook)
            def timed(state, bucket):
                return hook(state, bucket)

            return timed


        @_timed
        def allreduce_hook(state, bucket):
            tensor = bucket.buffer()
            tensor.div_($divide)
            future = dist.all_reduce(tensor, async_op=True).get_future()
            return future.then(lambda f: f.value()[0])
        """,
        dict(divide="dist.get_world_size()"),
        families=frozenset({"hook"}),
    ),
    # A hook that divides by a process group's size: the world's group (right), or a group
    # of its own (a node's) where the world's is due.
    Shape(
        "comm-hook-group",
        "comm-hook",
        "group_hook",
        """\
        _groups = {}


        def _group():
            if "made" not in _groups:
                world = dist.get_world_size()
                own = [dist.new_group([r]) for r in range(world)]
                _groups["made"] = {"world": dist.new_group(list(range(world))), "own": own}
            return _groups["made"]


        def group_hook(state, bucket):
            groups = _group()
            tensor = bucket.buffer()
            tensor.div_(dist.get_world_size(group=$group))
            future = dist.all_reduce(tensor, async_op=True).get_future()
            return future.then(lambda f: f.value()[0])
        """,
        dict(group='groups["world"]'),
        families=frozenset({"hook-group"}),
    ),
    # DDP's sync flag toggled by hand (what no_sync() does), on for the last micro-batch.
    Shape(
        "wrapped-step-flag",
        "wrapped-step",
        "flag_step",
        """\
        def flag_step(ddp_model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            world = dist.get_world_size()
            reported = torch.zeros((), dtype=torch.float64)
            for i, (x, y) in enumerate(micro_batches):
                ddp_model.require_backward_grad_sync = $flag
                loss = loss_fn(ddp_model(x), y) * len(y) * world / total.item()
                loss.backward()
                reported += loss.detach().double() / world
            ddp_model.require_backward_grad_sync = True
            optimizer.step()
            dist.all_reduce(reported)
            return reported
        """,
        dict(flag="i == len(micro_batches) - 1"),
        families=frozenset({"sync-flag"}),
    ),
    # The user's own recipe (issue 62): their loss, AdamW and a warm-up they step themselves,
    # judged against the same code on one rank holding the whole batch.
    Shape(
        "step-scheduler",
        "step",
        "recipe_step",
        """\
        def focal(outputs, targets):
            chosen = F.log_softmax(outputs, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
            return (-((1 - chosen.exp()) ** 2) * chosen).mean()


        def adamw(params):
            return torch.optim.AdamW(params, lr=0.02, weight_decay=0.1)


        def warmup(optimizer):
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / 4))


        def recipe_step(model, optimizer, micro_batches, loss_fn, scheduler):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for i, (x, y) in enumerate(micro_batches):
                $zero_inside
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
                $tick_inside
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_($divide)
            optimizer.step()
            $tick_after
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(
            zero_inside="",
            mb_weight="len(y)",
            tick_inside="",
            divide="total.item()",
            tick_after="scheduler.step()",
        ),
        options={
            "loss_fn": "focal",
            "optimizer": "adamw",
            "scheduler": "warmup",
            "losses": ("cross_entropy",),
        },
        families=frozenset({"step-recipe"}),
    ),
    # Gradients synchronised by shards (ZeRO's partitioning: a reduce-scatter of the flat
    # gradient, each rank's shard scaled, an all-gather back), the optimizer replicated.
    Shape(
        "step-shard",
        "step",
        "shard_step",
        """\
        def shard_step(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for x, y in micro_batches:
                $zero_inside
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
            $pre
            params = [p for p in model.parameters() if p.grad is not None]
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            world = dist.get_world_size()
            padded = torch.cat([flat, flat.new_zeros((-len(flat)) % world)])
            shard = padded.new_zeros(len(padded) // world)
            dist.reduce_scatter_tensor(shard, padded)
            shard.div_($divide)
            gathered = padded.new_zeros(len(padded))
            dist.all_gather_into_tensor(gathered, shard)
            offset = 0
            for p in params:
                p.grad.copy_(gathered[offset : offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            optimizer.step()
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(zero_inside="", mb_weight="len(y)", pre="", divide="total.item()"),
        families=frozenset({"step-shard"}),
    ),
    # ZeRO partitioning by parameter: each parameter's gradient reduced onto the rank that
    # owns it, the optimizer stepping only what it owns (the others' gradients dropped, so
    # it skips them), each parameter broadcast back from its owner.
    Shape(
        "step-zero",
        "step",
        "zero_step",
        """\
        def zero_step(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for x, y in micro_batches:
                $zero_inside
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
            $pre
            world, rank = dist.get_world_size(), dist.get_rank()
            params = [p for p in model.parameters() if p.grad is not None]
            for i, p in enumerate(params):
                owner = $owner
                dist.reduce(p.grad, dst=owner)
                if rank == owner:
                    p.grad.div_($divide)
                else:
                    p.grad = None
            optimizer.step()
            with torch.no_grad():
                for i, p in enumerate(params):
                    $gather
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(
            zero_inside="",
            mb_weight="len(y)",
            pre="",
            owner="i % world",
            divide="total.item()",
            gather="dist.broadcast(p, src=i % world)",
        ),
        families=frozenset({"step-zero"}),
    ),
    # Loss scaling (torch's GradScaler, as mixed precision trains): the scaled loss
    # backpropagated, the scaler unscaling the synchronised gradients in its step.
    Shape(
        "step-scaler",
        "step",
        "scaled_step",
        """\
        def scaled_step(model, optimizer, micro_batches, loss_fn):
            scaler = optimizer.__dict__.setdefault(
                "scaler", torch.amp.GradScaler("cpu", init_scale=1024.0)
            )
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for x, y in micro_batches:
                loss = loss_fn(model(x), y) * $mb_weight
                scaler.scale(loss).backward()
                reported += loss.detach().double()
            $unscale
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_($divide)
            $step
            $update
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(
            mb_weight="len(y)",
            unscale="",
            divide="total.item()",
            step="scaler.step(optimizer)",
            update="scaler.update()",
        ),
        families=frozenset({"step-scaler"}),
    ),
    # A running average of the weights (EMA) kept beside the model, for evaluation.
    Shape(
        "step-ema",
        "step",
        "ema_step",
        """\
        def ema_step(model, optimizer, micro_batches, loss_fn):
            average = optimizer.__dict__.setdefault("ema", {})
            if not average:
                average.update({n: p.detach().clone() for n, p in model.named_parameters()})
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for x, y in micro_batches:
                loss = loss_fn(model(x), y) * len(y)
                loss.backward()
                reported += loss.detach().double()
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(total.item())
            optimizer.step()
            with torch.no_grad():
                for n, p in model.named_parameters():
                    average[n].mul_(0.99).add_(p, alpha=0.01)
                    $swap
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(swap=""),
        families=frozenset({"step-ema"}),
    ),
    # A clip by norm of the user's own, after the sync (right) or before it, that bites.
    Shape(
        "step-clip",
        "step",
        "clipped_step",
        """\
        def clipped_step(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            reported = torch.zeros((), dtype=torch.float64)
            for x, y in micro_batches:
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                reported += loss.detach().double()
            $pre
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_($divide)
            $clip_after
            optimizer.step()
            dist.all_reduce(reported)
            return reported / total.item()
        """,
        dict(
            mb_weight="len(y)",
            pre="",
            divide="total.item()",
            clip_after="torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)",
        ),
        options={"loss_fn": "torch.nn:SmoothL1Loss", "losses": ("mse",)},
        families=frozenset({"step-clip"}),
    ),
    # A fairseq-style criterion of the user's: (summed loss, sample size, logging output).
    Shape(
        "grad-sync-criterion",
        "grad-sync",
        "sync",
        """\
        def smoothed(outputs, targets):
            summed = F.cross_entropy(outputs, targets, label_smoothing=0.1, reduction="sum")
            return summed, len(targets), {"loss": summed.detach()}


        $state
        def sync(model, num_samples):
            $pre
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = $total
            for index, p in enumerate(model.parameters()):
                if p.grad is None:
                    $unused
                $skip
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(
            state="",
            pre="",
            total="total.item()",
            unused="continue",
            skip="",
            weight="num_samples",
            divide="total",
        ),
        options={"loss_fn": "smoothed", "losses": ("cross_entropy",)},
        families=frozenset({"grad", "count"}),
    ),
    Shape(
        "wrapped-step",
        "wrapped-step",
        "ddp_step",
        """\
        def ddp_step(ddp_model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = sum(len(y) for _, y in micro_batches)
            total = torch.tensor([float(local)], dtype=torch.float64)
            dist.all_reduce(total)
            world = dist.get_world_size()
            reported = torch.zeros((), dtype=torch.float64)
            for i, (x, y) in enumerate(micro_batches):
                last = i == len(micro_batches) - 1
                with contextlib.nullcontext() if last else ddp_model.no_sync():
                    $zero_inside
                    loss = loss_fn(ddp_model(x), y) * $mb_weight
                    loss.backward()
                reported += loss.detach().double() / world
                $step_inside
            optimizer.step()
            dist.all_reduce(reported)
            return reported
        """,
        dict(zero_inside="", mb_weight="len(y) * world / total.item()", step_inside=""),
        families=frozenset({"ddp-step"}),
    ),
    Shape(
        "comm-hook",
        "comm-hook",
        "allreduce_hook",
        """\
        def allreduce_hook(state, bucket):
            tensor = bucket.buffer()
            tensor.div_($divide)
            future = dist.all_reduce(tensor, async_op=True).get_future()
            return future.then(lambda f: f.value()[0])
        """,
        dict(divide="dist.get_world_size()"),
        families=frozenset({"hook"}),
    ),
    Shape(
        "comm-hook-state",
        "comm-hook",
        "scaled_hook",
        """\
        class ScaleState:
            def __init__(self):
                self.world = dist.get_world_size()
                self.calls = 0


        def scaled_hook(state, bucket):
            state.calls += 1
            tensor = bucket.buffer()
            tensor.div_($state_divide)
            future = dist.all_reduce(tensor, async_op=True).get_future()
            return future.then(lambda f: f.value()[0])
        """,
        dict(state_divide="state.world"),
        options={"hook_state": "ScaleState"},
        families=frozenset({"hook-state"}),
    ),
    Shape(
        "wrapper",
        "wrapper",
        "average_in_backward",
        """\
        def _average(p):
            dist.all_reduce(p.grad)
            p.grad.div_($divide)


        def average_in_backward(module):
            for index, p in enumerate(module.parameters()):
                if p.requires_grad $skip:
                    p.register_post_accumulate_grad_hook(_average)
            return module
        """,
        dict(divide="dist.get_world_size()", skip=""),
        options={"max_micro_batches": 1},
        families=frozenset({"wrapper"}),
    ),
    Shape(
        "loss-agg",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            return ($masked).sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_tokens, world_size",
            masked="loss_mat * loss_mask",
            divide="global_tokens",
            dp="world_size",
        ),
        options={"max_micro_batches": 3},
        families=frozenset({"loss-agg"}),
    ),
    # The sequence-level objectives: verl's seq-mean-token-mean over the global sequence
    # count, and seq-mean-token-sum-norm with its declared constant (4, the data's longest).
    Shape(
        "loss-agg-seq",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            tokens = loss_mask.sum(-1)
            means = (loss_mat * loss_mask).sum(-1) / tokens.clamp(min=1)
            return means.sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_sequences, world_size",
            divide="global_sequences",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "seq-mean-token-mean"},
        families=frozenset({"loss-agg-seq"}),
    ),
    Shape(
        "loss-agg-norm",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            return (loss_mat * loss_mask).sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_sequences, world_size",
            divide="global_sequences * 4",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "seq-mean-token-sum-norm:4"},
        families=frozenset({"loss-agg-norm"}),
    ),
    # Windows of several optimizer steps sharing one generation batch (TRL's
    # steps_per_generation): a token mean normalised by the window's count per step, a
    # sequence mean likewise, and a per-step token mean whose code is handed window counts.
    Shape(
        "loss-agg-window",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            return (loss_mat * loss_mask).sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_tokens, window_tokens, window_steps, world_size",
            divide="window_tokens / window_steps",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "token-mean@window"},
        families=frozenset({"loss-agg-window"}),
    ),
    Shape(
        "loss-agg-seq-window",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            tokens = loss_mask.sum(-1)
            means = (loss_mat * loss_mask).sum(-1) / tokens.clamp(min=1)
            return means.sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_sequences, window_sequences, window_steps, "
            "world_size",
            divide="window_sequences / window_steps",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "seq-mean-token-mean@window"},
        families=frozenset({"loss-agg-seq-window"}),
    ),
    Shape(
        "loss-agg-step-window",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            return (loss_mat * loss_mask).sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_tokens, window_tokens, window_steps, world_size",
            divide="global_tokens",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "token-mean"},
        families=frozenset({"loss-agg-step-window"}),
    ),
    # Packed (padding-free) micro-batches: a sequence mean over segments, each found by the
    # segment ids handed over; padded, flat and packed layouts drawn alike.
    Shape(
        "loss-agg-packed",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            keep = ((segment_ids >= 0) & (loss_mask != 0)).reshape(-1).to(loss_mat.dtype)
            ids = $segments
            n = int(ids.max()) + 1
            sums = torch.zeros(n, dtype=loss_mat.dtype).index_add(
                0, ids, loss_mat.reshape(-1) * keep
            )
            tokens = torch.zeros(n, dtype=loss_mat.dtype).index_add(0, ids, keep)
            means = sums / tokens.clamp(min=1)
            return means.sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, segment_ids, global_sequences, world_size",
            segments="segment_ids.reshape(-1).clamp(min=0)",
            divide="global_sequences",
            dp="world_size",
        ),
        options={"max_micro_batches": 3, "objective": "seq-mean-token-mean"},
        families=frozenset({"loss-agg-packed"}),
    ),
    # Objectives of several terms: a policy token mean, a KL term's sequence mean and an
    # auxiliary term computed within each micro-batch over its routed tokens (verl's and
    # OpenRLHF's actor losses, a MoE load-balancing term); and an SFT term beside a DPO-style
    # sequence-sum term, each over the whole step.
    Shape(
        "loss-agg-terms",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            m = loss_mask.to(loss_mat.dtype)
            main = (loss_mat * m).sum() / ($divide)
            kl_term = $kl_sum / ($kl_divide)
            r = $routed
            aux_term = (aux * r).sum() / r.sum().clamp(min=1) / ($aux_divide)
            return (main + $kl_weight * kl_term + 0.01 * aux_term) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, kl, aux, routed, global_tokens, global_sequences, "
            "accumulation_steps, world_size",
            divide="global_tokens",
            kl_sum="((kl * m).sum(-1) / m.sum(-1).clamp(min=1)).sum()",
            kl_divide="global_sequences",
            routed="routed.to(aux.dtype)",
            aux_divide="accumulation_steps * world_size",
            kl_weight="0.1",
            dp="world_size",
        ),
        options={
            "max_micro_batches": 3,
            "objective": "token-mean(loss) + 0.1*seq-mean-token-mean(kl) "
            "+ 0.01*token-mean@micro(aux[routed])",
        },
        families=frozenset({"loss-agg-terms"}),
    ),
    Shape(
        "loss-agg-terms-nll",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            m = loss_mask.to(loss_mat.dtype)
            main = (loss_mat * m).sum(-1).sum() / ($divide)
            nll_term = $nll_sum / ($nll_divide)
            return (main + $nll_weight * nll_term) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, nll, global_tokens, global_sequences, "
            "accumulation_steps, world_size",
            divide="global_sequences",
            nll_sum="(nll * m).sum()",
            nll_divide="global_tokens",
            nll_weight="0.5",
            dp="world_size",
        ),
        options={
            "max_micro_batches": 3,
            "objective": "seq-mean-token-sum(loss) + 0.5*token-mean(nll)",
        },
        families=frozenset({"loss-agg-terms-nll"}),
    ),
    # A declared sum: no normaliser, the dp factor undoing DDP's average.
    Shape(
        "loss-agg-sum",
        "loss-agg",
        "agg_loss",
        """\
        def agg_loss($signature):
            return (loss_mat * loss_mask).sum() / ($divide) * $dp
        """,
        dict(
            signature="loss_mat, loss_mask, global_tokens, world_size", divide="1", dp="world_size"
        ),
        options={"max_micro_batches": 3, "objective": "sum"},
        families=frozenset({"loss-agg-sum"}),
    ),
    # A declared sum of sample losses: the ranks' summed gradients and losses add, nothing
    # divides; what is right for a mean is a mistake here.
    Shape(
        "grad-sync-sum",
        "grad-sync",
        "sync_sum",
        """\
        def sync_sum(model, num_samples):
            total = torch.tensor([float(num_samples)], dtype=torch.float64)
            dist.all_reduce(total)
            total = total.item()
            for p in model.parameters():
                if p.grad is None:
                    continue
                p.grad.mul_($weight)
                dist.all_reduce(p.grad)
                p.grad.div_($divide)
        """,
        dict(weight="1", divide="1"),
        options={"objective": "sum"},
        families=frozenset({"sum"}),
    ),
    Shape(
        "loss-sum",
        "loss",
        "global_sum",
        """\
        def global_sum(local_loss, num_samples):
            pair = torch.stack(
                [local_loss.detach().double() * $weight, torch.tensor(float(num_samples)).double()]
            )
            dist.all_reduce(pair)
            total = pair[1].item()
            return (pair[0] / ($divide)).item()
        """,
        dict(weight="1", divide="1"),
        options={"objective": "sum"},
        families=frozenset({"sum"}),
    ),
    Shape(
        "step-sum",
        "step",
        "step_sum",
        """\
        def step_sum(model, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            local = 0.0
            for x, y in micro_batches:
                $zero_inside
                loss = loss_fn(model(x), y) * $mb_weight
                loss.backward()
                local += loss.item()
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_($divide)
            optimizer.step()
            total = torch.tensor([local], dtype=torch.float64)
            dist.all_reduce(total)
            return total.item() / ($divide)
        """,
        dict(zero_inside="", mb_weight="1", divide="1"),
        options={"max_micro_batches": 3, "objective": "sum"},
        families=frozenset({"sum-step"}),
    ),
    # A loss that couples samples across ranks: CLIP's, features gathered with gradients.
    Shape(
        "coupled-clip",
        "coupled-loss",
        "clip",
        """\
        import torch.distributed.nn


        def clip(features_a, features_b, logit_scale):
            if dist.get_world_size() > 1:  # one process has nothing to gather
                $gather
            else:
                all_a, all_b = features_a, features_b
            logits = logit_scale * all_a @ all_b.T
            labels = torch.arange(len(logits))
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            return loss * $factor
        """,
        dict(gather=_GATHER_WITH_GRAD, factor="1"),
        options={"even": True},
        families=frozenset({"coupled"}),
    ),
    # The same with the temperature a parameter with a default, as InfoNCE code writes it:
    # never taken for a feature tensor.
    Shape(
        "coupled-temperature",
        "coupled-loss",
        "info_nce",
        """\
        import torch.distributed.nn


        def info_nce(features_a, features_b, temperature=0.5):
            if dist.get_world_size() > 1:  # one process has nothing to gather
                $gather
            else:
                all_a, all_b = features_a, features_b
            logits = all_a @ all_b.T / temperature
            labels = torch.arange(len(logits))
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            return loss * $factor
        """,
        dict(gather=_GATHER_WITH_GRAD, factor="1"),
        options={"even": True},
        # No learned parameter: gradients that stay local are 1/W of the right ones (every
        # rank computes the same loss), a scale, and copies without gradients leave nothing
        # to train; the mistakes whose truth holds without a learned parameter apply.
        families=frozenset({"coupled-fixed"}),
    ),
    # Each rank's anchors against every rank's positives, ranks holding different numbers
    # of pairs: sizes exchanged, the gather padded and cut back, the rank's summed loss
    # weighted by its share of the pairs.
    Shape(
        "coupled-mnrl",
        "coupled-loss",
        "mnrl",
        """        import torch.distributed.nn


        def mnrl(anchors, positives):
            world, rank = dist.get_world_size(), dist.get_rank()
            size = torch.tensor([anchors.shape[0]])
            sizes = [torch.zeros_like(size) for _ in range(world)]
            dist.all_gather(sizes, size)
            sizes = [int(n) for n in sizes]
            longest = max(sizes)
            pad = positives.new_zeros(longest - sizes[rank], positives.shape[1])
            padded = torch.cat([positives, pad])
            parts = torch.distributed.nn.all_gather(padded)
            candidates = torch.cat([p[:n] for p, n in zip(parts, sizes)])
            scores = 10.0 * anchors @ candidates.T
            labels = (torch.arange(anchors.shape[0]) + $offset) % max(len(candidates), 1)
            summed = F.cross_entropy(scores, labels, reduction="sum")
            return $reduce
        """,
        dict(offset="sum(sizes[:rank])", reduce="summed * world / sum(sizes)"),
        families=frozenset({"coupled-uneven"}),
    ),
)


_PREVIOUS = _lines(
    "_seen = []",
    "",
    "",
    "def _previous(total):",
    "    _seen.append(total)",
    "    return _seen[-2] if len(_seen) > 1 else total",
    indent=0,
)
_CACHE = "_cache = {}"
_CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)"
_RENORMALISED = "torch.tensor(float(num_samples), dtype=torch.float64) / num_samples * num_samples"
_USERS_CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)"
_SKIP_FIRST = _lines("if index == 0:", "    continue", indent=8)
_UNSCALE_BY_HAND = _lines(
    "for p in model.parameters():",
    "    if p.grad is not None:",
    "        p.grad.div_(scaler.get_scale())",
    indent=4,
)
_ZERO_FILL = _lines("p.grad = torch.zeros_like(p)", indent=12)

OPERATORS = (
    Operator(
        "world-average",
        "gradients or losses averaged by the world size, not weighted by counts",
        {
            "grad": {"weight": "1", "divide": "dist.get_world_size()"},
            "grad32": {"weight": "1", "divide": "dist.get_world_size()"},
            "report": {"weight": "1", "divide": "dist.get_world_size()"},
            "metric": {"weight": "1", "divide": "dist.get_world_size()"},
            "step": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
            "step-packed": {"mb_weight": "n / local", "divide": "dist.get_world_size()"},
            "step-recipe": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
            "step-clip": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
            "step-shard": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
            "ddp-step": {"mb_weight": "len(y) / local"},
            "token-loss-flat": {"signature": "source, target", "divide": "(target != -100).sum()"},
            "step-zero": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
            "step-scaler": {"mb_weight": "len(y) / local", "divide": "dist.get_world_size()"},
        },
        frozenset({"ranks:world", "loss:world", "micro:equal", "micro:own-mean"}),
    ),
    Operator(
        "no-divide",
        "summed over ranks, never divided",
        {
            "grad": {"divide": "1"},
            "grad32": {"weight": "count"},
            "report": {"divide": "1"},
            "metric": {"divide": "1"},
            "step": {"divide": "1"},
            "step-packed": {"divide": "1"},
            "step-shard": {"divide": "1"},
            "hook": {"divide": "1"},
            "hook-state": {"state_divide": "1"},
            "wrapper": {"divide": "1"},
            "token-loss-flat": {"divide": "1"},
            "token-loss-3d": {"divide": "1"},
            "token-loss-causal": {"divide": "1"},
            "token-loss-packed": {"divide": "1"},
            "loss-agg": {"divide": "1"},
            "loss-agg-seq": {"divide": "1"},
            "step-zero": {"divide": "1"},
            "step-scaler": {"divide": "1"},
        },
        frozenset({"scale", "ranks:sum", "loss:item-sum"}),
    ),
    Operator(
        "divided-twice",
        "divided by the count twice",
        {
            "grad": {"divide": "total * total"},
            "grad32": {"divide": "total"},
            "report": {"divide": "total * total"},
            "metric": {"divide": "total * total"},
            "step": {"divide": "total.item() ** 2"},
            "step-shard": {"divide": "total.item() ** 2"},
            "hook": {"divide": "dist.get_world_size() ** 2"},
            "wrapper": {"divide": "dist.get_world_size() ** 2"},
            "token-loss-flat": {"divide": "num_items_in_batch ** 2"},
            "token-loss-3d": {"divide": "num_tokens ** 2"},
            "loss-agg": {"divide": "global_tokens ** 2"},
            "loss-agg-seq": {"divide": "global_sequences ** 2"},
        },
        frozenset({"scale", "loss:scaled"}),
    ),
    Operator(
        "scale-w",
        "the result scaled by the world size",
        {
            "grad": {"divide": "total / dist.get_world_size()"},
            "report": {"divide": "total / dist.get_world_size()"},
            "step": {"divide": "total.item() / dist.get_world_size()"},
            "ddp-step": {"mb_weight": "len(y) * world * world / total.item()"},
            "hook-state": {"state_divide": "1 / state.world"},
            "token-loss-causal": {"divide": "num_items_in_batch / dist.get_world_size()"},
        },
        frozenset({"scale", "loss:scaled"}),
    ),
    Operator(
        "means-over-count",
        "each rank's mean summed and divided by the global count",
        {
            "grad": {"weight": "1"},
            "grad32": {"weight": "1 / total"},
            "report": {"weight": "1"},
        },
        frozenset({"ranks:means-over-count", "loss:means-over-count"}),
    ),
    Operator(
        "own-count",
        "each micro-batch normalised by its own token count",
        {
            "token-loss-flat": {"divide": "(target != -100).sum()"},
            "token-loss-3d": {"divide": "(labels != -100).sum()"},
            "token-loss-causal": {"divide": "(labels[:, 1:] != -100).sum()"},
        },
        frozenset({"micro:equal", "micro:own-mean", "ranks:sum", "scale", "ranks:world"}),
    ),
    Operator(
        "micro-mean",
        "a mean of micro-batch means (divided by the accumulation steps)",
        {
            "step": {"mb_weight": "1 / len(micro_batches)", "divide": "dist.get_world_size()"},
            "ddp-step": {"mb_weight": "1 / len(micro_batches)"},
        },
        frozenset({"micro:equal", "ranks:world"}),
    ),
    Operator(
        "stale-count",
        "the global count computed on the first call and cached",
        {
            "count": {
                "state": _CACHE,
                "total": "_cache.setdefault('total', " + "$total_default)",
            },
        },
        frozenset({"state:carried"}),
    ),
    Operator(
        "previous-count",
        "the global count from the previous step",
        {"count": {"state": _PREVIOUS, "total": "_previous($total_default)"}},
        frozenset({"state:carried"}),
    ),
    Operator(
        "clip-before-sync",
        "gradients clipped per rank before they are combined",
        {
            "grad": {"pre": _CLIP},
            "grad32": {"pre": _CLIP},
            "step": {"pre": _CLIP},
            "step-clip": {"pre": _USERS_CLIP, "clip_after": ""},
            "step-shard": {"pre": _CLIP},
            "step-zero": {"pre": _CLIP},
        },
        frozenset({"clip"}),
    ),
    Operator(
        "zero-grad-inside",
        "zero_grad() inside the accumulation loop",
        {
            "step": {"zero_inside": "optimizer.zero_grad()"},
            "step-packed": {"zero_inside": "optimizer.zero_grad()"},
            "step-recipe": {"zero_inside": "optimizer.zero_grad()"},
            "step-shard": {"zero_inside": "optimizer.zero_grad()"},
            "ddp-step": {"zero_inside": "optimizer.zero_grad()"},
            "step-zero": {"zero_inside": "optimizer.zero_grad()"},
        },
        frozenset({"micro:last-only"}),
    ),
    Operator(
        "flag-first-only",
        "DDP's sync flag on for the first micro-batch, not the last",
        {"sync-flag": {"flag": "i == 0"}},
        frozenset({"micro:unsynced", "sync:left-out", "ranks:own", "micro:other"}),
    ),
    Operator(
        "label-zero-as-padding",
        "label 0 taken for padding: the tokens whose target is 0 left out of the loss",
        {"token-loss-mask": {"mask": "labels > 0"}},
        frozenset({"label:dropped"}),
    ),
    Operator(
        "mask-never-applied",
        "the mask built and never applied: padding and ignored tokens counted as class 0",
        {"token-loss-mask": {"mask": "torch.ones_like(labels)"}},
        frozenset({"label:ignored-counted"}),
    ),
    Operator(
        "zero-count",
        "the rank's count divided out and back in (a local re-normalisation): 0/0 on a rank "
        "that holds no sample",
        {"grad": {"weight": _RENORMALISED}},
        frozenset({"nan:empty-rank"}),
    ),
    Operator(
        "wrong-group",
        "divided by the size of a group of its own (a node's) where the world's is due",
        {"hook-group": {"group": 'groups["own"][dist.get_rank()]'}},
        frozenset({"scale"}),
    ),
    Operator(
        "int-truncated",
        "the loss sum held in an integer tensor before it is reduced",
        {"report": {"allreduce": "pair = pair.long(); dist.all_reduce(pair)"}},
        frozenset({"loss:integer"}),
    ),
    Operator(
        "shard-not-broadcast",
        "each rank steps the parameters it owns and never broadcasts them: the others keep "
        "their old values",
        {"step-zero": {"gather": "pass"}},
        frozenset({"params:stale"}),
    ),
    Operator(
        "owner-mismatch",
        "gradients reduced onto one rank and stepped there, the parameter broadcast from "
        "another, which never stepped it: the update undone",
        {"step-zero": {"owner": "(i + 1) % world"}},
        frozenset({"params:replaced"}),
    ),
    Operator(
        "unscaled-twice",
        "the gradients divided by the loss scale by hand and then unscaled again by the "
        "scaler's step",
        {"step-scaler": {"unscale": _UNSCALE_BY_HAND}},
        frozenset({"scale"}),
    ),
    Operator(
        "scaler-bypassed",
        "the optimizer stepped directly, not through the scaler: the gradients still scaled",
        {"step-scaler": {"step": "optimizer.step()", "update": ""}},
        frozenset({"scale"}),
    ),
    Operator(
        "ema-left-in",
        "the running average copied into the model after each step and never swapped back",
        {"step-ema": {"swap": "p.copy_(average[n])"}},
        frozenset({"params:replaced"}),
    ),
    Operator(
        "scheduler-per-micro-batch",
        "the user's warm-up stepped once per micro-batch, not once per optimizer step",
        {"step-recipe": {"tick_inside": "scheduler.step()", "tick_after": ""}},
        frozenset({"optimizer:settings"}),
    ),
    Operator(
        "step-per-micro-batch",
        "the optimizer stepped once per micro-batch",
        {"ddp-step": {"step_inside": "optimizer.step()"}},
        frozenset({"step:each-micro-batch"}),
    ),
    Operator(
        "sync-first-micro-batch-only",
        "gradients synchronised after the first micro-batch only",
        {
            "step": {
                "sync_inside": _lines(
                    "if i == 0:",
                    "    for p in model.parameters():",
                    "        if p.grad is not None:",
                    "            dist.all_reduce(p.grad)",
                    "            p.grad.div_(total.item())",
                    indent=8,
                ),
                "sync_after": "",
            }
        },
        frozenset({"micro:unsynced", "sync:left-out", "ranks:own", "micro:other"}),
    ),
    Operator(
        "parameter-left-out",
        "one parameter never synchronised",
        {"grad-loop": {"skip": _SKIP_FIRST}, "wrapper": {"skip": "and index > 0"}},
        frozenset({"partial-sync", "sync:left-out"}),
    ),
    Operator(
        "zero-fill-unused",
        "a zero gradient made for a parameter forward never used, and averaged by world size",
        {"grad-loop": {"unused": _ZERO_FILL, "weight": "1", "divide": "dist.get_world_size()"}},
        frozenset({"ranks:world"}),
    ),
    Operator(
        "local-report",
        "the reported loss is the rank's own",
        {"report": {"allreduce": "pass"}},
        frozenset({"loss:local", "loss:scaled"}),
    ),
    Operator(
        "dp-forgotten",
        "the data-parallel factor forgotten: DDP's average divides once more",
        {
            "loss-agg": {"dp": "1"},
            "loss-agg-seq": {"dp": "1"},
            "loss-agg-norm": {"dp": "1"},
            "loss-agg-sum": {"dp": "1"},
            "loss-agg-window": {"dp": "1"},
            "loss-agg-step-window": {"dp": "1"},
            "loss-agg-packed": {"dp": "1"},
            "loss-agg-terms": {"dp": "1"},
            "loss-agg-terms-nll": {"dp": "1"},
        },
        frozenset({"scale"}),
    ),
    Operator(
        "dp-twice",
        "the data-parallel factor applied twice",
        {
            "loss-agg": {"dp": "world_size * world_size"},
            "loss-agg-seq": {"dp": "world_size * world_size"},
        },
        frozenset({"scale"}),
    ),
    Operator(
        "rank-count",
        "a per-rank denominator: the rank's tokens, not the step's",
        {
            "loss-agg": {
                "signature": "loss_mat, loss_mask, rank_tokens, world_size",
                "divide": "rank_tokens",
            },
            "loss-agg-seq": {
                "signature": "loss_mat, loss_mask, rank_sequences, world_size",
                "divide": "rank_sequences",
            },
            "loss-agg-packed": {
                "signature": "loss_mat, loss_mask, segment_ids, rank_sequences, world_size",
                "divide": "rank_sequences",
            },
            "loss-agg-norm": {
                "signature": "loss_mat, loss_mask, rank_sequences, world_size",
                "divide": "rank_sequences * 4",
            },
        },
        # verl's dp factor undoes DDP's average: each rank's mean counted 1, summed.
        frozenset({"ranks:sum", "loss:sum"}),
    ),
    Operator(
        "micro-count",
        "a per-micro-batch denominator: each micro-batch's own tokens",
        {
            "loss-agg": {
                "signature": "loss_mat, loss_mask, world_size",
                "divide": "loss_mask.sum()",
            },
            "loss-agg-seq": {
                "signature": "loss_mat, loss_mask, world_size",
                "divide": "(tokens > 0).sum()",
            },
        },
        # Every micro-batch's own mean counted 1 (the dp factor undoes DDP's average): ranks
        # and micro-batches summed, each alike whatever its tokens.
        frozenset({"ranks:sum", "micro:equal", "micro:own-mean", "scale", "loss:sum"}),
    ),
    Operator(
        "mean-for-sum",
        "a token mean where the sum was declared: divided by the step's tokens",
        {"loss-agg-sum": {"divide": "global_tokens"}},
        frozenset({"scale", "objective:other"}),
    ),
    Operator(
        "row-count",
        "a sequence mean over the micro-batch's rows, blank sequences counted (TRL's grpo)",
        {
            "loss-agg-seq": {
                "signature": "loss_mat, loss_mask, accumulation_steps",
                "divide": "loss_mask.shape[0] * accumulation_steps",
                "dp": "1",
            }
        },
        # Each micro-batch's mean over its rows, 1/M of its rank, ranks averaged by DDP.
        frozenset({"micro:rows"}),
    ),
    Operator(
        "padded-width",
        "the declared constant replaced by the micro-batch's padded width (verl's fallback)",
        {"loss-agg-norm": {"divide": "global_sequences * loss_mask.shape[-1]"}},
        frozenset({"micro:padded-width"}),
    ),
    Operator(
        "sum-averaged",
        "a declared sum averaged over ranks, as a mean's sync does: 1/W of it",
        {
            "sum": {"divide": "dist.get_world_size()"},
            "sum-step": {"divide": "dist.get_world_size()"},
        },
        frozenset({"scale", "loss:scaled"}),
    ),
    Operator(
        "sum-weighted-as-mean",
        "the ranks' sums weighted by their shares of the samples, as a mean's average is",
        {"sum": {"weight": "num_samples", "divide": "total"}},
        frozenset({"ranks:shares", "loss:shares"}),
    ),
    Operator(
        "sum-over-count",
        "a declared sum divided by the step's samples: the mean",
        {"sum": {"divide": "total"}},
        frozenset({"scale", "loss:scaled"}),
    ),
    Operator(
        "sum-micro-mean",
        "a declared sum's micro-batches divided by the accumulation steps",
        {"sum-step": {"mb_weight": "1 / len(micro_batches)"}},
        frozenset({"scale", "micro:equal"}),
    ),
    Operator(
        "sum-zero-grad-inside",
        "zero_grad() inside the accumulation loop of a declared sum",
        {"sum-step": {"zero_inside": "optimizer.zero_grad()"}},
        frozenset({"micro:last-only"}),
    ),
    Operator(
        "gather-local-put-back",
        "gathered without gradients, the local features put back (open_clip's default)",
        {"coupled": {"gather": _GATHER_COPIES, "substitute": _SUBSTITUTE}},
        frozenset({"coupled:local-gradient"}),
    ),
    Operator(
        "gather-copies",
        "gathered without gradients, every feature a copy",
        {"coupled": {"gather": _GATHER_COPIES, "substitute": ""}},
        frozenset({"coupled:no-feature-gradient"}),
    ),
    Operator(
        "one-view-without-grad",
        "one view gathered with gradients, the other without (the local features put back)",
        {
            "coupled": {"gather": _GATHER_B_WITHOUT_GRAD},
            "coupled-fixed": {"gather": _GATHER_B_WITHOUT_GRAD},
        },
        frozenset({"coupled:constant-tower"}),
    ),
    Operator(
        "local-negatives",
        "no gather: negatives from the local batch only",
        {
            "coupled": {"gather": "all_a, all_b = features_a, features_b"},
            "coupled-fixed": {"gather": "all_a, all_b = features_a, features_b"},
        },
        frozenset({"coupled:local-negatives"}),
    ),
    Operator(
        "times-world",
        "the loss multiplied by the world size where gradients already cross ranks",
        {
            "coupled": {"factor": "dist.get_world_size()"},
            "coupled-fixed": {"factor": "dist.get_world_size()"},
        },
        frozenset({"coupled:scale"}),
    ),
    Operator(
        "rank-mean",
        "each rank's loss the mean over its own pairs, ranks weighted equally by DDP",
        {"coupled-uneven": {"reduce": "summed / max(anchors.shape[0], 1)"}},
        frozenset({"coupled:ranks-equal"}),
    ),
    Operator(
        "offset-by-local-batch",
        "positives labelled by rank x local batch, wrapped into the batch",
        {"coupled-uneven": {"offset": "rank * anchors.shape[0]"}},
        frozenset({"coupled:wrong-positives"}),
    ),
    Operator(
        "mask-forgotten",
        "the per-token losses summed without the mask: prompt and padding counted",
        {"loss-agg": {"masked": "loss_mat"}},
        frozenset({"mask:ignored"}),
    ),
    Operator(
        "row-as-sequence",
        "each packed row taken for a sequence (the segment ids unused)",
        {
            "loss-agg-packed": {
                "segments": "torch.arange(loss_mat.shape[0]).repeat_interleave(loss_mat.shape[1])"
            }
        },
        frozenset({"packed:rows"}),
    ),
    Operator(
        "packed-row-count",
        "a sequence mean over the micro-batch's packed rows, not its sequences (TRL's grpo "
        "normaliser on packed rows)",
        {
            "loss-agg-packed": {
                "signature": "loss_mat, loss_mask, segment_ids, accumulation_steps",
                "divide": "loss_mat.shape[0] * accumulation_steps",
                "dp": "1",
            }
        },
        frozenset({"micro:rows"}),
    ),
    Operator(
        "position-ids-dropped",
        "the model called on packed rows without their position_ids: each sequence attends "
        "to the ones packed before it in its row, and takes their positions",
        {"step-packed": {"forward": 'b["input_ids"]'}},
        frozenset({"packed:disagrees"}),
    ),
    Operator(
        "boundary-unmasked",
        "packed rows' boundaries never masked: each sequence's last position trained to "
        "predict the next one's first token where that label is kept",
        {"token-loss-packed": {"keep": "position_ids[:, 1:] >= 0"}},
        frozenset({"packed:boundary"}),
    ),
    Operator(
        "term-times-accumulation",
        "one term multiplied by the accumulation steps (an NLL term at M times its weight)",
        {
            "loss-agg-terms": {"kl_divide": "global_sequences / accumulation_steps"},
            "loss-agg-terms-nll": {"nll_divide": "global_tokens / accumulation_steps"},
        },
        frozenset({"objective:term"}),
    ),
    Operator(
        "aux-not-divided",
        "the per-micro-batch term not divided by the accumulation steps, the main term right",
        {"loss-agg-terms": {"aux_divide": "world_size"}},
        frozenset({"objective:term"}),
    ),
    Operator(
        "term-other-aggregation",
        "a term aggregated as a token mean where a sequence mean was declared, or the reverse",
        {
            "loss-agg-terms": {"kl_sum": "(kl * m).sum()", "kl_divide": "global_tokens"},
            "loss-agg-terms-nll": {
                "nll_sum": "((nll * m).sum(-1) / m.sum(-1).clamp(min=1)).sum()",
                "nll_divide": "global_sequences",
            },
        },
        frozenset({"objective:term"}),
    ),
    Operator(
        "term-unmasked",
        "a term over every counted token where it declares a mask of its own (routed tokens)",
        {"loss-agg-terms": {"routed": "m"}},
        frozenset({"objective:term"}),
    ),
    Operator(
        "term-sign-flipped",
        "a penalty term added with the wrong sign",
        {"loss-agg-terms": {"kl_weight": "-0.1"}, "loss-agg-terms-nll": {"nll_weight": "-0.5"}},
        frozenset({"objective:term"}),
    ),
    Operator(
        "term-local-count",
        "a term divided by the rank's own count, the main term by the global one",
        {
            "loss-agg-terms-nll": {
                "signature": "loss_mat, loss_mask, nll, global_tokens, global_sequences, "
                "rank_tokens, accumulation_steps, world_size",
                "nll_divide": "rank_tokens",
            },
        },
        frozenset({"objective:term"}),
    ),
    Operator(
        "window-whole-count",
        "each step divided by its window's whole count, not the count per step (TRL before "
        "steps_per_generation was folded in)",
        {
            "loss-agg-window": {"divide": "window_tokens"},
            "loss-agg-seq-window": {"divide": "window_sequences"},
        },
        frozenset({"objective:window"}),
    ),
    Operator(
        "step-count-in-window",
        "each step divided by its own count where the window's normalises",
        {
            "loss-agg-window": {"divide": "global_tokens"},
            "loss-agg-seq-window": {"divide": "global_sequences"},
        },
        frozenset({"objective:window"}),
    ),
    Operator(
        "window-count-per-step",
        "a per-step mean divided by the window's count per step",
        {"loss-agg-step-window": {"divide": "window_tokens / window_steps"}},
        frozenset({"objective:window"}),
    ),
    Operator(
        "window-whole-per-step",
        "a per-step mean divided by the window's whole count",
        {"loss-agg-step-window": {"divide": "window_tokens"}},
        frozenset({"objective:window"}),
    ),
    Operator(
        "sum-of-means",
        "rank means summed, never divided (a sum reduction)",
        {"report": {"weight": "1", "divide": "1"}},
        frozenset({"loss:sum"}),
    ),
)


def _resolved(shape: Shape, operator: Operator) -> Operator:
    """``$total_default`` in an operator's slots is the shape's own total."""
    edits = {
        family: {
            k: v.replace("$total_default", shape.defaults.get("total", "")) for k, v in e.items()
        }
        for family, e in operator.edits.items()
    }
    return Operator(operator.name, operator.words, edits, operator.truth)


def cases() -> Iterator[Case]:
    """Every shape's correct form, then each operator that makes sense on it."""
    for shape in SHAPES:
        yield Case(shape, None)
        for operator in OPERATORS:
            if any(family in shape.families for family in operator.edits):
                yield Case(shape, _resolved(shape, operator))


def check_options(case: Case, module: Any) -> dict[str, Any]:
    """The options ``check()`` gets for ``case``: the shape's, with names resolved in the
    case's module (a hook state factory)."""
    options = dict(case.shape.options)
    for name in ("hook_state", "loss_fn", "optimizer", "scheduler"):
        # The case's own callables, by name; a reference with a colon is a library's.
        if name in options and ":" not in options[name]:
            options[name] = getattr(module, options[name])
    return options
