"""The documentation cannot drift from the code: every command its pages show is one the
commands accept (checked against their parsers, pytest's options, tox's environments and the
repository's files), the command line's reference page is its parsers' output, and every
option has help text.

The site itself is built with ``mkdocs build --strict`` by ``tox -e docs``, which CI runs.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_verify.frontends import cli, parity_command, reference
from ddp_verify.frontends.usage import UsageError

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
SHELL_BLOCKS = {"bash", "console", "sh", "shell", ""}


def commands_in(text: str) -> Iterator[str]:
    """The commands of a page's shell blocks: every line of a ``bash`` block, and the lines
    after a ``$`` prompt in an unlabelled one (the rest is output); continuations joined,
    comments dropped.

    >>> list(commands_in("```bash\\nddp-verify check a.py:f \\\\\\n  --kind loss  # x\\n```\\n"))
    ['ddp-verify check a.py:f --kind loss']
    >>> list(commands_in("```\\n$ pytest -q\\noutput\\n```\\n"))
    ['pytest -q']
    """
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        language, body = match.group(1), match.group(2)
        if language not in SHELL_BLOCKS:
            continue
        lines = iter(body.splitlines())
        for line in lines:
            if language == "":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            while line.endswith("\\"):
                line = line[:-1] + " " + next(lines, "").strip()
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                yield line


def _all_commands() -> list[tuple[str, str]]:
    return [
        (str(page.relative_to(ROOT)), command)
        for page in PAGES
        for command in commands_in(page.read_text())
    ]


def _words(command: str) -> list[str]:
    # Environment assignments before the command, and what a pipe or && adds, are not its.
    words = shlex.split(command.split("&&")[0].split("|")[0])
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)
    return words


def _ddp_verify_args(words: list[str]) -> list[str] | None:
    if words[:1] == ["ddp-verify"]:
        return words[1:]
    if words[:3] == ["python", "-m", "ddp_verify"]:
        return words[3:]
    return None


COMMANDS = _all_commands()


def test_the_pages_show_commands_at_all():
    # The collection below must not pass by finding nothing.
    tools = {_words(c)[0] for _, c in COMMANDS if _words(c)}
    assert {"ddp-verify", "pytest", "tox", "python"} <= tools, tools


@pytest.mark.parametrize(
    "page,command",
    [(p, c) for p, c in COMMANDS if _ddp_verify_args(_words(c)) is not None],
)
def test_every_ddp_verify_command_shown_parses(page, command):
    args = _ddp_verify_args(_words(command))
    assert args is not None
    if args == ["--version"]:
        return
    try:
        if args[:2] == ["parity", "compare"]:
            parity_command.compare_parser().parse_args(args[2:])
        elif args[:1] == ["parity"]:
            assert "--" in args, f"{page}: a parity command without its script: {command}"
            split = args.index("--")
            parity_command.parser().parse_args(args[1:split])
            assert args[split + 1 :], f"{page}: nothing after --: {command}"
        else:
            cli._parser().parse_known_args(args)
    except UsageError as exc:
        pytest.fail(f"{page}: `{command}` is refused by the parser: {exc}")


def _pytest_options() -> set[str]:
    # pytest's own and every plugin's (this one's and xdist's), as `pytest --help` lists them.
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    ).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out))


def test_every_pytest_option_shown_exists():
    known = _pytest_options()
    assert "--world-size" in known and "--ddp-backend" in known, "the plugin's options"
    unknown = []
    for page, command in COMMANDS:
        words = _words(command)
        if "pytest" not in words:
            continue
        for word in words[words.index("pytest") + 1 :]:
            if word == "--":
                break
            flag = word.split("=")[0]
            if flag.startswith("--") and flag not in known:
                unknown.append(f"{page}: {flag} in `{command}`")
    assert not unknown, "\n".join(unknown)


def test_every_tox_environment_shown_exists():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    envs = set()
    for section in ini.sections():
        name = section.removeprefix("testenv:")
        # conformance-torch{212,213,214} -> each.
        brace = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", name)
        if brace:
            envs |= {brace[1] + part + brace[3] for part in brace[2].split(",")}
        else:
            envs.add(name)
    missing = []
    for page, command in COMMANDS:
        words = _words(command)
        if words[:1] == ["tox"] and "-e" in words:
            for env in words[words.index("-e") + 1].split(","):
                if env not in envs and not re.fullmatch(r"py\d+", env):  # pyNNN: tox's own
                    missing.append(f"{page}: tox -e {env}")
    assert not missing, "\n".join(missing)


def test_every_script_and_module_shown_exists():
    missing = []
    for page, command in COMMANDS:
        words = _words(command)
        if words[:1] != ["python"] or len(words) < 2:
            continue
        if words[1] == "-m":
            if importlib.util.find_spec(words[2]) is None:
                missing.append(f"{page}: module {words[2]}")
        elif (
            words[1].endswith(".py")
            and not (ROOT / words[1]).exists()
            and not re.search(r"[A-Z]", words[1])  # PATH.py, TRAIN.py: placeholders
        ):
            missing.append(f"{page}: file {words[1]}")
    assert not missing, "\n".join(missing)


def test_the_command_line_page_is_the_parsers_output():
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert page == reference.cli_reference(), (
        "docs/reference/cli.md is stale: python -m ddp_verify.frontends.reference "
        "--write docs/reference/cli.md"
    )


def test_every_option_of_every_command_has_help():
    assert reference.undocumented() == []


def test_every_page_is_in_the_sites_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(p for p in pages if f": {p}" not in nav)
    assert not missing, f"pages mkdocs.yml's nav leaves out: {missing}"


def test_the_json_table_has_every_key_of_the_document():
    from ddp_verify.usercode.verdict import JSON_FIELDS

    page = (ROOT / "docs" / "reference" / "check.md").read_text()
    table = page[page.index("## The JSON document") : page.index("## The kinds")]
    rows = set(re.findall(r"^\| `(\w+)`", table, re.M)) | set(
        re.findall(r"^\| `\w+`, `(\w+)`", table, re.M)
    )
    missing = [key for key in JSON_FIELDS if f"`{key}`" not in table]
    assert rows and not missing, f"keys the JSON table leaves out: {missing}"


def test_the_site_names_its_release_and_repository_from_the_projects_own_files():
    # Issue 61: the site showed neither. Read from one place each, never written twice.
    import tomllib

    import ddp_verify

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    config = hooks.on_config({"site_name": "ddp_verify"})
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert config["site_name"] == f"ddp_verify {ddp_verify.__version__}"
    assert config["repo_url"] == repository["Repository"]
    assert ddp_verify.__version__ in config["copyright"]
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert "hooks:\n  - docs/hooks.py" in mkdocs and "/hooks.py" in mkdocs.split("exclude_docs")[1]


def _limits() -> list[tuple[str, str, str]]:
    """The rows of the "what it cannot check" page: (limit, command, refusal)."""
    page = (ROOT / "docs" / "reference" / "limits.md").read_text()
    command = r"`((?:[A-Z_]+=\S+ )*ddp-verify [^`]+)`"
    return re.findall(rf"^\| (.+?) \| {command} \| (.+?) \|$", page, re.M)


def test_the_limits_page_lists_what_it_refuses():
    rows = _limits()
    assert len(rows) >= 15, rows
    assert len({command for _, command, _ in rows}) == len(rows)


@pytest.mark.parametrize(("limit", "command", "refusal"), _limits(), ids=lambda v: v[:40])
def test_each_limit_the_docs_list_is_refused_as_they_say(limit, command, refusal):
    # Each listed limit is run as written, from the repository's root: refused before
    # anything starts, exit 2, in the page's words.
    from tests.frontends.in_process import ddp_verify_here

    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "ddp-verify", command
    result = ddp_verify_here(*words[1:], cwd=ROOT, env=env)
    assert result.returncode == 2, (command, result.stdout, result.stderr)
    said = " ".join(result.stderr.split())
    assert refusal in said, (refusal, said)
    assert "[ddp-verify] layout" not in result.stderr and "examples" not in result.stderr
