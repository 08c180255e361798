"""``python -m ddp_verify.parity.boot SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``): what
each rank of a parity layout runs. It installs the recorder the environment asks for
(``DDP_VERIFY_RECORD``, see :mod:`.recorder`; :mod:`.autorecord` has done it at start where
the package's ``.pth`` file is installed), then runs the script unmodified, as
``python SCRIPT ARGS...`` would (``__main__``, its directory first on ``sys.path``).

Example (what ``ddp-verify parity`` starts for a layout of 2 ranks)::

    DDP_VERIFY_RECORD=rec/2x2 torchrun --nproc-per-node 2 -m ddp_verify.parity.boot train.py
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    # The recorder, installed already where ddp_verify_record.pth ran at start.
    from .autorecord import RECORDER as recorder

    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("ddp_verify.parity.boot: -m needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    if recorder is not None:
        # The script ended before the steps wanted: what it did is the recording.
        recorder.write()


if __name__ == "__main__":
    main(sys.argv[1:])
