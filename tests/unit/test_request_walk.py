"""A ``tasks/get`` and a ``Last-Event-ID`` resume each walk from the ASGI entry down to their core decision and back
out without turning round (issue 26): recorded in process, with real signed tokens, on the memory store.

What is recorded: every Python frame of a file under ``src/mcp_lossless`` (a *module*) entered while the app
handles the one request, with the package's frames open at that moment (its *chain*; the nearest is its
*caller*). A coroutine resumed after an ``await`` is the same frame, not a new entry.

The walk property, precisely. A module ``M`` is *left* when none of its frames is open. Entering a left ``M``
again *turns round* when a module that entered ``M`` earlier is still open, above the caller's module: the walk
went from there down into ``M``, came back, went on down, and then back to ``M``. So every ``asgi`` helper the
transport or its checks call after the app's entry indexed the headers, or any store call the leg makes after
the decision again from a step below, turns round. What is not counted, and why:

- a module entering ``M`` again itself (one step calling a helper twice: the walk does not move);
- entries inside the core decision (``core/tasks.decide_poll``, ``core/resume.decide_resume``): the decision is
  the walk's one turning point, whatever pure helpers it consults (``core/resources``' coverage rules);
- on the way back out (after the last decision entry returned), entries into ``mcp_lossless.core``: pure data
  (``tests/unit/test_core_is_pure.py``): rendering a task, encoding frames, indexing an event batch;
- entering ``M`` from a step whose earlier caller of ``M`` has itself returned (a leaf used on the way in and
  again on the way out, as the response writers of :mod:`mcp_lossless.asgi.send`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import mcp_lossless
from mcp_lossless.asgi import ASGIApp, Receive, Scope, Send
from mcp_lossless.stores.memory import MemoryStore
from tests.support.in_process import BASE, in_process
from tests.support.mcp_http import Peer
from tests.support.modern_http import poll_until_settled

pytestmark = pytest.mark.anyio

DECIDE_POLL = ("core/tasks.py", "decide_poll")
DECIDE_RESUME = ("core/resume.py", "decide_resume")
SRC = str(Path(mcp_lossless.__file__).parent) + "/"


@dataclass(frozen=True)
class Entry:
    module: str
    function: str
    frame: FrameType
    chain: tuple[FrameType, ...]
    """The package's frames open when it was entered, its caller first (read then: a returned frame forgets its
    caller)."""

    @property
    def caller(self) -> FrameType | None:
        return self.chain[0] if self.chain else None


@dataclass
class Walk:
    """The frames of the package one request entered, in order."""

    entries: list[Entry] = field(default_factory=list)

    @property
    def modules(self) -> list[str]:
        """The modules in the order first entered."""
        return list(dict.fromkeys(entry.module for entry in self.entries))

    def calls(self, module: str, function: str) -> int:
        return sum(1 for entry in self.entries if (entry.module, entry.function) == (module, function))

    def turns(self, decision: tuple[str, str]) -> list[str]:
        """Each entry that turns round (the module docstring's definition), as ``caller module -> module.function``;
        ``decision`` is the core decision's ``(module, function)``."""
        deciding = [entry.frame for entry in self.entries if (entry.module, entry.function) == decision]
        last = max((i for i, entry in enumerate(self.entries) if entry.frame in deciding), default=len(self.entries))
        found: list[str] = []
        callers: dict[str, set[str]] = {}
        for i, entry in enumerate(self.entries):
            if any(frame in deciding for frame in entry.chain):
                continue  # inside the decision
            if i > last and entry.module.startswith("core/"):
                continue  # pure data on the way out
            here = _module(entry.chain[0]) if entry.chain else ""
            open_modules = {_module(frame) for frame in entry.chain}
            earlier = callers.setdefault(entry.module, set())
            if entry.module not in open_modules and any(m in open_modules and m != here for m in earlier):
                found.append(f"{here} -> {entry.module}.{entry.function}")
            if here != entry.module:
                earlier.add(here)
        return found


def _module(frame: FrameType) -> str:
    return frame.f_code.co_filename[len(SRC) :]


def _ours(frame: FrameType | None) -> FrameType | None:
    while frame is not None and not frame.f_code.co_filename.startswith(SRC):
        frame = frame.f_back
    return frame


def _chain(frame: FrameType | None) -> list[FrameType]:
    """The package's frames open from ``frame`` down the stack, innermost first."""
    chain: list[FrameType] = []
    frame = _ours(frame)
    while frame is not None:
        chain.append(frame)
        frame = _ours(frame.f_back)
    return chain


@contextmanager
def recorded(app: ASGIApp) -> Iterator[tuple[ASGIApp, Walk]]:
    """``app`` recording the walk of the requests it is given, and that walk."""
    walk = Walk()
    seen: set[int] = set()
    kept: list[FrameType] = []  # holds every recorded frame, so no id is reused while recording

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(SRC) or id(frame) in seen:
            return
        seen.add(id(frame))
        kept.append(frame)
        walk.entries.append(Entry(_module(frame), frame.f_code.co_name, frame, tuple(_chain(frame.f_back))))

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        sys.setprofile(hook)
        try:
            await app(scope, receive, send)
        finally:
            sys.setprofile(None)

    yield recording, walk


async def test_a_task_poll_walks_to_decide_poll_and_back_out() -> None:
    async with in_process(MemoryStore()) as server:
        peer = server.peer()
        created = (await peer.call("fetch", url="u", steps=0, delay_ms=0)).json()
        task_id = created["result"]["taskId"]
        await poll_until_settled(peer, task_id)
        transport: Any = server.http._transport
        app = transport.app
        with recorded(app) as (recording, walk):
            transport.app = recording
            read = await peer.task("tasks/get", task_id)
            transport.app = app
    assert read.status == 200, read
    print(" > ".join(walk.modules), f"({len(walk.modules)} files)")
    assert walk.calls(*DECIDE_POLL) == 1
    assert walk.turns(DECIDE_POLL) == []


async def test_a_last_event_id_walks_to_decide_resume_and_back_out() -> None:
    async with in_process(MemoryStore()) as server:
        legacy = Peer(server.http, BASE, server.whole)
        await legacy.initialize()
        call = {"name": "search", "arguments": {"query": "q", "steps": 2, "delay_ms": 0}}
        first = (await legacy.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})).ids[0]
        transport: Any = server.http._transport
        app = transport.app
        with recorded(app) as (recording, walk):
            transport.app = recording
            resumed = await legacy.resume(first)
            transport.app = app
    assert resumed.status == 200 and resumed.events, resumed
    print(" > ".join(walk.modules), f"({len(walk.modules)} files)")
    assert walk.calls(*DECIDE_RESUME) == 1
    assert walk.turns(DECIDE_RESUME) == []
