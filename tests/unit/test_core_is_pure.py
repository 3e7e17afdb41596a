"""The core stays sans-IO: no module under ``mcp_lossless/core`` imports I/O, clocks, RNGs or adapters."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mcp_lossless.core

CORE = Path(mcp_lossless.core.__file__).parent
FORBIDDEN = {
    "asyncio",
    "anyio",
    "socket",
    "httpx",
    "time",
    "os",
    "random",
    "threading",
    "subprocess",
    "sqlite3",
    "uvicorn",
}
"""Top-level modules whose import would bring I/O, a clock, randomness or an event loop into the core."""


PACKAGE = ("mcp_lossless", "core")


def imported_names(tree: ast.Module) -> list[str]:
    """Every dotted name ``tree`` imports; relative imports are resolved as if ``tree`` were in the core."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(PACKAGE):
                found.append("<beyond the top-level package>")
                continue
            parent = PACKAGE[: len(PACKAGE) + 1 - node.level] if node.level else ()
            base = ".".join((*parent, *([node.module] if node.module else [])))
            found.extend(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(names: list[str]) -> list[str]:
    bad = []
    for name in names:
        top = name.split(".")[0]
        outside_core = top == "mcp_lossless" and not name.startswith("mcp_lossless.core.")
        if top in FORBIDDEN or outside_core or not top.isidentifier():
            bad.append(name)
    return bad


CORE_MODULES = sorted(CORE.glob("*.py"))


def test_the_core_package_has_modules() -> None:
    assert {"eventids.py", "replay.py", "resources.py"} <= {path.name for path in CORE_MODULES}


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda path: path.name)
def test_core_module_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    assert violations(imported_names(tree)) == []


@pytest.mark.parametrize(
    ("source", "offender"),
    [
        ("import time", "time"),
        ("import os.path", "os.path"),
        ("from asyncio import sleep", "asyncio.sleep"),
        ("def f():\n    import socket", "socket"),
        ("from mcp_lossless.stores import base", "mcp_lossless.stores.base"),
        ("from mcp_lossless import server", "mcp_lossless.server"),
        ("from ..stores import base", "mcp_lossless.stores.base"),
        ("from .. import server", "mcp_lossless.server"),
        ("from ... import anything", "<beyond the top-level package>"),
    ],
)
def test_the_checker_catches_impure_imports(source: str, offender: str) -> None:
    assert violations(imported_names(ast.parse(source))) == [offender]


@pytest.mark.parametrize(
    "source",
    [
        "import orjson, hmac, hashlib, base64, re",
        "from urllib.parse import urlsplit",
        "from collections.abc import Iterable",
        "from .events import StoredEvent",
        "from . import resources",
        "from mcp_lossless.core.replay import plan_replay",
        "from mcp_lossless.core import events",
    ],
)
def test_the_checker_allows_pure_imports(source: str) -> None:
    assert violations(imported_names(ast.parse(source))) == []
