"""What a server offers besides tools: its resources and prompts, as both client eras return them.

Read from the wire leniently where a field is optional and strictly where the answer is the point: a
``resources/read`` without ``contents`` or a ``prompts/get`` without ``messages`` is a broken answer
(:class:`~.errors.ProtocolViolation`), never an empty success.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ProtocolViolation


def _text(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _objects(raw: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    value = raw.get(key)
    if not isinstance(value, list):
        raise ProtocolViolation(f"{what} answered without a {key} list")
    return [item for item in value if isinstance(item, dict)]


@dataclass(frozen=True, slots=True)
class Resource:
    """One entry of ``resources/list``; ``raw`` keeps what the server sent (annotations, ``_meta``, size)."""

    uri: str
    name: str
    description: str | None
    mime_type: str | None
    raw: Mapping[str, Any]

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Resource:
        return cls(
            uri=str(raw["uri"]),
            name=_text(raw, "name") or str(raw["uri"]),
            description=_text(raw, "description"),
            mime_type=_text(raw, "mimeType"),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class ResourceTemplate:
    """One entry of ``resources/templates/list`` (an RFC 6570 ``uriTemplate``); ``raw`` keeps what the server sent."""

    uri_template: str
    name: str
    description: str | None
    mime_type: str | None
    raw: Mapping[str, Any]

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ResourceTemplate:
        return cls(
            uri_template=str(raw["uriTemplate"]),
            name=_text(raw, "name") or str(raw["uriTemplate"]),
            description=_text(raw, "description"),
            mime_type=_text(raw, "mimeType"),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class Prompt:
    """One entry of ``prompts/list``: its ``arguments`` as the server declared them (name, required, …); ``raw``
    keeps what the server sent (title, icons, ``_meta``)."""

    name: str
    description: str | None
    arguments: list[Mapping[str, Any]]
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Prompt:
        arguments = raw.get("arguments")
        return cls(
            name=str(raw["name"]),
            description=_text(raw, "description"),
            arguments=[a for a in arguments if isinstance(a, dict)] if isinstance(arguments, list) else [],
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class PromptResult:
    """A ``prompts/get`` answer: the prompt's messages, ready for a model."""

    description: str | None
    messages: list[Mapping[str, Any]]

    @classmethod
    def from_wire(cls, name: str, raw: Mapping[str, Any]) -> PromptResult:
        return cls(_text(raw, "description"), _objects(raw, "messages", f"prompts/get {name}"))


def resource_contents(uri: str, raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``contents`` of a ``resources/read`` answer (each with its ``uri`` and ``text`` or ``blob``)."""
    return _objects(raw, "contents", f"resources/read {uri}")


class CatalogReads(ABC):
    """The reads besides tools, one way for both client eras; each era says how it sends a read."""

    @abstractmethod
    async def _listing(self, kind: str, timeout: float | None, method: str | None = None) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """The entries under ``kind`` of every page of ``<kind>/list`` (or ``method``), within the deadline (the
        client's timeout unless given)."""

    @abstractmethod
    async def _read(self, method: str, name: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        """The result of a request that changes nothing on the server (safe to send again), within the deadline;
        ``name`` is what it reads, for errors."""

    async def list_resources(self, *, timeout: float | None = None) -> list[Resource]:  # noqa: ASYNC109
        """Every resource the server lists (all pages)."""
        return [Resource.from_wire(r) for r in await self._listing("resources", timeout) if "uri" in r]

    async def read_resource(self, uri: str, *, timeout: float | None = None) -> list[Mapping[str, Any]]:  # noqa: ASYNC109
        """The contents of ``uri``; a server error (an unknown resource, say) is :class:`~.errors.RemoteError`."""
        return resource_contents(uri, await self._read("resources/read", uri, {"uri": uri}, timeout))

    async def list_resource_templates(self, *, timeout: float | None = None) -> list[ResourceTemplate]:  # noqa: ASYNC109
        """Every resource template the server lists (``resources/templates/list``, all pages)."""
        entries = await self._listing("resourceTemplates", timeout, "resources/templates/list")
        return [ResourceTemplate.from_wire(t) for t in entries if isinstance(t.get("uriTemplate"), str)]

    async def complete(
        self,
        ref: Mapping[str, Any],
        argument: Mapping[str, str],
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Mapping[str, Any]:
        """``completion/complete``: suggestions for ``argument`` (``{"name", "value"}``) of the prompt or resource
        template ``ref`` names (``{"type": "ref/prompt", "name"}`` or ``{"type": "ref/resource", "uri"}``); the
        ``completion`` object (``values``, ``total``, ``hasMore``) as the server sent it."""
        params: dict[str, Any] = {"ref": dict(ref), "argument": dict(argument)}
        if context is not None:
            params["context"] = dict(context)
        what = str(ref.get("name") or ref.get("uri"))
        completion = (await self._read("completion/complete", what, params, timeout)).get("completion")
        if not isinstance(completion, dict) or not isinstance(completion.get("values"), list):
            raise ProtocolViolation(f"completion/complete {what} answered without completion.values")
        return completion

    async def list_prompts(self, *, timeout: float | None = None) -> list[Prompt]:  # noqa: ASYNC109
        """Every prompt the server offers (all pages)."""
        return [Prompt.from_wire(p) for p in await self._listing("prompts", timeout) if "name" in p]

    async def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> PromptResult:
        """The prompt ``name`` filled in with ``arguments``; input it asks for comes from the input handlers."""
        params = {"name": name, "arguments": dict(arguments or {})}
        return PromptResult.from_wire(name, await self._read("prompts/get", name, params, timeout))
