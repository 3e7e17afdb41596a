"""The exposed tables: which upstream tool, prompt or resource answers to which name here (pure: no I/O).

An upstream tool ``t`` of upstream ``u`` is exposed as ``<prefix><t>`` (prefix ``"<u>_"`` unless configured),
filtered by the upstream's allow and deny lists. Each exposed tool is then an ordinary tool of the
gateway's server, with its own resource indicator ``<canonical>/tools/<exposed name>`` and the scopes the
config requires for it: authorization of calls, replays and live events is the server's, unchanged.
Prompts are named as tools are; resources and resource templates keep their URIs (docs/decisions/0021).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config import UpstreamConfig
from .upstream import UpstreamTool
from .uri_template import Compiled, compile_template, matches

log = logging.getLogger("mcp_lossless.gateway")


@dataclass(frozen=True, slots=True)
class ExposedTool:
    name: str
    upstream: str
    tool: UpstreamTool
    idempotent: bool
    """Safe to re-issue: annotated ``idempotentHint``/``readOnlyHint`` upstream, or listed in the config."""
    scopes: tuple[str, ...] = ()
    """OAuth scopes a client's token must hold for it (the config's ``scopes``), besides covering its resource."""


def expose(config: UpstreamConfig, tools: Iterable[UpstreamTool], taken: Iterable[str] = ()) -> list[ExposedTool]:
    """The exposed entries of one upstream; names already ``taken`` (by another upstream) are skipped, logged."""
    used = set(taken)
    out: list[ExposedTool] = []
    for tool in tools:
        if not config.exposes(tool.name):
            continue
        name = config.exposed_prefix + tool.name
        if name in used:
            log.error(
                "upstream %s: tool %s would be exposed as %r, which is taken; skipped", config.name, tool.name, name
            )
            continue
        used.add(name)
        idempotent = tool.annotated_idempotent or tool.name in config.idempotent
        out.append(ExposedTool(name, config.name, tool, idempotent, config.scopes_of(tool.name)))
    return out


@dataclass(frozen=True, slots=True)
class Listed:
    """One prompt or resource of an upstream as the gateway lists it: ``key`` is the exposed prompt name or the
    resource's URI, ``name`` the upstream's own, ``entry`` the listing entry as the gateway's clients see it."""

    key: str
    upstream: str
    name: str
    entry: dict[str, Any]


def expose_prompts(config: UpstreamConfig, entries: Iterable[Mapping[str, Any]], taken: Iterable[str]) -> list[Listed]:
    """An upstream's exposed prompts, named as its tools are (``<prefix><prompt>``); a name already ``taken`` by
    another upstream's prompt is skipped, logged."""
    used = set(taken)
    out: list[Listed] = []
    for entry in entries:
        name = entry.get("name")
        if not isinstance(name, str) or not name or not config.prompts.exposes(name):
            continue
        exposed = config.exposed_prefix + name
        if exposed in used:
            log.error(
                "upstream %s: prompt %s would be exposed as %r, which is taken; skipped", config.name, name, exposed
            )
            continue
        used.add(exposed)
        out.append(Listed(exposed, config.name, name, {**entry, "name": exposed}))
    return out


def expose_resources(
    config: UpstreamConfig, entries: Iterable[Mapping[str, Any]], taken: Iterable[str]
) -> list[Listed]:
    """An upstream's exposed resources under their own URIs (a URI is the client's handle on the content: it is
    not rewritten); a URI another upstream already lists is skipped, logged: a read of it goes to the first."""
    used = set(taken)
    out: list[Listed] = []
    for entry in entries:
        uri = entry.get("uri")
        if not isinstance(uri, str) or not uri or not config.resources.exposes(uri):
            continue
        if uri in used:
            log.error("upstream %s: resource %s is listed by another upstream too; skipped", config.name, uri)
            continue
        used.add(uri)
        out.append(Listed(uri, config.name, uri, dict(entry)))
    return out


@dataclass(frozen=True, slots=True)
class ListedTemplate:
    """One resource template of an upstream as the gateway lists it (under its own ``uriTemplate``), and the URIs it
    routes: ``compiled`` is ``None`` for a template that names none here (not level 1, or too long)."""

    template: str
    upstream: str
    compiled: Compiled | None
    entry: dict[str, Any]

    def routes(self, config: UpstreamConfig, uri: str) -> bool:
        """Whether a read of ``uri`` may go to this template's upstream: it matches, and is not a denied URI."""
        return self.compiled is not None and uri not in config.resources.deny and matches(self.compiled, uri)


def expose_templates(
    config: UpstreamConfig, entries: Iterable[Mapping[str, Any]], taken: Iterable[str]
) -> list[ListedTemplate]:
    """An upstream's exposed resource templates (the ``resources`` rule's allow/deny lists name them by
    ``uriTemplate``); a template another upstream already lists is skipped, logged, as a URI is."""
    used = set(taken)
    out: list[ListedTemplate] = []
    for entry in entries:
        template = entry.get("uriTemplate")
        if not isinstance(template, str) or not template or not config.resources.exposes(template):
            continue
        if template in used:
            log.error(
                "upstream %s: resource template %s is listed by another upstream too; skipped", config.name, template
            )
            continue
        used.add(template)
        compiled = compile_template(template)
        if compiled is None:
            log.info("upstream %s: resource template %s is not level 1; listed, routes no read", config.name, template)
        out.append(ListedTemplate(template, config.name, compiled, dict(entry)))
    return out
