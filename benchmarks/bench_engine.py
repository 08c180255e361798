"""Examples per second of a full equivalence check, next to the raw cost of the same training.

    python benchmarks/bench_engine.py [--sizes 2,4] [--examples 60]

For each world size: the same fixed list of scenarios (the default ``scenarios()`` strategy,
derandomized) is checked with ``ddp()`` against the reference; each check is timed from the
controller. The floor is the time the ranks spend inside the same DDP training (model build,
DDP construction, the steps), measured on the ranks themselves: no job shipping, no trace
transfer, no reference, no comparison. Writes ``benchmarks/results/engine.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch.distributed as dist
from hypothesis import HealthCheck, given, settings

from ddp_verify import VerifyingWorld
from ddp_verify.methods import ddp
from ddp_verify.scenario import Scenario
from ddp_verify.strategies import scenarios

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"


def fixed_scenarios(world_size: int, count: int) -> list[Scenario]:
    drawn: list[Scenario] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios(world_size=world_size))
    def collect(scenario: Scenario) -> None:
        drawn.append(scenario)

    collect()
    return drawn[:count]


def timed_training(scenario: Scenario) -> float:
    """On a rank: seconds spent in the DDP training of ``scenario``."""
    start = time.perf_counter()
    ddp().train_rank(scenario)
    dist.barrier()
    return time.perf_counter() - start


def measure(size: int, examples: int) -> dict[str, float]:
    cases = fixed_scenarios(size, examples)
    with VerifyingWorld(size) as world:
        for scenario in cases[:5]:  # warm-up: first DDP construction, allocator, caches
            world.check_equivalent(ddp(), scenario)
            world.run(timed_training, scenario)
        checks, floors = [], []
        for scenario in cases:
            start = time.perf_counter()
            outcome = world.check_equivalent(ddp(), scenario)
            checks.append(time.perf_counter() - start)
            assert outcome.equivalent, outcome.report()
            floors.append(max(world.run(timed_training, scenario)))
    check, floor = statistics.median(checks), statistics.median(floors)
    return {
        "examples": len(cases),
        "check_median_ms": check * 1e3,
        "examples_per_second": 1 / check,
        "floor_median_ms": floor * 1e3,
        "check_over_floor": check / floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--examples", type=int, default=60)
    args = parser.parse_args()
    results = {n: measure(int(n), args.examples) for n in args.sizes.split(",")}
    print(f"{'world size':>10} {'check ms':>9} {'examples/s':>11} {'floor ms':>9} {'ratio':>6}")
    for n, r in results.items():
        print(
            f"{n:>10} {r['check_median_ms']:9.1f} {r['examples_per_second']:11.1f} "
            f"{r['floor_median_ms']:9.1f} {r['check_over_floor']:6.2f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
