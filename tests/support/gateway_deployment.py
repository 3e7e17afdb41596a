"""A gateway under test on loopback, in front of the official SDK's test upstream over HTTP: the one setup of the
gateway's interop modules, each of which lists its own upstreams."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_lossless.gateway import BearerFromEnv, Gateway, UpstreamConfig, create_gateway
from mcp_lossless.server.config import ServerConfig
from tests.support.processes import free_port
from tests.support.upstreams import SdkHttpUpstream
from tests.support.uvicorn_server import lossless_server

DEV_CLIENT = ("dev-client", "dev-secret")
"""The client of the gateway's dev AS the tests get their tokens from."""
STARTUP_SECONDS = 120
"""The gateway's startup spawns and handshakes its stdio children: on a loaded box that takes a while."""


@dataclass
class Deployment:
    url: str
    gateway: Gateway
    sdk: SdkHttpUpstream

    @property
    def mcp(self) -> str:
        return f"{self.url}/mcp"

    def resource(self, exposed: str) -> str:
        """The resource indicator of the exposed tool ``exposed``."""
        return f"{self.mcp}/tools/{exposed}"


@contextmanager
def sdk_upstream(directory: Path, token: str, env: str) -> Iterator[tuple[SdkHttpUpstream, BearerFromEnv]]:
    """The SDK's test upstream (it records the headers it saw in ``directory``), accepting only ``token``, and the
    gateway's credential for it: ``token`` read from the environment variable ``env``, never the client's."""
    sdk = SdkHttpUpstream(free_port(), directory / "headers.jsonl", token)
    sdk.start()
    os.environ[env] = token
    try:
        yield sdk, BearerFromEnv(env)
    finally:
        sdk.stop()
        os.environ.pop(env, None)


@contextmanager
def serve_gateway(
    upstreams: Sequence[UpstreamConfig], sdk: SdkHttpUpstream, *, lenient_config: bool = False, **settings: Any
) -> Iterator[Deployment]:
    """The gateway over ``upstreams`` on a free port: memory store, the dev AS with :data:`DEV_CLIENT`, and
    ``settings`` (more :class:`ServerConfig` fields)."""
    made: list[Gateway] = []

    def make(port: int) -> Gateway:
        config = ServerConfig(port=port, store="memory", dev_clients=dict([DEV_CLIENT]), **settings)
        made.append(create_gateway(config, list(upstreams), lenient_config=lenient_config))
        return made[0]

    with lossless_server(make, STARTUP_SECONDS) as url:
        yield Deployment(url, made[0], sdk)
