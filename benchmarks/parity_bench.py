"""What recording costs, and what a parity run costs, against the script's own runs.

    python benchmarks/parity_bench.py [--repeats 5] [--steps 20] [--layout 2x2]

1. The script's own run at one layout (torchrun, ``--steps N``) against the same run with the
   recorder installed, recording those N steps (``python -m ddp_verify.parity.boot``): medians
   of ``--repeats`` runs each, and their ratio (start-up included: torch's import is most of a
   short run, and the same in both).
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


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=600)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
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
        recording = {**env, "DDP_VERIFY_RECORD": work, "DDP_VERIFY_STEPS": str(args.steps)}
        for _ in range(args.repeats):
            plain.append(timed([*torchrun, *script], env))
            recorded.append(timed([*torchrun, "-m", "ddp_verify.parity.boot", *script], recording))
        own = statistics.median(plain)
        print(
            f"layout {args.layout}, {args.steps} steps, {args.repeats} runs each: the script "
            f"alone {own:.2f} s, recorded {statistics.median(recorded):.2f} s (median), ratio "
            f"{statistics.median(recorded) / own:.3f}"
        )
        command = [sys.executable, "-m", "ddp_verify", "parity", "--layouts", args.layout,
                   "--steps", str(args.steps), "--global-batch", str(4 * world * accum), "--",
                   "python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
                   "{micro_batch}", "--steps", str(args.steps * 2)]  # fmt: skip
        parity = [timed(command, env) for _ in range(max(1, args.repeats // 2))]
        one = [*torchrun[:-1], "--nproc-per-node=1", str(SCRIPT), "--grad-accum", "1",
               "--batch-size", str(4 * world * accum), "--steps", str(args.steps)]  # fmt: skip
        single = [timed(one, env) for _ in range(max(1, args.repeats // 2))]
        both = statistics.median(single) + own
        print(
            f"a parity run (reference 1x1 and {args.layout}): {statistics.median(parity):.2f} s "
            f"(median of {len(parity)}), against {both:.2f} s for the two plain runs it stands "
            f"for: ratio {statistics.median(parity) / both:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
