"""A stdio upstream that fails to start says why, in words: its exit status and its last line on stderr (a new
user's misspelt script or npm package), never the repr of an internal exception."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mcp_lossless.gateway import UpstreamConfig
from mcp_lossless.gateway.stdio import StdioUpstream
from mcp_lossless.gateway.upstream import UpstreamFailure

pytestmark = pytest.mark.anyio

DIES = (
    "import sys; print('starting', file=sys.stderr); print('cannot open file server.py', file=sys.stderr); sys.exit(3)"
)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (DIES, "it exited with status 3 during its handshake; its last line on stderr: cannot open file server.py"),
        ("import sys; sys.exit(4)", "it exited with status 4 during its handshake, saying nothing on stderr"),
    ],
)
async def test_a_child_that_exits_during_its_start_is_named_with_its_status_and_last_stderr_line(
    script: str, expected: str
) -> None:
    upstream = StdioUpstream(UpstreamConfig(name="mine", command=(sys.executable, "-c", script)))
    with pytest.raises(UpstreamFailure) as failed:
        async with asyncio.timeout(60):
            await upstream.start(lambda: None)
    assert failed.value.reason == "unreachable"
    assert failed.value.detail == f"upstream mine did not start: {expected}"
    assert upstream.pid is None
