"""World start-up and job round trips, next to the usual spawn-a-world-per-test way.

    python benchmarks/bench_world.py [--sizes 2,4] [--round-trips 200] [--repeats 3]

Prints medians and ratios measured in this one run and writes them to
``benchmarks/results/world.json``. Plan on about a minute and a half on two cores.

Columns: world start-up (``World(n).start()``); a bare spawn of n interpreters that import
torch and init a gloo group (the floor for start-up); their ratio; the round trip of a job that
does nothing and of the trivial job (one all-reduce of one element) on a warm world, median and
90th percentile; the trivial job run the usual way (``torch.multiprocessing.spawn`` of a fresh
world per call); and how many times faster the warm world answers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_verify.world import World

RESULTS = Path(__file__).resolve().parent / "results" / "world.json"


def trivial_job() -> int:
    """What every measured call does on each rank: one tiny all-reduce."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())


def _spawned_rank(rank: int, size: int, port: int) -> None:
    # The usual test harness: a fresh process group per test, torn down at its end.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    trivial_job()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usual_way(size: int) -> float:
    """One trivial job the way torch.multiprocessing.spawn-based suites run every test."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    mp.spawn(_spawned_rank, args=(size, _free_port()), nprocs=size, join=True)
    return time.perf_counter() - start


_BARE_RANK = """
import sys, torch, torch.distributed as dist
rank, size, port = map(int, sys.argv[1:])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
print("ready", flush=True)
sys.stdin.read()
"""


def bare_start(size: int) -> float:
    """Spawn ``size`` plain interpreters and init a process group: the floor for start-up."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", _BARE_RANK, str(r), str(size), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(size)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    elapsed = time.perf_counter() - start
    for p in procs:
        p.communicate("")
    return elapsed


def world_start(size: int) -> float:
    start = time.perf_counter()
    world = World(size).start()
    elapsed = time.perf_counter() - start
    world.close()
    return elapsed


def _noop() -> None:
    return None


def warm_round_trips(size: int, count: int) -> tuple[list[float], list[float]]:
    """Round trips on one warm world: the trivial job, and a job that does nothing at all."""
    with World(size) as world:
        timings: dict[object, list[float]] = {trivial_job: [], _noop: []}
        for job, times in timings.items():
            for _ in range(10):  # warm-up
                world.run(job)
            for _ in range(count):
                start = time.perf_counter()
                world.run(job)
                times.append(time.perf_counter() - start)
    return timings[trivial_job], timings[_noop]


def measure(size: int, round_trips: int, repeats: int) -> dict[str, float]:
    starts = [world_start(size) for _ in range(repeats)]
    bares = [bare_start(size) for _ in range(repeats)]
    usual = [usual_way(size) for _ in range(repeats)]
    warm, noop = warm_round_trips(size, round_trips)
    return {
        "world_start_s": statistics.median(starts),
        "bare_spawn_and_init_s": statistics.median(bares),
        "start_ratio_world_over_bare": statistics.median(starts) / statistics.median(bares),
        "warm_round_trip_ms": statistics.median(warm) * 1e3,
        "warm_round_trip_p90_ms": statistics.quantiles(warm, n=10)[-1] * 1e3,
        "warm_noop_round_trip_ms": statistics.median(noop) * 1e3,
        "usual_way_per_call_s": statistics.median(usual),
        "speedup_usual_over_warm": statistics.median(usual) / statistics.median(warm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {str(n): measure(n, args.round_trips, args.repeats) for n in sizes}

    print(
        f"{'world size':>10} {'start s':>8} {'bare s':>7} {'ratio':>6} "
        f"{'warm ms':>8} {'p90 ms':>7} {'spawn/call s':>12} {'speed-up':>9}"
    )
    for n, r in results.items():
        print(
            f"{n:>10} {r['world_start_s']:8.2f} {r['bare_spawn_and_init_s']:7.2f} "
            f"{r['start_ratio_world_over_bare']:6.2f} {r['warm_noop_round_trip_ms']:8.2f} "
            f"{r['warm_round_trip_ms']:8.2f} "
            f"{r['warm_round_trip_p90_ms']:7.2f} {r['usual_way_per_call_s']:12.2f} "
            f"{r['speedup_usual_over_warm']:8.0f}x"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "when": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "python": platform.python_version(),
                "torch": torch.__version__,
                "medians": results,
            },
            indent=2,
        )
    )
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
