"""Our 2026-07-28 client answers a server's requests for client input from the user's handlers, against our
server (real loopback HTTP, real JWTs, memory store): rounds of ``input_required`` re-sent with the answers and
the sealed ``requestState``, a task waiting ``input_required`` answered with ``tasks/update``; without a
handler, or past the rounds bound, the call ends with :class:`InputUnanswered` (a task is cancelled)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mcp_lossless.client import Client, InputUnanswered, OAuth, RemoteError
from mcp_lossless.client.handlers import MAX_INPUT_ROUNDS
from mcp_lossless.client.modern import ModernClient, TaskUpdate
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from tests.support.recording import Exchange, RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
SEEN: list[str] = []
"""What the tools were told, run by run (a round re-runs its tool from its start)."""


def tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def book(ctx: ToolContext, city: str) -> str:
        """Asks the traveller's name, then whether to confirm: two rounds."""
        name = await ctx.request("elicitation/create", {"message": "Name?", "requestedSchema": NAME_SCHEMA})
        SEEN.append(f"name={name['content']['name']}")
        sure = await ctx.request("elicitation/create", {"message": "Sure?", "requestedSchema": {"type": "object"}})
        SEEN.append(f"sure={sure['action']}")
        return f"booked {city} for {name['content']['name']} ({sure['action']})"

    @registry.tool(task=True)
    async def approve(ctx: ToolContext, item: str) -> str:
        """A task that waits for its owner's approval."""
        answer = await ctx.request("elicitation/create", {"message": f"Approve {item}?", "requestedSchema": {}})
        SEEN.append(f"approve={answer['action']}")
        return f"{item}: {answer['action']}"

    @registry.tool(task="required", input_before_task=True)
    async def greet(ctx: ToolContext) -> str:
        """Asks the name on the tools/call (a round), then runs as a task that asks again in place."""
        name = await ctx.request("elicitation/create", {"message": "Name?", "requestedSchema": NAME_SCHEMA})
        await asyncio.sleep(0)  # the first await that is not an ask: the task starts here
        sure = await ctx.request("elicitation/create", {"message": "Sure?", "requestedSchema": {"type": "object"}})
        SEEN.append(f"greet={name['content']['name']},{sure['action']}")
        return f"hello {name['content']['name']} ({sure['action']})"

    @registry.tool()
    async def pester(ctx: ToolContext) -> str:
        """Never satisfied: asks one more question every round."""
        while True:
            await ctx.request("elicitation/create", {"message": "More?", "requestedSchema": {}})

    @registry.tool(task=True)
    async def nag(ctx: ToolContext) -> str:
        """A task that is never satisfied either."""
        while True:
            await ctx.request("elicitation/create", {"message": "Again?", "requestedSchema": {}})

    return registry


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, RecordingTransport, httpx.AsyncClient]]:
    sock = loopback_socket()
    config = ServerConfig(port=sock.getsockname()[1], store="memory", dev_clients={"dev-client": "dev-secret"})
    app = create_app(config, tools())
    assert app.modern is not None
    app.modern.tasks.poll_ms = 50
    with serve_app(app, sock=sock, lifespan="on") as base:
        recorder = RecordingTransport()
        async with httpx.AsyncClient(transport=recorder, timeout=10) as http:
            yield f"{base}/mcp", recorder, http


class Elicitor:
    """An elicitation handler that answers ``accept`` (with a name when one is asked) and records each ask."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(params["message"])
        if params.get("requestedSchema") == NAME_SCHEMA:
            return {"action": "accept", "content": {"name": "Alice"}}
        return {"action": "accept"}


def sent(recorder: RecordingTransport, method: str) -> list[Exchange]:
    return [e for e in recorder.to("/mcp") if (e.sent_json() or {}).get("method") == method]


async def test_rounds_of_input_are_answered_by_the_handler_and_resent_with_the_state(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()
    elicit = Elicitor()
    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http, input_handlers={"elicitation/create": elicit}) as client:
        result = await client.call_tool("book", {"city": "Oslo"})
    assert result.text == "booked Oslo for Alice (accept)"
    assert elicit.asked == ["Name?", "Sure?"], "each question put to the user once, in order"
    assert SEEN == ["name=Alice", "name=Alice", "sure=accept"], "the answers reached the tool, round by round"
    calls = sent(recorder, "tools/call")
    assert len(calls) == 3
    params = [c.sent_json()["params"] for c in calls]
    assert all("elicitation" in p["_meta"]["io.modelcontextprotocol/clientCapabilities"] for p in params)
    assert "requestState" not in params[0] and "inputResponses" not in params[0]
    for before, after in zip(calls, params[1:], strict=False):
        answered = before.received_json()["result"]
        assert answered["resultType"] == "input_required"
        assert after["requestState"] == answered["requestState"], "the sealed state echoed as the server gave it"
        assert set(after["inputResponses"]) == set(answered["inputRequests"]), "answered by the server's keys"
        assert after["arguments"] == {"city": "Oslo"}
    assert calls[-1].received_json()["result"]["resultType"] == "complete"


async def test_a_task_waiting_for_input_is_answered_with_tasks_update_and_polled_to_its_result(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()
    elicit = Elicitor()
    updates: list[TaskUpdate] = []
    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http, input_handlers={"elicitation/create": elicit}) as client:
        result = await client.call_tool("approve", {"item": "invoice-7"}, on_task_update=updates.append)
    assert result.text == "invoice-7: accept" and SEEN == ["approve=accept"]
    assert elicit.asked == ["Approve invoice-7?"], "asked once, however many polls showed the request"
    assert "input_required" in [u.status for u in updates] and updates[-1].status == "completed"
    (update,) = sent(recorder, "tasks/update")
    waiting = next(e for e in sent(recorder, "tasks/get") if e.received_json()["result"]["status"] == "input_required")
    assert update.sent_json()["params"]["taskId"] == waiting.sent_json()["params"]["taskId"]
    assert update.sent_json()["params"]["inputResponses"] == {
        key: {"action": "accept"} for key in waiting.received_json()["result"]["inputRequests"]
    }
    assert update.received_json()["result"] == {"resultType": "complete"}


async def test_input_before_a_task_then_inside_it_comes_from_the_same_handler(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()
    elicit = Elicitor()
    created: list[str] = []
    auth = OAuth("dev-client", "dev-secret")
    handlers = {"elicitation/create": elicit}
    async with ModernClient(
        url, auth=auth, http=http, input_handlers=handlers, on_task=lambda t, _: created.append(t)
    ) as client:
        result = await client.call_tool("greet")
    assert result.text == "hello Alice (accept)" and SEEN == ["greet=Alice,accept"]
    assert elicit.asked == ["Name?", "Sure?"], "the round's question, then the task's"
    calls = [c.received_json()["result"]["resultType"] for c in sent(recorder, "tools/call")]
    assert calls == ["input_required", "task"], "the round resolved before the task was created"
    assert len(created) == 1 and len(sent(recorder, "tasks/update")) == 1


async def test_without_a_handler_the_call_ends_with_input_unanswered(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()

    async def sample(params: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no sampling was asked for")

    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http, input_handlers={"sampling/createMessage": sample}) as client:
        with pytest.raises(InputUnanswered, match="elicitation"):
            await client.call_tool("book", {"city": "Oslo"})
        with pytest.raises(InputUnanswered, match="elicitation"):
            await client.call_tool("approve", {"item": "po-1"})
    assert SEEN == [], "no tool went past its question"
    declared = sent(recorder, "tools/call")[0].sent_json()["params"]["_meta"]
    assert declared["io.modelcontextprotocol/clientCapabilities"]["sampling"] == {}
    assert "elicitation" not in declared["io.modelcontextprotocol/clientCapabilities"], "only what it can answer"
    with pytest.raises(ValueError, match="tools/call"):
        ModernClient(url, input_handlers={"tools/call": sample})


async def test_past_the_rounds_bound_a_call_and_a_task_end_with_input_unanswered(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    elicit = Elicitor()
    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http, input_handlers={"elicitation/create": elicit}) as client:
        with pytest.raises(InputUnanswered, match=f"more than {MAX_INPUT_ROUNDS}"):
            await client.call_tool("pester", timeout=30)
        assert len(sent(recorder, "tools/call")) == MAX_INPUT_ROUNDS + 1
        assert elicit.asked == ["More?"] * MAX_INPUT_ROUNDS
        with pytest.raises(InputUnanswered, match=f"more than {MAX_INPUT_ROUNDS}"):
            await client.call_tool("nag", timeout=30)
    assert len(sent(recorder, "tasks/update")) == MAX_INPUT_ROUNDS
    (cancel,) = sent(recorder, "tasks/cancel")
    assert cancel.received_json()["result"] == {"resultType": "complete"}, "the task does not wait for its TTL"


async def test_the_legacy_client_answers_the_servers_requests_from_the_same_handlers(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    """One way to register them: a 2025-11-25 session gets the same questions as requests on the call's stream."""
    url, recorder, http = served
    SEEN.clear()
    elicit = Elicitor()
    auth = OAuth("dev-client", "dev-secret")
    async with Client(url, auth=auth, http=http, input_handlers={"elicitation/create": elicit}) as client:
        result = await client.call_tool("book", {"city": "Oslo"})
    assert result.text == "booked Oslo for Alice (accept)"
    assert elicit.asked == ["Name?", "Sure?"] and SEEN == ["name=Alice", "sure=accept"], "one run, two answers"
    (handshake,) = sent(recorder, "initialize")
    assert handshake.sent_json()["params"]["capabilities"] == {"elicitation": {}}
    replies = [e.sent_json() for e in recorder.to("/mcp") if "result" in (e.sent_json() or {})]
    assert [r["result"]["action"] for r in replies] == ["accept", "accept"]

    async def refuse(params: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the user closed the dialog")

    SEEN.clear()
    async with Client(url, auth=auth, http=http, input_handlers={"elicitation/create": refuse}) as client:
        with pytest.raises(RemoteError, match="closed the dialog"):
            await client.call_tool("book", {"city": "Rome"}, timeout=10)
    assert SEEN == [], "the tool got the handler's failure as an error, and the call ended with it"


async def test_a_handler_that_fails_ends_the_call_once_and_its_task_is_cancelled(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()

    async def closed(params: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the user closed the dialog")

    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http, input_handlers={"elicitation/create": closed}) as client:
        with pytest.raises(InputUnanswered, match="closed the dialog") as round_trip:
            await client.call_tool("book", {"city": "Oslo"})
        assert isinstance(round_trip.value.__cause__, RuntimeError)
        with pytest.raises(InputUnanswered, match="closed the dialog"):
            await client.call_tool("approve", {"item": "po-2"})
    assert SEEN == [] and len(sent(recorder, "tools/call")) == 2, "no retry sent without an answer"
    assert sent(recorder, "tasks/update") == []
    (cancel,) = sent(recorder, "tasks/cancel")
    assert cancel.received_json()["result"] == {"resultType": "complete"}, "the task does not wait for its TTL"


class Named(Elicitor):
    """An :class:`Elicitor` giving its own name: whose handler answered shows in the tool's result."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    async def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(params["message"])
        if params.get("requestedSchema") == NAME_SCHEMA:
            return {"action": "accept", "content": {"name": self.name}}
        return {"action": "accept"}


async def test_a_legacy_calls_own_handlers_answer_what_arrives_on_its_stream(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    """Two calls at once on one session, each with its own handler: each request is answered by the handler of
    the call whose stream it arrived on; a call without handlers of its own gets the client's."""
    url, _recorder, http = served
    SEEN.clear()
    alice, bob, client_wide = Named("Alice"), Named("Bob"), Named("Carol")
    auth = OAuth("dev-client", "dev-secret")
    async with Client(url, auth=auth, http=http, input_handlers={"elicitation/create": client_wide}) as client:
        results = await asyncio.gather(
            client.call_tool("book", {"city": "Oslo"}, input_handlers={"elicitation/create": alice}),
            client.call_tool("book", {"city": "Rome"}, input_handlers={"elicitation/create": bob}),
        )
        plain = await client.call_tool("book", {"city": "Bern"})
    assert [r.text for r in results] == ["booked Oslo for Alice (accept)", "booked Rome for Bob (accept)"]
    assert plain.text == "booked Bern for Carol (accept)"
    assert alice.asked == bob.asked == client_wide.asked == ["Name?", "Sure?"], "each asked only its own call's"


async def test_input_methods_offer_a_capability_that_only_calls_answer(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    """A gateway's session has no handler of its own: it offers the capability for its calls' handlers, and a
    request on a call's stream that brought none is refused (method not found), never answered made up."""
    url, recorder, http = served
    SEEN.clear()
    alice = Named("Alice")
    auth = OAuth("dev-client", "dev-secret")
    async with Client(url, auth=auth, http=http, input_methods=("elicitation/create",)) as client:
        answered = await client.call_tool("book", {"city": "Oslo"}, input_handlers={"elicitation/create": alice})
        with pytest.raises(RemoteError, match="does not support elicitation/create"):
            await client.call_tool("book", {"city": "Rome"}, timeout=10)
    assert answered.text == "booked Oslo for Alice (accept)" and SEEN == ["name=Alice", "sure=accept"]
    (handshake,) = sent(recorder, "initialize")
    assert handshake.sent_json()["params"]["capabilities"] == {"elicitation": {}}
    with pytest.raises(ValueError, match="input methods"):
        Client(url, input_methods=("tools/call",))


async def test_a_modern_calls_own_handlers_answer_its_rounds_and_its_task_and_declare_their_capability(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    SEEN.clear()
    alice = Named("Alice")
    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(url, auth=auth, http=http) as client:  # no handler of the client's own
        booked = await client.call_tool("book", {"city": "Oslo"}, input_handlers={"elicitation/create": alice})
        approved = await client.call_tool("approve", {"item": "po-1"}, input_handlers={"elicitation/create": alice})
        with pytest.raises(InputUnanswered):
            await client.call_tool("book", {"city": "Rome"})
    assert booked.text == "booked Oslo for Alice (accept)" and approved.text == "po-1: accept"
    assert alice.asked == ["Name?", "Sure?", "Approve po-1?"]
    declared = [
        e.sent_json()["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
        for e in sent(recorder, "tools/call")
    ]
    assert [sorted(d) for d in declared] == [["elicitation", "extensions"]] * 4 + [["extensions"]], (
        "three rounds of book and approve's call declare the call's handler; the call without one does not"
    )
    (update,) = sent(recorder, "tasks/update")
    assert "elicitation" in update.sent_json()["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
