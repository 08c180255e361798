"""``python -m ddp_verify.parity.agent [torchrun's arguments]``: torchrun's agent
(``torch.distributed.run``: its arguments, its ranks, its exit code) for a parity layout,
ended without the interpreter's teardown of torch once its ranks are done. That teardown is
about a second of CPU, on the layout's own time and on the cores the next layout starts on.

Example (what ``ddp-verify parity`` starts for a layout of 2 ranks)::

    python -m ddp_verify.parity.agent --standalone --nproc-per-node 2 \\
        -m ddp_verify.parity.boot train.py
"""

from __future__ import annotations

import sys

from ..world.cleanup import exit_now


def main() -> None:
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except SystemExit as exc:  # a usage error, --help
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        exit_now(code or 0)
    # A rank that failed raised torchrun's ChildFailedError above, through the usual exit.
    exit_now(0)


if __name__ == "__main__":
    main()
