"""The layers of ``mcp_lossless``: who may import whom, no import cycle, one import style.

The rules (``docs/architecture.md``): the core imports no adapter; ``tracing`` (OpenTelemetry, optional) only the
root package, and the client, the server and the gateway may use it; the client, the stores and the audit import
only the core (the client also ``tracing``); the dev authorization server the core and the ASGI helpers; the
server composes core, stores, dev AS and ASGI helpers; nothing imports the server but the entry points (``cli``,
``__main__``, ``serve``),
the conformance suite's fixtures (served by ``serve --conformance``) and the gateway, which is a server in front
of a client (its command takes ``serve``'s options). The root
package holds only ``__version__`` and may be imported by anyone. Lazy imports (inside functions, or for type
checking) count everywhere: they are dependencies all the same, and a circle through one is a circle, one the
first caller of the lazy side closes at run time instead of at import. Within the package, imports are
relative. The client and the audit never use asyncio directly (ADR 0009). Each checker is tested on planted
sources, as ``test_core_is_pure.py`` tests its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import mcp_lossless

SOURCE = Path(mcp_lossless.__file__).parent
ROOT = "mcp_lossless"
ANYTHING = frozenset({"*"})

MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "": frozenset(),
    "core": frozenset({"core"}),
    "asgi": frozenset({"asgi"}),
    "tracing": frozenset({""}),
    "client": frozenset({"core", "tracing", ""}),
    "stores": frozenset({"core", ""}),
    "audit": frozenset({"core", ""}),
    "devauth": frozenset({"core", "asgi", ""}),
    "server": frozenset({"server", "core", "stores", "devauth", "asgi", "tracing", ""}),
    "serve": frozenset({"server", "conformance_fixtures", "core", "tracing", ""}),
    "conformance_fixtures": frozenset({"server", "core", ""}),
    "gateway": frozenset({"gateway", "serve", "server", "client", "core", "stores", "asgi", "tracing", ""}),
    "cli": ANYTHING,
    "__main__": ANYTHING,
}
"""Layer (the first name under ``mcp_lossless``; ``""`` is the root package) -> the layers it may import."""


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    """The importing module's dotted name."""
    target: str
    """The imported module's dotted name (a submodule when the imported name is one, else the package)."""
    lazy: bool
    """Inside a function or class body: it runs when called, not when the module is imported."""
    relative: bool


def module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of ``path`` under the package root, and whether it is a package ``__init__``."""
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports_of(module: str, is_package: bool, source: str, modules: frozenset[str]) -> list[Import]:
    """Every import of ``mcp_lossless`` in ``source``, resolved to the module it loads."""
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(tree):
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, lazy, False) for alias in node.names if _ours(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - node.level + 1]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if not _ours(base):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                target = candidate if candidate in modules else base
                found.append(Import(module, target, lazy, node.level > 0))
    return found


def _ours(name: str) -> bool:
    return name == ROOT or name.startswith(ROOT + ".")


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(imports: Iterable[Import], rules: Mapping[str, frozenset[str]]) -> list[str]:
    bad = []
    for edge in imports:
        source, target = layer_of(edge.source), layer_of(edge.target)
        allowed = rules.get(source)
        if allowed is None:
            bad.append(f"{edge.source}: layer {source!r} has no rule in MAY_IMPORT")
        elif allowed is not ANYTHING and target != source and target not in allowed:
            bad.append(f"{edge.source} imports {edge.target} ({source!r} may not import {target!r})")
    return bad


def cycles(imports: Iterable[Import]) -> list[list[str]]:
    """Import cycles, lazy imports included (each reported once, as the path that closes it)."""
    graph: dict[str, set[str]] = {}
    for edge in imports:
        if edge.target != edge.source:
            graph.setdefault(edge.source, set()).add(edge.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def absolute_imports(imports: Iterable[Import]) -> list[str]:
    return [f"{edge.source} imports {edge.target} absolutely" for edge in imports if not edge.relative]


def package_imports() -> Iterator[Import]:
    paths = sorted(SOURCE.rglob("*.py"))
    names = {path: module_name(path) for path in paths}
    modules = frozenset(name for name, _ in names.values())
    for path, (name, is_package) in names.items():
        yield from imports_of(name, is_package, path.read_text(encoding="utf-8"), modules)


IMPORTS = list(package_imports())


def test_the_package_imports_across_layers() -> None:
    assert {layer_of(edge.source) for edge in IMPORTS} >= {"client", "server", "stores", "audit", "cli"}


def test_every_import_follows_the_layer_rules() -> None:
    assert layer_violations(IMPORTS, MAY_IMPORT) == []


def test_no_import_cycle() -> None:
    assert cycles(IMPORTS) == []


def test_imports_within_the_package_are_relative() -> None:
    assert absolute_imports(IMPORTS) == []


ANYIO_ONLY = frozenset({"client", "audit"})
"""Libraries that run in their caller's loop, asyncio or trio: anyio only (docs/decisions/0009)."""


def asyncio_users(sources: Iterable[tuple[str, str]]) -> list[str]:
    found = []
    for module, source in sources:
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(name.split(".")[0] == "asyncio" for name in names):
                found.append(module)
    return found


def test_the_client_and_the_audit_do_not_use_asyncio() -> None:
    sources = [
        (name, path.read_text(encoding="utf-8"))
        for path in sorted(SOURCE.rglob("*.py"))
        for name, _ in [module_name(path)]
        if layer_of(name) in ANYIO_ONLY
    ]
    assert len(sources) > 5
    assert asyncio_users(sources) == []


def test_the_asyncio_checker_finds_a_planted_use() -> None:
    planted_sources = [
        ("mcp_lossless.client.a", "import asyncio"),
        ("mcp_lossless.client.b", "def f():\n    from asyncio import sleep"),
        ("mcp_lossless.client.c", "import anyio\nfrom .asyncio_like import x"),
    ]
    assert asyncio_users(planted_sources) == ["mcp_lossless.client.a", "mcp_lossless.client.b"]


# ---- the checkers on planted sources --------------------------------------------------------------

PLANTED = frozenset(
    {
        "mcp_lossless",
        "mcp_lossless.core",
        "mcp_lossless.core.events",
        "mcp_lossless.client",
        "mcp_lossless.client.session",
        "mcp_lossless.server",
        "mcp_lossless.server.app",
        "mcp_lossless.stores",
        "mcp_lossless.stores.base",
        "mcp_lossless.stores.memory",
    }
)


def planted(module: str, source: str, is_package: bool = False) -> list[Import]:
    return imports_of(module, is_package, source, PLANTED)


@pytest.mark.parametrize(
    ("module", "source", "offender"),
    [
        ("mcp_lossless.client.session", "from ..server import app", "mcp_lossless.server.app"),
        ("mcp_lossless.client.session", "def f():\n    from ..server.app import create_app", "mcp_lossless.server.app"),
        ("mcp_lossless.stores.base", "from mcp_lossless.client import session", "mcp_lossless.client.session"),
        ("mcp_lossless.core.events", "from ..stores.base import EventStore", "mcp_lossless.stores.base"),
        ("mcp_lossless.core.events", "import mcp_lossless.server.app", "mcp_lossless.server.app"),
        ("mcp_lossless.audit.run", "from ..client.session import Session", "mcp_lossless.client.session"),
        ("mcp_lossless.gateway.http", "def f():\n    from ..cli import main", "mcp_lossless.cli"),
        ("mcp_lossless.serve", "from .gateway.command import run", "mcp_lossless.gateway.command"),
        (
            "mcp_lossless.server.app",
            "def f():\n    from ..conformance_fixtures import app",
            "mcp_lossless.conformance_fixtures",
        ),
    ],
)
def test_the_layer_checker_catches_a_planted_violation(module: str, source: str, offender: str) -> None:
    found = layer_violations(planted(module, source), MAY_IMPORT)
    assert len(found) == 1 and f"imports {offender} " in found[0]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("mcp_lossless.client.session", "from ..core.events import StoredEvent"),
        ("mcp_lossless.client.session", "from .. import __version__"),
        ("mcp_lossless.server.app", "from ..stores.base import EventStore\nfrom ..core import events"),
        ("mcp_lossless.cli", "def f():\n    from .server.app import create_app"),
        (
            "mcp_lossless.gateway.command",
            "def f():\n    from ..serve import build_config\n    from ..server import app",
        ),
        ("mcp_lossless.stores.base", "import orjson\nfrom collections.abc import Iterable"),
    ],
)
def test_the_layer_checker_allows_what_the_rules_allow(module: str, source: str) -> None:
    assert layer_violations(planted(module, source), MAY_IMPORT) == []


def test_the_layer_checker_requires_a_rule_for_a_new_layer() -> None:
    assert layer_violations(planted("mcp_lossless.newpkg.x", "from ..core import events"), MAY_IMPORT) == [
        "mcp_lossless.newpkg.x: layer 'newpkg' has no rule in MAY_IMPORT"
    ]


@pytest.mark.parametrize(
    "base_source",
    [
        "from .memory import MemoryStore",
        "def open_store():\n    from .memory import MemoryStore",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .memory import MemoryStore",
    ],
    ids=["eager", "lazy", "type-checking"],
)
def test_the_cycle_checker_finds_a_planted_cycle_eager_or_lazy(base_source: str) -> None:
    base = planted("mcp_lossless.stores.base", base_source)
    memory = planted("mcp_lossless.stores.memory", "from .base import EventStore")
    assert cycles([*base, *memory]) == [
        ["mcp_lossless.stores.base", "mcp_lossless.stores.memory", "mcp_lossless.stores.base"]
    ]


def test_the_cycle_checker_passes_a_factory_kept_apart_from_its_interface() -> None:
    opener = planted("mcp_lossless.stores.open", "def open_store():\n    from .memory import MemoryStore")
    memory = planted("mcp_lossless.stores.memory", "from .base import EventStore")
    assert cycles([*opener, *memory]) == []


def test_a_package_init_importing_its_submodules_is_no_cycle() -> None:
    init = planted("mcp_lossless.stores", "from .base import EventStore", is_package=True)
    memory = planted("mcp_lossless.stores.memory", "from . import base")
    assert [edge.target for edge in [*init, *memory]] == ["mcp_lossless.stores.base", "mcp_lossless.stores.base"]
    assert cycles([*init, *memory]) == []


def test_the_style_checker_finds_an_absolute_import() -> None:
    mixed = planted("mcp_lossless.stores.memory", "from mcp_lossless.core.events import X\nfrom ..core import events")
    assert absolute_imports(mixed) == ["mcp_lossless.stores.memory imports mcp_lossless.core.events absolutely"]
