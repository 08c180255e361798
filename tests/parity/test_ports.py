"""A layout's store that finds its port taken is started again on another port, up to three
times, and only then: real launches of the plain DDP script, the port held by this test's own
listening socket (the collision CI met when another process took a port chosen by binding
port 0 before the launched store bound it). And the ports chosen lie where no outgoing
connection is given one."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddp_verify.parity.launch import launch
from ddp_verify.parity.layouts import Layout
from ddp_verify.world.ports import collided, ephemeral_range, free_port

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "plain_ddp.py"
COMMAND = ["python", str(SCRIPT), "--grad-accum", "{grad_accum}", "--batch-size",
           "{micro_batch}"]  # fmt: skip


@pytest.fixture
def taken() -> Iterator[int]:
    """A port this test listens on, as another process's store would."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield int(held.getsockname()[1])


def _given(*ports: int) -> tuple[Callable[[], int], list[int]]:
    drawn: list[int] = []
    left = iter(ports)

    def draw() -> int:
        drawn.append(next(left))
        return drawn[-1]

    return draw, drawn


def test_a_store_that_finds_its_port_taken_is_started_again_on_another(tmp_path, taken):
    free = free_port()
    draw, drawn = _given(taken, free)
    run = launch(
        Layout(1, 1), COMMAND, tmp_path / "run", steps=1, global_batch=8, ports=draw, timeout=120
    )
    assert drawn == [taken, free]
    assert run.returncode == 0, run.output
    assert (tmp_path / "run" / "rank0.pt").exists()


def test_a_port_taken_at_every_start_fails_after_three_with_the_stores_words(tmp_path, taken):
    draw, drawn = _given(taken, taken, taken, taken)
    run = launch(
        Layout(1, 1), COMMAND, tmp_path / "run", steps=1, global_batch=8, ports=draw, timeout=120
    )
    assert drawn == [taken] * 3
    assert run.returncode not in (0, None)
    assert f"could not listen on 127.0.0.1:{taken}" in run.output, run.output
    assert not (tmp_path / "run" / "rank0.pt").exists()


def test_a_run_that_fails_for_its_own_reason_is_not_started_again(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit('the data directory is missing')\n")
    draw, drawn = _given(free_port(), free_port())
    run = launch(Layout(1, 1), ["python", str(script)], tmp_path / "run", steps=1, ports=draw)
    assert len(drawn) == 1
    assert run.returncode == 1
    assert "the data directory is missing" in run.output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ports_are_drawn_below_the_range_outgoing_connections_use():
    low, _ = ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), (sorted(ports), low)
    # Drawn, not counted up from a start: twenty choosers rarely meet.
    assert len(ports) > 15


def test_a_collision_is_read_from_the_stores_words_only():
    assert collided("RuntimeError: ... port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE")
    assert collided("OSError: [Errno 98] Address already in use")
    assert not collided("RuntimeError: rank 1 found no data for its shard")
