"""Issue 14: a stdio upstream's era is negotiated, 2026-07-28 first with the legacy handshake as fallback.

Real children over real pipes: the official SDK server (``mcp`` 2.3, which serves either era on stdio,
picking the one its first request opens), ``@modelcontextprotocol/server-everything`` (legacy only: it
answers ``server/discover`` with -32601), and a legacy server that answers nothing before ``initialize``
(``peers/silent_legacy_stdio``). Each test drives a :class:`StdioUpstream` as the gateway does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mcp_lossless.gateway import UpstreamConfig, stdio_era
from mcp_lossless.gateway.stdio import StdioUpstream
from mcp_lossless.gateway.upstream import UpstreamFailure
from tests.support.node import everything_server, node_binary

pytestmark = pytest.mark.anyio

SDK_STDIO = (sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio")
SILENT = (sys.executable, "-m", "tests.interop.peers.silent_legacy_stdio")
WAIT = 60.0
"""For events that need a child's start on a loaded box (importing the SDK alone has taken half a minute)."""


class Collected:
    """A call's reporter: what the gateway would put on the client's stream."""

    wants_progress = True

    def __init__(self) -> None:
        self.progress: list[float] = []

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        self.progress.append(progress)

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        raise AssertionError("a stdio child's logs go to the gateway's log, never to a call's stream")


def everything() -> tuple[str, ...]:
    return (str(node_binary()), str(everything_server()), "stdio")


@asynccontextmanager
async def started(config: UpstreamConfig, changed: asyncio.Event | None = None) -> AsyncIterator[StdioUpstream]:
    upstream = StdioUpstream(config, initial_backoff=0.05)
    async with asyncio.timeout(WAIT):
        await upstream.start(changed.set if changed is not None else lambda: None)
    try:
        yield upstream
    finally:
        await upstream.close()


def ready_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    """The upstream's one line per started child: its pid, era, why that era, and its tools."""
    lines = [r.getMessage() for r in caplog.records]
    return [line for line in lines if line.startswith(f"upstream {name}: child ") and " ready, " in line]


async def test_the_sdk_child_is_spoken_to_in_2026_07_28(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    changed = asyncio.Event()
    async with started(UpstreamConfig(name="py", command=SDK_STDIO, timeout=30), changed) as py:
        assert py.era == "modern"
        assert "modern era (server/discover lists it)" in ready_lines(caplog, "py")[0]
        reporter = Collected()
        result = await py.call("work", {"label": "m", "steps": 2, "delay_ms": 10}, reporter, idempotent=False, key=None)
        assert result["content"][0]["text"] == "work m done"
        assert result["resultType"] == "complete", "a 2026-07-28 answer (a legacy one has no resultType)"
        assert reporter.progress == [1, 2]

        changed.clear()
        grown = await py.call("grow", {"name": "leaf"}, Collected(), idempotent=False, key=None)
        assert grown["content"][0]["text"] == "added leaf"
        async with asyncio.timeout(WAIT):
            await changed.wait()  # announced on the subscriptions/listen request open on the pipe
        assert "leaf" in {t.name for t in py.tools()}
        leaf = await py.call("leaf", {}, Collected(), idempotent=False, key=None)
        assert leaf["content"][0]["text"] == "leaf grown"


async def test_the_sdk_child_pinned_to_legacy_gets_the_handshake(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    changed = asyncio.Event()
    async with started(UpstreamConfig(name="pyold", command=SDK_STDIO, era="legacy"), changed) as py:
        assert py.era == "legacy"
        assert "legacy era (configured)" in ready_lines(caplog, "pyold")[0]
        reporter = Collected()
        result = await py.call("work", {"label": "l", "steps": 2, "delay_ms": 10}, reporter, idempotent=False, key=None)
        assert result["content"][0]["text"] == "work l done" and "resultType" not in result, "a legacy answer"
        assert reporter.progress == [1, 2]
        changed.clear()
        await py.call("grow", {"name": "sprig"}, Collected(), idempotent=False, key=None)
        async with asyncio.timeout(WAIT):
            await changed.wait()  # a plain notifications/tools/list_changed on the pipe
        assert "sprig" in {t.name for t in py.tools()}


async def test_server_everything_falls_back_and_its_restart_keeps_the_era(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    async with started(UpstreamConfig(name="ev", command=everything(), timeout=30)) as ev:
        assert ev.era == "legacy"
        first = ready_lines(caplog, "ev")[0]
        assert "legacy era (server/discover refused (-32601" in first, first
        echoed = await ev.call("echo", {"message": "one"}, Collected(), idempotent=True, key=None)
        assert echoed["content"][0]["text"] == "Echo: one"

        restarted = asyncio.Event()
        ev.on_restart = restarted.set
        assert ev.pid is not None
        os.kill(ev.pid, signal.SIGKILL)
        async with asyncio.timeout(WAIT):
            await restarted.wait()
        assert ev.era == "legacy"
        assert "legacy era (as at its last start)" in ready_lines(caplog, "ev")[1], "no second probe"
        again = await ev.call("echo", {"message": "two"}, Collected(), idempotent=True, key=None)
        assert again["content"][0]["text"] == "Echo: two"


async def test_a_child_pinned_to_2026_07_28_that_is_legacy_does_not_start() -> None:
    upstream = StdioUpstream(UpstreamConfig(name="ev", command=everything(), era="modern"))
    with pytest.raises(UpstreamFailure) as failed:
        async with asyncio.timeout(WAIT):
            await upstream.start(lambda: None)
    assert failed.value.reason == "unreachable" and "configured 2026-07-28" in failed.value.detail
    assert upstream.pid is None, "its child was stopped"


async def test_a_server_silent_before_initialize_is_legacy_once_the_probe_times_out(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    monkeypatch.setattr(stdio_era, "PROBE_SECONDS", 0.5)
    async with started(UpstreamConfig(name="quiet", command=SILENT)) as quiet:
        assert quiet.era == "legacy"
        assert "legacy era (server/discover had no answer in 0.5 s)" in ready_lines(caplog, "quiet")[0]
        assert [t.name for t in quiet.tools()] == ["echo"]
        echoed = await quiet.call("echo", {"text": "hi"}, Collected(), idempotent=False, key="gw1.k")
        assert [c["text"] for c in echoed["content"]] == ["hi"], "no key to a child that does not declare keys"


async def test_a_call_key_goes_to_a_stdio_child_that_declares_keys() -> None:
    """ADR 0033: the gateway's key for the call goes with it where the child declares ``tools.idempotency``."""
    async with started(UpstreamConfig(name="keyed", command=(*SILENT, "keyed"))) as keyed:
        echoed = await keyed.call("echo", {"text": "hi"}, Collected(), idempotent=False, key="gw1.k")
        assert [c["text"] for c in echoed["content"]] == ["hi", "idempotencyKey gw1.k"]
        unkeyed = await keyed.call("echo", {"text": "hi"}, Collected(), idempotent=False, key=None)
        assert [c["text"] for c in unkeyed["content"]] == ["hi"]


async def test_a_slow_dual_era_child_that_answers_the_probe_late_stays_modern(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child reads its stdin only after a second (the probe's time, 0.2 s, has run out by then): it reads the
    probe first and serves 2026-07-28, so it refuses the ``initialize`` sent meanwhile."""
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    monkeypatch.setattr(stdio_era, "PROBE_SECONDS", 0.2)
    slow = ("sh", "-c", 'sleep 1; exec "$0" "$@"', *SDK_STDIO)
    async with started(UpstreamConfig(name="slow", command=slow)) as child:
        assert child.era == "modern"
        line = ready_lines(caplog, "slow")[0]
        assert "modern era (server/discover answered late, and initialize was refused)" in line
        result = await child.call(
            "work", {"label": "s", "steps": 1, "delay_ms": 1}, Collected(), idempotent=False, key=None
        )
        assert result["content"][0]["text"] == "work s done" and result["resultType"] == "complete"
