"""``serve TARGET``: the :class:`~mcp_lossless.server.tools.ToolRegistry` a user names as ``path/to/file.py:NAME`` or
``package.module:NAME`` (the convention of ``uvicorn`` and ``fastmcp run``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from .tools import ToolRegistry


class TargetError(ValueError):
    """A TARGET that names no tool registry; the message says what was found instead."""


def load_registry(target: str) -> ToolRegistry:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise TargetError(f"{target!r}: expected path/to/file.py:NAME or package.module:NAME")
    module = _file_module(Path(where)) if where.endswith(".py") or "/" in where else _package_module(where)
    found: object = module
    for part in name.split("."):
        if not hasattr(found, part):
            raise TargetError(f"{target!r}: {where} has no attribute {name!r}")
        found = getattr(found, part)
    if not isinstance(found, ToolRegistry):
        raise TargetError(f"{target!r} is of type {type(found).__name__}, not a ToolRegistry")
    return found


def _file_module(path: Path) -> ModuleType:
    """The file run as a top-level module whose folder is importable, as ``python path/to/file.py`` would."""
    if not path.is_file():
        raise TargetError(f"no file {str(path)!r}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"{str(path)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(path.stem, None)
        raise TargetError(f"importing {str(path)!r} failed: {_where_failed(exc)}") from None
    return module


def _package_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise TargetError(f"no module named {exc.name!r} (is its folder on PYTHONPATH?)") from None
        raise TargetError(f"importing {name!r} failed: {_where_failed(exc)}") from None
    except Exception as exc:
        raise TargetError(f"importing {name!r} failed: {_where_failed(exc)}") from None


def _where_failed(exc: BaseException) -> str:
    """``ExcType: message (file:line)`` of the innermost frame: enough to find the fault without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, SyntaxError):
        place = f" ({exc.filename}:{exc.lineno})"
    return f"{type(exc).__name__}: {exc}{place}"
