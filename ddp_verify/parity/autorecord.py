"""The recorder installed at interpreter start where ``DDP_VERIFY_RECORD`` asks for it, so that
``DDP_VERIFY_RECORD=DIR torchrun ... train.py`` records an unmodified script on a cluster (and,
in the layouts ``ddp-verify parity`` starts on this machine, the stores kept on loopback: see
:mod:`.loopback`).

The package installs ``ddp_verify_record.pth`` beside itself in site-packages; its one line
imports this module only when the variable is set (any other interpreter pays for one
``os.environ`` lookup). :mod:`.boot` imports it too: one recorder per process either way.

Example (each node of a two-node job, then one comparison)::

    DDP_VERIFY_RECORD=rec/8x1 torchrun --nnodes 2 --nproc-per-node 4 ... train.py
    ddp-verify parity compare rec/1x1 rec/8x1
"""

from __future__ import annotations

import os

from . import loopback
from .recorder import Recorder

__all__ = ["RECORDER"]

# In the layouts ddp-verify parity starts on this machine: stores on loopback only.
if os.environ.get(loopback.ENV_LOOPBACK) == "1":
    loopback.install()
RECORDER = Recorder.from_env()
if RECORDER is not None:
    RECORDER.install()
