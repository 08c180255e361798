"""One precedence chain for every front end (flag, environment variable, ini key, the front
end's default), the same environment variables everywhere, and advice spelled as the front end
in use spells its options, on the ranks too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddp_verify.frontends import options as opts
from ddp_verify.world import World
from ddp_verify.world.naming import option, spelled_as
from tests.user_code import FIXTURES, load


@pytest.mark.parametrize("front_end", opts.FRONT_ENDS)
def test_a_flag_beats_the_environment_which_beats_the_ini_which_beats_the_default(front_end):
    env = {opts.DEVICE_ENV: "cuda"}
    assert opts.resolve("device", front_end, given="cpu", ini="cuda", environ=env) == "cpu"
    assert opts.resolve("device", front_end, ini="cpu", environ=env) == "cuda"
    assert opts.resolve("device", front_end, ini="cuda", environ={}) == "cuda"
    assert opts.resolve("device", front_end, environ={}) is None
    assert opts.resolve("timeout", front_end, environ={}) == opts.DEFAULT_TIMEOUT_S


def test_each_front_end_has_its_own_defaults_and_names_its_own_flag_in_errors():
    assert opts.resolve("world_sizes", "pytest", environ={}) == (2,)
    assert opts.resolve("world_sizes", "cli", environ={}) == (4,)
    assert opts.resolve("world_sizes", "python", environ={}) == (4,)
    for front_end, source in (("pytest", "--ddp-timeout"), ("cli", "--timeout"), ("python", "")):
        with pytest.raises(ValueError, match=f"{source or 'timeout='} expects a positive"):
            opts.resolve("timeout", front_end, given="soon", environ={})
    with pytest.raises(ValueError, match=f"{opts.WORLD_SIZE_ENV} expects a positive integer"):
        opts.resolve("world_sizes", "cli", environ={opts.WORLD_SIZE_ENV: "four"})


def test_every_option_of_a_world_has_a_setting_and_a_default_in_every_front_end():
    import dataclasses

    names = {f.name for f in dataclasses.fields(opts.WorldOptions)}
    assert names <= opts.SETTINGS.keys()
    for front_end in opts.FRONT_ENDS:
        assert opts.SETTINGS.keys() == opts.DEFAULTS[front_end].keys()


def test_advice_is_spelled_as_the_front_end_in_use():
    with spelled_as({}):
        assert option("device", "cpu") == "device='cpu'"
        assert option("debug", True) == "debug=True"
    with spelled_as(opts.SPELLINGS["cli"]):
        assert option("device", "cpu") == "--device cpu"
        assert option("same_micro_batch_counts", True) == "--micro-batch-counts same"
    with spelled_as(opts.SPELLINGS["pytest"]):
        assert option("device", "cpu") == "--ddp-device cpu"
        assert option("debug", True) == "--ddp-debug"


def _advice() -> str:
    from ddp_verify.world.naming import option

    return option("device", "cpu")


def test_the_ranks_spell_advice_as_the_controller_does():
    # Advice made on a rank or in the helper (a diagnosis's causes) is sent back as text.
    with World(2, timeout=60) as world:
        with spelled_as(opts.SPELLINGS["cli"]):
            assert world.run(_advice) == ["--device cpu"] * 2
        with spelled_as({}):
            assert world.run(_advice) == ["device='cpu'"] * 2


def _cli(*args: str, env: dict[str, str], cwd) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "ddp_verify", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **env},
    )
    return json.loads(done.stdout)


def test_the_command_line_honours_the_environment_variables_pytest_does(tmp_path):
    target = f"{FIXTURES}/grad_sync.py:sample_weighted"
    check = ["check", target, "--kind", "grad-sync", "--max-examples", "2"]
    sized = _cli(*check, env={opts.WORLD_SIZE_ENV: "2"}, cwd=tmp_path)
    assert (sized["verdict"], sized["world_size"]) == ("equivalent", 2)
    flagged = _cli(*check, "--world-size", "3", env={opts.WORLD_SIZE_ENV: "2"}, cwd=tmp_path)
    assert flagged["world_size"] == 3  # the flag wins
    bad = _cli(*check, env={opts.DEVICE_ENV: "tpu"}, cwd=tmp_path)
    assert bad["verdict"] == "usage-error"
    assert f"{opts.DEVICE_ENV} expects one of cpu, cuda, got 'tpu'" in bad["report"]


def test_check_honours_the_environment_variables_too(monkeypatch):
    from ddp_verify import check

    monkeypatch.setenv(opts.WORLD_SIZE_ENV, "3")
    verdict = check(load("grad_sync").sample_weighted, kind="grad-sync", max_examples=2)
    assert verdict.world_size == 3
