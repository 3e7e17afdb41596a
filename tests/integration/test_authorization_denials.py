"""Acceptance 4 of issue 29: every authorization refusal, in both eras, before and after commit, carries the
SEP-2643 envelope; read here by a small client written only from the SEP's text, over real HTTP with real signed
JWTs. The legacy 403 (a refused call, a refused resume), the in-band ``-32041``, the modern ``-31043`` and the task
denial ``-31041`` (on every ``tasks/get`` while it is denied), and the SEP's retry echo."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED, FORBIDDEN, TASK_DENIED, TOOL_FORBIDDEN
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.modern_http import ModernPeer, answer, poll_until_settled

pytestmark = pytest.mark.anyio

# -- a client written from SEP-2643's text alone -------------------------------------------------------------


def sep_denial(data: object) -> dict[str, Any] | None:
    """The SEP's "Authorization Denial Envelope": ``data.authorization``, an object whose ``reason`` (REQUIRED)
    is ``insufficient_authorization``; ``remediationHints`` (OPTIONAL) an array of objects each with a string
    ``type``; ``authorizationContextId`` (OPTIONAL) a string. ``None``: not an authorization denial."""
    if not isinstance(data, dict) or not isinstance(data.get("authorization"), dict):
        return None
    envelope: dict[str, Any] = data["authorization"]
    if envelope.get("reason") != "insufficient_authorization":
        return None
    hints = envelope.get("remediationHints", [])
    assert isinstance(hints, list) and all(isinstance(h, dict) and isinstance(h.get("type"), str) for h in hints)
    assert isinstance(envelope.get("authorizationContextId", ""), str)
    assert envelope.get("credentialDisposition", "replacement") in ("replacement", "additional")
    return envelope


def sep_retry_meta(envelope: dict[str, Any]) -> dict[str, Any]:
    """The SEP's "Retry Echo via _meta": the handle, verbatim, under its key."""
    return {"io.modelcontextprotocol/authorization-context-id": envelope["authorizationContextId"]}


# -- what our envelope says beyond the SEP's minimum ---------------------------------------------------------


def assert_ours(envelope: dict[str, Any], data: dict[str, Any], resource: str) -> None:
    """``remediation: available``, our hint naming exactly what the refusal's own fields name, and the same object
    repeated under ``_meta``."""
    assert envelope["remediation"] == "available"
    assert envelope["authorizationContextId"].startswith("authzctx_")
    (hint,) = envelope["remediationHints"]
    assert hint == {"type": "io.github.mcp-lossless/oauth-grant", "resources": [resource], "scopes": []}
    assert data["requiredResources"] == [resource], "the existing fields stay"
    assert data["_meta"]["io.modelcontextprotocol/authorization"] == envelope


async def test_legacy_refusals_carry_the_envelope(server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    fetch = f"{mcp}/tools/fetch"
    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")
    peer = Peer(http, server_url, await dev_token(http, server_url, mcp), version="2025-11-25")
    await peer.initialize()

    refused = await peer.post(call(1, "fetch", url="https://example.com/a"), token=narrowed)  # -32043, a 403
    assert refused.status == 403 and "insufficient_scope" in refused.headers["www-authenticate"]
    error = refused.json()["error"]
    assert error["code"] == FORBIDDEN
    envelope = sep_denial(error["data"])
    assert envelope is not None
    assert_ours(envelope, error["data"], fetch)

    batch = [
        call(2, "search", progress="s", query="q", steps=1, delay_ms=0),
        call(3, "fetch", progress="f", url="https://example.com/slow", steps=2, delay_ms=150),
    ]
    peer = Peer(http, server_url, await dev_token(http, server_url, mcp), version="2025-03-26")  # batches
    await peer.initialize()
    first = await peer.post(batch, stop_after=2)
    cursor = first.ids[-1]
    live = await peer.resume(cursor, token=narrowed)  # committed: the in-band -32041
    (in_band,) = [m for m in live.messages if m.get("id") == 3]
    assert in_band["error"]["code"] == DELIVERY_REFUSED
    envelope = sep_denial(in_band["error"]["data"])
    assert envelope is not None
    assert_ours(envelope, in_band["error"]["data"], fetch)

    replay = await peer.resume(cursor, token=narrowed)  # the fetch events are stored now: the 403 before commit
    assert replay.status == 403 and "insufficient_scope" in replay.headers["www-authenticate"]
    body = replay.json()
    envelope = sep_denial(body)  # a resume's 403 body is not a JSON-RPC error: its data is the body itself
    assert envelope is not None
    assert_ours(envelope, body, fetch)


async def test_modern_refusals_carry_the_envelope_on_every_denied_poll(
    server_url: str, http: httpx.AsyncClient
) -> None:
    mcp = f"{server_url}/mcp"
    fetch = f"{mcp}/tools/fetch"
    aggregate = await dev_token(http, server_url, mcp)
    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")
    peer = ModernPeer(http, server_url, aggregate)

    refused = await peer.call("fetch", token=narrowed, url="https://example.com/a")
    error = answer(refused)["error"]
    assert refused.status == 403 and error["code"] == TOOL_FORBIDDEN
    envelope = sep_denial(error["data"])
    assert envelope is not None
    assert_ours(envelope, error["data"], fetch)

    created = answer(await peer.call("fetch", url="https://example.com/a", steps=1, delay_ms=0))["result"]
    task_id = created["taskId"]
    handles = set()
    for _ in range(3):  # the SEP: repeated on every tasks/get while the task is not delivered
        denied = await peer.task("tasks/get", task_id, token=narrowed)
        error = answer(denied)["error"]
        assert denied.status == 403 and error["code"] == TASK_DENIED
        envelope = sep_denial(error["data"])
        assert envelope is not None
        assert_ours(envelope, error["data"], fetch)
        handles.add(envelope["authorizationContextId"])
    assert len(handles) == 1, "one refusal, one correlation handle"

    retry = peer.message("tasks/get", {"taskId": task_id})
    retry["params"]["_meta"].update(sep_retry_meta(envelope))
    echoed = await peer.send(retry)  # a covering token with the handle echoed: answered on the credential alone
    assert echoed.status == 200 and "result" in answer(echoed)
    assert (await poll_until_settled(peer, task_id))["status"] == "completed"
