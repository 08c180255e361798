"""What the command line says when it cannot run what was asked: :class:`UsageError` (exit
2), and an argparse parser that raises it instead of exiting, so ``--json`` still prints one
document. Shared by ``ddp-verify check`` and ``ddp-verify parity``.

Example::

    parser = Parser(prog="ddp-verify parity")
    parser.parse_args(["--bad"])   # raises UsageError
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["Parser", "UsageError"]


class UsageError(Exception):
    """What the user asked for cannot be run; exit 2 with this message."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is a :class:`UsageError` (so ``--json`` still prints one
    document) rather than an exit from inside the parser."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")
