"""The generated-mutation tool's parts: its operators change what they say, a generated
mutant runs in place of torch's function wherever it is called from, one that cannot take
its place is refused, and the modules and lines it draws from are those real trainings
execute."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
from pathlib import Path

import pytest
import torch

from tests.mutation import operators
from tests.mutation.generated import mutants
from tests.mutation.generated_patch import compiled, install_mutant

SOURCE = textwrap.dedent(
    """
    def f(xs, group=None, n=2):
        total = 0
        for i, x in enumerate(xs):
            if i < n:
                total += x.sum() / dist.get_world_size(group)
        return g(xs, group=group)["mean"] + total
    """
)


def test_each_operator_changes_what_it_says():
    (function,) = ast.parse(SOURCE).body
    made = {site.operator: operators.mutated(function, site) for site in operators.sites(function)}
    assert set(made) == {
        "comparison", "sum-mean", "dropped-keyword", "world-divisor", "reversed-iteration",
        "ignored-argument", "arithmetic", "off-by-one",
    }  # fmt: skip
    assert "if i <= n:" in made["comparison"]
    assert "x.mean()" in made["sum-mean"]
    assert "g(xs)" in made["dropped-keyword"]
    assert "dist.get_world_size()" in made["world-divisor"]
    assert "reversed(list(enumerate(xs)))" in made["reversed-iteration"]
    assert "if i < 2:" in made["ignored-argument"]
    # Every mutant is the function with one change: it parses, and differs from the original.
    for source in made.values():
        assert ast.dump(ast.parse(source)) != ast.dump(ast.parse(SOURCE))


def test_a_mutant_runs_wherever_torchs_function_is_called_from():
    # clip_grad_norm_ is re-exported as torch.nn.utils.clip_grad_norm_ and wrapped by a
    # decorator: the mutated code must run through both.
    module = "torch.nn.utils.clip_grad"
    (mutant,) = [
        m for m in mutants(module)
        if m.qualname == "_get_total_norm" and m.site.operator == "ignored-argument"
        and "norm_type" in m.site.change
    ][:1]  # fmt: skip
    params = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    params[0].grad = torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64)
    target, original = compiled(mutant.as_json())[0], None
    original = target.__code__
    try:
        install_mutant(mutant.as_json())
        total = torch.nn.utils.clip_grad_norm_(params, 100.0, norm_type=1.0)
        assert float(total) == pytest.approx(5.0), "the mutant (the 2-norm) did not run"
    finally:
        target.__code__ = original
        del target._generated_mutant
    total = torch.nn.utils.clip_grad_norm_(params, 100.0, norm_type=1.0)
    assert float(total) == pytest.approx(7.0)


def test_a_mutant_of_a_function_that_calls_itself_runs_in_its_recursion_too():
    # _pycute's product calls itself by name (from a lambda): the mutated code must read that
    # name from its module, as the original does, so that every level of the recursion runs
    # the mutant (compiled inside a function that defines the same name, it closed over that
    # name and was refused, and such mutants were never drawn).
    module = "torch.distributed._pycute.int_tuple"
    (mutant,) = [m for m in mutants(module)
                 if m.qualname == "product" and m.site.operator == "off-by-one"]  # fmt: skip
    target, code = compiled(mutant.as_json())
    assert code.co_freevars == () and code.co_name == "product"
    original = target.__code__
    try:
        install_mutant(mutant.as_json())
        # reduce starts at 2, not 1, at each level: 2 * 2 * (2 * 3 * 4).
        assert target((2, (3, 4))) == 2 * 2 * (2 * 3 * 4)
    finally:
        target.__code__ = original
        del target._generated_mutant
    assert target((2, (3, 4))) == 24


def _closing(k: int):
    def closed(x):
        return x + k

    return closed


closed = _closing(3)


def test_a_mutant_that_closes_over_other_names_is_refused():
    mutant = {
        "module": __name__,
        "qualname": "closed",
        "source": "def closed(x):\n    return x - k",
    }
    target, code = compiled(mutant)
    assert code.co_freevars == target.__code__.co_freevars == ("k",)
    mutant["source"] = "def closed(x):\n    return x"  # no longer closes over k
    with pytest.raises(ValueError, match="closes over"):
        compiled(mutant)


def test_a_mutant_of_a_hash_is_judged_as_its_modules_source_not_swapped():
    # Swapped once placements sit in sets and caches, a hash loses them (a false kill); a
    # changed hash holds from the start only in the module's source.
    from tests.mutation.generated import installable

    made = [m for m in mutants("torch.distributed.tensor.placement_types")
            if m.qualname.endswith("__hash__")]  # fmt: skip
    others = [m for m in mutants("torch.distributed.tensor.placement_types")
              if m.qualname == "Shard.local_shard_size_and_offset"]  # fmt: skip
    assert made and others
    assert not any(installable(m) for m in made)
    assert all(installable(m) for m in others)


def test_the_modules_and_lines_are_those_real_trainings_execute():
    import tempfile
    from pathlib import Path

    from tests.mutation import generated, trace

    before = set(Path(tempfile.gettempdir()).glob("ddp_verify-trace-*"))
    reached = trace.trace()
    # The checkpoint round trip's directory is removed: a trace leaves nothing behind.
    assert set(Path(tempfile.gettempdir()).glob("ddp_verify-trace-*")) == before
    # Training's own modules, beyond any list: the optimizers, the scheduler, the scaler, the
    # norms, c10d and the distributed checkpoint among them.
    for module in ("torch.optim.sgd", "torch.optim.adam", "torch.optim.lr_scheduler",
                   "torch.amp.grad_scaler", "torch.nn.modules.batchnorm",
                   "torch.distributed.distributed_c10d", "torch.nn.parallel.distributed",
                   "torch.distributed.checkpoint.state_dict",
                   "torch.distributed.fsdp._fully_shard._fsdp_collectives",
                   "torch.distributed.pipelining.schedules", "torch.distributed.pipelining.stage",
                   "torch.distributed.tensor.parallel.style"):  # fmt: skip
        assert reached.get(module), f"{module}: not reached"
    # What every program runs is out of scope; a module only imported is not reached (its
    # def lines run at import, none of its functions do).
    assert "torch.nn.modules.linear" not in reached
    assert "torch.distributed.optim.functional_adadelta" not in reached
    # A mutant is drawn only where a training ran: on a line of a function it executed.
    lines = set(reached["torch.optim.sgd"])
    there = generated.mutants("torch.optim.sgd", lines)
    every = generated.mutants("torch.optim.sgd")
    assert there and len(there) < len(every)
    assert all(m.line in lines for m in there)
    assert any(m.qualname == "_single_tensor_sgd" for m in there)


def test_the_mutated_modules_own_properties_run_first(tmp_path):
    # Only the order changes: every test is still collected.
    import os
    import subprocess
    import sys

    from tests.mutation.generated import ROOT
    from tests.mutation.generated_patch import FIRST_ENV

    def collected(first: str) -> list[str]:
        env = {**os.environ, FIRST_ENV: first, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--pyargs", "ddp_verify.conformance",
             "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "tests.mutation.generated_patch"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return [line for line in done.stdout.splitlines() if "::" in line]

    plain, ordered = collected(""), collected("test_zero,test_fsdp")
    assert sorted(plain) == sorted(ordered) and len(plain) > 50
    zero = sum(1 for t in plain if t.startswith("test_zero.py"))
    fsdp = sum(1 for t in plain if t.startswith("test_fsdp.py"))
    assert all(t.startswith("test_zero.py") for t in ordered[:zero])
    assert all(t.startswith("test_fsdp.py") for t in ordered[zero : zero + fsdp])
    assert not plain[0].startswith("test_zero.py")


def test_every_declared_equivalent_is_a_mutant_of_this_torch():
    # Declarations read from torch 2.13.0's code: each must still name a mutant the operators
    # make, or it would excuse nothing (and say so nowhere).
    from tests.mutation.equivalent import EQUIVALENT

    if not torch.__version__.startswith("2.13."):
        pytest.skip(f"declared from torch 2.13.0's code, not {torch.__version__}'s")
    made = {
        key
        for module in {key[0] for key in EQUIVALENT}
        for m in mutants(module)
        for key in (
            (m.module, m.qualname, m.site.operator, m.site.change),
            (m.module, m.qualname, m.site.operator, f"{m.site.change} at `{m.where}`"),
            (
                m.module,
                m.qualname,
                f"{m.site.operator}#{m.nth + 1}",
                f"{m.site.change} at `{m.where}`",
            ),
        )
    }
    stale = [key for key in EQUIVALENT if key not in made]
    assert not stale, f"declared equivalents no operator makes: {stale}"
    assert all(len(why) > 40 for why in EQUIVALENT.values()), "each needs its reason"


def test_a_rerun_keeps_what_was_judged_and_runs_the_survivors_again(tmp_path):
    # Three of the distributed sampler's mutants: one recorded killed by an earlier run keeps
    # that outcome without a suite run (its "by" is the earlier run's); one recorded as
    # surviving runs again, here against a time-out too short for any suite: "timed out", not
    # "survived"; one whose "kill" was a SIGTERM from outside ending its suite runs again too.
    import random

    from tests.mutation.generated import main
    from tests.mutation.trace import trace

    module = "torch.utils.data.distributed"
    every = mutants(module, set(trace()[module]))
    drawn = random.Random(f"0:{module}").sample(every, 3)  # what --seed 0 --samples 3 draws
    said = ("the earlier run", "the earlier run", "exit -15")
    earlier = [
        {"mutant": m.name, "change": m.site.change, "outcome": outcome, "by": by}
        for m, outcome, by in zip(drawn, ("killed", "survived", "killed"), said, strict=True)
    ]
    # And one of a module this rerun leaves out: the file it writes keeps it.
    other = {"mutant": "torch.optim.sgd:SGD.step:1:arithmetic", "change": "+ -> -",
             "outcome": "killed", "by": "another module's run"}  # fmt: skip
    (tmp_path / "before.json").write_text(json.dumps([*earlier, other]))
    # A later run's file that says the killed one survived: a kill in any file is kept.
    later = {**earlier[0], "outcome": "survived", "by": "a later run"}
    (tmp_path / "later.json").write_text(json.dumps([later]))
    before, after_json = str(tmp_path / "before.json"), str(tmp_path / "after.json")
    main(["--modules", module, "--samples", "3", "--seed", "0", "--timeout", "0.01",
          "--every-test", "--rerun", before, str(tmp_path / "later.json"),
          "--json", after_json])  # fmt: skip
    after = {o["mutant"]: o for o in json.loads((tmp_path / "after.json").read_text())}
    kept, again, ended = earlier
    assert after[kept["mutant"]]["outcome"] == "killed"
    assert after[kept["mutant"]]["by"] == "the earlier run"
    assert after[again["mutant"]]["outcome"] == "timed out", after[again["mutant"]]
    assert after[ended["mutant"]]["outcome"] == "timed out", after[ended["mutant"]]
    assert after[other["mutant"]] == other


def test_a_declaration_of_one_line_excuses_no_other_line():
    # scatter_object_list makes "0 -> 1" at two placeholders (declared) and could at the index
    # its result is written to (not): only the lines named are excused.
    from tests.mutation.equivalent import why_equivalent

    args = ("torch.distributed.distributed_c10d", "scatter_object_list", "off-by-one", "0 -> 1")
    placeholder = "obj_tensor_size = torch.tensor([0], dtype=torch.long, device=pg_device)"
    assert why_equivalent(*args, placeholder)
    assert why_equivalent(*args, "scatter_object_output_list[0] = _tensor_to_object(") is None


def test_a_declaration_of_one_twin_excuses_not_the_other():
    # cosize's `self(self.size() - 1) + 1` makes "1 -> 2" twice on one line: the first raises
    # cosize (every mesh refused, killed), the second lowers it (a weaker guard, declared).
    from tests.mutation.equivalent import why_equivalent

    made = [
        m for m in mutants("torch.distributed._pycute.layout")
        if m.qualname == "Layout.cosize" and m.site.change == "1 -> 2"
    ]  # fmt: skip
    assert sorted(m.nth for m in made) == [0, 1]
    said = {
        m.source.strip().splitlines()[-1].split("#")[0].strip(): why_equivalent(
            m.module, m.qualname, m.site.operator, m.site.change, m.where, m.nth
        )
        for m in made
    }
    assert said["return self(self.size() - 1) + 2"] is None
    assert said["return self(self.size() - 2) + 1"]


def test_two_mutants_of_one_line_making_the_same_change_are_named_apart():
    # FSDP2's _init_sharded_param has lines with two zeros (narrow(dim=..., start=0,
    # length=... if ... > 0 else 0)): each made 1 is its own mutant, and their outcomes must
    # not be kept under one name (a rerun would give the second the first's). The first keeps
    # the name outcomes were recorded under before.
    made = mutants("torch.distributed.fsdp._fully_shard._fsdp_param")
    # Outcomes are kept by (name, change): the name holds the line and operator.
    keys = [(m.name, m.site.change) for m in made]
    twins = [m for m in made if m.nth]
    assert twins, "no line of _fsdp_param makes one change twice: pick another module"
    assert len(set(keys)) == len(keys), "two mutants share a name and a change"
    for twin in twins:
        assert twin.name.endswith(f"#{twin.nth + 1}")
        first = next(
            m for m in made
            if (m.qualname, m.line, m.site.operator, m.site.change, m.nth)
            == (twin.qualname, twin.line, twin.site.operator, twin.site.change, 0)
        )  # fmt: skip
        assert first.name == f"{first.module}:{first.qualname}:{first.line}:{first.site.operator}"
        assert first.source != twin.source, "the twins are the same mutant"


def test_the_functions_drawn_from_are_the_modules_own_decorated_or_not():
    # A NamedTuple's generated methods (from collections' file) are not the module's code,
    # though their line numbers could match its traced lines; a function behind a decorator
    # of another module (c10d's collectives behind its logger) is.
    from tests.mutation.generated import functions

    fsdp = {
        name for name, _, _ in functions("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    }
    assert "foreach_reduce" in fsdp
    assert not {"AllGatherResult._make", "AllGatherResult.__repr__"} & fsdp, fsdp
    c10d = {name for name, _, _ in functions("torch.distributed.distributed_c10d")}
    assert {"all_reduce", "broadcast"} <= c10d
    # A method whose source has a line at the margin (a bracketed expression's, in
    # pipelining's schedules) is parsed, its lines counted in the module's file.
    schedules = "torch.distributed.pipelining.schedules"
    found = {name: (tree, first) for name, tree, first in functions(schedules)}
    tree, first = found["Schedule1F1B.__init__"]
    text = Path(inspect.getsourcefile(importlib.import_module(schedules)) or "").read_text()
    last = text.splitlines()[first + tree.body[-1].lineno - 2].strip()
    assert last.startswith(ast.unparse(tree.body[-1]).splitlines()[0][:20]), last


def test_a_survivor_is_judged_again_at_the_next_world_size(monkeypatch, tmp_path):
    # The suite's runs stand in for by what each world size would say (a real run of both
    # is the tool's own work): a survivor at 2 runs again at 4, which names its size; a
    # mutant killed at 2 runs nowhere else.
    from tests.mutation import generated

    runs: list[int] = []
    timeouts: list[float] = []

    def suite(mutant, directory, world_size, timeout, first=(), only=None, at_import=False):
        runs.append(world_size)
        timeouts.append(timeout)
        return ("killed", "test_fsdp.py::t") if world_size == 4 else ("survived", "")

    monkeypatch.setattr(generated, "suite", suite)
    mutant = mutants("torch.utils.data.sampler")[0]
    assert generated.judge(mutant, tmp_path, [2, 4], 1.0) == (
        "killed",
        "test_fsdp.py::t (at world size 4)",
    )
    assert runs == [2, 4]
    assert timeouts == [1.0, 2.0]  # a world twice as large, twice the time on the same cores
    runs.clear()
    assert generated.judge(mutant, tmp_path, [4, 2], 1.0) == ("killed", "test_fsdp.py::t")
    assert runs == [4]
    runs.clear()
    assert generated.judge(mutant, tmp_path, [2], 1.0) == ("survived", "")
    assert runs == [2]


MARKED = textwrap.dedent(
    """
    import threading

    def direct(x):
        return x + 1

    def threaded(x):
        return x * 2

    def forked(x):
        return x - 1

    def at_import(x):
        return x

    def never(x):
        return x

    at_import(0)
    """
)

TESTS = textwrap.dedent(
    """
    import multiprocessing
    import threading

    import marked_mod

    marked_mod.at_import(1)  # while the tests are collected, before any runs

    def test_direct():
        assert marked_mod.direct(1) == 2

    def test_threaded():
        out = []
        t = threading.Thread(target=lambda: out.append(marked_mod.threaded(2)))
        t.start()
        t.join(30)
        assert out == [4]

    def test_forked():
        p = multiprocessing.get_context("fork").Process(target=marked_mod.forked, args=(1,))
        p.start()
        p.join(30)
        assert p.exitcode == 0

    def test_nothing():
        assert marked_mod.direct is not marked_mod.never
    """
)


def _session(tmp_path, env_extra, *args):
    import os
    import subprocess
    import sys

    from tests.mutation.generated import ROOT

    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "test_calls.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_reach_names_the_tests_that_call_each_marked_function(tmp_path):
    # Calls made in the session's process, in a thread it starts, and in a forked child are
    # each the running test's; a call while no test runs (an import during collection) may
    # reach every test; a function nobody calls is in no test's reach.
    from tests.mutation.reach import MARKS_ENV, OUT_ENV, marked, reached

    (tmp_path / "marked_mod.py").write_text(MARKED)
    (tmp_path / "test_calls.py").write_text(TESTS)
    tree = ast.parse(MARKED)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    made = [{"module": "marked_mod", "qualname": d.name,
             "source": marked(d, f"marked_mod:{d.name}")} for d in defs]  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    (out / "marks.json").write_text(json.dumps(made))
    # The marks go in as the tool puts them: the test module imports marked_mod at collection,
    # after the plugin has installed them (it imports the module to mark it).
    done = _session(
        tmp_path,
        {MARKS_ENV: str(out / "marks.json"), OUT_ENV: str(out)},
        "-p", "tests.mutation.reach",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = reached(out)
    assert found["marked_mod:direct"] == ["test_calls::test_direct"]
    assert found["marked_mod:threaded"] == ["test_calls::test_threaded"]
    assert found["marked_mod:forked"] == ["test_calls::test_forked"]
    assert found["marked_mod:at_import"] is None
    assert "marked_mod:never" not in found


def test_a_mutant_runs_only_the_tests_named(tmp_path):
    from tests.mutation.generated_patch import ONLY_ENV

    (tmp_path / "marked_mod.py").write_text(MARKED)
    (tmp_path / "test_calls.py").write_text(TESTS)
    (tmp_path / "only.json").write_text(json.dumps(["test_calls::test_forked"]))
    done = _session(tmp_path, {ONLY_ENV: str(tmp_path / "only.json")},
                    "-p", "tests.mutation.generated_patch")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 3 deselected" in done.stdout, done.stdout


@pytest.mark.parametrize("named", [True, False], ids=["reach named", "no mark"])
def test_a_survivor_runs_every_test_once_more_as_its_modules_source(monkeypatch, tmp_path,
                                                                     named):  # fmt: skip
    # The suite's runs stand in (a real run is the tool's own work): the runs with the
    # function's code swapped (the tests the reach names, or every test where the function
    # has no mark) let the mutant through; every test with the module imported from the
    # mutated source kills it (a decorator's closure, say, built as the module is imported).
    # It is killed, and the outcome says how.
    import random

    from tests.mutation import generated
    from tests.mutation.trace import trace

    module = "torch.utils.data.distributed"
    every = mutants(module, set(trace()[module]))
    (drawn,) = random.Random(f"0:{module}").sample(every, 1)
    key = f"{drawn.module}:{drawn.qualname}"
    runs: list[tuple[int, list[str] | None, bool]] = []

    def suite(mutant, directory, world_size, timeout, first=(), only=None, at_import=False):
        runs.append((world_size, only, at_import))
        return ("killed", "test_data.py::t") if at_import else ("survived", "")

    monkeypatch.setattr(generated, "suite", suite)
    monkeypatch.setattr(generated, "raises_at_import", lambda *a: "")
    mark = {"module": drawn.module, "qualname": drawn.qualname, "source": ""}
    monkeypatch.setattr(generated, "marks", lambda traced: [mark] if named else [])
    monkeypatch.setattr(generated, "reach", lambda made, size, timeout: {key: ["test_data::t"]})
    monkeypatch.setattr(generated, "why_equivalent", lambda *a: None)
    out = tmp_path / "out.json"
    generated.main(["--modules", module, "--samples", "1", "--world-size", "2", "4",
                    "--json", str(out)])  # fmt: skip
    (outcome,) = json.loads(out.read_text())
    selected = ["test_data::t"] if named else None
    assert runs == [(2, selected, False), (4, selected, False), (2, None, True)]
    assert outcome["outcome"] == "killed"
    assert outcome["by"] == "test_data.py::t (every test, its module imported mutated)"


def test_a_mutant_whose_code_cannot_be_swapped_is_judged_as_its_modules_source(
    monkeypatch, tmp_path
):
    # Not set aside: where the mutated code cannot take the original's place, the module's
    # mutated source runs against every test, at each world size.
    import random

    from tests.mutation import generated
    from tests.mutation.trace import trace

    module = "torch.utils.data.distributed"
    (drawn,) = random.Random(f"0:{module}").sample(mutants(module, set(trace()[module])), 1)
    runs: list[tuple[int, list[str] | None, bool]] = []

    def suite(mutant, directory, world_size, timeout, first=(), only=None, at_import=False):
        runs.append((world_size, only, at_import))
        return "survived", ""

    monkeypatch.setattr(generated, "suite", suite)
    monkeypatch.setattr(generated, "installable", lambda mutant: False)
    monkeypatch.setattr(generated, "raises_at_import", lambda *a: "")
    monkeypatch.setattr(generated, "marks", lambda traced: [])
    monkeypatch.setattr(generated, "why_equivalent", lambda *a: None)
    out = tmp_path / "out.json"
    generated.main(["--modules", module, "--samples", "1", "--world-size", "2", "4",
                    "--json", str(out)])  # fmt: skip
    (outcome,) = json.loads(out.read_text())
    assert outcome["mutant"] == drawn.name and outcome["outcome"] == "survived"
    assert runs == [(2, None, True), (4, None, True)]


def test_a_mutant_of_what_runs_at_import_runs_as_its_modules_source(tmp_path):
    # _use_grad_for_differentiable wraps every optimizer's step as torch.optim is imported: a
    # swap of its code afterwards changes no wrapper already made, while the module imported
    # from the mutated source wraps every step with the mutated wrapper (self read from the
    # second argument: a step with no argument fails).
    import os
    import subprocess
    import sys

    from tests.mutation.generated import ROOT, _write_source, raises_at_import
    from tests.mutation.source_patch import ENV as SOURCE_ENV

    (mutant,) = [m for m in mutants("torch.optim.optimizer")
                 if m.qualname == "_use_grad_for_differentiable"]  # fmt: skip
    source = mutant.module_source()
    assert "self = cast(Optimizer, args[1])" in source
    assert source.count("@_use_grad_for_differentiable") == 0  # defined here, applied elsewhere
    compile(source, "optimizer.py", "exec")
    step = (
        "import torch; p = torch.nn.Parameter(torch.ones(1)); p.grad = torch.ones(1); "
        "torch.optim.SGD([p], lr=0.5).step(); print(float(p))"
    )

    def run(installed: bool) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}"}
        if installed:
            env[SOURCE_ENV] = str(_write_source(mutant, tmp_path))
            env["PYTHONPATH"] = f"{tmp_path / 'site'}{os.pathsep}{ROOT}"
        return subprocess.run([sys.executable, "-c", step], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    plain, mutated = run(False), run(True)
    assert plain.returncode == 0 and plain.stdout.strip() == "0.5", plain.stderr
    assert mutated.returncode != 0 and "IndexError" in mutated.stderr, mutated.stderr[-2000:]
    assert raises_at_import(mutant, tmp_path, 300) == ""  # it imports; only a step fails


def test_a_mutant_of_a_class_found_under_an_alias_is_written_into_the_class():
    # placement_types keeps ``_Partial = Partial`` for old callers: its methods are traced
    # under both names, and a mutant drawn under the alias is written into the class the
    # alias names (before, rebuilding its source raised KeyError and stopped the run).
    import importlib.util
    import inspect
    from pathlib import Path

    from torch.distributed.tensor.placement_types import Partial

    module = "torch.distributed.tensor.placement_types"
    drawn = [m for m in mutants(module) if m.qualname == "_Partial.__hash__"]
    assert drawn, "placement_types no longer has _Partial.__hash__ to draw"
    for mutant in drawn:
        source = mutant.module_source()
        compile(source, "placement_types.py", "exec")
        # The mutated method replaced Partial's own, where it stood; the rest is as it was.
        lines, start = inspect.getsourcelines(Partial.__hash__)
        origin = importlib.util.find_spec(module).origin
        assert origin is not None
        original = Path(origin).read_text().splitlines(keepends=True)
        before, after = original[: start - 1], original[start - 1 + len(lines) :]
        assert source.startswith("".join(before)) and source.endswith("".join(after))
        assert source != "".join(original)
