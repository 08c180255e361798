"""The recorder installed at interpreter start where ``DDP_VERIFY_RECORD`` asks for it, so that
``DDP_VERIFY_RECORD=DIR torchrun ... train.py`` records an unmodified script on a cluster.

The package installs ``ddp_verify_record.pth`` beside itself in site-packages; its one line
imports this module only when the variable is set (any other interpreter pays for one
``os.environ`` lookup). :mod:`.boot` imports it too: one recorder per process either way.

Example (each node of a two-node job, then one comparison)::

    DDP_VERIFY_RECORD=rec/8x1 torchrun --nnodes 2 --nproc-per-node 4 ... train.py
    ddp-verify parity compare rec/1x1 rec/8x1
"""

from __future__ import annotations

from .recorder import Recorder

__all__ = ["RECORDER"]

RECORDER = Recorder.from_env()
if RECORDER is not None:
    RECORDER.install()
