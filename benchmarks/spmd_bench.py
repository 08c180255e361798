"""What SPMD mode costs next to fork mode: the same examples at the same world size, run by
``pytest --world-size N`` (fork) and by ``torchrun --standalone --nproc-per-node N -m pytest``
(SPMD).

    python benchmarks/spmd_bench.py [--sizes 2,4] [--examples 40] [--out PATH]

Each run is one pytest session of a generated test file that checks ``ddp()`` against the
reference on a fixed list of scenarios (the default strategy, derandomized: the same list in
both modes) and times every example where it runs (rank 0 in SPMD mode). Reported per mode and
size: start-up (from starting the command to the first example: interpreter, torch, pytest,
the world or the launcher and its process group), the median example, and the whole run. The
ratio SPMD/fork is the figure to watch. Plan on two to three minutes on two cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "spmd_bench.json"

TEST_FILE = """
import json, os, time
from hypothesis import given, settings, HealthCheck
from ddp_verify.engine import compat
from ddp_verify.methods import ddp
from ddp_verify.strategies import scenarios

def _fixed(world_size, count):
    # The same list whatever the code around it (hypothesis mixes in local constants).
    compat.without_local_constants()
    found = []
    @settings(max_examples=count, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(world_size=world_size))
    def collect(s):
        found.append(s)
    collect()
    return found[:count]

def test_examples(world):
    times = []
    first = time.time()
    for scenario in _fixed(world.size, int(os.environ["BENCH_EXAMPLES"])):
        started = time.perf_counter()
        world.assert_equivalent(ddp(), scenario)
        times.append(time.perf_counter() - started)
    if getattr(world, "rank", 0) == 0:
        with open(os.environ["BENCH_OUT"], "w") as f:
            json.dump({"first_example_at": first, "times": times}, f)
"""


def run(mode: str, size: int, examples: int, workdir: Path) -> dict[str, float]:
    out = workdir / f"{mode}-{size}.json"
    env = {
        **os.environ,
        "BENCH_EXAMPLES": str(examples),
        "BENCH_OUT": str(out),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_b.py"]
    if mode == "fork":
        command = [sys.executable, *pytest, "--world-size", str(size), "-p", "no:xdist"]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={size}",
            *pytest,
        ]
    started = time.time()
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900
    )
    total = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"{mode} at world size {size} failed:\n{done.stdout}\n{done.stderr}")
    measured = json.loads(out.read_text())
    return {
        "start_s": measured["first_example_at"] - started,
        "example_median_ms": 1000 * statistics.median(measured["times"]),
        "examples_s": sum(measured["times"]),
        "total_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ddp_verify-spmd-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "test_b.py").write_text(textwrap.dedent(TEST_FILE))
        for size in map(int, args.sizes.split(",")):
            results[str(size)] = {m: run(m, size, args.examples, workdir) for m in ("fork", "spmd")}
    print(
        "| world size | mode | start-up s | example median ms | examples s | whole run s |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    for size, modes in results.items():
        for mode, r in modes.items():
            print(
                f"| {size} | {mode} | {r['start_s']:.2f} | {r['example_median_ms']:.1f} | "
                f"{r['examples_s']:.2f} | {r['total_s']:.2f} |"
            )
        ratio = modes["spmd"]["example_median_ms"] / modes["fork"]["example_median_ms"]
        print(f"| {size} | spmd / fork | | {ratio:.2f} | | |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "examples": args.examples,
                "cpus": os.cpu_count(),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
