"""``python -m ddp_verify``: the ``ddp-verify`` command."""

from .frontends.cli import console

console()
