"""The command line's reference page (docs/reference/cli.md), generated from its parsers: every
command's options with their values, defaults, environment variables and help, so the page
cannot drift from what the commands accept.

Run ``python -m ddp_verify.frontends.reference`` to print the page, or with ``--write
docs/reference/cli.md`` to write it.

Example::

    >>> "| `--kind` |" in cli_reference()
    True
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from . import cli, parity_command
from . import options as opts

__all__ = ["cli_reference", "commands", "main", "undocumented"]

_INTRO = """\
# Command line

Generated from the commands' parsers (`python -m ddp_verify.frontends.reference --write
docs/reference/cli.md`; a test fails when this page and the parsers differ). Every front end
resolves an option one way: the flag, then its environment variable, then (under pytest) the
ini key, then the front end's default.

Exit codes, for every command: **0** equivalent (no counterexample); **1** not equivalent, or
the code raised, crashed a rank or hung; **2** a usage error (bad arguments, path, function or
signature; said before any world starts); **3** the harness or the machine failed; **130**
interrupted (SIGINT); **143** terminated (SIGTERM or SIGHUP). `--json` prints one JSON document
in every case (its keys: [ddp-verify check and check()](check.md#the-json-document)).
"""


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command's name and parser: ``ddp-verify check``, ``parity``, ``parity compare``,
    ``conformance``."""
    top = cli._parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    yield "ddp-verify check", sub.choices["check"]
    yield "ddp-verify parity", parity_command.parser()
    yield "ddp-verify parity compare", parity_command.compare_parser()
    yield "ddp-verify conformance", sub.choices["conformance"]


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        yield action


def undocumented() -> list[str]:
    """The options whose parser gives no help text (there should be none).

    Example::

        >>> undocumented()
        []
    """
    return [
        f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
        for name, parser in commands()
        for action in _options(parser)
        if not action.help
    ]


def _environment(flag: str) -> str:
    names = [name for name, spelled in opts.SPELLINGS["cli"].items() if spelled == flag]
    envs = {opts.SETTINGS[n].env for n in names if n in opts.SETTINGS}
    return ", ".join(f"`{e}`" for e in sorted(e for e in envs if e))


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    return f"`{action.metavar or action.dest.upper()}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [], ()):
        return ""
    return f"`{action.default}`"


def _usage(parser: argparse.ArgumentParser) -> str:
    # A fixed width: the page must not depend on the terminal that wrote it.
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def cli_reference() -> str:
    """The page, in Markdown."""
    out = [_INTRO]
    for name, parser in commands():
        out.append(f"## `{name}`\n")
        if parser.formatter_class is argparse.RawDescriptionHelpFormatter:
            # Laid out as a table of its own (check's kinds): kept as written.
            out.append("```text\n" + (parser.description or "").rstrip() + "\n```\n")
        else:
            out.append(_cell(parser.description or "") + "\n")
        out.append("```text\n" + _usage(parser) + "\n```\n")
        out.append("| option | value | default | environment | what it does |")
        out.append("| --- | --- | --- | --- | --- |")
        for action in _options(parser):
            flag = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar}`"
            env = _environment(action.option_strings[0]) if action.option_strings else ""
            helptext = _cell(action.help or "") % {"default": action.default}
            out.append(f"| {flag} | {_value(action)} | {_default(action)} | {env} | {helptext} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The command line's reference page.")
    parser.add_argument("--write", metavar="PAGE", help="write the page to this file")
    args = parser.parse_args(argv)
    if args.write is None:
        print(cli_reference(), end="")
    else:
        Path(args.write).write_text(cli_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
