"""What a launched job's ranks read from the launcher's store is data, not code: a value
written there by a process outside the job is read as words and runs nothing. (Only the
broken flag so far: the agreed outcomes are still pickles, issue 26.)"""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap

import torch.distributed as dist

from ddp_verify.world.agreement import Agreement, read_broken

EVIL = textwrap.dedent(
    """
    import os, pickle, sys
    import torch.distributed as dist

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {sys.argv[2]}",))

    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)
    store.set("broken", pickle.dumps(Evil()))
    """
)


def test_a_broken_flag_written_by_an_outsider_is_read_as_words(tmp_path):
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    marker = tmp_path / "ran"
    subprocess.run(
        [sys.executable, "-c", EVIL, str(store.port), str(marker)], check=True, timeout=60
    )
    # What pickle.loads would have done: run the outsider's command.
    assert b"os" in store.get("broken") and b"system" in store.get("broken")
    said = read_broken(store)
    assert isinstance(said, str) and not marker.exists()
    # A rank that finds the flag set stops with those words, and runs nothing either.
    agreement = Agreement(store, rank=0, size=2)
    try:
        agreement.agree("a job", None, deadline=0.0)
    except Exception as exc:  # Broken (a WorldError), or Late once the deadline passed
        assert not marker.exists(), exc
    assert not marker.exists()
    # The flag a rank writes is plain text, read back as written.
    store.delete_key("broken")
    Agreement(store, rank=1, size=2).break_("rank 1 hung")
    assert store.get("broken") == b"rank 1 hung" and read_broken(store) == "rank 1 hung"
