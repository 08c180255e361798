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

from ..world.naming import public

__all__ = ["Parser", "UsageError", "add_verbose", "require_plotting"]


@public
class UsageError(Exception):
    """What the user asked for cannot be run; exit 2 with this message.

    Example::

        >>> Parser(prog="ddp-verify check").parse_args(["--nope"])
        Traceback (most recent call last):
        ...
        ddp_verify.UsageError: unrecognized arguments: --nope
        usage: ddp-verify check [-h]
    """


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is a :class:`UsageError` (so ``--json`` still prints one
    document) rather than an exit from inside the parser."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def require_plotting() -> None:
    """matplotlib is installed, or a :class:`UsageError` saying how to get it: asked for
    pictures (``--plot``, ``--html``) are checked for before anything runs."""
    from ..usercode.plot import PlotUnavailable, figure_class

    try:
        figure_class()
    except PlotUnavailable as exc:
        raise UsageError(str(exc)) from None


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose``, the same on every command: the report with each cause's evidence
    (without it the evidence lines are left out; ``--json`` always has them)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each cause's evidence too (the numbers behind it; --json always has them)",
    )
