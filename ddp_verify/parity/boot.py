"""``python -m ddp_verify.parity.boot SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``): what
each rank of a parity layout runs. It installs the recorder the environment asks for
(``DDP_VERIFY_RECORD``, see :mod:`.recorder`; :mod:`.autorecord` has done it at start where
the package's ``.pth`` file is installed), then runs the script unmodified, as
``python SCRIPT ARGS...`` would (``__main__``, its directory first on ``sys.path``).

Under ``srun`` (Slurm's variables, none of torchrun's) each task is given torchrun's
variables from Slurm's first (``RANK`` from ``SLURM_PROCID``, ``MASTER_ADDR`` the step's first
host, ...), as ``init_process_group`` reads them; variables already set are left as they are.

Example (what ``ddp-verify parity`` starts for a layout of 2 ranks)::

    DDP_VERIFY_RECORD=rec/2x2 torchrun --nproc-per-node 2 -m ddp_verify.parity.boot train.py
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import MutableMapping

from ..world.launch import LaunchError, detect


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    torchrun_variables(os.environ)
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


def torchrun_variables(environ: MutableMapping[str, str]) -> None:
    """Under srun, torchrun's variables from Slurm's where the environment lacks them.

    Example::

        >>> env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
        ...        "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node[3-4]", "MASTER_PORT": "2950"}
        >>> torchrun_variables(env)
        >>> env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["LOCAL_WORLD_SIZE"]
        ('1', '2', 'node3', '2')
    """
    try:
        launched = detect(environ)
    except LaunchError as error:
        raise SystemExit(f"ddp_verify.parity.boot: {error}") from None
    if launched is None or launched.launcher != "slurm":
        return
    per_node = launched.world_size // max(1, launched.nodes)
    for name, value in (
        ("RANK", launched.rank),
        ("WORLD_SIZE", launched.world_size),
        ("LOCAL_RANK", launched.local_rank),
        ("LOCAL_WORLD_SIZE", per_node),
        ("GROUP_RANK", environ.get("SLURM_NODEID", "0")),
        ("MASTER_ADDR", launched.master_addr),
        ("MASTER_PORT", launched.master_port),
    ):
        environ.setdefault(name, str(value))


if __name__ == "__main__":
    main(sys.argv[1:])
