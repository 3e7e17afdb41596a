"""The fixtures the official conformance suite's server scenarios call (``mcp-lossless serve --conformance``).

Names and payloads follow the scenario descriptions of ``@modelcontextprotocol/conformance``: tools
``test_*`` (text, image, audio, embedded resource, logging, progress, errors, sampling, elicitation, SEP-1699
stream close), resources under ``test://``, four prompts and argument completion. Everything is built on the
public server API: tools on a :class:`ToolRegistry`, the other methods as ``methods=`` handlers. Outside the
server package: they are a test suite's fixtures, no part of the server a deployment runs, and nothing in the
server imports them (only ``serve --conformance`` and the tests do).
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import struct
import wave
import zlib
from collections.abc import Callable
from typing import Any, Literal

import orjson

from .core import errors
from .server.app import LosslessApp, create_app
from .server.config import ServerConfig
from .server.tools import MethodError, MethodHandler, ToolContext, ToolError, ToolRegistry

FIXTURE_CAPABILITIES: dict[str, Any] = {
    "resources": {"subscribe": True, "listChanged": False},
    "prompts": {"listChanged": False},
    "completions": {},
}


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def red_pixel_png() -> bytes:
    """A valid 1x1 red PNG, built rather than pasted so it is visibly what it claims to be."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit depth, RGB, no interlace
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # scanline filter 0, then one red pixel
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")


def silent_wav() -> bytes:
    """10 ms of 8 kHz mono 16-bit silence: the smallest honest ``audio/wav``."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 80)
    return buffer.getvalue()


PNG_B64 = base64.b64encode(red_pixel_png()).decode()
WAV_B64 = base64.b64encode(silent_wav()).decode()

JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

SEP1034_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Your name", "default": "John Doe"},
        "age": {"type": "integer", "description": "Your age", "default": 30},
        "score": {"type": "number", "description": "Your score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "Your status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verified?", "default": True},
    },
}

SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


async def _ask_client(ctx: ToolContext, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A client request whose refusal (no such capability, declined) becomes the tool's error result."""
    try:
        return await ctx.request(method, params)
    except MethodError as exc:
        raise ToolError(f"{method} failed: {exc.message}") from None
    except TimeoutError:
        raise ToolError(f"{method}: the client did not answer") from None


async def _elicit(ctx: ToolContext, message: str, schema: dict[str, Any]) -> str:
    answer = await _ask_client(ctx, "elicitation/create", {"message": message, "requestedSchema": schema})
    content = orjson.dumps(answer.get("content", {})).decode()
    return f"Elicitation completed: action={answer.get('action')}, content={content}"


def _ask_name(message: str, field: str = "name") -> tuple[str, dict[str, Any]]:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return "elicitation/create", {"message": message, "requestedSchema": schema}


def _sample(text: str, max_tokens: int = 100) -> tuple[str, dict[str, Any]]:
    return "sampling/createMessage", {"messages": [{"role": "user", "content": _text(text)}], "maxTokens": max_tokens}


def _accepted(answer: dict[str, Any], field: str) -> str:
    content = answer.get("content")
    value = content.get(field) if isinstance(content, dict) else None
    return str(value) if value is not None else f"(no {field}: {answer.get('action', 'no action')})"


def _sampled(answer: dict[str, Any]) -> str:
    content = answer.get("content")
    text = content.get("text") if isinstance(content, dict) else None
    return text if isinstance(text, str) else orjson.dumps(content).decode()


def _roots(answer: dict[str, Any]) -> str:
    roots = answer.get("roots")
    uris = [r.get("uri") for r in roots if isinstance(r, dict)] if isinstance(roots, list) else []
    return ", ".join(str(u) for u in uris) or "(none)"


CONFIRM: tuple[str, dict[str, Any]] = (
    "elicitation/create",
    {
        "message": "Please confirm",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    },
)
HEADER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "description": "Mirrored as Mcp-Param-Region", "x-mcp-header": "Region"},
        "query": {"type": "string", "description": "Not mirrored"},
    },
    "required": ["region", "query"],
}


def input_required_tools(registry: ToolRegistry) -> None:
    """The 2026-07-28 multi round-trip fixtures (``input-required-result-*``, ``tasks-mrtr-*``): each asks
    through :meth:`ToolContext.request` / :meth:`ToolContext.ask`, as any tool would; on a legacy session the
    same tools send the requests on the call's stream."""

    @registry.tool()
    async def test_input_required_result_elicitation(ctx: ToolContext) -> str:
        """Asks the client's name (key ``user_name``), then greets it."""
        answer = await ctx.request(*_ask_name("What is your name?"), key="user_name")
        return f"Hello, {_accepted(answer, 'name')}!"

    @registry.tool()
    async def test_input_required_result_sampling(ctx: ToolContext) -> str:
        """Asks the client's LLM for the capital of France (key ``capital_question``)."""
        answer = await ctx.request(*_sample("What is the capital of France?"), key="capital_question")
        return f"LLM response: {_sampled(answer)}"

    @registry.tool()
    async def test_input_required_result_list_roots(ctx: ToolContext) -> str:
        """Asks the client's roots (key ``client_roots``)."""
        answer = await ctx.request("roots/list", {}, key="client_roots")
        return f"Client roots: {_roots(answer)}"

    @registry.tool()
    async def test_input_required_result_request_state(ctx: ToolContext) -> str:
        """Asks for a confirmation; the retry's requestState is verified before the tool runs again."""
        answer = await ctx.request(*CONFIRM, key="confirm")
        return f"state-ok: confirmed={_accepted(answer, 'ok')}"

    @registry.tool()
    async def test_input_required_result_tampered_state(ctx: ToolContext) -> str:
        """Asks for a confirmation; an altered requestState is refused with -32602."""
        answer = await ctx.request(*CONFIRM, key="confirm")
        return f"confirmed={_accepted(answer, 'ok')}"

    @registry.tool()
    async def test_input_required_result_multiple_inputs(ctx: ToolContext) -> str:
        """Asks an elicitation, a sampling and the roots at once."""
        answers = await ctx.ask(
            {
                "user_name": _ask_name("What is your name?"),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": ("roots/list", {}),
            }
        )
        name, greeting = _accepted(answers["user_name"], "name"), _sampled(answers["greeting"])
        return f"{greeting} {name} (roots: {_roots(answers['client_roots'])})"

    @registry.tool()
    async def test_input_required_result_multi_round(ctx: ToolContext) -> str:
        """Asks a name, then (a second round) a favourite colour."""
        name = _accepted(await ctx.request(*_ask_name("Step 1: What is your name?"), key="step1"), "name")
        colour = await ctx.request(*_ask_name("Step 2: What is your favorite color?", "color"), key="step2")
        return f"{name} likes {_accepted(colour, 'color')}"

    @registry.tool()
    async def test_input_required_result_capabilities(ctx: ToolContext) -> str:
        """Asks for an elicitation and a sampling, each only if the client declared it can give it."""
        answers = []
        for key, (method, params) in (("user_name", _ask_name("What is your name?")), ("capital", _sample("Paris?"))):
            try:
                answers.append(orjson.dumps(await ctx.request(method, params, key=key)).decode())
            except MethodError as exc:
                if exc.code != errors.MISSING_REQUIRED_CLIENT_CAPABILITY:
                    raise
        return f"answers: {'; '.join(answers) or 'none'}"

    @registry.tool()
    async def test_streaming_elicitation(ctx: ToolContext) -> str:
        """Asks the client's name: input_required on 2026-07-28, never a request on the response stream."""
        return f"Hello, {_accepted(await ctx.request(*_ask_name('What is your name?')), 'name')}!"

    @registry.tool(task=True)
    async def confirm_delete(ctx: ToolContext, filename: str) -> str:
        """A task that asks to confirm deleting ``filename`` (input_required until tasks/update answers)."""
        schema = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}
        answer = await ctx.request("elicitation/create", {"message": f"Delete {filename}?", "requestedSchema": schema})
        confirmed = answer.get("action") == "accept" and (answer.get("content") or {}).get("confirm") is True
        return f"{filename} {'deleted' if confirmed else 'kept'}"

    @registry.tool(task=True)
    async def multi_input(ctx: ToolContext) -> str:
        """A task that asks two elicitations at once; it goes on when both are answered."""
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "confirm": {"type": "boolean"}}}
        answers = await ctx.ask(
            {
                "first": ("elicitation/create", {"message": "First input?", "requestedSchema": schema}),
                "second": ("elicitation/create", {"message": "Second input?", "requestedSchema": schema}),
            }
        )
        return f"inputs: {_accepted(answers['first'], 'name')}, {_accepted(answers['second'], 'name')}"

    @registry.tool(task="required", input_before_task=True)
    async def test_tool_with_task(ctx: ToolContext) -> str:
        """Asks the client's name on the tools/call (multi round-trip), then runs as a task that greets it."""
        name = _accepted(await ctx.request(*_ask_name("What is your name?"), key="user_name"), "name")
        await asyncio.sleep(0.1)  # the task's own work, after the input
        return f"Hello, {name}, from a task!"

    @registry.tool(input_schema=HEADER_SCHEMA)
    async def test_header_mirroring(region: str, query: str) -> str:
        """Its ``region`` is mirrored as Mcp-Param-Region (x-mcp-header), which the server checks against the body."""
        return f"query {query!r} in region {region!r}"


def conformance_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def test_simple_text() -> str:
        """Returns one text block."""
        return "This is a simple text response for testing."

    @registry.tool()
    async def test_image_content() -> dict[str, Any]:
        """Returns a 1x1 red PNG."""
        return {"content": [{"type": "image", "data": PNG_B64, "mimeType": "image/png"}]}

    @registry.tool()
    async def test_audio_content() -> dict[str, Any]:
        """Returns a short silent WAV."""
        return {"content": [{"type": "audio", "data": WAV_B64, "mimeType": "audio/wav"}]}

    @registry.tool()
    async def test_embedded_resource() -> dict[str, Any]:
        """Returns an embedded text resource."""
        resource = {"uri": "test://embedded-resource", "mimeType": "text/plain", "text": _EMBEDDED_TEXT}
        return {"content": [{"type": "resource", "resource": resource}]}

    @registry.tool()
    async def test_multiple_content_types() -> dict[str, Any]:
        """Returns text, an image and an embedded resource."""
        resource = {
            "uri": "test://mixed-content-resource",
            "mimeType": "application/json",
            "text": '{"test":"data","value":123}',
        }
        return {
            "content": [
                _text("Multiple content types test:"),
                {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
                {"type": "resource", "resource": resource},
            ]
        }

    @registry.tool()
    async def test_tool_with_logging(ctx: ToolContext) -> str:
        """Sends three info log messages about 50 ms apart."""
        await ctx.log("info", "Tool execution started")
        await asyncio.sleep(0.05)  # the fixture's own pacing: clients must take several logs mid-call
        await ctx.log("info", "Tool processing data")
        await asyncio.sleep(0.05)
        await ctx.log("info", "Tool execution completed")
        return "Tool with logging executed successfully"

    @registry.tool()
    async def test_tool_with_progress(ctx: ToolContext) -> str:
        """Reports progress 0, 50 and 100 of 100, about 50 ms apart."""
        await ctx.report_progress(0, 100)
        await asyncio.sleep(0.05)  # the fixture's own pacing, as the scenario describes
        await ctx.report_progress(50, 100)
        await asyncio.sleep(0.05)
        await ctx.report_progress(100, 100)
        return f"Tool with progress executed successfully (request {ctx.request_id})"

    @registry.tool()
    async def test_error_handling() -> str:
        """Always fails with an isError result."""
        raise ToolError("This tool intentionally returns an error for testing")

    @registry.tool()
    async def test_sampling(ctx: ToolContext, prompt: str) -> str:
        """Asks the client to sample an LLM with `prompt`."""
        params = {"messages": [{"role": "user", "content": _text(prompt)}], "maxTokens": 100}
        answer = await _ask_client(ctx, "sampling/createMessage", params)
        content = answer.get("content")
        text = content.get("text") if isinstance(content, dict) else None
        return f"LLM response: {text if isinstance(text, str) else orjson.dumps(content).decode()}"

    @registry.tool()
    async def test_elicitation(ctx: ToolContext, message: str) -> str:
        """Asks the client for a username and an email."""
        schema = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        answer = await _ask_client(ctx, "elicitation/create", {"message": message, "requestedSchema": schema})
        content = orjson.dumps(answer.get("content", {})).decode()
        return f"User response: action={answer.get('action')}, content={content}"

    @registry.tool()
    async def test_elicitation_sep1034_defaults(ctx: ToolContext) -> str:
        """Elicits fields of every primitive type, each with a default (SEP-1034)."""
        return await _elicit(ctx, "Please review and update the form fields with defaults", SEP1034_SCHEMA)

    @registry.tool()
    async def test_elicitation_sep1330_enums(ctx: ToolContext) -> str:
        """Elicits the five enum schema variants (SEP-1330)."""
        return await _elicit(ctx, "Please select options from the enum fields", SEP1330_SCHEMA)

    @registry.tool(name="json_schema_2020_12_tool", input_schema=JSON_SCHEMA_2020_12)
    async def json_schema_tool(
        name: str | None = None,
        address: dict[str, str] | None = None,
        contactMethod: Literal["phone", "email"] | None = None,  # the schema's own property name
        phone: str | None = None,
        email: str | None = None,
    ) -> str:
        """Tool with JSON Schema 2020-12 features"""
        return f"ok: {name or 'anonymous'} by {contactMethod or ('phone' if phone else 'email')}"

    # 2026-07-28's diagnostic fixtures (server-stateless).
    @registry.tool()
    async def test_missing_capability(ctx: ToolContext) -> str:
        """Needs the client's sampling capability: -32021 for a client that did not declare it."""
        await ctx.request("sampling/createMessage", {"messages": [], "maxTokens": 1})
        return "sampled"

    @registry.tool()
    async def test_logging_tool(ctx: ToolContext) -> str:
        """Logs once at info: sent only to a request whose ``_meta`` set a logLevel at or below it."""
        await ctx.log("info", "test_logging_tool ran")
        return "logged"

    # The tasks extension's fixtures (2026-07-28 task scenarios).
    @registry.tool()
    async def greet(name: str) -> str:
        """Runs within its request, never as a task."""
        return f"Hello, {name}!"

    @registry.tool(task=True)
    async def slow_compute(seconds: float = 1.0, label: str = "") -> str:
        """A task for clients with the tasks extension: sleeps ``seconds``, then answers."""
        await asyncio.sleep(seconds)
        return f"computed {label or 'result'} after {seconds}s"

    @registry.tool(task="required")
    async def failing_job() -> str:
        """Only as a task: reports a tool error after a second."""
        await asyncio.sleep(1.0)
        raise ToolError("failing_job failed, as it always does")

    @registry.tool(task=True)
    async def protocol_error_job() -> str:
        """A task that fails with a JSON-RPC error (the task ends ``failed``)."""
        raise MethodError(errors.INTERNAL_ERROR, "protocol_error_job failed at the protocol level")

    @registry.tool()
    async def test_reconnection(ctx: ToolContext) -> str:
        """Closes its SSE stream mid-call (SEP-1699); the answer arrives on GET + Last-Event-ID."""
        ctx.close_stream()
        await asyncio.sleep(0.1)  # the call's remaining work: its answer must come after the close
        return "Reconnection test completed successfully"

    input_required_tools(registry)
    return registry


_EMBEDDED_TEXT = "This is an embedded resource content."
_TEMPLATE = re.compile(r"^test://template/([^/]+)/data$")
_STATIC_RESOURCES: dict[str, dict[str, Any]] = {
    "test://static-text": {
        "listing": {"name": "static-text", "description": "A static text resource", "mimeType": "text/plain"},
        "contents": {"mimeType": "text/plain", "text": "This is the content of the static text resource."},
    },
    "test://static-binary": {
        "listing": {"name": "static-binary", "description": "A 1x1 red PNG", "mimeType": "image/png"},
        "contents": {"mimeType": "image/png", "blob": PNG_B64},
    },
    "test://watched-resource": {
        "listing": {"name": "watched-resource", "description": "A resource to subscribe to", "mimeType": "text/plain"},
        "contents": {"mimeType": "text/plain", "text": "Watched resource content."},
    },
}


def _read(uri: str) -> dict[str, Any]:
    static = _STATIC_RESOURCES.get(uri)
    if static is not None:
        return {"uri": uri, **static["contents"]}
    match = _TEMPLATE.match(uri)
    if match is not None:
        item = match.group(1)
        data = {"id": item, "templateTest": True, "data": f"Data for ID: {item}"}
        return {"uri": uri, "mimeType": "application/json", "text": orjson.dumps(data).decode()}
    raise MethodError(errors.RESOURCE_NOT_FOUND, f"resource {uri} not found", {"uri": uri})


def _string_param(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise MethodError(errors.INVALID_PARAMS, f"params.{name} must be a non-empty string")
    return value


PromptBuilder = Callable[[dict[str, str]], list[dict[str, Any]]]


def _user(content: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": content}


_PROMPTS: dict[str, tuple[str, list[dict[str, Any]], PromptBuilder]] = {
    "test_simple_prompt": (
        "A simple prompt without arguments",
        [],
        lambda _: [_user(_text("This is a simple prompt for testing."))],
    ),
    "test_prompt_with_arguments": (
        "A prompt with two required arguments",
        [
            {"name": "arg1", "description": "First test argument", "required": True},
            {"name": "arg2", "description": "Second test argument", "required": True},
        ],
        lambda a: [_user(_text(f"Prompt with arguments: arg1='{a['arg1']}', arg2='{a['arg2']}'"))],
    ),
    "test_prompt_with_embedded_resource": (
        "A prompt that embeds a resource",
        [{"name": "resourceUri", "description": "URI of the resource to embed", "required": True}],
        lambda a: [
            _user(
                {
                    "type": "resource",
                    "resource": {
                        "uri": a["resourceUri"],
                        "mimeType": "text/plain",
                        "text": "Embedded resource content for testing.",
                    },
                }
            ),
            _user(_text("Please process the embedded resource above.")),
        ],
    ),
    "test_prompt_with_image": (
        "A prompt with an image",
        [],
        lambda _: [
            _user({"type": "image", "data": PNG_B64, "mimeType": "image/png"}),
            _user(_text("Please analyze the image above.")),
        ],
    ),
}

_COMPLETIONS = {
    ("ref/prompt", "test_prompt_with_arguments", "arg1"): ["paris", "park", "party", "test", "testing"],
    ("ref/prompt", "test_prompt_with_arguments", "arg2"): ["hello", "help", "world"],
    ("ref/resource", "test://template/{id}/data", "id"): ["1", "12", "123"],
}


class Subscriptions:
    """URIs clients asked ``resources/updated`` for (auth is off in this mode: one anonymous principal)."""

    def __init__(self) -> None:
        self.uris: set[str] = set()

    async def subscribe(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        uri = _string_param(params, "uri")
        _read(uri)  # only resources that exist can be watched
        self.uris.add(uri)
        return {}

    async def unsubscribe(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        self.uris.discard(_string_param(params, "uri"))
        return {}


async def resources_list(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    return {"resources": [{"uri": uri, **entry["listing"]} for uri, entry in _STATIC_RESOURCES.items()]}


async def resource_templates_list(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    template = {
        "uriTemplate": "test://template/{id}/data",
        "name": "template-data",
        "description": "JSON data for any id",
        "mimeType": "application/json",
    }
    return {"resourceTemplates": [template]}


async def resources_read(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    return {"contents": [_read(_string_param(params, "uri"))]}


async def prompts_list(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    prompts = []
    for name, (description, arguments, _) in _PROMPTS.items():
        entry: dict[str, Any] = {"name": name, "description": description}
        if arguments:
            entry["arguments"] = arguments
        prompts.append(entry)
    prompts.append({"name": INPUT_PROMPT, "description": "A prompt that asks the client for its context first"})
    return {"prompts": prompts}


INPUT_PROMPT = "test_input_required_result_prompt"
"""A prompt that asks the client for its context first (multi round-trip on ``prompts/get``)."""


async def prompts_get(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    name = _string_param(params, "name")
    if name == INPUT_PROMPT:
        answer = await ctx.request(*_ask_name("What context should the prompt use?", "context"), key="user_context")
        text = f"Answer within this context: {_accepted(answer, 'context')}"
        return {"description": "A prompt built from the client's input", "messages": [_user(_text(text))]}
    if name not in _PROMPTS:
        raise MethodError(errors.INVALID_PARAMS, f"unknown prompt {name!r}")
    description, declared, build = _PROMPTS[name]
    given = params.get("arguments") or {}
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise MethodError(errors.INVALID_PARAMS, "prompt arguments must be an object of strings")
    missing = [a["name"] for a in declared if a.get("required") and a["name"] not in given]
    if missing:
        raise MethodError(errors.INVALID_PARAMS, f"prompt {name} needs arguments: {', '.join(missing)}")
    return {"description": description, "messages": build(given)}


async def completion(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    ref = params.get("ref")
    argument = params.get("argument")
    if not isinstance(ref, dict) or not isinstance(argument, dict):
        raise MethodError(errors.INVALID_PARAMS, "completion/complete needs params.ref and params.argument")
    target = ref.get("name") if ref.get("type") == "ref/prompt" else ref.get("uri")
    candidates = _COMPLETIONS.get((str(ref.get("type")), str(target), str(argument.get("name"))))
    if candidates is None:
        raise MethodError(errors.INVALID_PARAMS, f"nothing to complete for {ref.get('type')} {target!r}")
    prefix = str(argument.get("value", ""))
    values = [c for c in candidates if c.startswith(prefix)]
    return {"completion": {"values": values, "total": len(values), "hasMore": False}}


def conformance_methods() -> dict[str, MethodHandler]:
    subscriptions = Subscriptions()
    return {
        "resources/list": resources_list,
        "resources/templates/list": resource_templates_list,
        "resources/read": resources_read,
        "resources/subscribe": subscriptions.subscribe,
        "resources/unsubscribe": subscriptions.unsubscribe,
        "prompts/list": prompts_list,
        "prompts/get": prompts_get,
        "completion/complete": completion,
    }


def conformance_app(config: ServerConfig) -> LosslessApp:
    """The server with the conformance fixtures; the caller keeps auth off and the host on loopback."""
    return create_app(config, conformance_tools(), methods=conformance_methods(), capabilities=FIXTURE_CAPABILITIES)
