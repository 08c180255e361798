"""The float32 bound on many drawn scenarios: correct methods must pass, bugs must not.

    python benchmarks/float32_sweep.py [--scenarios 2000] [--sizes 2,3,4] [--seed 0]
        [--dtype float32|bfloat16] [--device cpu|cuda] [--allow-tf32]
        [--fixture-examples 100] [--out benchmarks/results/float32_sweep.json]

``--dtype bfloat16`` sweeps bfloat16's bound the same way, ``--device cuda`` puts the ranks
(and the measuring runs) on GPUs, ``--allow-tf32`` lets them use TF32.

Draws ``--scenarios`` float32 scenarios (split over the world sizes; half of them with as many
micro-batches on every rank of a step, which FSDP2 needs), derives each one's tolerance once
(``ddp_verify.engine.tolerances``: the float32 reference and 8 reordered float32 runs), and
checks ``ddp()``, ``manual_allreduce()`` and ``ddp(zero=True)`` on every scenario and
``fully_shard()`` on those with equal micro-batch counts. It prints, per method, how many runs
failed (the bound's claim is none), and the median, 99th percentile and largest share of the
allowance used. Then every buggy fixture of ``fixtures/`` is checked with ``check()`` on
float32 scenarios only, at world size 2: each must be caught, with its expected cause.

Plan on about 15 minutes on two cores.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from hypothesis import HealthCheck, given, seed, settings

import ddp_verify
from ddp_verify.engine.scenario import Scenario
from ddp_verify.engine.strategies import scenarios
from ddp_verify.engine.tolerances import rounding_may_branch
from ddp_verify.methods import ddp, fully_shard, manual_allreduce
from ddp_verify.methods.equivalence import reference_and_tolerance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIXTURE_KINDS = {
    "grad_sync": "grad-sync",
    "loss": "loss",
    "step": "step",
    "comm_hook": "comm-hook",
    "wrapper": "wrapper",
}


def draw(
    world_size: int, count: int, same_counts: bool, at: int, dtype: str = "float32"
) -> list[Scenario]:
    """``count`` scenarios in ``dtype`` for ``world_size`` ranks, reproducibly from ``at``."""
    drawn: list[Scenario] = []

    @seed(at)
    @settings(max_examples=count, database=None, suppress_health_check=list(HealthCheck))
    @given(
        scenarios(
            world_size=world_size,
            max_micro_batches=3,
            same_micro_batch_counts=same_counts,
            dtypes=(dtype,),
        )
    )
    def collect(scenario: Scenario) -> None:
        drawn.append(scenario)

    collect()
    return drawn


def sweep(world: Any, cases: list[Scenario], results: dict[str, list[dict[str, Any]]]) -> None:
    methods = {"ddp": ddp(), "manual_allreduce": manual_allreduce(), "zero": ddp(zero=True)}
    fsdp = fully_shard()
    for scenario in cases:
        device = "cpu" if world.device == "cpu" else "cuda"
        options = {"device": device, "tf32": world.allow_tf32}
        _, tolerance = world.helper.run_job(reference_and_tolerance, (scenario,), options)[0]
        chosen = dict(methods)
        if all(len({len(sizes) for sizes in step}) == 1 for step in scenario.schedule):
            chosen["fully_shard"] = fsdp
        for name, method in chosen.items():
            outcome = world.check_equivalent(method, scenario, tolerance=tolerance)
            if not outcome.equivalent and rounding_may_branch(scenario):
                # As a check does: a failure with Adam is measured again on more runs.
                outcome = world.check_equivalent(method, scenario)
            results.setdefault(name, []).append(
                {
                    "world_size": scenario.world_size,
                    "used": outcome.allowance_used(),
                    "equivalent": outcome.equivalent,
                    "scenario": repr(scenario),
                    "report": None if outcome.equivalent else outcome.report(),
                }
            )


def buggy_fixtures() -> list[tuple[str, str, Any, str]]:
    found = []
    for stem, kind in FIXTURE_KINDS.items():
        spec = importlib.util.spec_from_file_location(
            f"fixture_{stem}", ROOT / "fixtures" / f"{stem}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for name, (verdict, cause) in module.EXPECTED.items():
            if verdict == "not equivalent":
                found.append((f"{stem}.{name}", kind, getattr(module, name), cause))
    return found


def check_fixtures(examples: int, dtype: str, **world: Any) -> list[dict[str, Any]]:
    rows = []
    for label, kind, fn, cause in buggy_fixtures():
        row: dict[str, Any] = {"fixture": label, "expected_cause": cause}
        try:
            ddp_verify.check(
                fn,
                kind=kind,
                world_size=2,
                max_examples=examples,
                seed=0,
                dtypes=(dtype,),
                **world,
            )
            row.update(caught=False, cause=None)
        except ddp_verify.EquivalenceError as error:
            row.update(
                caught=True,
                found_at=error.found_at,
                cause=error.cause,
                cause_named=cause in (error.cause or ""),
            )
        rows.append(row)
        print(f"  {label:40} caught={row['caught']} cause named={row.get('cause_named')}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=2000)
    parser.add_argument("--sizes", default="2,3,4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--allow-tf32", action="store_true")
    parser.add_argument("--fixture-examples", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="default results/DTYPE_sweep.json")
    args = parser.parse_args()
    suffix = "" if args.device == "cpu" else f"_{args.device}{'_tf32' if args.allow_tf32 else ''}"
    args.out = args.out or RESULTS / f"{args.dtype}{suffix}_sweep.json"
    sizes = [int(s) for s in args.sizes.split(",")]
    per_stream = max(1, args.scenarios // (2 * len(sizes)))
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    world_options = {"device": args.device, "allow_tf32": args.allow_tf32}
    drawn = 0
    for size in sizes:
        cases = draw(size, per_stream, False, args.seed, args.dtype)
        cases += draw(size, per_stream, True, args.seed, args.dtype)
        drawn += len(cases)
        with ddp_verify.VerifyingWorld(size, timeout=120, **world_options) as world:
            sweep(world, cases, results)
        print(f"world size {size}: {len(cases)} scenarios ({time.perf_counter() - started:.0f} s)")
    summary = {}
    for name, rows in results.items():
        used = sorted(r["used"] for r in rows)
        summary[name] = {
            "runs": len(rows),
            "failed": sum(not r["equivalent"] for r in rows),
            "median_used": statistics.median(used),
            "p99_used": used[int(0.99 * (len(used) - 1))],
            "max_used": used[-1],
            "worst_scenario": max(rows, key=lambda r: r["used"])["scenario"],
        }
    print(f"\n{drawn} {args.dtype} scenarios on {args.device}; share of the allowance used:")
    print(f"{'method':18} {'runs':>6} {'failed':>7} {'median':>8} {'p99':>8} {'max':>8}")
    for name, s in summary.items():
        print(
            f"{name:18} {s['runs']:>6} {s['failed']:>7} {s['median_used']:>8.3f} "
            f"{s['p99_used']:>8.3f} {s['max_used']:>8.3f}"
        )
    print(f"\nbuggy fixtures, {args.dtype} only, world size 2, {args.fixture_examples} examples:")
    fixtures = check_fixtures(args.fixture_examples, args.dtype, **world_options)
    caught = sum(r["caught"] for r in fixtures)
    named = sum(bool(r.get("cause_named")) for r in fixtures)
    print(f"caught {caught} of {len(fixtures)}; expected cause named for {named}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "torch": torch.__version__,
                "arguments": {k: str(v) for k, v in vars(args).items()},
                "scenarios": drawn,
                "seconds": round(time.perf_counter() - started),
                "methods": summary,
                "failures": {
                    name: [r for r in rows if not r["equivalent"]] for name, rows in results.items()
                },
                "fixtures": fixtures,
            },
            indent=2,
        )
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
