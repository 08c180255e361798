"""``python -m ddp_verify``: the ``ddp-verify`` command."""

import sys

from .cli import main

sys.exit(main())
