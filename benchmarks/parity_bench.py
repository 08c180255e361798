"""What recording costs, and what a parity run costs, against the script's own runs.

    python benchmarks/parity_bench.py [--repeats 5] [--steps 10] [--layout 2x2]

1. The time of the script's first N optimizer steps at one layout (rank 0, from its model's
   first forward to the N-th step's end, timed by hooks installed before anything else), with
   and without the recorder: medians of ``--repeats`` runs each, and their ratio. (The whole
   run's wall time says nothing of it: the recorder ends the run at the N-th step, skipping
   the script's own teardown, so a recorded run is the shorter one.)
2. A parity run of the reference and the layout against the two plain runs it stands for.

The script is the tests' plain DDP script (fixtures/scripts/plain_ddp.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fixtures" / "scripts" / "plain_ddp.py"


# Run in each rank instead of the script: times the first N steps, then runs the script (with
# the recorder, where DDP_VERIFY_RECORD is set, as ddp_verify.parity.boot does).
TIMER = """
import os, sys, time, torch
from torch.optim.optimizer import register_optimizer_step_post_hook
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
register_optimizer_step_post_hook(step)
from ddp_verify.parity.boot import main
main(sys.argv[1:])
"""


# A run whose rank aborts at exit (gloo's teardown: "terminate called without an active
# exception", about one plain run in six here) is tried again, at most this many times.
TRIES = 3


def _run(command: list[str], env: dict[str, str]) -> None:
    for attempt in range(TRIES):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return
        print(f"  (a run failed, exit {done.returncode}; try {attempt + 2} of {TRIES})",
              file=sys.stderr)  # fmt: skip
    raise SystemExit(f"{command[-1]!r} failed {TRIES} times: {done.stderr[-600:]}")


def steps_time(torchrun: list[str], script: list[str], env: dict[str, str], out: Path) -> float:
    timer = out.parent / "timer.py"
    timer.write_text(TIMER)
    _run([*torchrun, str(timer), *script], {**env, "BENCH_OUT": str(out)})
    return float(out.read_text())


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    _run(command, env)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layout", default="2x2")
    args = parser.parse_args()
    world, accum = (int(x) for x in args.layout.split("x"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={world}"]  # fmt: skip
    script = [str(SCRIPT), "--grad-accum", str(accum), "--batch-size", "4",
              "--steps", str(args.steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "seconds"
        timing = {**env, "BENCH_STEPS": str(args.steps)}
        recording = {**timing, "DDP_VERIFY_RECORD": work, "DDP_VERIFY_STEPS": str(args.steps)}
        for _ in range(args.repeats):
            plain.append(steps_time(torchrun, script, timing, out))
            recorded.append(steps_time(torchrun, script, recording, out))
        own = statistics.median(plain)
        print(
            f"layout {args.layout}, the first {args.steps} steps on rank 0, {args.repeats} runs "
            f"each: the script alone {own * 1000:.1f} ms, recorded "
            f"{statistics.median(recorded) * 1000:.1f} ms (medians), ratio "
            f"{statistics.median(recorded) / own:.3f}"
        )
        whole = statistics.median(timed([*torchrun, *script], env) for _ in range(3))
        command = [sys.executable, "-m", "ddp_verify", "parity", "--layouts", args.layout,
                   "--steps", str(args.steps), "--global-batch", str(4 * world * accum), "--",
                   "python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
                   "{micro_batch}", "--steps", str(args.steps * 2)]  # fmt: skip
        parity = [timed(command, env) for _ in range(max(1, args.repeats // 2))]
        one = [*torchrun[:-1], "--nproc-per-node=1", str(SCRIPT), "--grad-accum", "1",
               "--batch-size", str(4 * world * accum), "--steps", str(args.steps)]  # fmt: skip
        single = [timed(one, env) for _ in range(max(1, args.repeats // 2))]
        both = statistics.median(single) + whole
        print(
            f"a parity run (reference 1x1 and {args.layout}): {statistics.median(parity):.2f} s "
            f"(median of {len(parity)}), against {both:.2f} s for the two plain runs it stands "
            f"for: ratio {statistics.median(parity) / both:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
