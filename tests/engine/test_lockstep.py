"""The lockstep pieces that need no world: the rank-0 example database and the rebuilt
exception every rank raises. (Lockstep on real launched jobs: tests/frontends/test_spmd.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.database import InMemoryExampleDatabase

from ddp_verify.engine.lockstep import LockstepDatabase, agreed


class Exchange:
    """What two ranks' agreements return, played from one process: rank 0's view posts its
    value and sees rank 1's; rank 1's sees what rank 0 posted. Not a process group: the
    lockstep module only asks a world for ``rank`` and ``agree``."""

    def __init__(self, rank: int, other: list[Any]) -> None:
        self.rank = rank
        self.other = other
        self.posted: list[tuple[str, Any]] = []

    def agree(self, tag: str, value: Any) -> list[Any]:
        self.posted.append((tag, value))
        theirs = self.other.pop(0)
        return [value, theirs] if self.rank == 0 else [theirs, value]


def test_rank_0_reads_and_writes_the_database_and_the_others_replay_what_it_read() -> None:
    mine = InMemoryExampleDatabase()
    mine.save(b"key", b"example-1")
    rank0 = LockstepDatabase(mine, Exchange(0, [None]))
    assert list(rank0.fetch(b"key")) == [b"example-1"]

    theirs = InMemoryExampleDatabase()
    theirs.save(b"key", b"only-on-rank-1")
    rank1 = LockstepDatabase(theirs, Exchange(1, [[b"example-1"]]))
    # Rank 1 replays rank 0's examples, not its own database's.
    assert list(rank1.fetch(b"key")) == [b"example-1"]
    rank1.save(b"key", b"new")
    rank1.delete(b"key", b"only-on-rank-1")
    assert sorted(theirs.fetch(b"key")) == [b"only-on-rank-1"]
    rank0.save(b"key", b"new")
    assert sorted(mine.fetch(b"key")) == [b"example-1", b"new"]


def test_a_failure_on_another_rank_is_raised_here_with_where_it_happened() -> None:
    def passes() -> None:
        return None

    try:
        raise ValueError("rank 1 saw a bad gradient")
    except ValueError as exc:
        from ddp_verify.world import frames, wire

        said = ("builtins.ValueError", wire.dumps_exception(exc), frames.format_exception(exc))
    run = agreed(passes, Exchange(0, [said]), "test_x")
    with pytest.raises(ValueError, match="rank 1 saw a bad gradient") as caught:
        run()
    assert any("raised on rank 1 of 2" in note for note in caught.value.__notes__)


def test_an_outcome_every_rank_shares_carries_no_note() -> None:
    from ddp_verify.world import frames, wire

    def fails() -> None:
        raise KeyError("everywhere")

    try:
        fails()
    except KeyError as exc:
        said = ("builtins.KeyError", wire.dumps_exception(exc), frames.format_exception(exc))
    run = agreed(fails, Exchange(0, [said]), "test_y")
    with pytest.raises(KeyError) as caught:
        run()
    assert not getattr(caught.value, "__notes__", [])


DRAWS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from hypothesis import Phase, given, settings, strategies as st
from ddp_verify.engine import compat
if sys.argv[2] == "with-module":
    import local_constants  # noqa: F401 (its constants are what hypothesis may mix in)
if sys.argv[3] == "in-lockstep":
    compat.without_local_constants()
seen = []

@settings(derandomize=True, max_examples=300, database=None, phases=[Phase.generate])
@given(st.integers())
def draw(x):
    seen.append(x)

draw()
print(json.dumps(seen))
"""


def test_ranks_that_imported_different_local_modules_draw_the_same_examples(tmp_path) -> None:
    # Hypothesis mixes in constants from the local modules a process imported: two ranks that
    # imported different ones draw different examples, unless lockstep leaves them out.
    import json
    import subprocess
    import sys

    (tmp_path / "local_constants").mkdir()
    (tmp_path / "local_constants" / "__init__.py").write_text(
        "ODD = 918273645\nODDER = -56473829\nODDEST = 192837465564738\n"
    )
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)

    def draws(module: str, mode: str) -> list[int]:
        out = subprocess.run(
            [sys.executable, str(script), str(tmp_path), module, mode],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(out.stdout)

    # The hazard is real where hypothesis draws local constants at all: from 6.131.1 (the
    # lowest release pyproject.toml allows draws none, and has nothing to leave out).
    from ddp_verify.engine.compat import LOCAL_CONSTANTS_SINCE, release

    hazard = release("hypothesis") >= LOCAL_CONSTANTS_SINCE
    assert (draws("with-module", "alone") != draws("without", "alone")) == hazard
    assert draws("with-module", "in-lockstep") == draws("without", "in-lockstep")
