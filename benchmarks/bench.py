"""ddp_verify's cost next to its two yardsticks: the floor and the usual way.

    python benchmarks/bench.py [--sizes 2,4] [--kinds ddp,grad-sync,...] [--examples 40]
        [--rounds 5] [--usual 3] [--repeats 3] [--cli-examples 100] [--device cpu|cuda]
        [--out benchmarks/results/bench.json]

``--device cuda`` trains on GPUs everywhere (the harness's ranks, the floor's and the usual
way's, ranks sharing GPUs round-robin, all over gloo) and writes ``bench_cuda.json``.

For each world size, one run measures:

- start-up: ``World(n).start()`` in a fresh controller (torch already imported there; the
  fork server imports it for the ranks) and again once the controller has a world already
  (a relaunch, or a second world size), next to a bare spawn of n interpreters that import
  torch and init a gloo group (the floor for start-up);
- the round trip of a job that does nothing and of a trivial job (one all-reduce) on a warm
  world;
- per example, on the same fixed list of scenarios (the default ``scenarios()`` strategy,
  derandomized): a full check of ``ddp()`` against the reference, and a check of the
  ``grad-sync`` plug-in ``fixtures/grad_sync.py:sample_weighted``; each timed from the
  controller, reference and comparison included, ``--rounds`` times alternated with its
  floor (below), the fastest round of each counting;
- the **floor** for the same work: the same training steps and collectives run by a bare
  persistent-worker loop (plain multiprocessing workers, one process group, a scenario in, a
  number out), no harness around them;
- a correct training step (``fixtures/step.py:accumulate_weighted``) checked on the same
  scenarios judged by the oracle and by its own run on one rank holding the whole batch (the
  harness's loss handed in as the user's: what makes a step's reference its own); the target
  is ``own/oracle`` at most 1.2;
- a sequence mean over segments (a loss-agg plug-in) checked on the same scenarios padded
  and packed (flat or in rows): the same tokens, only the layout handed over differs; the
  target is ``packed/pad`` at most 1.2; and likewise a causal-LM loss masking each packed
  sequence's start (a loss-fn plug-in), ``packed/pad loss-fn`` at most 1.2, and a training
  step over dict micro-batches whose model is told the ``position_ids`` (a step plug-in, the
  model run on the packed rows), ``packed/pad step`` at most 1.2;
- the **usual way** for the same work: a fresh ``torch.multiprocessing.spawn`` world per
  example, as spawn-based test suites do (timed last, after every other figure);
- ``ddp-verify check fixtures/grad_sync.py:sample_weighted --kind grad-sync`` with 100
  examples, start-up included, as a user runs it, next to its budget: the floor's work for as
  many examples, plus a bare ``python -c "import torch"`` (ended by ``os._exit``, as the
  command ends), plus a bare world start (the target is within 1.1 times that);
- a world-averaged ``grad-sync`` function (a mistake on uneven batches) checked on the warm
  world with ``world.check``: from its first failing example to the report, split into
  shrinking (its examples, next to the same scenarios trained at the floor, and
  hypothesis's own search around them) and the diagnosis; and what probing a loss's
  logits layout adds (the same loss checked with its layout probed, then pinned);
- that diagnosis's reproducer run as a user runs it (``python PATH``; not in ``--quick``), next
  to its floor: a bare ``python -c "import torch, torch._dynamo"`` (torch's optimizers import
  ``torch._dynamo`` at their first step), ended by ``os._exit`` as a reproducer ends;
- peak resident memory of the controller and of the largest rank.

It prints medians and the ratios harness/floor (of the medians, and of the totals over the
same scenarios) and usual-way/harness, and writes everything as JSON. Plan on about seven
minutes on two cores (``--quick``: about half a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(ROOT / "fixtures" / "real_style"))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: one thread per process

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from grad_sync import average_gradients, sample_weighted  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from lm_losses import masked_lm_loss  # noqa: E402
from open_clip_losses import clip_loss_gather_with_grad  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from verl_losses import token_mean_over_global_tokens  # noqa: E402

from ddp_verify import VerifyingWorld  # noqa: E402
from ddp_verify.engine import compat  # noqa: E402
from ddp_verify.engine.models import build_data, build_model, build_optimizer, loss_function  # noqa: E402
from ddp_verify.engine.reference import train_reference  # noqa: E402
from ddp_verify.engine.scenario import Scenario  # noqa: E402
from ddp_verify.methods import ddp  # noqa: E402
from ddp_verify.methods.base import train_whole_variants  # noqa: E402
from ddp_verify.strategies import coupled_scenarios, scenarios  # noqa: E402
from ddp_verify.usercode import search as search_module  # noqa: E402
from ddp_verify.usercode.adapters import adapt  # noqa: E402
from ddp_verify.usercode.diagnosis.coupled import coupled_bounds  # noqa: E402
from ddp_verify.usercode.search import bounds_for  # noqa: E402
from ddp_verify.usercode.verdict import NotEquivalent  # noqa: E402
from ddp_verify.world import World, rank_device  # noqa: E402
from ddp_verify.world.ports import free_port  # noqa: E402
from ddp_verify.world.runtime import set_rank_device  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bench.json"
# The longest one yardstick sample may take (a spawned world, a bare start) before it is
# ended and counted as failed.
SAMPLE_TIMEOUT_S = 120.0


STARTED = time.monotonic()


def say(line: str) -> None:
    """Progress, as it goes, with the seconds since the benchmark started (stderr: the table
    and the JSON path go to stdout)."""
    print(f"[bench {time.monotonic() - STARTED:6.1f} s] {line}", file=sys.stderr, flush=True)


def samples(
    name: str, fn: Callable[..., float], count: int, failures: dict[str, str], *inputs: Any
) -> list[float]:
    """``count`` samples of ``fn`` (sample ``i`` given ``inputs[i]``, where given); one that
    raises is tried again on the same input once, and where that fails too it is left out
    and the failure kept in ``failures`` under ``name``: a yardstick that crashes (the plain
    spawn's SIGABRT) never loses the figures measured before it."""
    taken = []
    for i in range(count):
        given = (inputs[i],) if inputs else ()
        for attempt in (1, 2):
            try:
                taken.append(fn(*given))
                break
            except Exception as exc:  # any crash of a yardstick is recorded, not raised
                lines = str(exc).strip().splitlines()
                said = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
                say(f"{name}: sample {i + 1} failed (attempt {attempt} of 2): {said}")
                if attempt == 2:
                    failures[name] = said
    return taken


def median_of(taken: list[float]) -> float | None:
    return statistics.median(taken) if taken else None


# -- the work, bare: what the floor and the usual way run on every rank -------------------------


def bare_ddp(scenario: Scenario) -> float:
    """DDP training of ``scenario`` as the ``ddp()`` method does it, without the trace."""
    device = rank_device()
    model = build_model(scenario, device=device)
    wrapped = DistributedDataParallel(model, find_unused_parameters=scenario.model.unused)
    optimizer = build_optimizer(scenario.optimizer, wrapped.parameters())
    loss_fn, rank, size = loss_function(scenario), dist.get_rank(), dist.get_world_size()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for step, (inputs, targets) in enumerate(build_data(scenario, device=device)):
        optimizer.zero_grad(set_to_none=True)
        weight = size / scenario.global_batch(step)
        start = scenario.offset(step, rank)
        sizes = scenario.schedule[step][rank]
        local = torch.zeros((), dtype=torch.float64, device=device)
        for j, m in enumerate(sizes):
            x, y = inputs[start : start + m], targets[start : start + m]
            start += m
            with contextlib.nullcontext() if j == len(sizes) - 1 else wrapped.no_sync():
                loss = loss_fn(wrapped(x), y)
                (loss * (m * weight)).backward()
            local += loss.detach().double() * m
        dist.all_reduce(local)
        optimizer.step()
        total += local
    return float(total)


def bare_grad_sync(scenario: Scenario) -> float:
    """Local backward of each rank's mean loss, the user's ``sample_weighted``, one step."""
    device = rank_device()
    model = build_model(scenario, device=device)
    optimizer = build_optimizer(scenario.optimizer, model.parameters())
    loss_fn, rank = loss_function(scenario), dist.get_rank()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for step, (inputs, targets) in enumerate(build_data(scenario, device=device)):
        optimizer.zero_grad(set_to_none=True)
        n = scenario.samples(step)[rank]
        start = scenario.offset(step, rank)
        local = torch.zeros((), dtype=torch.float64, device=device)
        for m in scenario.schedule[step][rank]:
            outputs = model(inputs[start : start + m])
            if m == 0:
                # An empty micro-batch (a rank holding no sample): zero gradients, as the
                # check's loss gives it, so that every rank syncs every parameter.
                (outputs.sum() * 0.0).backward()
                continue
            loss = loss_fn(outputs, targets[start : start + m])
            (loss * (m / n)).backward()
            local += loss.detach().double() * m
            start += m
        sample_weighted(model, n)
        dist.all_reduce(local)
        optimizer.step()
        total += local
    return float(total)


# The loss-agg and coupled-loss kinds' floors train as the kind's own rank job does (token
# losses through verl's correct token mean; a CLIP loss gathered with gradients), called
# directly in the bare workers: the floor keeps their training and collectives and drops
# the harness around them (the world's protocol, the comparison, the probes).
OWN_JOB = {
    "loss-agg": adapt(token_mean_over_global_tokens, "loss-agg"),
    "coupled-loss": adapt(clip_loss_gather_with_grad, "coupled-loss"),
}
COUPLED = OWN_JOB["coupled-loss"]


def own_rank_job(kind: str) -> Callable[[Scenario], float]:
    def job(scenario: Scenario) -> float:
        trace = OWN_JOB[kind].train_rank(scenario)
        return trace.losses[-1] if trace.losses else 0.0

    return job


WORK: dict[str, Callable[[Scenario], float]] = {
    "ddp": bare_ddp,
    "grad-sync": bare_grad_sync,
    "loss-agg": own_rank_job("loss-agg"),
    "coupled-loss": own_rank_job("coupled-loss"),
}


# The kinds also timed the usual way (a spawned world per example: seconds each).
USUAL = ("ddp", "grad-sync")


def bare_reference(kind: str, scenario: Scenario) -> float:
    """The reference a check is held to, trained once, in one process: the full batch on one
    model (a coupled loss: the loss itself on one rank holding every pair)."""
    if kind == "coupled-loss":
        return train_whole_variants(COUPLED, scenario, 1)[0].losses[-1]
    return train_reference(scenario, "float64").ranks[0].losses[-1]


def harness_method(kind: str) -> Any:
    if kind == "ddp":
        return ddp()
    if kind in OWN_JOB:
        return OWN_JOB[kind]
    return adapt(sample_weighted, kind)


# -- the floor: a bare persistent-worker loop -----------------------------------------------------


def _use_device(rank: int, device: str) -> None:
    """Train on ``device`` as a harness rank does: cuda:rank, shared round-robin."""
    torch.set_num_threads(1)
    if device == "cuda":
        gpu = rank % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        set_rank_device(f"cuda:{gpu}")


def _floor_worker(rank: int, size: int, port: int, conn: Any, device: str) -> None:
    _use_device(rank, device)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    while (message := conn.recv()) is not None:
        kind, scenario = message
        conn.send(WORK[kind](scenario))
    dist.barrier()
    dist.destroy_process_group()


def _floor_reference(conn: Any) -> None:
    """The floor's reference: one process, a one-rank group of its own (a coupled loss's
    reference calls its collectives), fed scenarios through a pipe."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    while (message := conn.recv()) is not None:
        conn.send(bare_reference(*message))
    dist.destroy_process_group()


class FloorWorkers:
    """``size`` spawned workers in one process group, and (``reference``) one more that
    trains the reference beside them, fed scenarios through pipes."""

    def __init__(self, size: int, device: str, *, reference: bool = True) -> None:
        context = multiprocessing.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        for rank in range(size):
            ours, theirs = context.Pipe()
            proc = context.Process(target=_floor_worker, args=(rank, size, port, theirs, device))
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)
        self.reference: Any = None
        if reference:
            self.reference, theirs = context.Pipe()
            proc = context.Process(target=_floor_reference, args=(theirs,))
            proc.start()
            self.procs.append(proc)

    def run(self, kind: str, scenario: Scenario, *, reference: bool = True) -> None:
        """The ranks' training of ``scenario``, and (``reference``) the reference's beside
        it, as a check trains both."""
        if reference and self.reference is None:
            raise ValueError("these floor workers train no reference: run(..., reference=False)")
        for conn in self.conns:
            conn.send((kind, scenario))
        if reference:
            self.reference.send((kind, scenario))
        for conn in self.conns:
            _receive(conn)
        if reference:
            _receive(self.reference)

    def close(self) -> None:
        for conn in self.conns + ([self.reference] if self.reference is not None else []):
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=SAMPLE_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()


def _receive(conn: Any) -> Any:
    # Never a read without a time-out: a worker that dies or hangs fails the run.
    if not conn.poll(SAMPLE_TIMEOUT_S):
        raise TimeoutError(f"a floor worker gave no answer in {SAMPLE_TIMEOUT_S:.0f} s")
    return conn.recv()


# -- the usual way: a fresh world per example -----------------------------------------------------


def _usual_rank(
    rank: int, size: int, port: int, kind: str, scenario: Scenario, device: str
) -> None:
    _use_device(rank, device)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    WORK[kind](scenario)
    dist.barrier()  # no rank tears its pairs down while a peer still uses them
    dist.destroy_process_group()


def usual_way(size: int, kind: str, scenario: Scenario, device: str) -> float:
    start = time.perf_counter()
    args = (size, free_port(), kind, scenario, device)
    context = mp.spawn(_usual_rank, args=args, nprocs=size, join=False)
    try:
        # join() raises when a rank dies (the SIGABRT this yardstick sometimes ends in).
        while not context.join(timeout=1.0):
            if time.perf_counter() - start > SAMPLE_TIMEOUT_S:
                raise TimeoutError(f"a spawned world outlasted {SAMPLE_TIMEOUT_S:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    return time.perf_counter() - start


# -- start-up and round trips ---------------------------------------------------------------------

_BARE_RANK = """
import sys, torch, torch.distributed as dist
rank, size, port = map(int, sys.argv[1:])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
# torch's first optimizer imports torch._dynamo: a rank that trains pays it before its first
# step (the floor's workers do, in their warm-up).
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).zero_grad()
print("ready", flush=True)
sys.stdin.read()
"""


def bare_start(size: int) -> float:
    """Spawn ``size`` plain interpreters that import torch, init a process group and build
    torch's first optimizer: ready to train."""
    port = free_port()
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", _BARE_RANK, str(r), str(size), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(size)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            # Never a read without a time-out: a rank that dies or hangs fails the sample.
            left = SAMPLE_TIMEOUT_S - (time.perf_counter() - start)
            ready, _, _ = select.select([p.stdout], [], [], max(left, 0.0))
            if not ready or p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a bare rank did not get ready (exit status {p.poll()})")
        elapsed = time.perf_counter() - start
        for p in procs:
            p.communicate("", timeout=SAMPLE_TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return elapsed


def world_start(size: int, device: str) -> float:
    """A world started by a controller that has started one before (warm fork server)."""
    start = time.perf_counter()
    world = World(size, device=device).start()
    elapsed = time.perf_counter() - start
    world.close()
    return elapsed


_COLD_START = """
import sys, time, torch
from ddp_verify.world import World
start = time.perf_counter()
world = World(int(sys.argv[1]), device=sys.argv[2]).start()
print(time.perf_counter() - start)
world.close()
"""


def cold_world_start(size: int, device: str) -> float:
    """The first world of a fresh controller process that has imported torch."""
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _COLD_START, str(size), device],
        capture_output=True,
        text=True,
        check=True,
        timeout=SAMPLE_TIMEOUT_S,
    )
    return float(result.stdout.strip().splitlines()[-1])


def _noop() -> None:
    return None


def _trivial() -> float:
    t = torch.ones(1, device=rank_device())
    dist.all_reduce(t)
    return float(t)


def timed_rounds(
    world: VerifyingWorld,
    floor: FloorWorkers,
    ranks_floor: FloorWorkers,
    kind: str,
    method: Any,
    cases: list[Scenario],
    args: argparse.Namespace,
) -> tuple[list[float], list[float], list[float]]:
    """Each scenario's check, floor and ranks-only floor, timed ``args.rounds`` times (the
    order reversed every other round, so neither side always runs first): per scenario, the
    fastest of its rounds, as ``timeit`` takes the fastest repeat. On two cores shared by
    the controller, the ranks and the reference, another process's slice of the CPU only
    ever adds to a sample (one sample of a 15 ms example moves by a tenth from run to run),
    and both sides are read the same way.

    Each side runs on processes of its own (the ranks-only floor on ``ranks_floor``, not on
    the floor's workers), so every side's processes wait as long between their examples:
    a process that has waited through two other examples runs its next one on cold caches,
    and with the ranks-only floor on the floor's workers those ran two examples in three
    while the check's ran one (check / floor at world size 2 read 1.15-1.28 by the totals
    so, 1.03-1.10 with a side's processes to each; three alternated runs of each)."""
    # taken[side][i]: every round's seconds of side `side` on scenario i.
    taken: list[list[list[float]]] = [[[] for _ in cases] for _ in range(3)]

    def check(scenario: Scenario) -> None:
        outcome = world.check_equivalent(method, scenario)
        assert outcome.equivalent, outcome.report()

    sides: list[Callable[[Scenario], None]] = [
        check,
        lambda scenario: floor.run(kind, scenario),
        lambda scenario: ranks_floor.run(kind, scenario, reference=False),
    ]
    for round_ in range(args.rounds):
        order = range(3) if round_ % 2 == 0 else range(2, -1, -1)
        for i, scenario in enumerate(cases):
            for side in order:
                start = time.perf_counter()
                sides[side](scenario)
                taken[side][i].append(time.perf_counter() - start)
    checks, floors, rank_floors = ([min(t) for t in side] for side in taken)
    return checks, floors, rank_floors


def own_reference(
    world: VerifyingWorld, size: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """A correct training step checked on the same scenarios twice: judged by the engine's
    oracle (the harness's loss), and by its own run on one rank holding the whole batch (the
    same loss handed in as the user's: torch's ``MSELoss`` or ``CrossEntropyLoss``, which is
    what makes a step's reference its own). Per scenario, the fastest of ``args.rounds``
    rounds of each, the order reversed every other round (as :func:`timed_rounds`)."""
    from step import accumulate_weighted

    from ddp_verify.engine.scenario import Recipe
    from ddp_verify.usercode.adapters import adapt

    method = adapt(accumulate_weighted, "step")
    losses = {"mse": "torch.nn:MSELoss", "cross_entropy": "torch.nn:CrossEntropyLoss"}
    cases = [s for s in fixed_scenarios(size, args.examples, "step") if s.loss in losses]
    pairs = [(s, dataclasses.replace(s, recipe=Recipe(loss=losses[s.loss]))) for s in cases]
    # Warm-up first: the one-rank world starts on first use.
    return paired_rounds(world, method, pairs, args.rounds)


def paired_rounds(
    world: VerifyingWorld, method: Any, pairs: list[tuple[Scenario, Scenario]], rounds: int
) -> tuple[list[float], list[float]]:
    """Each pair's two scenarios checked ``rounds`` times, the order reversed every other
    round (as :func:`timed_rounds`), after the first three pairs once as a warm-up: per pair,
    the fastest round of each side."""
    for pair in pairs[:3]:
        for scenario in pair:
            world.check_equivalent(method, scenario)
    taken: list[list[list[float]]] = [[[] for _ in pairs] for _ in range(2)]
    for round_ in range(rounds):
        for i, pair in enumerate(pairs):
            for side in (0, 1) if round_ % 2 == 0 else (1, 0):
                start = time.perf_counter()
                outcome = world.check_equivalent(method, pair[side])
                taken[side][i].append(time.perf_counter() - start)
                assert outcome.equivalent, outcome.report()
    first, second = ([min(t) for t in side] for side in taken)
    return first, second


def packed_checks(
    world: VerifyingWorld, size: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """A sequence mean over segments (``fixtures/real_style/packed_losses.py``) checked on
    the same scenarios padded and packed (each one's micro-batches in one row, or in rows of
    the packer's capacity, alternately): the same tokens, the same reference, only the layout
    the code is handed differs. Per scenario, the fastest of ``args.rounds`` rounds of each,
    the order reversed every other round (as :func:`timed_rounds`)."""
    from packed_losses import seq_mean_by_segment_ids

    method = adapt(seq_mean_by_segment_ids, "loss-agg")
    cases = [
        dataclasses.replace(s, objective="seq-mean-token-mean", packing="")
        for s in fixed_scenarios(size, args.examples, "loss-agg")
    ]
    return paired_rounds(world, method, _padded_and_packed(cases), args.rounds)


def packed_loss_checks(
    world: VerifyingWorld, size: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """A causal-LM loss that shifts its labels and masks each packed sequence's start from
    ``position_ids`` (``fixtures/real_style/packed_lm_losses.py``, a loss-fn plug-in)
    checked on the same token scenarios padded and packed (flat or in rows, alternately):
    the same tokens, only the logits' and labels' layout differs. As :func:`packed_checks`."""
    from packed_lm_losses import causal_lm_loss_masking_boundaries

    method = adapt(causal_lm_loss_masking_boundaries, "loss-fn", layout="labels=unshifted")
    # Token scenarios, as the loss-agg row draws them: a language model's loss meets those.
    cases = [
        dataclasses.replace(s, labels="unshifted", packing="")
        for s in fixed_scenarios(size, args.examples, "loss-agg")
    ]
    return paired_rounds(world, method, _padded_and_packed(cases), args.rounds)


def packed_step_checks(
    world: VerifyingWorld, size: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """A training step over dict micro-batches that tells the model each packed sequence's
    ``position_ids`` (``fixtures/real_style/packed_steps.py``) checked on the same token
    scenarios padded and packed (flat or in rows, alternately): the same tokens, the model
    run on the packed rows. As :func:`packed_checks`."""
    from packed_steps import padding_free_step

    method = adapt(padding_free_step, "step", loss_reduction="sum", layout="batches=dicts")
    # Token scenarios under a token mean: what a packed step is checked under.
    cases = [
        dataclasses.replace(s, objective="", terms="", window=1, packing="")
        for s in fixed_scenarios(size, args.examples, "loss-agg")
    ]
    return paired_rounds(world, method, _padded_and_packed(cases), args.rounds)


def _padded_and_packed(cases: list[Scenario]) -> list[tuple[Scenario, Scenario]]:
    """Each padded scenario beside itself packed, in one row or in rows alternately."""
    return [
        (s, dataclasses.replace(s, packing=("flat", "rows")[i % 2])) for i, s in enumerate(cases)
    ]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn: Callable[[], object], count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def fixed_scenarios(world_size: int, count: int, kind: str = "ddp") -> list[Scenario]:
    # The same list whatever the code around it: hypothesis (from 6.131.1) mixes constants of
    # the local modules into its draws, derandomized or not, so an edit to ddp_verify would
    # change which scenarios a benchmark times.
    compat.without_local_constants()
    drawn: list[Scenario] = []

    @settings(
        max_examples=count, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    # The bounds ddp-verify check draws with, so the floor does the work the CLI run does.
    @given(kind_scenarios(kind, world_size))
    def collect(scenario: Scenario) -> None:
        drawn.append(scenario)

    collect()
    return drawn[:count]


def kind_scenarios(kind: str, world_size: int) -> Any:
    """The scenarios ``ddp-verify check`` draws for ``kind``."""
    if kind == "coupled-loss":
        # open_clip's gather takes as many pairs on every rank (--even-batches).
        bounds = bounds_for(kind, {"even": True})
        return coupled_scenarios(
            world_size=world_size, **coupled_bounds(COUPLED.fn, COUPLED.call, bounds)
        )
    if kind == "ddp":  # a method, not a kind: the bounds of a check
        return scenarios(world_size=world_size, max_micro_batches=3)
    return scenarios(world_size=world_size, **bounds_for(kind, {"max_micro_batches": 3}))


def bare_import_torch() -> float:
    """A fresh interpreter that imports torch and ends: what any tool using torch pays. It
    ends by ``os._exit``, as ``ddp-verify`` does, without tearing torch's modules down (a
    second of CPU a floor need not pay)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import os, torch; os._exit(0)"],
        check=True,
        timeout=SAMPLE_TIMEOUT_S,
    )
    return time.perf_counter() - start


def cli_json(size: int, device: str, target: str, *options: str) -> dict[str, Any]:
    """``ddp-verify check TARGET --json`` as a user runs it: a fresh process, start-up
    included; its verdict, and its wall time under ``wall_s``."""
    command = [
        sys.executable,
        "-m",
        "ddp_verify",
        "check",
        f"{ROOT}/fixtures/{target}",
        "--world-size",
        str(size),
        "--seed",
        "0",
        "--device",
        device,
        "--json",
        *options,
    ]
    start = time.perf_counter()
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=10 * SAMPLE_TIMEOUT_S
    )
    elapsed = time.perf_counter() - start
    try:
        verdict = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"ddp-verify check gave no verdict:\n{result.stderr}") from None
    return {**verdict, "wall_s": elapsed}


def cli_check(size: int, examples: int, device: str) -> float:
    """A correct grad-sync function checked on ``examples`` examples."""
    verdict = cli_json(
        size, device, "grad_sync.py:sample_weighted", "--kind", "grad-sync",
        "--max-examples", str(examples),
    )  # fmt: skip
    if verdict["verdict"] != "equivalent":
        raise RuntimeError(f"ddp-verify check said {verdict['verdict']}:\n{verdict['report']}")
    return float(verdict["wall_s"])


# What the diagnosis row reports (medians over its runs), besides the ratios.
DIAGNOSIS_FIGURES = (
    "to_report_s",
    "shrink_s",
    "examples_s",
    "search_s",
    "shrink_floor_s",
    "diagnosis_s",
    "shrink_examples",
)


@contextlib.contextmanager
def examples_recorded() -> Iterator[list[tuple[Scenario, float]]]:
    """Every example a search checks, with the seconds its check took, in the order run.
    The search calls ``assert_equivalent`` once per example it reaches (a draw hypothesis
    abandons reaches none); the benchmark wraps it, the check itself is unchanged."""
    ran: list[tuple[Scenario, float]] = []
    checked = search_module.assert_equivalent

    def recorded(world: Any, method: Any, scenario: Scenario, **options: Any) -> None:
        start = time.perf_counter()
        try:
            checked(world, method, scenario, **options)
        finally:
            ran.append((scenario, time.perf_counter() - start))

    search_module.assert_equivalent = recorded
    try:
        yield ran
    finally:
        search_module.assert_equivalent = checked


def diagnosis(world: VerifyingWorld, floor: FloorWorkers) -> dict[str, float | str]:
    """A world-averaged grad-sync function (a mistake on uneven batches), from its first
    failing example to the report: shrinking, then the diagnosis. Checked on the benchmark's
    warm world, as ``world.check`` runs it in a test: the milestones are the check's own
    (start-up is the CLI row's). Shrinking's floor is the examples it ran, the same
    scenarios, trained by the floor's workers; what shrinking took beyond its examples is
    hypothesis's own search (drawing, and the tries it abandons before an example)."""
    with examples_recorded() as ran:
        try:
            world.check(average_gradients, kind="grad-sync", seed=0)
        except NotEquivalent as failed:
            verdict = failed.verdict
        else:
            raise RuntimeError("a world-averaged grad-sync passed its check")
    at = dict(verdict.timeline)
    assert verdict.examples is not None and verdict.found_at is not None
    assert verdict.reproducer is not None
    # The examples after the first failing one: shrinking's (the report's replays and
    # probes after it do not go through the search's examples).
    shrinking = ran[verdict.found_at : verdict.examples]
    examples_s = sum(taken for _, taken in shrinking)
    floor_s = 0.0
    for scenario, _ in shrinking:
        start = time.perf_counter()
        floor.run("grad-sync", scenario)
        floor_s += time.perf_counter() - start
    shrink_s = at["shrunk"] - at["first_failure"]
    return {
        "to_report_s": at["report"] - at["first_failure"],
        "shrink_s": shrink_s,
        "examples_s": examples_s,
        "search_s": shrink_s - examples_s,
        "shrink_floor_s": floor_s,
        "diagnosis_s": at["report"] - at["shrunk"],
        "shrink_examples": float(len(shrinking)),
        "reproducer": verdict.reproducer,
    }


def reproducer(path: str) -> float:
    """The diagnosis's reproducer run as a user runs it (``python PATH``): a fresh process
    that starts its own world and trains the one shrunk scenario; it exits 1 while the
    mistake is there."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=SAMPLE_TIMEOUT_S
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 1:
        raise RuntimeError(f"the reproducer exited {result.returncode}:\n{result.stderr}")
    return elapsed


def bare_import_optimizers() -> float:
    """A fresh interpreter importing torch and what torch's optimizers import at their first
    step (``torch._dynamo``): a reproducer's floor, as it trains with them. It ends by
    ``os._exit``, as a reproducer does, without tearing the modules down (two seconds of CPU
    with ``torch._dynamo``)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import os, torch, torch._dynamo; os._exit(0)"],
        check=True,
        timeout=SAMPLE_TIMEOUT_S,
    )
    return time.perf_counter() - start


def layout_probes(world: VerifyingWorld) -> float:
    """What probing a loss's layouts adds to a check: a Hugging Face style loss whose logits
    layout is found by probing, against the same check with the layout pinned (each to the
    end of its precision probe, on the benchmark's warm world)."""
    options: dict[str, Any] = {"kind": "loss-fn", "max_examples": 1, "seed": 0}
    probed = world.check(masked_lm_loss, **options)
    pinned = world.check(masked_lm_loss, **options, logits="3d", labels="aligned")
    return float(dict(probed.timeline)["precision"] - dict(pinned.timeline)["precision"])


def measure(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure at world size ``size``; a yardstick that fails leaves its figure out and
    says why under ``failures``."""
    out: dict[str, Any] = {}
    failures: dict[str, str] = {}
    device = args.device

    def put(key: str, value: float | None, scale: float = 1.0) -> None:
        if value is not None:
            out[key] = value * scale

    def ratio(key: str, over: str, under: str) -> None:
        if over in out and under in out:
            out[key] = out[over] / out[under]

    say(f"world size {size}: start-up (a fresh controller, a bare spawn, a warm start)")
    put(
        "world_start_s",
        median_of(
            samples("world start", lambda: cold_world_start(size, device), args.repeats, failures)
        ),
    )
    put(
        "bare_spawn_and_init_s",
        median_of(samples("bare spawn", lambda: bare_start(size), args.repeats, failures)),
    )
    world_start(size, device)  # the fork server of this process, started once
    put(
        "warm_world_start_s",
        median_of(samples("warm start", lambda: world_start(size, device), args.repeats, failures)),
    )
    ratio("start_world_over_bare", "world_start_s", "bare_spawn_and_init_s")

    with VerifyingWorld(size, device=device) as world:
        say(f"world size {size}: round trips")
        for job, name in ((_noop, "noop"), (_trivial, "trivial")):
            _timed(lambda job=job: world.run(job), 10)  # warm-up
            out[f"{name}_round_trip_ms"] = (
                statistics.median(_timed(lambda job=job: world.run(job), args.round_trips)) * 1e3
            )
        floor = FloorWorkers(size, device)
        ranks_floor = FloorWorkers(size, device, reference=False)
        drawn: dict[str, list[Scenario]] = {}
        try:
            for kind in args.kinds:
                cases = fixed_scenarios(size, args.examples, kind)
                say(f"world size {size}: {kind}, {len(cases)} examples, checked and at the floor")
                method = harness_method(kind)
                for scenario in cases[:3]:  # warm-up: first optimizer, first DDP, caches
                    world.check_equivalent(method, scenario)
                    floor.run(kind, scenario)
                    ranks_floor.run(kind, scenario, reference=False)
                checks, floors, rank_floors = timed_rounds(
                    world, floor, ranks_floor, kind, method, cases, args
                )
                out[f"{kind}_check_ms"] = statistics.median(checks) * 1e3
                out[f"{kind}_floor_ms"] = statistics.median(floors) * 1e3
                out[f"{kind}_ranks_floor_ms"] = statistics.median(rank_floors) * 1e3
                ratio(f"{kind}_check_over_floor", f"{kind}_check_ms", f"{kind}_floor_ms")
                # The same scenarios' work in all: long examples weigh by their length, where
                # the medians' ratio shows the fixed cost of a short one.
                out[f"{kind}_total_over_floor"] = sum(checks) / sum(floors)
                drawn[kind] = cases
            say(f"world size {size}: a step judged by the oracle and by its own run on one rank")
            harness_side, own_side = own_reference(world, size, args)
            out["step_oracle_reference_ms"] = statistics.median(harness_side) * 1e3
            out["step_own_reference_ms"] = statistics.median(own_side) * 1e3
            ratio("own_over_oracle_reference", "step_own_reference_ms", "step_oracle_reference_ms")
            say(f"world size {size}: a sequence mean checked padded and packed, same tokens")
            padded, packed = packed_checks(world, size, args)
            out["padded_check_ms"] = statistics.median(padded) * 1e3
            out["packed_check_ms"] = statistics.median(packed) * 1e3
            ratio("packed_over_padded", "packed_check_ms", "padded_check_ms")
            say(f"world size {size}: a causal-LM loss checked padded and packed, same tokens")
            padded, packed = packed_loss_checks(world, size, args)
            out["padded_loss_check_ms"] = statistics.median(padded) * 1e3
            out["packed_loss_check_ms"] = statistics.median(packed) * 1e3
            ratio("packed_loss_over_padded", "packed_loss_check_ms", "padded_loss_check_ms")
            say(f"world size {size}: a padding-free step checked padded and packed, same tokens")
            padded, packed = packed_step_checks(world, size, args)
            out["padded_step_check_ms"] = statistics.median(padded) * 1e3
            out["packed_step_check_ms"] = statistics.median(packed) * 1e3
            ratio("packed_step_over_padded", "packed_step_check_ms", "padded_step_check_ms")
            if args.diagnosis:
                say(f"world size {size}: a mistake found, shrunk and diagnosed (world.check)")
                taken = samples(
                    "diagnosis", lambda: diagnosis(world, floor), args.cli_runs, failures
                )
                for key in DIAGNOSIS_FIGURES:
                    put(f"diagnosis_{key}", median_of([float(t[key]) for t in taken]))
                ratio(
                    "diagnosis_shrink_over_floor", "diagnosis_shrink_s", "diagnosis_shrink_floor_s"
                )
                ratio(
                    "diagnosis_examples_over_floor",
                    "diagnosis_examples_s",
                    "diagnosis_shrink_floor_s",
                )
                say(
                    f"world size {size}: layout probes (a loss's logits layout probed, then pinned)"
                )
                put(
                    "layout_probes_s",
                    median_of(
                        samples(
                            "layout probes", lambda: layout_probes(world), args.cli_runs, failures
                        )
                    ),
                )
                if taken and not args.quick:
                    say(f"world size {size}: the diagnosis's reproducer, run as a user runs it")
                    script = str(taken[-1]["reproducer"])
                    put(
                        "reproducer_s",
                        median_of(
                            samples(
                                "reproducer", lambda: reproducer(script), args.repeats, failures
                            )
                        ),
                    )
                    put(
                        "bare_import_optimizers_s",
                        median_of(
                            samples(
                                "import torch._dynamo",
                                bare_import_optimizers,
                                args.repeats,
                                failures,
                            )
                        ),
                    )
                    ratio("reproducer_over_floor", "reproducer_s", "bare_import_optimizers_s")
        finally:
            floor.close()
            ranks_floor.close()
        out["rank_peak_rss_mib"] = max(world.run(_peak_rss_mib))
    out["controller_peak_rss_mib"] = _peak_rss_mib()
    if args.cli_examples:
        say(f"world size {size}: ddp-verify check, {args.cli_examples} examples, as a user runs it")
        put(
            "cli_check_s",
            median_of(
                samples(
                    "cli check",
                    lambda: cli_check(size, args.cli_examples, device),
                    args.cli_runs,
                    failures,
                )
            ),
        )
        put(
            "bare_import_torch_s",
            median_of(samples("import torch", bare_import_torch, args.repeats, failures)),
        )
        parts = ("grad-sync_floor_ms", "bare_import_torch_s", "bare_spawn_and_init_s")
        if all(part in out for part in parts):
            out["cli_budget_s"] = (
                args.cli_examples * out["grad-sync_floor_ms"] / 1e3
                + out["bare_import_torch_s"]
                + out["bare_spawn_and_init_s"]
            )
        ratio("cli_over_budget", "cli_check_s", "cli_budget_s")
    # The usual way last: its spawned worlds start and end (a SIGABRT at times) after every
    # figure of the harness is taken, not between two kinds' examples.
    for kind, cases in drawn.items():
        if kind not in USUAL or (args.quick and kind != USUAL[0]):
            continue  # --quick: one spawned world (seconds each) is enough to compare
        say(f"world size {size}: {kind}, {args.usual} examples the usual way (spawned)")
        put(
            f"{kind}_usual_ms",
            median_of(
                samples(
                    f"{kind} usual way",
                    lambda scenario, kind=kind: usual_way(size, kind, scenario, device),
                    min(args.usual, len(cases)),
                    failures,
                    *cases[: args.usual],
                )
            ),
            1e3,
        )
        ratio(f"{kind}_usual_over_check", f"{kind}_usual_ms", f"{kind}_check_ms")
    if failures:
        out["failures"] = failures
    return out


COLUMNS = [
    ("world_start_s", "start s", "{:.2f}"),
    ("bare_spawn_and_init_s", "bare s", "{:.2f}"),
    ("start_world_over_bare", "ratio", "{:.2f}"),
    ("warm_world_start_s", "again s", "{:.2f}"),
    ("noop_round_trip_ms", "no-op ms", "{:.2f}"),
    ("trivial_round_trip_ms", "trivial ms", "{:.2f}"),
    ("rank_peak_rss_mib", "rank MiB", "{:.0f}"),
    ("controller_peak_rss_mib", "ctrl MiB", "{:.0f}"),
    ("cli_check_s", "cli s", "{:.1f}"),
    ("cli_budget_s", "budget s", "{:.1f}"),
    ("cli_over_budget", "cli/budget", "{:.2f}"),
]
# From the first failing example to the report, and what probing a loss's layout adds.
PATHS = [
    ("diagnosis_to_report_s", "to report s", "{:.2f}"),
    ("diagnosis_shrink_s", "shrink s", "{:.2f}"),
    ("diagnosis_shrink_examples", "shrink ex", "{:.0f}"),
    ("diagnosis_examples_s", "in them s", "{:.2f}"),
    ("diagnosis_shrink_floor_s", "their floor", "{:.2f}"),
    ("diagnosis_examples_over_floor", "ex/floor", "{:.2f}"),
    ("diagnosis_search_s", "search s", "{:.2f}"),
    ("diagnosis_shrink_over_floor", "shrink/floor", "{:.2f}"),
    ("diagnosis_diagnosis_s", "diagnosis s", "{:.2f}"),
    ("layout_probes_s", "layouts s", "{:.2f}"),
    ("reproducer_s", "repro s", "{:.2f}"),
    ("bare_import_optimizers_s", "its floor s", "{:.2f}"),
    ("reproducer_over_floor", "repro/floor", "{:.2f}"),
]
# A training step judged by the oracle and by its own run on one rank (the user's reference).
REFERENCES = [
    ("step_oracle_reference_ms", "oracle ms", "{:.1f}"),
    ("step_own_reference_ms", "own ms", "{:.1f}"),
    ("own_over_oracle_reference", "own/oracle", "{:.2f}"),
    ("padded_check_ms", "padded ms", "{:.1f}"),
    ("packed_check_ms", "packed ms", "{:.1f}"),
    ("packed_over_padded", "packed/pad", "{:.2f}"),
    ("packed_loss_over_padded", "packed/pad loss-fn", "{:.2f}"),
    ("packed_step_over_padded", "packed/pad step", "{:.2f}"),
]
PER_KIND = [
    ("check_ms", "check ms", "{:.1f}"),
    ("floor_ms", "floor ms", "{:.1f}"),
    ("ranks_floor_ms", "ranks ms", "{:.1f}"),
    ("check_over_floor", "check/floor", "{:.2f}"),
    ("total_over_floor", "all/floor", "{:.2f}"),
    ("usual_ms", "usual ms", "{:.0f}"),
    ("usual_over_check", "usual/check", "{:.0f}x"),
]


def _table(columns: Any, results: dict[str, dict[str, float]], width: int) -> list[str]:
    """One row per world size: the cells of ``columns`` that were measured, "-" for the rest."""
    lines = [f"{'ws':>3} " + " ".join(f"{title:>{width}}" for _, title, _ in columns)]
    for size, r in results.items():
        cells = [fmt.format(r[key]) if key in r else "-" for key, _, fmt in columns]
        lines.append(f"{size:>3} " + " ".join(f"{c:>{width}}" for c in cells))
    return lines


def render(results: dict[str, dict[str, float]]) -> str:
    lines = _table(COLUMNS, results, 10)
    lines.append("")
    lines.append(f"{'ws':>3} {'example':>10} " + " ".join(f"{t:>11}" for _, t, _ in PER_KIND))
    for size, r in results.items():
        for kind in WORK:
            # A figure not measured (or whose yardstick failed twice: listed below) is "-".
            cells = [
                fmt.format(r[f"{kind}_{key}"]) if f"{kind}_{key}" in r else "-"
                for key, _, fmt in PER_KIND
            ]
            lines.append(f"{size:>3} {kind:>10} " + " ".join(f"{c:>11}" for c in cells))
    lines.append("")
    lines += _table(REFERENCES, results, 11)
    lines.append("")
    lines += _table(PATHS, results, 12)
    for size, r in results.items():
        for name, why in r.get("failures", {}).items():
            lines.append(f"ws {size}: {name} failed twice, left out: {why}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument(
        "--kinds", default=",".join(WORK), help=f"the examples timed (of {', '.join(WORK)})"
    )
    parser.add_argument("--examples", type=int, default=40, help="scenarios per kind")
    parser.add_argument(
        "--rounds", type=int, default=5, help="times each example is checked and floored"
    )
    parser.add_argument("--usual", type=int, default=3, help="examples run the usual way")
    parser.add_argument("--repeats", type=int, default=3, help="start-ups timed")
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--cli-examples", type=int, default=100, help="0 skips the CLI run")
    parser.add_argument("--cli-runs", type=int, default=3, help="CLI runs timed")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--no-diagnosis",
        dest="diagnosis",
        action="store_false",
        help="skip the diagnosis and layout-probe rows",
    )
    parser.add_argument("--out", type=Path, default=None, help="default results/bench.json")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="about a minute: world size 2, 8 examples, one sample of each yardstick (the "
        "usual way for ddp only), 20 CLI examples (figures for a quick look, not for the "
        "performance page)",
    )
    args = parser.parse_args()
    args.kinds = args.kinds.split(",")
    if unknown := sorted(set(args.kinds) - set(WORK)):
        parser.error(f"--kinds: {', '.join(unknown)} not among {', '.join(WORK)}")
    if args.quick:
        args.sizes = "2" if args.sizes == parser.get_default("sizes") else args.sizes
        args.examples, args.usual, args.repeats, args.round_trips = 8, 1, 1, 20
        args.rounds = 1
        args.cli_examples, args.cli_runs = 20, 1
    args.out = args.out or DEFAULT_OUT.with_name(
        ("bench" if args.device == "cpu" else f"bench_{args.device}")
        + ("_quick" if args.quick else "")
        + ".json"
    )
    results: dict[str, dict[str, Any]] = {}
    sizes = args.sizes.split(",")
    for n in sizes:
        results[n] = measure(int(n), args)
        # Written after every world size: a later one that fails loses nothing measured.
        _write(args, results, complete=n == sizes[-1])
        say(f"world size {n} done; written to {args.out}")
    print(render(results))
    print(f"written to {args.out}")


def _write(args: argparse.Namespace, results: dict[str, dict[str, Any]], complete: bool) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "python": platform.python_version(),
                "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                "arguments": {k: str(v) for k, v in vars(args).items()},
                "complete": complete,
                "medians": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
