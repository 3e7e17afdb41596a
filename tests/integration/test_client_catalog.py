"""Resources and prompts through both client eras, against our server's conformance fixtures over real HTTP:
every listing whole, contents and messages as served, a server error typed, input a prompt asks for answered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mcp_lossless.client import Client, Prompt, RemoteError, Resource
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.client.sync import SyncClient
from mcp_lossless.conformance_fixtures import INPUT_PROMPT, conformance_app
from mcp_lossless.core.errors import INVALID_PARAMS, RESOURCE_NOT_FOUND
from mcp_lossless.server.config import ServerConfig
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

AnyClient = Client | ModernClient


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with lossless_server(lambda port: conformance_app(ServerConfig(port=port, store="memory", issuer=None))) as base:
        yield f"{base}/mcp"


async def _context(params: dict[str, Any]) -> Mapping[str, Any]:
    return {"action": "accept", "content": {"context": f"asked: {params['message']}"}}


@asynccontextmanager
async def opened(era: str, url: str) -> AsyncIterator[AnyClient]:
    handlers = {"elicitation/create": _context}
    client: AnyClient = (
        Client(url, timeout=10, input_handlers=handlers)
        if era == "legacy"
        else ModernClient(url, timeout=10, input_handlers=handlers)
    )
    async with client:
        yield client


@pytest.fixture(params=["legacy", "modern"])
def era(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_resources_are_listed_and_read_as_served(era: str, url: str) -> None:
    async with opened(era, url) as client:
        resources = {r.uri: r for r in await client.list_resources()}
        assert {"test://static-text", "test://static-binary", "test://watched-resource"} <= resources.keys()
        text = resources["test://static-text"]
        assert text == Resource("test://static-text", "static-text", "A static text resource", "text/plain", text.raw)
        (contents,) = await client.read_resource("test://static-text")
        assert contents["text"] == "This is the content of the static text resource."
        (binary,) = await client.read_resource("test://static-binary")
        assert binary["mimeType"] == "image/png" and isinstance(binary["blob"], str) and binary["blob"]
        with pytest.raises(RemoteError) as missing:
            await client.read_resource("test://nowhere")
        # each era's code for it: 2026-07-28 replaced -32002 by -32602
        assert missing.value.code == (RESOURCE_NOT_FOUND if era == "legacy" else INVALID_PARAMS)
        assert missing.value.data == {"uri": "test://nowhere"}


async def test_prompts_are_listed_and_filled_in(era: str, url: str) -> None:
    async with opened(era, url) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
        assert prompts["test_simple_prompt"] == Prompt("test_simple_prompt", "A simple prompt without arguments", [])
        assert [a["name"] for a in prompts["test_prompt_with_arguments"].arguments] == ["arg1", "arg2"]
        filled = await client.get_prompt("test_prompt_with_arguments", {"arg1": "paris", "arg2": "hello"})
        assert filled.description == "A prompt with two required arguments"
        assert [m["content"]["text"] for m in filled.messages] == ["Prompt with arguments: arg1='paris', arg2='hello'"]
        with pytest.raises(RemoteError) as incomplete:
            await client.get_prompt("test_prompt_with_arguments", {"arg1": "paris"})
        assert incomplete.value.code == INVALID_PARAMS and "arg2" in str(incomplete.value)


async def test_input_a_prompt_asks_for_comes_from_the_handlers(era: str, url: str) -> None:
    async with opened(era, url) as client:
        result = await client.get_prompt(INPUT_PROMPT)
        (message,) = result.messages
        assert message["content"]["text"] == ("Answer within this context: asked: What context should the prompt use?")


def test_the_blocking_client_reads_the_same(url: str) -> None:
    with SyncClient(url, timeout=10) as client:
        assert "test://static-text" in {r.uri for r in client.list_resources()}
        (contents,) = client.read_resource("test://static-text")
        assert contents["text"] == "This is the content of the static text resource."
        assert "test_simple_prompt" in {p.name for p in client.list_prompts()}
        (message,) = client.get_prompt("test_simple_prompt").messages
        assert message["content"]["text"] == "This is a simple prompt for testing."
        template = "test://template/{id}/data"
        assert template in {t.uri_template for t in client.list_resource_templates()}
        completion = client.complete({"type": "ref/resource", "uri": template}, {"name": "id", "value": "12"})
        assert completion["values"] == ["12", "123"]
