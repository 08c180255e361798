"""Search power for code that keeps state: how many seeds find a stateful comm hook's mistake
within the default examples, and at which example.

    python benchmarks/stateful_power.py [--seeds 20] [--examples 25] [--world-size 4]
                                        [--lossy bf16]

The case is issue 60's: torch's PowerSGD at rank 1, compressing from its second iteration
(``start_powerSGD_iter=1``, no error feedback, no warm start), checked as a user would under
``--lossy bf16``. Its mistake (a low-rank approximation, not rounding) shows only from the
second step on and only on a weight matrix PowerSGD compresses, so a search that reaches
that step late, or never, passes it. Prints one line per seed (caught or not, the example
that first failed, seconds) and the count; exits 1 unless every seed caught it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_verify import VerifyingWorld, check  # noqa: E402
from ddp_verify.usercode.verdict import CheckFailed, NotEquivalent  # noqa: E402
from tests.user_code import load  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--lossy", default="bf16")
    args = parser.parse_args(argv)
    powersgd = load("real_style/powersgd_hooks")
    caught = 0
    started = time.monotonic()
    os.chdir(tempfile.mkdtemp(prefix="stateful_power-"))  # reproducers land here
    with VerifyingWorld(args.world_size) as world:
        for seed in range(args.seeds):
            began = time.monotonic()
            try:
                check(
                    powersgd.powerSGD_hook,
                    kind="comm-hook",
                    world=world,
                    max_examples=args.examples,
                    seed=seed,
                    lossy=args.lossy,
                    hook_state=powersgd.rank_one_from_step_one,
                )
                found, at, said = False, None, "passed"
            except NotEquivalent as error:
                # Caught for its reason: named a low-rank approximation, not rounding.
                first = error.causes[0].pattern if error.causes else None
                found, at, said = first == "lowrank", error.found_at, f"caught ({first})"
            except CheckFailed as error:  # the code failed to run: not the mistake
                found, at, said = False, None, f"{error.verdict.status.value}"
            caught += found
            print(
                f"seed {seed:>3}: {said}{f' at example {at}' if at else ''} "
                f"({time.monotonic() - began:.1f} s)",
                flush=True,
            )
    print(
        f"{caught}/{args.seeds} seeds caught it within {args.examples} examples at world size "
        f"{args.world_size} (--lossy {args.lossy}), {time.monotonic() - started:.0f} s"
    )
    return 0 if caught == args.seeds else 1


if __name__ == "__main__":
    raise SystemExit(main())
