"""The exposed-tool table: which upstream tool answers to which name here (pure: no I/O).

An upstream tool ``t`` of upstream ``u`` is exposed as ``<prefix><t>`` (prefix ``"<u>_"`` unless configured),
filtered by the upstream's allow and deny lists. Each exposed tool is then an ordinary tool of the
gateway's server, with its own resource indicator ``<canonical>/tools/<exposed name>`` and the scopes the
config requires for it: authorization of calls, replays and live events is the server's, unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .config import UpstreamConfig
from .upstream import UpstreamTool

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
