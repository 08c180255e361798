"""Issue 15's list under two torchrun node agents on this machine, by hand (CI runs one world
and the examples across two agents, and everything else under ``torchrun --standalone``):

    python benchmarks/two_agents_check.py

``ddp-verify check --json`` of a buggy and a correct fixture, the conformance suite at world
size 4, and a session with a raising rank, each as one job of two ``--nnodes 2 --nproc-per-node
2`` agents joined by the c10d rendezvous on 127.0.0.1. Prints what rank 0 reported; about two
minutes on two cores.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.spmd import torchrun_nodes  # noqa: E402

RAISING = """
import pytest, torch, torch.distributed as dist

@pytest.mark.distributed
def test_raise_mid_collective(rank):
    if rank == 3:
        raise ValueError("rank 3 gives up before the collective")
    dist.all_reduce(torch.ones(1))

def test_after(world):
    assert world.run(lambda: dist.get_world_size()) == [4] * 4
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ddp_verify-two-agents-") as tmp:
        cwd = Path(tmp)
        for fn in ("summed_not_divided", "sample_weighted"):
            started = time.monotonic()
            target = f"{ROOT / 'fixtures' / 'grad_sync.py'}:{fn}"
            jobs = torchrun_nodes(
                [
                    "-m",
                    "ddp_verify.frontends.cli",
                    "check",
                    target,
                    "--kind",
                    "grad-sync",
                    "--max-examples",
                    "10",
                    "--seed",
                    "3",
                    "--json",
                ],
                cwd=cwd,
            )
            docs = [
                json.loads(line)
                for j in jobs
                for line in j.stdout.splitlines()
                if line.startswith("{")
            ]
            print(
                f"check {fn}: {len(docs)} JSON document(s); verdict {docs[0]['verdict']}, "
                f"scenario {docs[0]['scenario']}, cause {docs[0]['likely_cause']} "
                f"({time.monotonic() - started:.0f} s)"
            )
        started = time.monotonic()
        jobs = torchrun_nodes(
            [
                "-m",
                "ddp_verify.frontends.cli",
                "conformance",
                "--examples",
                "2",
                "--",
                "-q",
                "-p",
                "no:cacheprovider",
            ],
            cwd=cwd,
            timeout=600,
        )
        summary = [s for j in jobs for s in re.findall(r"^\d+ passed.*$", j.stdout, re.M)]
        print(f"conformance: {summary} ({time.monotonic() - started:.0f} s)")
        (cwd / "test_raising.py").write_text(textwrap.dedent(RAISING))
        started = time.monotonic()
        jobs = torchrun_nodes(
            ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_raising.py"], cwd=cwd
        )
        summary = [s for j in jobs for s in re.findall(r"^\d+ failed.*$", j.stdout, re.M)]
        print(f"raising rank: {summary} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
