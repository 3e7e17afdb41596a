"""The ASGI protocol check every in-process server test runs under (tests/support/in_process.py): it must catch
each fault it names, or the tests that rely on it prove nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from mcp_lossless.asgi import Receive, Scope, Send
from tests.support.in_process import AsgiViolation, checked

START = {"type": "http.response.start", "status": 200, "headers": []}
END = {"type": "http.response.body", "body": b"x"}
PART = {"type": "http.response.body", "body": b"x", "more_body": True}


def app_sending(*messages: dict[str, Any]) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for message in messages:
            await send(message)

    return app


async def play(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: Any) -> None:
        sent.append(message)

    await checked(app_sending(*messages))({"type": "http"}, receive, send)
    return sent


@pytest.mark.parametrize(
    ("messages", "fault"),
    [
        ((START, END, END), "http.response.body sent after the response ended"),
        ((START, START), "http.response.start sent twice"),
        ((END,), "http.response.body sent before http.response.start"),
        ((START, PART), r"the app returned without ending its response \(started: True\)"),
        ((), r"the app returned without ending its response \(started: False\)"),
    ],
    ids=["after-the-end", "two-starts", "body-first", "unfinished", "silent"],
)
def test_each_fault_is_caught(messages: tuple[dict[str, Any], ...], fault: str) -> None:
    with pytest.raises(AsgiViolation, match=f"^{fault}$"):
        anyio.run(play, *messages)


def test_a_whole_response_passes_untouched() -> None:
    assert anyio.run(play, START, PART, END) == [START, PART, END]
