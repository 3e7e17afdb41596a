"""The real single-audience authorization server (npm ``oidc-provider``) as a child process.

Node 22 and the package come from :mod:`tests.support.node` (installed once, then cached); the provider's
configuration is ``tests/interop/peers/oidc_as.mjs``. Startup is awaited by reading the line the script
prints once it listens, under a deadline; the process is terminated (then killed) when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support import node
from tests.support.processes import free_port

OIDC_PROVIDER_PACKAGE = "oidc-provider"
OIDC_PROVIDER_VERSION = "9.13.3"
SCRIPT = Path(__file__).resolve().parents[1] / "interop" / "peers" / "oidc_as.mjs"
STARTUP_TIMEOUT = 30.0


@dataclass(frozen=True)
class OidcServer:
    issuer: str
    log: Path


def provider_module() -> Path:
    # node.py keeps one cached npm prefix per pinned package; it has no public helper for other packages yet.
    package = node._package(OIDC_PROVIDER_PACKAGE, OIDC_PROVIDER_VERSION, node.node_binary().parent)
    entry = package / "lib" / "index.js"
    if not entry.is_file():
        raise node.NodeSetupError(f"{OIDC_PROVIDER_PACKAGE}@{OIDC_PROVIDER_VERSION} at {package} lacks lib/index.js")
    return entry


@contextlib.contextmanager
def oidc_provider(
    resources: Mapping[str, int],
    clients: Mapping[str, str],
    log: Path,
    redirect_uris: Sequence[str] = ("http://127.0.0.1:9/callback",),
    keyed_clients: Mapping[str, Mapping[str, object]] | None = None,
) -> Iterator[OidcServer]:
    """``resources`` maps each resource indicator to its access-token lifetime in seconds; ``keyed_clients`` maps
    client ids to the public JWK each signs its ``private_key_jwt`` assertions with."""
    port = free_port()
    config = {
        "module": provider_module().as_uri(),
        "port": port,
        "resources": dict(resources),
        "clients": [{"client_id": cid, "client_secret": secret} for cid, secret in clients.items()]
        + [{"client_id": cid, "jwks": {"keys": [dict(jwk)]}} for cid, jwk in (keyed_clients or {}).items()],
        "redirect_uris": list(redirect_uris),
    }
    env = {**os.environ, "NODE_ENV": "test"}
    with log.open("ab") as errors:
        process = subprocess.Popen(
            [str(node.node_binary()), str(SCRIPT), json.dumps(config)], stdout=subprocess.PIPE, stderr=errors, env=env
        )
    try:
        issuer = _await_listening(process, log)
        yield OidcServer(issuer, log)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        if process.stdout is not None:
            process.stdout.close()


def _await_listening(process: subprocess.Popen[bytes], log: Path) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                break
            line = process.stdout.readline().decode().strip()
            if line.startswith("listening "):
                return line.removeprefix("listening ")
            if not line and process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited with {process.returncode}:\n{log.read_text()}")
    raise RuntimeError(f"oidc-provider did not start within {STARTUP_TIMEOUT}s:\n{log.read_text()}")
