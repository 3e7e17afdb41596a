"""Our 2026-07-28 client follows a task with ``tasks/stream`` (SEP-2694) where the server declares it (real HTTP, real
JWTs from the least-privilege dev AS, behind a proxy that cuts): progress from the stream's events, each once;
a cut resumed after the last delivered seq; a narrowed token's denial repaired with a fresh grant; ``events_gone``
told to the caller, then the outcome by ``tasks/get``; polling where the server does not declare it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest

from mcp_lossless.client import OAuth, ProgressUpdate
from mcp_lossless.client.modern import ModernClient, TaskUpdate, open_client
from mcp_lossless.core.errors import TASK_DENIED
from mcp_lossless.core.task_stream import STREAM_EXTENSION
from mcp_lossless.server.app import LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.stores.memory import MemoryStore
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer, poll_until_settled
from tests.support.proxy import CuttingProxy, Fault
from tests.support.recording import Exchange, RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio
CLIENTS = {"dev-client": "dev-secret"}


@dataclass
class Served:
    url: str
    base: str
    proxy: CuttingProxy
    recorder: RecordingTransport
    http: httpx.AsyncClient

    def sent(self, method: str) -> list[Exchange]:
        return [e for e in self.recorder.to("/mcp") if (e.sent_json() or {}).get("method") == method]


@asynccontextmanager
async def served(
    store: MemoryStore | None = None, tune: Callable[[LosslessApp], None] | None = None
) -> AsyncIterator[Served]:
    """Our server (least-privilege dev AS) behind the cutting proxy, whose address is its canonical URI."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    async with CuttingProxy(port) as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        config = ServerConfig(
            port=port, public_url=f"{base}/mcp", store="memory", least_privilege=True, dev_clients=CLIENTS
        )
        app = create_app(config, store=store)
        if tune is not None:
            tune(app)
        recorder = RecordingTransport()
        with serve_app(app, sock=sock, lifespan="on"):
            async with httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(10, read=60)) as http:
                yield Served(f"{base}/mcp", base, proxy, recorder, http)


def progress_of(seen: list[ProgressUpdate]) -> list[float]:
    return [update.progress for update in seen]


async def test_a_task_is_followed_by_its_stream_progress_from_its_events_no_polls() -> None:
    async with served() as s:
        seen: list[ProgressUpdate] = []
        states: list[TaskUpdate] = []
        async with open_client(s.url, auth=OAuth("dev-client", "dev-secret"), http=s.http) as client:
            assert isinstance(client, ModernClient)
            result = await client.call_tool(
                "fetch",
                {"url": "https://example.com/s", "steps": 4, "delay_ms": 20},
                on_progress=seen.append,
                on_task_update=states.append,
            )
        assert result.text == "contents of https://example.com/s: 21 bytes"
        assert progress_of(seen) == [1, 2, 3, 4] and seen[0].message == "fetch step 1/4" and seen[0].total == 4
        assert [u.status for u in states] == ["working", "completed"]
        assert len(s.sent("tasks/stream")) == 1 and not s.sent("tasks/get"), "one stream, no poll"


class NarrowedAfterTheCut(OAuth):
    """The client's own OAuth, told to narrow (a real grant for ``search`` only) before the next token it hands
    out: set while the stream is read, so exactly the resume after the cut presents the narrowed token."""

    narrow_to: list[str] | None = None

    async def token(self, resources: frozenset[str]) -> str | None:
        if self.narrow_to is not None:
            narrow, self.narrow_to = self.narrow_to, None
            await self.narrow(narrow)
        return await super().token(resources)


async def test_a_cut_stream_resumes_is_denied_under_a_narrowed_token_reauthorizes_each_event_once() -> None:
    """Acceptance 1 of issue 29 from the client: cut after the 2nd progress event, resumed under a token narrowed
    to search (403, -31041, nothing of fetch), a fresh grant, the rest from the same cursor, each event once."""
    async with served() as s:
        search, fetch = f"{s.url}/tools/search", f"{s.url}/tools/fetch"
        auth = NarrowedAfterTheCut("dev-client", "dev-secret")
        seen: list[ProgressUpdate] = []

        def on_progress(update: ProgressUpdate) -> None:
            seen.append(update)
            if update.progress == 2:
                auth.narrow_to = [search]

        def on_task(task_id: str, tool: str) -> None:
            s.proxy.reset(lambda n: Fault(cut=True) if n == 3 else None)  # seq 0 working, 1 and 2 progress: cut

        async with open_client(s.url, auth=auth, http=s.http, on_task=on_task) as client:
            result = await client.call_tool(
                "fetch", {"url": "https://example.com/n", "steps": 6, "delay_ms": 30}, on_progress=on_progress
            )
        assert result.text == "contents of https://example.com/n: 21 bytes"
        assert progress_of(seen) == [1, 2, 3, 4, 5, 6], "every progress event exactly once, in order"
        assert s.proxy.stats.cut_at == [3]
        streams = s.sent("tasks/stream")
        assert [e.status for e in streams] == [200, 403, 200]
        first, denied, resumed = streams
        assert "after" not in first.sent_json()["params"]
        assert denied.sent_json()["params"]["after"] == 2 and resumed.sent_json()["params"]["after"] == 2
        assert denied.audience == {search}, "the resume presented the narrowed token"
        error = denied.received_json()["error"]
        assert error["code"] == TASK_DENIED and error["data"]["lastSeq"] == 2
        assert b"fetch step" not in denied.received and b"contents of" not in denied.received, "nothing of fetch"
        assert fetch in resumed.audience, "a fresh grant covering fetch"
        echoed = resumed.sent_json()["params"]["_meta"]["io.modelcontextprotocol/authorization-context-id"]
        assert echoed == error["data"]["authorization"]["authorizationContextId"], "the SEP's retry echo"
        seqs = [m["params"]["seq"] for e in (first, resumed) for m in e.messages() if "seq" in m.get("params", {})]
        assert seqs == list(range(len(seqs))), "the two streams carried each seq once between them"
        assert not s.sent("tasks/get")


async def test_events_gone_is_told_then_the_outcome_comes_by_tasks_get() -> None:
    """Acceptance 2 from the client: a store holding 4 events, a task that made 10; following it from the start
    gets ``events_gone``, which the caller hears once, explicitly; the result then comes by polling."""
    async with served(MemoryStore(max_events=4)) as s:
        peer = ModernPeer(s.http, s.base, await dev_token(s.http, s.base, s.url))
        created = answer(await peer.call("fetch", url="https://example.com/g", steps=8, delay_ms=0))
        task_id = created["result"]["taskId"]
        await poll_until_settled(peer, task_id)
        states: list[TaskUpdate] = []
        async with open_client(s.url, auth=OAuth("dev-client", "dev-secret"), http=s.http) as client:
            assert isinstance(client, ModernClient)
            result = await client.resume_task("fetch", task_id, on_task_update=states.append)
        assert result.text == "contents of https://example.com/g: 21 bytes"
        gone = [u for u in states if u.missed is not None]
        assert len(gone) == 1 and gone[0].missed is not None
        assert gone[0].missed.after is None and gone[0].missed.earliest is not None and gone[0].missed.earliest > 0
        assert "gone" in (gone[0].message or "")
        assert states[-1].status == "completed"
        streamed = s.sent("tasks/stream")
        assert len(streamed) == 1 and streamed[0].received_json()["error"]["code"] == -32010
        assert b"notifications/tasks/event" not in streamed[0].received
        assert s.sent("tasks/get"), "the outcome by tasks/get"


async def test_a_server_that_does_not_declare_task_streams_is_polled() -> None:
    def without_streams(app: LosslessApp) -> None:
        assert app.modern is not None
        del app.modern.capabilities["extensions"][STREAM_EXTENSION]
        app.modern.tasks.poll_ms = 50

    async with served(tune=without_streams) as s:
        async with open_client(s.url, auth=OAuth("dev-client", "dev-secret"), http=s.http) as client:
            result = await client.call_tool("fetch", {"url": "https://example.com/p", "steps": 2, "delay_ms": 20})
        assert result.text == "contents of https://example.com/p: 21 bytes"
        assert s.sent("tasks/get") and not s.sent("tasks/stream")
