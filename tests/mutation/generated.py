"""Generated regressions, not chosen ones: the conformance suite's reach, measured.

For each module of the table below (the Python source behind the surface the gate stands
for), every place an operator of :mod:`tests.mutation.operators` can change is a mutant;
``--samples`` of them are drawn at random per module with ``--seed``. Each is first run
through its module's quick probe (:mod:`tests.mutation.probes`, written apart from the suite):
one that gives exactly the unmutated numbers changes no numerics and is set aside. Each live
one is installed in a fresh conformance session (its ranks and its own process) and the whole
suite runs against it, stopping at the first failure: a failure kills it, a pass lets it
survive, a run past ``--timeout`` counts as killed (the log says "timed out"). A mutant that
cannot take the function's place (its code closes over other names) is set aside with the
ones that change no numbers. A survivor :mod:`tests.mutation.equivalent` declares equivalent
under torch's contract (with its reason) counts as "equivalent". The score per module is
killed / (live - equivalent); the raw score, killed / live, is shown beside it. Each module
draws from its own random generator (seeded by ``--seed`` and its name), so a run over some
modules draws what a run over all draws for them.

    python -m tests.mutation.generated [--samples 5] [--seed 0] [--world-size 4]
        [--modules GLOB ...] [--match TEXT] [--write docs/mutation.md] [--json out.json]

``tox -e mutation`` runs it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import importlib
import inspect
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tests.mutation.equivalent import why_equivalent
from tests.mutation.generated_patch import ENV, FIRST_ENV, compiled
from tests.mutation.operators import Site, mutated, sites

ROOT = Path(__file__).resolve().parents[2]

# Module -> its probe (tests.mutation.probes).
MODULES: dict[str, str] = {
    "torch.distributed.algorithms.model_averaging.averagers": "averaging",
    "torch.distributed.algorithms.model_averaging.utils": "averaging",
    "torch.distributed.optim.post_localSGD_optimizer": "averaging",
    "torch.nn.utils.clip_grad": "clipping",
    "torch.distributed.nn.functional": "differentiable",
    "torch.utils.data.distributed": "sampler",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks": "hooks",
    "torch.distributed.algorithms.model_averaging.hierarchical_model_averager": "averaging",
    "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook": "post_local",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook": "powersgd",
    "torch.distributed.optim.zero_redundancy_optimizer": "zero",
    "torch.nn.parallel.distributed": "ddp",
    "torch.distributed.fsdp._fully_shard._fsdp_collectives": "fsdp",
    "torch.distributed.fsdp._fully_shard._fsdp_param_group": "fsdp",
    "torch.distributed.fsdp._fully_shard._fully_shard": "fsdp",
    "torch.distributed.checkpoint.state_dict": "checkpoint",
}


# Probe -> the conformance modules run first against its modules' mutants (the order only:
# a survivor runs the whole suite).
FIRST: dict[str, tuple[str, ...]] = {
    "averaging": ("test_model_averaging",),
    "post_local": ("test_model_averaging",),
    "clipping": ("test_optimizers",),
    "differentiable": ("test_differentiable_collectives",),
    "sampler": ("test_data",),
    "hooks": ("test_comm_hooks",),
    "powersgd": ("test_comm_hooks",),
    "zero": ("test_zero",),
    "ddp": ("test_ddp_options", "test_join", "test_fused_optimizer"),
    "fsdp": ("test_fsdp",),
    "checkpoint": ("test_fsdp", "test_zero"),
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    module: str
    qualname: str
    site: Site
    source: str
    line: int  # in the module's file

    def as_json(self) -> dict[str, str]:
        return {"module": self.module, "qualname": self.qualname, "source": self.source}

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}:{self.line}:{self.site.operator}"


def functions(module: str) -> list[tuple[str, ast.FunctionDef, int]]:
    """The module's functions and methods defined in its own file: (qualname, parsed def,
    first line in the file)."""
    found = []
    loaded = importlib.import_module(module)
    for name, value in vars(loaded).items():
        candidates = []
        if inspect.isfunction(value) and value.__module__ == module:
            candidates.append((name, value))
        elif inspect.isclass(value) and value.__module__ == module:
            for attr, member in vars(value).items():
                function = getattr(member, "__func__", member)
                if inspect.isfunction(function):
                    candidates.append((f"{name}.{attr}", function))
        for qualname, function in candidates:
            if function.__code__.co_name == "<lambda>":
                continue
            try:
                lines, first = inspect.getsourcelines(function)
            except (OSError, TypeError):
                continue
            tree = ast.parse(textwrap.dedent("".join(lines)))
            if tree.body and isinstance(tree.body[0], ast.FunctionDef):
                found.append((qualname, tree.body[0], first))
    return found


def mutants(module: str) -> list[Mutant]:
    """Every mutant the operators make of ``module``."""
    made = []
    for qualname, function, first in functions(module):
        for site in sites(function):
            made.append(
                Mutant(module, qualname, site, mutated(function, site), first + site.line - 1)
            )
    return made


def _write(mutant: Mutant, directory: Path) -> Path:
    path = directory / "mutant.json"
    path.write_text(json.dumps(mutant.as_json()))
    return path


# Probes that need a world of 3: a sampler pads past its data only with more ranks than items
# and fewer items than half the ranks.
PROBE_WORLD = {"sampler": 3}


def probe(name: str, mutant: Mutant | None) -> list[float] | str:
    """The probe ``name`` on a world of 2 (or ``PROBE_WORLD``'s), under ``mutant`` (or none),
    installed by the job in each rank (ranks are forked afresh for each world)."""
    from ddp_verify.world import World
    from tests.mutation import probes

    given = None if mutant is None else mutant.as_json()
    try:
        with World(PROBE_WORLD.get(name, 2), timeout=60) as world:
            results = world.run(probes.run, name, given)
    except Exception as exc:  # a mutant that breaks the world is live
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return [x for rank in results for x in (rank if isinstance(rank, list) else [rank])]


def suite(
    mutant: Mutant, directory: Path, world_size: int, timeout: float, first: tuple[str, ...] = ()
) -> tuple[str, str]:
    """The conformance suite against ``mutant`` (the test modules ``first`` run first):
    ("killed", the failing test) or ("survived", "") or ("timed out", "")."""
    env = {**os.environ, ENV: str(_write(mutant, directory)), FIRST_ENV: ",".join(first),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    command = [sys.executable, "-m", "pytest", "--pyargs", "ddp_verify.conformance",
               "--world-size", str(world_size), "-x", "-q", "-p", "no:cacheprovider",
               "-p", "tests.mutation.generated_patch",
               "--ddp-preload", "tests.mutation.generated_patch", "-n", "0"]  # fmt: skip
    try:
        done = subprocess.run(command, env=env, cwd=directory, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timed out", ""
    if done.returncode == 0:
        return "survived", ""
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return "killed", failed[0][7:120] if failed else f"exit {done.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5, help="mutants drawn per module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per suite run")
    parser.add_argument("--modules", nargs="*", default=["*"])
    parser.add_argument("--match", default=None,
                        help="run every mutant whose name contains this (a survivor, again) "
                        "instead of a sample")  # fmt: skip
    parser.add_argument("--write", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows: list[list[object]] = []
    outcomes: list[dict[str, str]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        for module, probe_name in MODULES.items():
            if not any(fnmatch.fnmatch(module, g) for g in args.modules):
                continue
            every = mutants(module)
            if args.match:
                drawn = [m for m in every if args.match in f"{m.name} ({m.site.change})"]
            else:
                rng = random.Random(f"{args.seed}:{module}")
                drawn = rng.sample(every, min(args.samples, len(every)))
            baseline = probe(probe_name, None)
            counts = {"live": 0, "killed": 0, "not live": 0, "survived": 0, "timed out": 0,
                      "equivalent": 0}  # fmt: skip
            for mutant in drawn:
                try:
                    compiled(mutant.as_json())
                    numbers = probe(probe_name, mutant)
                except ValueError:
                    numbers = baseline  # cannot take the original's place: set aside
                if numbers == baseline:
                    counts["not live"] += 1
                    outcome, by = "not live", ""
                else:
                    counts["live"] += 1
                    outcome, by = suite(
                        mutant, directory, args.world_size, args.timeout, FIRST[probe_name]
                    )
                    reason = why_equivalent(
                        mutant.module, mutant.qualname, mutant.site.operator, mutant.site.change
                    )
                    if outcome == "survived" and reason:
                        outcome, by = "equivalent", reason
                    counts[outcome] += 1
                outcomes.append({"mutant": mutant.name, "change": mutant.site.change,
                                 "outcome": outcome, "by": by})  # fmt: skip
                print(f"{mutant.name} ({mutant.site.change}): {outcome} {by}".rstrip(),
                      flush=True)  # fmt: skip
            killed = counts["killed"] + counts["timed out"]
            judged = counts["live"] - counts["equivalent"]
            score = f"{killed / judged:.0%}" if judged else "—"
            raw = f"{killed / counts['live']:.0%}" if counts["live"] else "—"
            rows.append([module, len(every), len(drawn), counts["not live"], counts["live"],
                         counts["equivalent"], killed, score, raw])  # fmt: skip
    lines = ["| module | mutants | drawn | not live | live | equivalent | killed | score | raw |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    lines += ["| `" + str(r[0]) + "` | " + " | ".join(str(x) for x in r[1:]) + " |" for r in rows]
    survivors = [o for o in outcomes if o["outcome"] == "survived"]
    equivalents = [o for o in outcomes if o["outcome"] == "equivalent"]
    total = f"{time.monotonic() - started:.0f} s"
    print("\n" + "\n".join(lines) + f"\n\n{len(survivors)} survived; {total}")
    if args.write:
        import torch

        page = [
            "# The gate's reach, measured by generated regressions",
            "",
            f"`python -m tests.mutation.generated --samples {args.samples} --seed {args.seed} "
            f"--world-size {args.world_size}` (`tox -e mutation`); torch {torch.__version__}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs; {total}.",
            "",
            *lines,
            "",
            "Survivors (a live change the suite let through):",
            "",
            *(f"- `{o['mutant']}`: {o['change']}" for o in survivors),
            "",
            "Equivalent under torch's contract (survivors `tests/mutation/equivalent.py` "
            "declares, with the reason read from the code):",
            "",
            *(f"- `{o['mutant']}`: {o['change']}: {o['by']}" for o in equivalents),
            "",
        ]
        Path(args.write).write_text("\n".join(page))
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
