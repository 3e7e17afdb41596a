"""``HeldHead``: what a request cycle writes through. A response's head and its first body bytes go to the
transport as one write; a head sent alone goes out at the end of its loop turn; nothing is reordered or lost.

The transport is a recorder: the property is the number and order of writes handed to it, which a real socket
does not show (the kernel may merge or split segments either way). Whole responses over real sockets are
``tests/integration/test_http_limits.py``'s, byte for byte against uvicorn's own protocol."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcp_lossless.server.connections import HeldHead

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _held(loop: asyncio.AbstractEventLoop, held: list[HeldHead] | None = None) -> tuple[HeldHead, Recorder]:
    recorder = Recorder()
    transport: Any = recorder
    return HeldHead(transport, loop, [] if held is None else held), recorder


@pytest.mark.anyio
async def test_a_head_and_its_body_are_one_write() -> None:
    out, recorder = _held(asyncio.get_running_loop())
    out.write(HEAD)
    assert recorder.writes == []
    out.write(b"ok")
    assert recorder.writes == [HEAD + b"ok"]
    out.write(b"more")  # the rest of a streamed body as it comes
    assert recorder.writes == [HEAD + b"ok", b"more"]


@pytest.mark.anyio
async def test_a_head_sent_alone_goes_out_at_the_end_of_its_turn() -> None:
    loop = asyncio.get_running_loop()
    out, recorder = _held(loop)
    out.write(HEAD)
    turn_over = loop.create_future()
    loop.call_soon(turn_over.set_result, None)  # queued after the head's flush
    await turn_over
    assert recorder.writes == [HEAD]
    out.write(b"ok")
    assert recorder.writes == [HEAD, b"ok"]


@pytest.mark.anyio
async def test_heads_of_many_connections_held_in_one_turn_each_go_out_once_in_order() -> None:
    loop = asyncio.get_running_loop()
    held: list[HeldHead] = []
    pairs = [_held(loop, held) for _ in range(3)]
    for out, _ in pairs:
        out.write(HEAD)
    pairs[1][0].write(b"ok")
    assert len(held) == 3
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done
    assert [recorder.writes for _, recorder in pairs] == [[HEAD], [HEAD + b"ok"], [HEAD]]
    assert held == []


@pytest.mark.anyio
async def test_an_interim_100_continue_is_not_held() -> None:
    out, recorder = _held(asyncio.get_running_loop())
    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert recorder.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


@pytest.mark.anyio
async def test_close_writes_a_held_head_first_and_a_closed_transport_gets_nothing_more() -> None:
    loop = asyncio.get_running_loop()
    out, recorder = _held(loop)
    out.write(HEAD)
    out.close()
    assert recorder.writes == [HEAD] and recorder.closed
    lost, lost_recorder = _held(loop)
    lost.write(HEAD)
    lost_recorder.closed = True  # the connection went while the head waited for its turn's end
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done
    assert lost_recorder.writes == []
