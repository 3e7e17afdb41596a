"""Acceptance (issue 12): stock OAuth clients recover from our 403 by themselves.

Each client starts with a token narrowed to ``…/tools/search`` (see :mod:`tests.interop.stepup`), calls
``fetch``, gets our 403 ``insufficient_scope``, re-authorizes on its own and returns ``fetch``'s true
result exactly once (the tool ran once, the client saw one result):

- the official Python SDK (``mcp`` 2.3.0) with ``OAuthClientProvider``, registering dynamically;
- the TypeScript SDK (1.32.2) with its ``ClientCredentialsProvider``, its client registered with the SDK's
  own ``registerClient``;
- ``mcp-remote`` (0.15.1), the stdio proxy desktop apps use, signing in through its browser flow.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import orjson
import pytest
from mcp.client.auth import OAuthClientProvider
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp_types import TextContent

from tests.interop.stepup import (
    FETCH_RESULT,
    FETCH_URL,
    ResourceOwner,
    StepUpServer,
    callback_params,
    jwt_audience,
    step_up_server,
)
from tests.support.node import mcp_remote_cli, node_binary, ts_sdk_dir

pytestmark = pytest.mark.anyio

TS_DRIVER = Path(__file__).parent / "peers" / "ts_sdk_stepup.mjs"
CLIENT_BOUND = 60.0
"""Every client finishes well within this; a hang fails with a clear timeout instead of stalling the run."""


def assert_one_step_up(server: StepUpServer) -> None:
    """The server refused ``fetch`` once, with a challenge a stock client can act on, and ran it once."""
    refusals = server.seen.challenges(403)
    assert len(refusals) == 1, refusals
    challenge = refusals[0]
    assert 'error="insufficient_scope"' in challenge
    assert f'resource_metadata="{server.base}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert f'resource="{server.tool_resource("fetch")}"' in challenge
    assert server.seen.fetch_runs == 1


class MemoryStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def test_python_sdk_oauth_provider_registers_steps_up_and_returns_the_result_once() -> None:
    with step_up_server() as server:
        owner = ResourceOwner([server.tool_resource("search")])
        redirects: list[str] = []

        async def redirect_handler(authorization_url: str) -> None:
            redirects.append(await owner.consent(authorization_url))

        async def callback_handler() -> AuthorizationCodeResult:
            params = callback_params(redirects.pop(0))
            return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))

        storage = MemoryStorage()
        metadata = OAuthClientMetadata(
            redirect_uris=["http://127.0.0.1:9/callback"],
            token_endpoint_auth_method="none",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            client_name="python-sdk-acceptance",
        )
        provider = OAuthClientProvider(server.url, metadata, storage, redirect_handler, callback_handler)
        try:
            with anyio.fail_after(CLIENT_BOUND):
                async with (
                    httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=60)) as http,
                    streamable_http_client(server.url, http_client=http) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    assert storage.tokens is not None
                    assert jwt_audience(storage.tokens.access_token) == server.tool_resource("search")
                    searched = await session.call_tool("search", {"query": "q"})
                    assert not searched.is_error
                    result = await session.call_tool("fetch", {"url": FETCH_URL})
        finally:
            await owner.close()
        assert not result.is_error
        assert [c.text for c in result.content if isinstance(c, TextContent)] == [FETCH_RESULT]
        assert storage.client is not None and storage.client.client_id.startswith("reg-"), "registered itself"
        assert server.seen.statuses("/dev-as/register") == [201]
        assert [v.approved for v in owner.visits] == [[server.tool_resource("search")], [server.url]]
        assert jwt_audience(storage.tokens.access_token) == server.url, "stepped up to the whole server"
        assert_one_step_up(server)


async def test_ts_sdk_client_credentials_provider_steps_up_and_returns_the_result_once() -> None:
    node, sdk = node_binary(), ts_sdk_dir()  # install first, outside the bound
    with step_up_server() as server:
        env = {**os.environ, "MCP_TS_SDK": str(sdk)}
        command = [str(node), str(TS_DRIVER), server.url, server.issuer, server.tool_resource("search"), FETCH_URL]
        with anyio.fail_after(CLIENT_BOUND):
            done = await anyio.run_process(command, env=env, check=False)
    report = f"rc {done.returncode}\n{done.stdout.decode()}\n{done.stderr.decode()[-3000:]}"
    assert done.returncode == 0, report
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    events = {line["event"]: line for line in lines}
    assert events["registered"]["client_id"].startswith("reg-"), report
    assert events["narrowed"]["aud"] == server.tool_resource("search"), report
    results = [line for line in lines if line["event"] == "result"]
    assert [(r["isError"], r["text"]) for r in results] == [(False, FETCH_RESULT)], report
    assert events["token"]["aud"] == server.url, "stepped up to the whole server"
    assert server.seen.statuses("/dev-as/register") == [201]
    assert_one_step_up(server)


class StdioPeer:
    """A desktop app's side of mcp-remote: JSON-RPC lines on its stdin and stdout."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self._buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(orjson.dumps(message) + b"\n")

    async def answer(self, request_id: int) -> dict[str, Any]:
        """Read lines until the response to ``request_id`` (notifications are passed over)."""
        assert self.process.stdout is not None
        while True:
            while b"\n" not in self._buffer:
                self._buffer += await self.process.stdout.receive()
            line, self._buffer = self._buffer.split(b"\n", 1)
            if not line.strip():
                continue
            message: dict[str, Any] = orjson.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message


AUTHORIZE_URL = re.compile(rb"Please authorize this client by visiting:\s*(\S+)")
CALLBACK_READY = re.compile(rb"OAuth callback server running at ")


async def play_browser(stderr: anyio.abc.ByteReceiveStream, owner: ResourceOwner, log: bytearray) -> None:
    """Whenever mcp-remote prints an authorization URL, the owner consents and the browser follows back.

    The k-th URL is delivered once mcp-remote has started its k-th callback server: mid-session it prints the
    URL first and listens after (a person takes longer than that to click; a script must wait for it).
    """
    delivered = 0
    async for chunk in stderr:
        log += chunk
        found = AUTHORIZE_URL.findall(bytes(log))
        listening = len(CALLBACK_READY.findall(bytes(log)))
        while delivered < len(found) and delivered < listening:
            await owner.deliver(found[delivered].decode())
            delivered += 1


async def test_mcp_remote_signs_in_steps_up_and_returns_the_result_once(tmp_path: Path) -> None:
    node, cli = node_binary(), mcp_remote_cli()
    with step_up_server() as server:
        owner = ResourceOwner([server.tool_resource("search")])
        env = {**os.environ, "MCP_REMOTE_CONFIG_DIR": str(tmp_path / "mcp-auth"), "BROWSER": "true"}
        command = [str(node), str(cli), server.url, "--transport", "http-only", "--host", "127.0.0.1"]
        log = bytearray()
        try:
            with anyio.fail_after(CLIENT_BOUND):
                async with await anyio.open_process(command, env=env) as process, anyio.create_task_group() as tg:
                    assert process.stderr is not None
                    tg.start_soon(play_browser, process.stderr, owner, log)
                    peer = StdioPeer(process)
                    init = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "clientInfo": {"name": "desk", "version": "1"},
                    }
                    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
                    assert "result" in await peer.answer(1), log.decode()[-3000:]
                    await peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
                    call = {"name": "fetch", "arguments": {"url": FETCH_URL}}
                    await peer.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
                    answer = await peer.answer(2)
                    process.terminate()
                    tg.cancel_scope.cancel()
        finally:
            await owner.close()
        report = log.decode(errors="replace")[-4000:]
        assert "result" in answer, f"{answer}\n{report}"
        assert [c["text"] for c in answer["result"]["content"]] == [FETCH_RESULT], report
        assert answer["result"].get("isError") is not True
        assert [v.approved for v in owner.visits] == [[server.tool_resource("search")], [server.url]], report
        assert server.seen.statuses("/dev-as/register") == [201], "mcp-remote registered itself once"
        assert_one_step_up(server)
