"""Acceptance 1 and 2 of the server issue: narrowed resumes never leak, refusals are explicit and resumable."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED
from tests.support.mcp_http import Peer, StreamRead, call, dev_token

pytestmark = pytest.mark.anyio


def results_by_id(reads: list[StreamRead]) -> dict[object, dict[str, object]]:
    return {m["id"]: m for r in reads for m in r.messages if "id" in m and ("result" in m or "error" in m)}


def fetch_events(read: StreamRead) -> list[str]:
    return [e.data for e in read.events if "fetch" in e.data or "contents of" in e.data]


async def open_session(http: httpx.AsyncClient, base: str, version: str, *resources: str) -> Peer:
    peer = Peer(http, base, await dev_token(http, base, *resources), version=version)
    await peer.initialize()
    return peer


async def test_batch_stream_narrowed_resume_is_refused_then_completes_exactly_once(server_url: str, http) -> None:
    mcp = f"{server_url}/mcp"
    peer = await open_session(http, server_url, "2025-03-26", mcp)
    batch = [
        call(1, "search", progress="s", query="q", steps=3, delay_ms=60),
        call(2, "fetch", progress="f", url="https://example.com/a", steps=3, delay_ms=0),
    ]
    first = await peer.post(batch, stop_after=2)
    assert first.status == 200 and len(first.ids) == 2
    cursor = first.ids[-1]

    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")
    refused = await peer.resume(cursor, token=narrowed)
    assert refused.status == 403
    assert refused.events == []
    body = refused.json()
    assert body["error"] == "replay_refused"
    assert body["requiredResources"] == [f"{mcp}/tools/fetch"]
    assert body["lastEventId"] == cursor and body["resumable"] is True
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and f'resource="{mcp}/tools/fetch"' in challenge
    # The endpoint's metadata (its resource is the URI the client connected to), not the tool's: stock OAuth
    # clients accept no other. The missing tool indicator is still named in resource= and the body.
    assert f'resource_metadata="{server_url}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert "scope=" not in challenge, "the demo tools need no scope"

    wide = await dev_token(http, server_url, f"{mcp}/tools/search", f"{mcp}/tools/fetch")
    rest = await peer.resume(cursor, token=wide)
    assert rest.status == 200
    assert body["eventId"] == rest.ids[0], "the refusal names the first event the narrowed token would have received"
    ids = first.ids + rest.ids
    assert len(ids) == len(set(ids)), "no event delivered twice"
    results = results_by_id([first, rest])
    assert results[1]["result"]["content"][0]["text"].startswith("search results for 'q'")
    assert results[2]["result"]["content"][0]["text"].startswith("contents of https://example.com/a")
    progress = Counter(
        m["params"]["progressToken"]
        for r in (first, rest)
        for m in r.messages
        if m.get("method") == "notifications/progress"
    )
    assert progress == {"s": 3, "f": 3}


async def test_own_post_streams_narrowed_token_resumes_search_but_not_fetch(server_url: str, http) -> None:
    mcp = f"{server_url}/mcp"
    peer = await open_session(http, server_url, "2025-11-25", mcp)
    fetch = await peer.post(call(7, "fetch", progress="f", url="u", steps=4, delay_ms=0), stop_after=2)
    search = await peer.post(call(8, "search", progress="s", query="x", steps=4, delay_ms=0), stop_after=2)
    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")

    refused = await peer.resume(fetch.ids[-1], token=narrowed)
    assert refused.status == 403 and refused.json()["requiredResources"] == [f"{mcp}/tools/fetch"]

    searched = await peer.resume(search.ids[-1], token=narrowed)
    assert searched.status == 200
    assert not fetch_events(searched)
    assert results_by_id([searched])[8]["result"]["isError"] is False

    fetched = await peer.resume(fetch.ids[-1], token=f"{await dev_token(http, server_url, mcp)}")
    assert [m["params"]["progress"] for m in fetched.messages if "method" in m] == [2, 3, 4]
    assert results_by_id([fetched])[7]["result"]["content"][0]["text"] == "contents of u: 1 bytes"


async def test_live_event_for_uncovered_tool_is_an_in_band_resumable_error(server_url: str, http) -> None:
    mcp = f"{server_url}/mcp"
    peer = await open_session(http, server_url, "2025-03-26", mcp)
    batch = [
        call(1, "search", progress="s", query="q", steps=1, delay_ms=0),
        call(2, "fetch", progress="f", url="https://example.com/slow", steps=2, delay_ms=150),
    ]
    first = await peer.post(batch, stop_after=2)  # search progress + result; fetch still sleeping
    cursor = first.ids[-1]
    assert 1 in results_by_id([first])

    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")
    live = await peer.resume(cursor, token=narrowed)
    assert live.status == 200, "nothing uncovered was buffered yet, so the replay was committed"
    assert live.ids == [], "no event, and no error frame, carries an SSE id"
    assert not any("fetch step" in e.data or "contents of" in e.data for e in live.events)
    log_note, error = live.messages
    assert (
        log_note["method"] == "notifications/message"
        and log_note["params"]["data"]["reason"] == "insufficient_audience"
    )
    assert error["id"] == 2 and error["error"]["code"] == DELIVERY_REFUSED
    data = error["error"]["data"]
    assert data["requiredResources"] == [f"{mcp}/tools/fetch"]
    assert data["lastEventId"] == cursor and data["resumable"] is True
    assert data["eventId"].split(".")[0] == cursor.split(".")[0], "the offending event is on this stream"

    rest = await peer.resume(cursor, token=await dev_token(http, server_url, mcp))
    assert rest.ids[0] == data["eventId"]
    assert [m["params"]["progress"] for m in rest.messages if "method" in m] == [1, 2]
    assert results_by_id([rest])[2]["result"]["isError"] is False


async def test_cursor_problems_are_explicit_4xx_never_an_empty_200(server_url: str, http) -> None:
    mcp = f"{server_url}/mcp"
    alice = await open_session(http, server_url, "2025-11-25", mcp)
    other = await open_session(http, server_url, "2025-11-25", mcp)
    a1 = await alice.post(call(1, "fetch", url="a", steps=0, delay_ms=0))
    a2 = await alice.post(call(2, "search", query="b", steps=0, delay_ms=0))
    theirs = await other.post(call(1, "fetch", url="secret", steps=0, delay_ms=0))

    cases = {
        "malformed": ("not-an-id", 400),
        "unknown": ("AAAAAAAAAAAAAAAAAAAAAA.0.AAAAAAAAAAAAAAAA", 400),
        "foreign_session": (theirs.ids[0], 409),
        "foreign_stream": (a1.ids[0].split(".")[0] + "." + ".".join(a2.ids[0].split(".")[1:]), 409),
    }
    for reason, (cursor, status) in cases.items():
        read = await alice.resume(cursor)
        assert (read.status, read.json()["error"]) == (status, reason), reason
        assert read.events == []

    mallory = Peer(http, server_url, await dev_token(http, server_url, mcp, client=("mallory", "mallory-secret")))
    await mallory.initialize()  # alice's real id on mallory's own session reads exactly as a made-up one
    stolen, made_up = await mallory.resume(a1.ids[0]), await mallory.resume(cases["unknown"][0])
    assert (stolen.status, stolen.events) == (made_up.status, made_up.events) == (400, [])
    assert {**stolen.json(), "lastEventId": None} == {**made_up.json(), "lastEventId": None}
    mallory.session_id = alice.session_id
    hijack = await mallory.resume(a1.ids[0])
    assert hijack.status == 404 and hijack.events == []
    posted = await mallory.post(call(9, "fetch", url="x"))
    assert posted.status == 404


async def test_resuming_a_completed_stream_returns_the_rest_and_ends(server_url: str, http) -> None:
    peer = await open_session(http, server_url, "2025-11-25", f"{server_url}/mcp")
    done = await peer.post(call(3, "fetch", progress="p", url="z", steps=2, delay_ms=0))
    assert done.messages[-1]["id"] == 3
    tail = await peer.resume(done.ids[1])
    assert [e.id for e in tail.events if e.id] == done.ids[2:]
    at_end = await peer.resume(done.ids[-1])
    assert at_end.status == 200 and at_end.ids == []
