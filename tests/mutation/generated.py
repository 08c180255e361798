"""Generated regressions, not chosen ones: the conformance suite's reach, measured.

The modules are those small real trainings execute (:mod:`tests.mutation.trace`: DDP, ZeRO,
FSDP2 with a distributed checkpoint, the comm hooks and averagers, on the installed torch),
and the places a mutant may change are the lines they execute there: every place an operator
of :mod:`tests.mutation.operators` can change on such a line, in a function whose mutated code
can take the original's place, is a mutant. ``--samples`` of them are drawn at random per
module with ``--seed`` (every one where fewer), each module from its own generator (seeded by
``--seed`` and its name), so a run over some modules draws what a run over all draws for them.

Every drawn mutant counts. Each is installed in a fresh conformance session (its ranks and its
own process) and the whole suite runs against it, stopping at the first failure, the mutated
module's own properties first: a failure kills it, a pass lets it survive, a run past
``--timeout`` counts as killed (the log says "timed out"). A survivor
:mod:`tests.mutation.equivalent` declares equivalent under torch's contract (with its reason
read from the code) counts as "equivalent"; nothing else is set aside. The score per module is
killed / (drawn - equivalent); the raw score, killed / drawn, is shown beside it.

    python -m tests.mutation.generated [--samples 40] [--seed 0] [--world-size 2 [4 ...]]
        [--modules GLOB ...] [--match TEXT] [--rerun RUN.json ...]
        [--write docs/mutation-measured.md] [--json out.json]

``--rerun`` judges a run's survivors again (after new properties or declarations): its killed
mutants stay killed, its equivalent ones stay so while declared, the rest run the suite. Given
several runs' files (``benchmarks/mutation/*.json``: the outcomes each measurement kept), it
judges them as one: a mutant one run killed stays killed whatever another said, and a mutant
none of them judged runs, so one command over every module gives the whole table.
``--json`` is written as each mutant is judged, so a run stopped part-way goes on with
``--rerun`` of what it wrote. Given several world sizes, a mutant that survives the suite at
one runs it again at the next (a regression only a larger world shows: at 2 ranks every group
of two is the world, so code that drops its group argument goes unseen); the outcome says the
size that killed it.
``tox -e mutation`` runs it.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import fnmatch
import hashlib
import importlib
import importlib.util
import inspect
import json
import linecache
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from tests.mutation.equivalent import why_equivalent
from tests.mutation.generated_patch import ENV, FIRST_ENV, ONLY_ENV, compiled
from tests.mutation.operators import Site, mutated, sites
from tests.mutation.reach import MARKS_ENV, OUT_ENV, marked, reached
from tests.mutation.source_patch import ENV as SOURCE_ENV
from tests.mutation.source_patch import SITECUSTOMIZE
from tests.mutation.trace import trace

ROOT = Path(__file__).resolve().parents[2]

# Module prefix -> the conformance modules run first against its mutants (the longest prefix
# that matches; the order only: a survivor runs the whole suite).
FIRST: dict[str, tuple[str, ...]] = {
    "torch.distributed.algorithms.model_averaging": ("test_model_averaging",),
    "torch.distributed.optim.post_localSGD_optimizer": ("test_model_averaging",),
    "torch.distributed.algorithms.ddp_comm_hooks": ("test_comm_hooks",),
    "torch.distributed.algorithms.join": ("test_join",),
    "torch.nn.utils.clip_grad": ("test_optimizers",),
    "torch.optim": ("test_optimizer_options", "test_optimizers", "test_fused_optimizer"),
    "torch.optim.optimizer": ("test_optimizer_base", "test_optimizer_options", "test_optimizers"),
    "torch.optim.lr_scheduler": ("test_lr_schedulers", "test_optimizers"),
    "torch.amp": ("test_grad_scaler", "test_optimizers"),
    "torch.distributed.nn": ("test_differentiable_collectives",),
    "torch.utils.data": ("test_data",),
    "torch.distributed.optim.zero_redundancy_optimizer": ("test_zero",),
    "torch.nn.parallel": ("test_ddp_options", "test_join", "test_fused_optimizer"),
    "torch.nn.modules.batchnorm": ("test_batch_norm", "test_ddp_options"),
    "torch.distributed.fsdp": ("test_fsdp",),
    "torch.distributed.tensor": ("test_dtensor", "test_fsdp"),
    "torch.distributed.tensor.parallel": ("test_tensor_parallel",),
    "torch.distributed.pipelining": ("test_pipelining",),
    "torch.distributed.device_mesh": ("test_device_mesh", "test_dtensor"),
    "torch.distributed._mesh_layout": ("test_device_mesh", "test_dtensor"),
    "torch.distributed._pycute": ("test_device_mesh", "test_dtensor"),
    "torch.distributed._functional_collectives": ("test_collectives", "test_dtensor"),
    "torch.distributed.checkpoint": ("test_checkpoint", "test_fsdp", "test_zero"),
    "torch.distributed.checkpoint.state_dict": ("test_state_dict", "test_fsdp"),
    "torch.distributed.distributed_c10d": ("test_collectives", "test_object_collectives"),
}


def first_for(module: str) -> tuple[str, ...]:
    """The conformance modules to run first against a mutant of ``module``.

    Example::

        >>> first_for("torch.optim.sgd")[0]
        'test_optimizer_options'
    """
    matches = [prefix for prefix in FIRST if module == prefix or module.startswith(prefix + ".")]
    return FIRST[max(matches, key=len)] if matches else ()


@dataclasses.dataclass(frozen=True)
class Mutant:
    module: str
    qualname: str
    site: Site
    source: str
    line: int  # in the module's file
    # Among the function's mutants of the same line, operator and change (two zeros of one
    # line made 1), which one: the second and later are named apart, so that their outcomes
    # are kept apart (the first keeps the name outcomes were recorded under before).
    nth: int = 0

    def as_json(self) -> dict[str, str]:
        return {"module": self.module, "qualname": self.qualname, "source": self.source}

    @property
    def name(self) -> str:
        twin = f"#{self.nth + 1}" if self.nth else ""
        return f"{self.module}:{self.qualname}:{self.line}:{self.site.operator}{twin}"

    @property
    def where(self) -> str:
        """The mutated line of torch's file, stripped: what tells apart two mutants of one
        function that make the same change (a placeholder 0 made 1 here, an index there)."""
        path = importlib.util.find_spec(self.module).origin  # type: ignore[union-attr]
        return linecache.getline(str(path), self.line).strip()

    def module_source(self) -> str:
        """The module's whole source with this mutant's function in place of the original's
        ``def`` (its decorators kept, applied to it as the module is imported): what
        :mod:`tests.mutation.source_patch` imports the module from."""
        path = importlib.util.find_spec(self.module).origin  # type: ignore[union-attr]
        text = Path(str(path)).read_text()
        node: ast.AST = ast.parse(text)
        for part in self.qualname.split("."):
            node = _defined(node, part)
        assert isinstance(node, ast.FunctionDef) and node.end_lineno is not None
        lines = text.splitlines(keepends=True)
        made = textwrap.indent(self.source.rstrip("\n") + "\n", " " * node.col_offset)
        return "".join(lines[: node.lineno - 1]) + made + "".join(lines[node.end_lineno :])


def _defined(scope: ast.AST, name: str) -> ast.AST:
    # The def or class ``name`` in ``scope``'s own body, behind an if or a try at most (not
    # in a nested function's body); through an alias (``_Partial = Partial``: the class is
    # found, and its methods traced, under both names).
    bodies = [getattr(scope, "body", [])]
    while bodies:
        for statement in bodies.pop(0):
            if isinstance(statement, (ast.FunctionDef, ast.ClassDef)) and statement.name == name:
                return statement
            if (
                isinstance(statement, ast.Assign)
                and [getattr(t, "id", None) for t in statement.targets] == [name]
                and isinstance(statement.value, ast.Name)
            ):
                return _defined(scope, statement.value.id)
            if isinstance(statement, (ast.If, ast.Try)):
                bodies += [statement.body, statement.orelse]
                bodies += [h.body for h in getattr(statement, "handlers", [])]
    raise KeyError(f"no {name} defined in {getattr(scope, 'name', 'the module')}")


def functions(module: str) -> list[tuple[str, ast.FunctionDef, int]]:
    """The module's functions and methods defined in its own file: (qualname, parsed def,
    first line in the file)."""
    found = []
    loaded = importlib.import_module(module)
    own = inspect.getsourcefile(loaded)
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
            # Not lambdas, and only code of the module's own file: a class's generated methods
            # (a NamedTuple's _make and __repr__ come from collections) have line numbers of
            # another file, which the trace's lines of this one would match by chance.
            source = inspect.getsourcefile(inspect.unwrap(function))
            if function.__code__.co_name == "<lambda>" or source != own:
                continue
            try:
                lines, first = inspect.getsourcelines(function)
            except (OSError, TypeError):
                continue
            parsed = _parsed("".join(lines))
            if parsed is not None:
                found.append((qualname, parsed, first))
    return found


def _parsed(source: str) -> ast.FunctionDef | None:
    r"""A function's source, as ``inspect`` gives it, parsed, its lines counted from 1.

    A method's source is indented; ``dedent`` leaves it so where a line of it starts at
    the margin (a line of a string or of an expression in brackets, as in
    ``pipelining.schedules``), so such a source is parsed as the body of a block instead.

    Example::

        >>> _parsed("    def f(self):\n        s = (\n'a')\n        return s\n").body[1].lineno
        4
    """
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        tree = ast.parse("if True:\n" + source)
        block = tree.body[0]
        assert isinstance(block, ast.If)
        tree.body = block.body
        ast.increment_lineno(tree, -1)
    if tree.body and isinstance(tree.body[0], ast.FunctionDef):
        return tree.body[0]
    return None


def mutants(module: str, lines: set[int] | None = None) -> list[Mutant]:
    """Every mutant the operators make of ``module`` (on ``lines`` only, where given)."""
    made = []
    seen: collections.Counter[tuple[str, int, str, str]] = collections.Counter()
    for qualname, function, first in functions(module):
        for site in sites(function):
            line = first + site.line - 1
            if lines is None or line in lines:
                key = (qualname, line, site.operator, site.change)
                made.append(
                    Mutant(module, qualname, site, mutated(function, site), line, seen[key])
                )
                seen[key] += 1
    return made


def installable(mutant: Mutant) -> bool:
    """Whether the mutated code can take the original's place (not where it closes over
    other names, or its function cannot be found as named; nor a ``__hash__``: objects
    already in sets and dicts, hashed by the original, would not be found by the swapped one,
    a failure no regression makes, as a changed hash holds from the start)."""
    if mutant.qualname.rpartition(".")[2] == "__hash__":
        return False
    try:
        compiled(mutant.as_json())
    except (ValueError, KeyError, AttributeError, SyntaxError, TypeError):
        return False
    return True


def _write(mutant: Mutant, directory: Path) -> Path:
    path = directory / "mutant.json"
    path.write_text(json.dumps(mutant.as_json()))
    return path


def _write_source(mutant: Mutant, directory: Path) -> Path:
    # The module's mutated source, and a sitecustomize that every process of the run imports
    # at its start (before torch) to import the module from it.
    (directory / "site").mkdir(exist_ok=True)
    (directory / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = directory / "mutant-source.json"
    path.write_text(json.dumps({"module": mutant.module, "source": mutant.module_source()}))
    return path


def raises_at_import(mutant: Mutant, directory: Path, timeout: float) -> str:
    """What importing ``mutant``'s module from its mutated source raises ("" where it
    imports): a mutant that cannot be imported is not a regression anyone ships."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, ONLY_ENV)}
    env[SOURCE_ENV] = str(_write_source(mutant, directory))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(directory / "site"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    )
    command = [sys.executable, "-c", f"import {mutant.module}"]
    try:
        done = subprocess.run(
            command, env=env, cwd=directory, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return ""  # no raise seen: the suite's own time-out judges a mutant that hangs
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


# Return codes of a suite ended by a signal from outside rather than by what it ran.
EXTERNAL = (-signal.SIGTERM, -signal.SIGKILL)


def suite(
    mutant: Mutant,
    directory: Path,
    world_size: int,
    timeout: float,
    first: tuple[str, ...] = (),
    only: list[str] | None = None,
    at_import: bool = False,
) -> tuple[str, str]:
    """The conformance suite against ``mutant`` (the test modules ``first`` run first; only
    the tests ``only`` names where given, none where it is empty): ("killed", the failing
    test) or ("survived", "") or ("timed out", ""). ``at_import``: the mutant is its module's
    source from before the module is imported (:mod:`tests.mutation.source_patch`), for a
    function that runs as its module is imported; else its function's code is swapped once
    the module is (:mod:`tests.mutation.generated_patch`)."""
    if only is not None and not only:
        return "survived", ""  # no test calls the function: each runs what torch runs
    env = {**os.environ, FIRST_ENV: ",".join(first),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    for name in (ONLY_ENV, ENV, SOURCE_ENV):
        env.pop(name, None)
    if at_import:
        env[SOURCE_ENV] = str(_write_source(mutant, directory))
        env["PYTHONPATH"] = f"{directory / 'site'}{os.pathsep}{env['PYTHONPATH']}"
    else:
        env[ENV] = str(_write(mutant, directory))
    if only is not None:
        selection = directory / "only.json"
        selection.write_text(json.dumps(only))
        env[ONLY_ENV] = str(selection)
    command = [sys.executable, "-m", "pytest", "--pyargs", "ddp_verify.conformance",
               "--world-size", str(world_size), "-x", "-q", "-p", "no:cacheprovider",
               "-p", "tests.mutation.generated_patch",
               "--ddp-preload", "tests.mutation.generated_patch", "-n", "0"]  # fmt: skip
    for _ in range(2):
        try:
            done = subprocess.run(command, env=env, cwd=directory, capture_output=True,
                                  text=True, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            return "timed out", ""
        # Ended from outside (SIGTERM, SIGKILL: the machine, a user), not by the mutant: once
        # more. Other signals (a crash, an abort) are the mutant's.
        if done.returncode not in EXTERNAL:
            break
    if done.returncode == 0:
        return "survived", ""
    # A test failed, or errored (a fixture, a world that could not start under the mutant).
    lines = done.stdout.splitlines()
    failed = [line[7:120] for line in lines if line.startswith("FAILED ")]
    failed += [f"error in {line[6:113]}" for line in lines if line.startswith("ERROR ")]
    return "killed", failed[0] if failed else f"exit {done.returncode}"


def judge(
    mutant: Mutant,
    directory: Path,
    world_sizes: list[int],
    timeout: float,
    first: tuple[str, ...] = (),
    only: Callable[[int], list[str] | None] = lambda size: None,
    at_import: bool = False,
) -> tuple[str, str]:
    """:func:`suite` at each world size in turn until one kills (or times out on) the mutant;
    past the first size, what killed it says the size. ``timeout`` is the first size's: a
    larger world's suite is given it in proportion (its ranks share the same cores), so that
    a slower suite is not read as a hang. ``only(size)``: the tests to run at that size
    (every one where None)."""
    outcome, by = "survived", ""
    for index, world_size in enumerate(world_sizes):
        scaled = timeout * max(1.0, world_size / world_sizes[0])
        outcome, by = suite(
            mutant, directory, world_size, scaled, first, only(world_size), at_import
        )
        if outcome != "survived":
            if index:
                by = f"{by} (at world size {world_size})"
            break
    return outcome, by


def marks(traced: dict[str, list[int]]) -> list[dict[str, str]]:
    """Each function of ``traced``'s modules with a mutant on a line the trainings run, marked
    (:func:`tests.mutation.reach.marked`): where its mark cannot take its code's place, left
    out (its mutants then run every test)."""
    made = []
    for module, lines in traced.items():
        names = {m.qualname for m in mutants(module, set(lines))}
        for qualname, function, _ in functions(module):
            if qualname not in names:
                continue
            mark = {"module": module, "qualname": qualname,
                    "source": marked(function, f"{module}:{qualname}")}  # fmt: skip
            try:
                compiled(mark)
            except (ValueError, KeyError, AttributeError, SyntaxError, TypeError):
                continue
            made.append(mark)
    return made


def _sources_digest(made: list[dict[str, str]], world_size: int) -> str:
    import torch

    digest = hashlib.sha256(f"{torch.__version__}:{world_size}".encode())
    digest.update(json.dumps(made, sort_keys=True).encode())
    for path in sorted([*(ROOT / "ddp_verify").rglob("*.py"), ROOT / "tests/mutation/reach.py"]):
        digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def reach(
    made: list[dict[str, str]], world_size: int, timeout: float
) -> dict[str, list[str] | None]:
    """The tests that call each marked function at ``world_size``
    (:func:`tests.mutation.reach.reached`), from one run of the whole suite on unmodified
    torch with the marks in place: cached under ``.cache/mutation-reach`` while torch, the
    suite and the marks stay as they are. A ``SystemExit`` where the suite fails there: no
    mutant's outcome means anything against a suite that fails on torch itself."""
    cache = ROOT / ".cache" / "mutation-reach" / f"{_sources_digest(made, world_size)}.json"
    if cache.exists():
        return dict(json.loads(cache.read_text()))
    with tempfile.TemporaryDirectory() as work:
        out = Path(work)
        (out / "marks.json").write_text(json.dumps(made))
        env = {**os.environ, MARKS_ENV: str(out / "marks.json"), OUT_ENV: str(out),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
        for name in (ENV, ONLY_ENV, FIRST_ENV):
            env.pop(name, None)
        command = [sys.executable, "-m", "pytest", "--pyargs", "ddp_verify.conformance",
                   "--world-size", str(world_size), "-q", "-p", "no:cacheprovider",
                   "-p", "tests.mutation.reach", "--ddp-preload", "tests.mutation.reach",
                   "-n", "0"]  # fmt: skip
        print(f"which tests call which function, at world size {world_size}: the suite on "
              f"unmodified torch with {len(made)} functions marked", flush=True)  # fmt: skip
        try:
            done = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True,
                                  timeout=timeout * 4)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SystemExit(
                f"the conformance suite on unmodified torch at world size {world_size} ran past "
                f"{timeout * 4:.0f} s: give --timeout more"
            ) from exc
        if done.returncode != 0:
            raise SystemExit(
                f"the conformance suite fails on unmodified torch at world size {world_size} "
                f"(exit {done.returncode}): fix that first, no mutant's outcome means anything "
                f"against it\n{done.stdout[-3000:]}"
            )
        found = reached(out)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(found, indent=0, sort_keys=True))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40, help="mutants drawn per module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-size", type=int, nargs="+", default=[2],
                        help="a survivor runs again at the next size")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per suite run")
    parser.add_argument("--modules", nargs="*", default=["*"])
    parser.add_argument("--match", default=None,
                        help="run every mutant whose name contains this (a survivor, again) "
                        "instead of a sample")  # fmt: skip
    parser.add_argument("--rerun", nargs="+", default=None, metavar="JSON",
                        help="runs' --json files: their killed mutants stay killed (killed in "
                        "any of them), their equivalent ones stay so while declared, the rest "
                        "run again against the suite as it stands "
                        "(the same --samples and --seed draw the same mutants)")  # fmt: skip
    parser.add_argument("--every-test", action="store_true",
                        help="run every test against each mutant, not only those that call "
                        "the function it changes (tests.mutation.reach)")  # fmt: skip
    parser.add_argument("--write", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows: list[list[object]] = []
    outcomes: list[dict[str, str]] = []
    started = time.monotonic()
    before: dict[tuple[str, str], dict[str, str]] = {}
    if args.rerun:
        before = kept_outcomes([Path(p) for p in args.rerun])
    reached = trace()
    made: list[dict[str, str]] | None = None
    reaches: dict[int, dict[str, list[str] | None]] = {}

    def only(mutant: Mutant) -> Callable[[int], list[str] | None]:
        # The tests that call the mutated function at each size (measured when first needed):
        # every test where its function has no mark.
        def at(size: int) -> list[str] | None:
            nonlocal made
            if args.every_test:
                return None
            if made is None:
                made = marks(reached)
            key = f"{mutant.module}:{mutant.qualname}"
            if not any(f"{m['module']}:{m['qualname']}" == key for m in made):
                return None
            if size not in reaches:
                reaches[size] = reach(made, size, args.timeout)
            return reaches[size].get(key, [])

        return at

    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        for module, lines in reached.items():
            if not any(fnmatch.fnmatch(module, g) for g in args.modules):
                continue
            every = mutants(module, set(lines))
            if args.match:
                drawn = [m for m in every if args.match in f"{m.name} ({m.site.change})"]
            else:
                rng = random.Random(f"{args.seed}:{module}")
                drawn = rng.sample(every, min(args.samples, len(every)))
            if not drawn:
                continue
            counts = {"killed": 0, "survived": 0, "timed out": 0, "equivalent": 0}
            for mutant in drawn:
                earlier = before.get((mutant.name, mutant.site.change))
                reason = why_equivalent(
                    mutant.module,
                    mutant.qualname,
                    mutant.site.operator,
                    mutant.site.change,
                    mutant.where,
                    mutant.nth,
                )
                # Killed stays killed (unless a signal from outside ended its suite);
                # equivalent stays so while it is declared (in the declaration's words as they
                # stand); anything else runs again.
                ended = earlier is not None and earlier["by"] in [f"exit {c}" for c in EXTERNAL]
                if (
                    earlier is not None
                    and earlier["outcome"] in ("killed", "timed out")
                    and (not ended)
                ):
                    outcome, by = earlier["outcome"], earlier["by"]
                elif earlier is not None and earlier["outcome"] == "equivalent" and reason:
                    outcome, by = "equivalent", reason
                else:
                    # A declared mutant that survives is equivalent whatever a larger world
                    # says (killed there or not, it leaves no survivor): judged at one size.
                    sizes = args.world_size[:1] if reason else args.world_size
                    calls = only(mutant)
                    whole = False  # whether every test has run it as its module's source
                    if not installable(mutant) or (not args.every_test and calls(sizes[0]) == []):
                        # Never called once its module is imported: it runs as the module is
                        # imported (or no test calls it), where a swap of its code would change
                        # nothing that runs; or its code cannot take the original's place.
                        # Judged as its module's source, by every test.
                        failure = raises_at_import(mutant, directory, args.timeout)
                        if failure:
                            outcome, by = "equivalent", f"raises at import: {failure}"
                        else:
                            outcome, by = judge(mutant, directory, sizes, args.timeout,
                                                first_for(module), at_import=True)  # fmt: skip
                        whole = True
                    else:
                        outcome, by = judge(
                            mutant, directory, sizes, args.timeout, first_for(module), calls
                        )
                    if outcome == "survived" and not reason and not whole:
                        # A survivor runs every test once more, its module imported from the
                        # mutated source: neither a call the reach missed (a closure made in
                        # one test, called in another) nor one a swap of the function's code
                        # cannot change (a decorator applied, a closure built, as the module
                        # is imported, perhaps inside a test) leaves a survivor that the whole
                        # suite kills.
                        failure = raises_at_import(mutant, directory, args.timeout)
                        if failure:
                            outcome, by = "equivalent", f"raises at import: {failure}"
                        else:
                            outcome, by = suite(mutant, directory, sizes[0], args.timeout,
                                                first_for(module), at_import=True)  # fmt: skip
                        if outcome != "survived" and not failure:
                            # Said, so that a reach or a swap that misses is seen and mended.
                            by = f"{by} (every test, its module imported mutated)"
                if outcome == "survived" and reason:
                    outcome, by = "equivalent", reason
                counts[outcome] += 1
                outcomes.append({"mutant": mutant.name, "change": mutant.site.change,
                                 "outcome": outcome, "by": by})  # fmt: skip
                print(f"{mutant.name} ({mutant.site.change}): {outcome} {by}".rstrip(),
                      flush=True)  # fmt: skip
                if args.json:
                    _keep(args.json, outcomes, before)
            killed = counts["killed"] + counts["timed out"]
            judged = len(drawn) - counts["equivalent"]
            score = f"{killed / judged:.0%}" if judged else "—"
            raw = f"{killed / len(drawn):.0%}"
            rows.append([module, len(lines), len(every), len(drawn), counts["equivalent"],
                         killed, counts["survived"], score, raw])  # fmt: skip
    head = "| module | lines run | mutants there | drawn | equivalent | killed | survived |"
    table = [f"{head} score | raw |", "|" + " --- |" * 9]
    table += ["| `" + str(r[0]) + "` | " + " | ".join(str(x) for x in r[1:]) + " |" for r in rows]
    survivors = [o for o in outcomes if o["outcome"] == "survived"]
    equivalents = [o for o in outcomes if o["outcome"] == "equivalent"]
    total = f"{time.monotonic() - started:.0f} s"
    print("\n" + "\n".join(table) + f"\n\n{len(survivors)} survived; {total}")
    if args.write:
        import torch

        modules = " ".join(args.modules)
        page = [
            "# Generated regressions: the last run written",
            "",
            "Written by the run below (`--write`); the method and every survivor's reading "
            "are in [the generated regressions page](mutation.md).",
            "",
            f"`python -m tests.mutation.generated --samples {args.samples} --seed {args.seed} "
            f"--world-size {' '.join(map(str, args.world_size))} --modules {modules}` "
            f"(`tox -e mutation`); torch "
            f"{torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
            f"{total}"
            + (
                ", judging again the survivors of "
                + ", ".join(f"`{Path(p).name}`" for p in args.rerun)
                + " (the killed mutants kept, the declared equivalents kept while declared)."
                if args.rerun
                else "."
            ),
            "",
            *table,
            "",
            "Survivors (a change the suite let through):",
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
        _keep(args.json, outcomes, before)
    return 0


def kept_outcomes(paths: list[Path]) -> dict[tuple[str, str], dict[str, str]]:
    """The outcomes several runs' ``--json`` files hold, by (mutant, change): where they differ,
    a kill (or a time-out) in any of them wins, as a property that killed a mutant once still
    does; otherwise the last file's word.

    >>> import json, tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> m = {"mutant": "m:f:1:comparison", "change": "a < b -> a <= b", "by": ""}
    >>> _ = (d / "a.json").write_text(json.dumps([{**m, "outcome": "killed"}]))
    >>> _ = (d / "b.json").write_text(json.dumps([{**m, "outcome": "survived"}]))
    >>> [o["outcome"] for o in kept_outcomes([d / "a.json", d / "b.json"]).values()]
    ['killed']
    """
    kept: dict[tuple[str, str], dict[str, str]] = {}
    for path in paths:
        for outcome in json.loads(path.read_text()):
            key = (outcome["mutant"], outcome["change"])
            if kept.get(key, {}).get("outcome") in ("killed", "timed out"):
                continue
            kept[key] = outcome
    return kept


def _keep(
    path: str, outcomes: list[dict[str, str]], before: dict[tuple[str, str], dict[str, str]]
) -> None:
    # Written after each mutant, with what a rerun's file held that this run has not judged
    # (not reached yet, or of modules it leaves out): a run stopped part-way goes on by --rerun
    # of its own file, and a rerun of some modules keeps the others' outcomes.
    judged = {(o["mutant"], o["change"]) for o in outcomes}
    pending = [o for key, o in before.items() if key not in judged]
    # Whole or not at all: a run stopped while writing keeps the file it last wrote.
    partial = Path(f"{path}.writing")
    partial.write_text(json.dumps(outcomes + pending, indent=1))
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
