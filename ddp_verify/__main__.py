"""``python -m ddp_verify``: the ``ddp-verify`` command."""

import sys

from .frontends.cli import main

sys.exit(main())
