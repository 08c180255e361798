"""The reference pages generated from the code, so they cannot drift from it: the command
line's (docs/reference/cli.md), from its parsers: every command's options with their values,
defaults, environment variables and help; and the causes tables of docs/reference/causes.md,
from the diagnosis's rows and passes and parity's findings, each cause with a real example.

Run ``python -m ddp_verify.frontends.reference`` to print the CLI page, or with ``--write
docs/reference/cli.md`` to write it; ``--causes docs/reference/causes.md --examples
fixtures/causes.py`` rewrites the causes tables between that page's markers.

Example::

    >>> "| `--kind` |" in cli_reference()
    True
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..parity.catalogue import script_causes
from ..usercode.diagnosis.catalogue import check_causes, markdown
from . import cli, parity_command
from . import options as opts

__all__ = [
    "CAUSES_MARKERS",
    "causes_page",
    "cli_reference",
    "commands",
    "example_cells",
    "main",
    "undocumented",
]

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


_WRITE_CAUSES = (
    "python -m ddp_verify.frontends.reference --causes docs/reference/causes.md"
    " --examples fixtures/causes.py"
)
# Each table's markers on the causes page: the check's, then parity's own.
CAUSES_MARKERS = {
    "check": (f"<!-- check causes: {_WRITE_CAUSES} -->", "<!-- end of the check causes -->"),
    "parity": ("<!-- parity causes -->", "<!-- end of the parity causes -->"),
}


def example_cells(path: str | Path) -> dict[str, dict[str, str]]:
    """The example column of each causes table, from a file that sets ``EXAMPLES`` (per
    table, ``check`` and ``parity``: a pattern's command, as a user runs it) and
    ``NO_EXAMPLE`` (a pattern no real code shows, and why)."""
    held = runpy.run_path(str(path))
    cells: dict[str, dict[str, str]] = {}
    for table in CAUSES_MARKERS:
        mine = {p: f"`{command}`" for p, command in held["EXAMPLES"].get(table, {}).items()}
        for pattern, why in held.get("NO_EXAMPLE", {}).items():
            mine.setdefault(pattern, f"none: {why}")
        cells[table] = mine
    return cells


def causes_page(page: str, examples: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """``page`` with each causes table between its markers rewritten; ``examples``: each
    table's example cells by pattern (see :func:`example_cells`).

    Example::

        >>> begin, end = CAUSES_MARKERS["parity"]
        >>> "| `data:same-samples` |" in causes_page(begin + end)
        True
    """
    tables = {"check": check_causes(), "parity": script_causes()}
    for name, (begin, end) in CAUSES_MARKERS.items():
        if begin not in page:
            continue
        start, stop = page.index(begin) + len(begin), page.index(end)
        cells = None if examples is None else examples.get(name, {})
        page = page[:start] + "\n" + markdown(tables[name], cells) + "\n" + page[stop:]
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The reference pages generated from the code.")
    parser.add_argument("--write", metavar="PAGE", help="write the CLI page to this file")
    parser.add_argument(
        "--causes", metavar="PAGE", help="rewrite the causes tables between this page's markers"
    )
    parser.add_argument(
        "--examples",
        metavar="FILE",
        help="with --causes: the examples column, from this file's EXAMPLES and NO_EXAMPLE",
    )
    args = parser.parse_args(argv)
    if args.causes is not None:
        path = Path(args.causes)
        examples = example_cells(args.examples) if args.examples else None
        path.write_text(causes_page(path.read_text(), examples))
        return 0
    if args.write is None:
        print(cli_reference(), end="")
    else:
        Path(args.write).write_text(cli_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
