"""``python .../ddp_verify/parity/boot_script.py SCRIPT [ARGS...]``: :mod:`.boot` for a
launcher that starts a script by its path, not a module (``fabric run``).

Example (what ``ddp-verify parity --launcher fabric`` starts for a layout of 2 ranks)::

    python -m lightning.fabric.cli --devices 2 ... .../ddp_verify/parity/boot_script.py train.py
"""

import os
import sys

if __name__ == "__main__":
    # Run as a file, this folder is first on the path, where its modules would shadow the
    # script's imports (a `run` or `plot` of its own): the boot puts the script's there.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from ddp_verify.parity.boot import main

    main(sys.argv[1:])
