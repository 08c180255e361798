"""MkDocs hook: the site names the release it documents and the repository it comes from,
each read from the one place the project says it (``ddp_verify/__init__.py``'s
``__version__``, ``pyproject.toml``'s ``[project.urls]``), never written twice. The docs
build installs nothing of ours (``tox -e docs``): both are read as text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def project() -> tuple[str, str]:
    """The release (``0.1.0``) and the repository's address."""
    source = (ROOT / "ddp_verify" / "__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', source, re.M)
    if version is None:
        raise ValueError("ddp_verify/__init__.py says no __version__")
    # One line of [project.urls] (tomllib is 3.11's; the docs build may run on 3.10).
    repository = re.search(
        r'^\[project\.urls\]$.*?^Repository = "([^"]+)"$',
        (ROOT / "pyproject.toml").read_text(),
        re.M | re.S,
    )
    if repository is None:
        raise ValueError("pyproject.toml's [project.urls] says no Repository")
    return version[1], repository[1]


def on_config(config: Any) -> Any:
    version, repository = project()
    config["site_name"] = f"ddp_verify {version}"
    config["repo_url"] = repository
    config["repo_name"] = repository.split("://", 1)[-1]
    config["copyright"] = f"ddp_verify {version}, MIT License"
    return config
