"""The conformance gate's pass rate on the torch installed: the whole packaged suite, run as a
framework team runs it, once per hypothesis seed at each world size. On a torch that should
pass, every run must pass; a failing run is a defect of the suite (a bound a correct torch can
exceed, a torch limitation left to chance), never of torch.

    python benchmarks/gate_pass_rate.py [--sizes 2,4] [--seeds 20] [--first-seed 0]
                                        [--out gate_pass_rate.json]

Prints one line per run (world size, seed, passed or the failing tests, seconds) and the pass
rate per world size; writes every run as JSON with --out; exits 1 if any run failed. Each run
is ``python -m ddp_verify conformance --world-size N -- --hypothesis-seed S`` in a temporary
directory. About 1 minute a run at world size 2 and 2 at world size 4 on two cores.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_suite(size: int, seed: int, timeout: float = 1800.0) -> dict[str, object]:
    """One run of the whole suite: its outcome, the tests that failed and its summary line."""
    command = [
        sys.executable, "-m", "ddp_verify", "conformance", "--world-size", str(size), "--",
        "-q", "-p", "no:cacheprovider", "--hypothesis-seed", str(seed),
    ]  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gate-") as directory:
        try:
            done = subprocess.run(
                command, cwd=directory, capture_output=True, text=True, timeout=timeout
            )
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = None, f"timed out after {timeout:.0f} s: {exc}"
    summary = next(
        (line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line)),
        "",
    )
    failed = sorted(set(re.findall(r"^FAILED (\S+)", output, re.M)))
    return {
        "world_size": size,
        "seed": seed,
        "passed": code == 0,
        "exit_code": code,
        "failed": failed,
        "summary": summary.strip("= "),
        "seconds": round(time.monotonic() - started, 1),
        "tail": "" if code == 0 else output[-4000:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = []
    for size in sizes:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run = run_suite(size, seed)
            runs.append(run)
            said = (
                "passed"
                if run["passed"]
                else f"FAILED {', '.join(run['failed']) or run['exit_code']}"
            )
            print(f"world size {size} seed {seed}: {said}; {run['summary']} ({run['seconds']} s)",
                  flush=True)  # fmt: skip
            if args.out is not None:
                args.out.write_text(json.dumps(runs, indent=1))
    for size in sizes:
        mine = [r for r in runs if r["world_size"] == size]
        good = sum(bool(r["passed"]) for r in mine)
        print(f"world size {size}: {good}/{len(mine)} runs passed")
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
