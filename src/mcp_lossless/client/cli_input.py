"""How ``mcp-lossless call`` answers a tool that asks its client for input: roots from ``--root``, an
elicitation from ``--elicit`` values or, on a terminal, from the person at it. Sampling needs a model the
shell has not got: not offered, so a server never waits on it.

An elicitation the command cannot complete is declined (the elicitation's own answer for "no"), never answered
with made-up values: with ``--elicit`` the values given must cover the requested schema's required fields,
and the terminal asks field by field (its type, default and choices shown; a value that is none of them is
asked again), an empty line on a required field without a default or end of input declining. The terminal
is read on a worker thread: the event loop keeps the call's stream moving while the person types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

from .handlers import InputHandler

Ask = Callable[[str], str]
"""Shows a prompt and returns the line typed (``EOFError`` at end of input): ``input`` on a terminal."""


def input_handlers(roots: Sequence[str], given: Mapping[str, Any] | None, ask: Ask | None) -> dict[str, InputHandler]:
    """The handlers the command registers: ``roots/list`` when roots are given, ``elicitation/create`` when
    values are given or a terminal can ask (``ask``)."""
    handlers: dict[str, InputHandler] = {}
    if roots:
        listed = [{"uri": Path(root).resolve().as_uri(), "name": Path(root).resolve().name} for root in roots]

        async def list_roots(params: dict[str, Any]) -> Mapping[str, Any]:
            return {"roots": listed}

        handlers["roots/list"] = list_roots
    if given is not None:
        values = dict(given)

        async def elicit_given(params: dict[str, Any]) -> Mapping[str, Any]:
            properties, required = _schema(params)
            if not required <= values.keys():
                return {"action": "decline"}  # --elicit did not say what the tool needs
            return {"action": "accept", "content": {k: v for k, v in values.items() if k in properties}}

        handlers["elicitation/create"] = elicit_given
    elif ask is not None:
        terminal = ask

        async def elicit_here(params: dict[str, Any]) -> Mapping[str, Any]:
            return await anyio.to_thread.run_sync(_ask_fields, terminal, params, abandon_on_cancel=True)

        handlers["elicitation/create"] = elicit_here
    return handlers


def _schema(params: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    schema = params.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    required = schema.get("required") if isinstance(schema, dict) else None
    fields = {k: v for k, v in properties.items() if isinstance(v, dict)} if isinstance(properties, dict) else {}
    return fields, {str(r) for r in required} if isinstance(required, list) else set()


def _ask_fields(ask: Ask, params: Mapping[str, Any]) -> dict[str, Any]:
    """One elicitation on the terminal: the server's message, then each field, typed values read as JSON; an
    empty line takes the field's default, leaves an optional field out, and declines at a required one."""
    properties, required = _schema(params)
    content: dict[str, Any] = {}
    heading = f"The tool asks: {params.get('message', '')}\n"
    try:
        for name, spec in properties.items():
            kind = str(spec.get("type", "string"))
            choices = spec.get("enum") if isinstance(spec.get("enum"), list) else None
            notes = [kind] + (["required"] if name in required else [])
            notes += [f"default {orjson.dumps(spec['default']).decode()}"] if "default" in spec else []
            notes += ["one of " + "|".join(map(str, choices))] if choices else []
            hint = f" ({spec['description']})" if isinstance(spec.get("description"), str) else ""
            while True:
                line = ask(f"{heading}{name}{hint} [{', '.join(notes)}]: ").strip()
                heading = ""
                if not line:
                    if "default" in spec:
                        content[name] = spec["default"]
                    elif name in required:
                        return {"action": "decline"}
                    break
                value = _typed(kind, line)
                if value is not None and (choices is None or value in choices):
                    content[name] = value
                    break
    except EOFError:
        return {"action": "decline"}
    return {"action": "accept", "content": content}


def _typed(kind: str, line: str) -> Any:
    """``line`` as a value of the schema type ``kind``; ``None`` when it is not one (the field is asked again)."""
    if kind == "string":
        return line
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    expected = {"number": (int, float), "integer": (int,), "boolean": (bool,)}.get(kind)
    if expected is None or (isinstance(value, expected) and not (kind != "boolean" and isinstance(value, bool))):
        return value
    return None
