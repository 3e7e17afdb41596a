"""One name, one thing: no two modules define the same public name (class, function or constant) for different
things, a constant of the protocol has one home, and every type a public signature names is exported.

A reader who meets ``Session`` (or ``SUPPORTED``) in two packages takes a detour through the imports, and two
copies of one constant drift apart; a store or verifier written
from the public names alone must find every type its signatures need in some package's ``__all__``. Types
defined in ``mcp_lossless.core`` count as exported by their module: the core has no package-level surface,
each of its modules is public. Both checkers are tested on planted sources.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
import typing
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mcp_lossless

SOURCE = Path(mcp_lossless.__file__).parent
PACKAGES = sorted(
    f"mcp_lossless.{path.parent.name}"
    for path in SOURCE.glob("*/__init__.py")
    if path.parent.name != "core" and hasattr(importlib.import_module(f"mcp_lossless.{path.parent.name}"), "__all__")
)
NOT_PUBLIC_SIGNATURES = {
    "mcp_lossless.server.LosslessApp.__init__": "built by create_app; its ServerState is the server's internals",
}


# ---- public class names ---------------------------------------------------------------------------


def public_classes(modules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Module-level public class names of ``(module name, source)`` pairs, and where each is defined."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in modules:
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(module)
    return where


def collisions(modules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    return {name: places for name, places in public_classes(modules).items() if len(places) > 1}


def package_sources() -> Iterator[tuple[str, str]]:
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
        yield module, path.read_text(encoding="utf-8")


def test_the_package_has_public_classes() -> None:
    assert {"Client", "Ledger", "ToolRegistry"} <= set(public_classes(package_sources()))


def test_no_two_public_classes_share_a_name() -> None:
    assert collisions(package_sources()) == {}


def test_the_name_checker_finds_a_planted_collision() -> None:
    planted = [
        ("pkg.server.sessions", "class Session:\n    pass\nclass _Private:\n    pass"),
        ("pkg.client.session", "class Session:\n    pass\nclass _Private:\n    pass\ndef Session2():\n    pass"),
    ]
    assert collisions(planted) == {"Session": ["pkg.server.sessions", "pkg.client.session"]}


# ---- public functions and constants ---------------------------------------------------------------

SAME_THING = {
    "run": "each subcommand module's entry point: the interface cli.py dispatches to",
    "add_arguments": "each subcommand module's options: the interface cli.py builds its parser from",
    "EPILOG": "each subcommand module's help epilog, beside its add_arguments",
    "log": "each module's logger, logging.getLogger(its name)",
    "EXIT_USAGE": "exit status 2 of a usage error, in the audit's and the call's exit-status tables",
}
"""Names several modules define for the same role; each entry is checked to still be shared."""


def public_definitions(modules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Module-level public names (classes, functions, assigned constants and aliases) and where each is defined.

    Imports define nothing (a re-export is the same thing); nor does a type variable, a placeholder."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in modules:
        for node in ast.parse(source).body:
            for name in _defined(node):
                if not name.startswith("_"):
                    where[name].append(module)
    return where


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return [node.name]
    if isinstance(node, ast.Assign | ast.AnnAssign) and not _is_type_variable(node.value):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [target.id for target in targets if isinstance(target, ast.Name)]
    return []


def _is_type_variable(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "TypeVar"


def name_collisions(modules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    return {
        name: places
        for name, places in public_definitions(modules).items()
        if len(places) > 1 and name not in SAME_THING
    }


def test_no_two_modules_define_a_public_name_for_different_things() -> None:
    assert name_collisions(package_sources()) == {}


@pytest.mark.parametrize("name", sorted(SAME_THING))
def test_every_shared_name_is_still_shared(name: str) -> None:
    assert len(public_definitions(package_sources())[name]) > 1, f"{name} has one home now: drop it from SAME_THING"


def test_the_definition_checker_finds_planted_collisions() -> None:
    planted = [
        ("pkg.core.limits", "def new_task():\n    pass\nT = TypeVar('T')\nfrom .x import y\n_HIDDEN = 1"),
        ("pkg.core.tasks", "async def new_task():\n    pass\nT = TypeVar('T')\ny = 2\n_HIDDEN = 1"),
        ("pkg.core.protocol", "SUPPORTED = ('a',)\nrun = 1"),
        ("pkg.server.modern", "SUPPORTED: tuple[str, ...] = ('b', 'a')\nrun = 2"),
    ]
    assert name_collisions(planted) == {
        "new_task": ["pkg.core.limits", "pkg.core.tasks"],
        "SUPPORTED": ["pkg.core.protocol", "pkg.server.modern"],
    }


PROTOCOL_NAMESPACE = "io.modelcontextprotocol/"
JSON_RPC_CODES = range(-32768, -31000)
"""The JSON-RPC reserved range and the project's codes below it (core/errors.py)."""


def constant_homes(modules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Where each protocol constant is written: a module-level text or JSON-RPC error code assigned to a name, and
    any text of the protocol's ``io.modelcontextprotocol/`` namespace written anywhere; only those written twice."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in modules:
        tree = ast.parse(source)
        written: set[object] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant | ast.UnaryOp):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, str) or (type(value) is int and value in JSON_RPC_CODES):
                    written.add(value)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(PROTOCOL_NAMESPACE)
            ):
                written.add(node.value)
        for value in written:
            where[repr(value)].append(module)
    return {value: sorted(places) for value, places in where.items() if len(places) > 1}


def test_every_protocol_constant_has_one_home() -> None:
    assert constant_homes(package_sources()) == {}


def test_the_constant_checker_finds_planted_copies() -> None:
    planted = [
        ("pkg.core.protocol", 'LATEST = "2025-11-25"\nMETA = "io.modelcontextprotocol/logLevel"\nCODE = -32002'),
        ("pkg.gateway.era", 'LEGACY_VERSION = "2025-11-25"\nPAGE = 100\nDEFAULT = None'),
        ("pkg.client.modern", 'def meta():\n    return {"io.modelcontextprotocol/logLevel": "info"}\nN = -32002'),
        ("pkg.server.modern", "PAGE = 100\nSECONDS = 5.0"),
        ("pkg.audit.wire", "SECONDS = 5.0"),
    ]
    assert constant_homes(planted) == {
        "'2025-11-25'": ["pkg.core.protocol", "pkg.gateway.era"],
        "'io.modelcontextprotocol/logLevel'": ["pkg.client.modern", "pkg.core.protocol"],
        "-32002": ["pkg.client.modern", "pkg.core.protocol"],
    }


# ---- types in public signatures -------------------------------------------------------------------


def classes_named(annotation: object) -> Iterator[type]:
    """Every class an annotation names, through unions and generic arguments."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from classes_named(argument)


def public_callables(package: str, names: Iterable[str], owner: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Exported functions, and the public methods, properties and ``__init__`` of exported classes."""
    for name in names:
        obj = getattr(owner, name)
        if inspect.isfunction(obj):
            yield f"{package}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{package}.{name} (fields)", obj
            for attribute, value in vars(obj).items():
                if attribute.startswith("_") and attribute != "__init__":
                    continue
                member = value.fget if isinstance(value, property) else value
                member = member.__func__ if isinstance(member, staticmethod | classmethod) else member
                if inspect.isfunction(member):
                    yield f"{package}.{name}.{attribute}", member


def unexported(surface: Iterable[tuple[str, Callable[..., Any]]], exported: set[int]) -> dict[str, set[str]]:
    """Classes of this project named in ``surface``'s hints that no package exports, and where they appear."""
    missing: dict[str, set[str]] = defaultdict(set)
    for where, target in surface:
        if where in NOT_PUBLIC_SIGNATURES:
            continue
        hints = typing.get_type_hints(target)
        for name, annotation in hints.items():
            if name.startswith("_"):
                continue
            for cls in classes_named(annotation):
                ours = cls.__module__.split(".")[0] == "mcp_lossless"
                if ours and not cls.__module__.startswith("mcp_lossless.core.") and id(cls) not in exported:
                    missing[f"{cls.__module__}.{cls.__qualname__}"].add(where)
    return dict(missing)


def exported_ids() -> set[int]:
    return {id(getattr(importlib.import_module(p), n)) for p in PACKAGES for n in importlib.import_module(p).__all__}


def package_surface() -> Iterator[tuple[str, Callable[..., Any]]]:
    for package in PACKAGES:
        module = importlib.import_module(package)
        yield from public_callables(package, module.__all__, module)


def test_the_public_packages_are_found() -> None:
    assert {"mcp_lossless.client", "mcp_lossless.server", "mcp_lossless.stores", "mcp_lossless.audit"} <= set(PACKAGES)


def test_every_type_in_a_public_signature_is_exported() -> None:
    assert unexported(package_surface(), exported_ids()) == {}


def test_the_signature_checker_finds_a_planted_unexported_type() -> None:
    planted = types.ModuleType("mcp_lossless.planted")
    source = (
        "from __future__ import annotations\n"
        "class Hidden:\n    pass\n"
        "class Shown:\n"
        "    def method(self, x: list[Hidden] | None) -> int:\n        return 0\n"
        "def public(a: Shown, b: dict[str, Hidden]) -> None:\n    pass\n"
    )
    exec(compile(source, "planted.py", "exec"), planted.__dict__)
    for obj in (planted.Hidden, planted.Shown):
        obj.__module__ = "mcp_lossless.planted"
    surface = list(public_callables("mcp_lossless.planted", ["Shown", "public"], planted))
    found = unexported(surface, {id(planted.Shown), id(planted.public)})
    assert found == {
        "mcp_lossless.planted.Hidden": {"mcp_lossless.planted.Shown.method", "mcp_lossless.planted.public"}
    }


@pytest.mark.parametrize("where", sorted(NOT_PUBLIC_SIGNATURES))
def test_every_exemption_names_a_real_signature(where: str) -> None:
    assert where in dict(package_surface()), f"{where} is exempt but no longer part of the surface"
