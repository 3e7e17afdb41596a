"""A blocking wrapper for scripts: the async :class:`Client` on a private event-loop thread.

    with SyncClient("http://127.0.0.1:8000/mcp") as client:
        print(client.call_tool("search", {"query": "x"}).text)

Progress callbacks run on the loop thread. Exceptions are the same typed errors as the async client's.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from functools import partial
from types import TracebackType
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from .catalog import Prompt, PromptResult, Resource, ResourceTemplate
from .client import Client, Tool, ToolResult
from .journal import PendingCall
from .session import ProgressCallback, ServerInfo


class SyncClient:
    """Takes the same arguments as :class:`Client`."""

    def __init__(self, url: str, **options: Any) -> None:
        self._client = Client(url, **options)
        self._stack: ExitStack | None = None
        self._portal: BlockingPortal | None = None

    def __enter__(self) -> SyncClient:
        with ExitStack() as stack:
            portal = stack.enter_context(start_blocking_portal())
            # One task enters and exits the client: its task group must not change hands.
            stack.enter_context(portal.wrap_async_context_manager(self._client))
            self._portal, self._stack = portal, stack.pop_all()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.close()

    @property
    def server(self) -> ServerInfo:
        return self._client.server

    def list_tools(self, *, timeout: float | None = None) -> list[Tool]:
        return self._require().call(partial(self._client.list_tools, timeout=timeout))

    def list_resources(self, *, timeout: float | None = None) -> list[Resource]:
        return self._require().call(partial(self._client.list_resources, timeout=timeout))

    def read_resource(self, uri: str, *, timeout: float | None = None) -> list[Mapping[str, Any]]:
        return self._require().call(partial(self._client.read_resource, uri, timeout=timeout))

    def list_resource_templates(self, *, timeout: float | None = None) -> list[ResourceTemplate]:
        return self._require().call(partial(self._client.list_resource_templates, timeout=timeout))

    def complete(
        self,
        ref: Mapping[str, Any],
        argument: Mapping[str, str],
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Mapping[str, Any]:
        return self._require().call(partial(self._client.complete, ref, argument, context, timeout=timeout))

    def list_prompts(self, *, timeout: float | None = None) -> list[Prompt]:
        return self._require().call(partial(self._client.list_prompts, timeout=timeout))

    def get_prompt(
        self, name: str, arguments: Mapping[str, str] | None = None, *, timeout: float | None = None
    ) -> PromptResult:
        return self._require().call(partial(self._client.get_prompt, name, arguments, timeout=timeout))

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
        reissue: bool | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        call = partial(
            self._client.call_tool,
            name,
            arguments,
            on_progress=on_progress,
            timeout=timeout,
            reissue=reissue,
            idempotency_key=idempotency_key,
        )
        return self._require().call(call)

    def resume_pending(
        self, call: PendingCall, *, timeout: float | None = None, on_progress: ProgressCallback | None = None
    ) -> ToolResult:
        """:meth:`Client.resume_pending`: a call an earlier process left in its journal, re-issued under its key."""
        resume = partial(self._client.resume_pending, call, timeout=timeout, on_progress=on_progress)
        return self._require().call(resume)

    def _require(self) -> BlockingPortal:
        if self._portal is None:
            raise RuntimeError("use the client inside 'with'")
        return self._portal
