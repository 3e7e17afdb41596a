"""What a server offers besides tools: its resources and prompts, as both client eras return them.

Read from the wire leniently where a field is optional and strictly where the answer is the point: a
``resources/read`` without ``contents`` or a ``prompts/get`` without ``messages`` is a broken answer
(:class:`~.errors.ProtocolViolation`), never an empty success.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
class Prompt:
    """One entry of ``prompts/list``: its ``arguments`` as the server declared them (name, required, …)."""

    name: str
    description: str | None
    arguments: list[Mapping[str, Any]]

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Prompt:
        arguments = raw.get("arguments")
        return cls(
            name=str(raw["name"]),
            description=_text(raw, "description"),
            arguments=[a for a in arguments if isinstance(a, dict)] if isinstance(arguments, list) else [],
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
