"""What recording costs, and what a parity run costs, against the script's own runs.

    python benchmarks/parity_bench.py [--repeats 5] [--steps 10] [--layouts 1x4,2x2,4x1]

1. The time of the script's first N optimizer steps at each layout (rank 0, from its model's
   first forward to the N-th step's start, when its gradients are in), with and without the
   recorder: medians of ``--repeats`` runs each, and their ratio. (The whole
   run's wall time says nothing of it: the recorder ends the run at the N-th step, skipping
   the script's own teardown, so a recorded run is the shorter one.)
2. The script's whole run at each layout, as a user starts it (torchrun), against the run
   parity makes of that layout (its report's seconds), and the whole parity run against the
   plain runs it stands for.

The script is the tests' plain DDP script (fixtures/scripts/plain_ddp.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fixtures" / "scripts" / "plain_ddp.py"


# Run in each rank instead of the script: times the script from its model's first forward to
# the N-th step's start (a step pre-hook: the recorder, installed at interpreter start where
# DDP_VERIFY_RECORD is set, ends the run in the N-th step's post-hooks, before any hook of
# ours there would run), then runs the script as ddp_verify.parity.boot does.
TIMER = """
import os, sys, time, torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
wanted, started, steps = int(os.environ["BENCH_STEPS"]), [], [0]
call = torch.nn.Module.__call__
def first(module, *a, **k):
    if not started:
        started.append(time.perf_counter())
    return call(module, *a, **k)
torch.nn.Module.__call__ = first
def step(*_):
    steps[0] += 1
    if steps[0] == wanted and os.environ.get("RANK", "0") == "0":
        with open(os.environ["BENCH_OUT"], "w") as out:
            out.write(str(time.perf_counter() - started[0]))
register_optimizer_step_pre_hook(step)
from ddp_verify.parity.boot import main
main(sys.argv[1:])
"""


# A run whose rank aborts at exit (gloo's teardown: "terminate called without an active
# exception", about one plain run in six here) is tried again, at most this many times.
TRIES = 3


def _run(command: list[str], env: dict[str, str]) -> float:
    """Seconds the successful try took (a failed try's time is not the script's)."""
    for attempt in range(TRIES):
        started = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return time.monotonic() - started
        print(f"  (a run failed, exit {done.returncode}; try {attempt + 2} of {TRIES})",
              file=sys.stderr)  # fmt: skip
    raise SystemExit(f"{command[-1]!r} failed {TRIES} times: {done.stderr[-600:]}")


def steps_time(torchrun: list[str], script: list[str], env: dict[str, str], out: Path) -> float:
    timer = out.parent / "timer.py"
    timer.write_text(TIMER)
    out.unlink(missing_ok=True)  # a figure is this run's or none: never the last run's
    _run([*torchrun, str(timer), *script], {**env, "BENCH_OUT": str(out)})
    if not out.exists():
        raise SystemExit(f"the timed run wrote no time ({' '.join(script)})")
    return float(out.read_text())


def timed(command: list[str], env: dict[str, str]) -> float:
    return _run(command, env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layouts", default="1x4,2x2,4x1")
    parser.add_argument("--micro-batch", type=int, default=4)
    args = parser.parse_args()
    layouts = [tuple(int(x) for x in text.split("x")) for text in args.layouts.split(",")]
    # The global batch every layout shares: the largest layout's ranks x micro-batches.
    global_batch = args.micro_batch * max(w * a for w, a in layouts)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"plain_ddp.py, global batch {global_batch}, {args.steps} steps, "
          f"{args.repeats} runs each; medians", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "seconds"
        timing = {**env, "BENCH_STEPS": str(args.steps)}
        recording = {**timing, "DDP_VERIFY_RECORD": work, "DDP_VERIFY_STEPS": str(args.steps)}
        # 1. What recording costs, per layout.
        plains: dict[str, float] = {}
        for world, accum in [(1, 1), *layouts]:
            label = f"{world}x{accum}"
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={world}"]  # fmt: skip
            script = [str(SCRIPT), "--grad-accum", str(accum), "--batch-size",
                      str(global_batch // (world * accum)), "--steps", str(args.steps)]  # fmt: skip
            plain, recorded = [], []
            for _ in range(args.repeats):
                plain.append(steps_time(torchrun, script, timing, out))
                recorded.append(steps_time(torchrun, script, recording, out))
            own, rec = statistics.median(plain), statistics.median(recorded)
            # 2. The script's own whole run at this layout, as a user starts it.
            whole = [timed([*torchrun, *script], env) for _ in range(max(1, args.repeats // 2))]
            plains[label] = statistics.median(whole)
            rows.append([label, own * 1000, rec * 1000, rec / own])
            print(f"layout {label}: the first {args.steps} steps on rank 0: alone "
                  f"{own * 1000:.1f} ms, recorded {rec * 1000:.1f} ms, ratio {rec / own:.3f}; "
                  f"its whole run {plains[label]:.2f} s", flush=True)  # fmt: skip
        # 3. One parity run of every layout, each layout's run against the script's own.
        command = [sys.executable, "-m", "ddp_verify", "parity", "--json", "--layouts",
                   args.layouts, "--steps", str(args.steps), "--global-batch",
                   str(global_batch), "--", "python", str(SCRIPT), "--grad-accum",
                   "{grad_accum}", "--batch-size", "{micro_batch}", "--steps",
                   str(args.steps)]  # fmt: skip
        seconds: dict[str, list[float]] = {}
        totals = []
        for _ in range(max(1, args.repeats // 2)):
            started = time.monotonic()
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            totals.append(time.monotonic() - started)
            if done.returncode != 0:
                print(f"  (a parity run ended {done.returncode}: not counted)", file=sys.stderr)
                continue
            for row in json.loads(done.stdout)["layouts"]:
                seconds.setdefault(row["layout"], []).append(row["seconds"])
        print("\n| layout | steps alone | recorded | ratio | script's run | parity's run | ratio |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for label, own, rec, ratio in rows:
            times, plain = seconds.get(label), plains[label]
            # The reference's run is not a row of parity's report: its time is in the total.
            said = (
                f"{statistics.median(times):.2f} s | {statistics.median(times) / plain:.3f}"
                if times
                else "(the reference) | —"
            )
            print(f"| {label} | {own:.1f} ms | {rec:.1f} ms | {ratio:.3f} | "
                  f"{plain:.2f} s | {said} |")  # fmt: skip
        total, whole = sum(plains.values()), statistics.median(totals)
        print(f"\nthe whole parity run: {whole:.2f} s against {total:.2f} s for the plain "
              f"runs it stands for: ratio {whole / total:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
