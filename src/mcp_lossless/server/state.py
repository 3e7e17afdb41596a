"""Everything a request handler needs, built once per server: settings, tools, policy, store, codec, metrics."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.eventids import EventIdCodec, new_key
from ..core.events import StreamRecord
from ..core.idempotency import CAPABILITY
from ..core.principal import ANONYMOUS, Grant
from ..core.protocol import RESOURCE_META_KEY, SCOPES_META_KEY
from ..core.resources import AudiencePolicy, canonical_resource, requirement, tool_resource
from ..stores.base import EventStore
from . import metadata
from .auth import TokenVerifier
from .config import ServerConfig
from .dpop import DpopGuard, DpopSettings
from .observability import Metrics
from .sessions import SessionRegistry
from .streams import LiveStream
from .tools import MethodHandler, MethodTags, ToolRegistry


class ServerState:
    """What every part of one server shares, built once: settings, tools and their resources, the audience
    policy, the store, sessions, the token verifier, metrics, and this process's identity.

    It exists so that the ASGI app, the transport and the dispatcher agree on one set of each; a part that needs
    only a few of them (the writer, the stream producers) is given those, not this.
    """

    def __init__(
        self,
        config: ServerConfig,
        tools: ToolRegistry,
        store: EventStore,
        verifier: TokenVerifier | None,
        authorization_servers: Iterable[str] = (),
        methods: Mapping[str, MethodHandler] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        method_tags: Mapping[str, MethodTags] | None = None,
        method_scopes: Iterable[str] = (),
    ) -> None:
        self.config = config
        self.methods = dict(methods or {})
        """Extra JSON-RPC methods beyond ping, tools/list and tools/call."""
        self.method_tags = dict(method_tags or {})
        """What a token needs for a request of an extra method (by its params); a method absent needs nothing."""
        self.method_scopes = frozenset(method_scopes)
        """The scopes those needs may name: published with the aggregate's, as every tool's are."""
        self.capabilities: dict[str, Any] = {"tools": {"listChanged": False}, "logging": {}, **(capabilities or {})}
        canonical = canonical_resource(config.canonical_uri)
        self.canonical = canonical
        self.tools = tools.tools
        self.tool_resource: dict[str, str] = {}
        self.tool_tags: dict[str, frozenset[str]] = {}
        """One interned tag set per tool (its resource and its scopes): replay checks memoize on it."""
        self.scopes_for: dict[str, frozenset[str]] = {}
        """The scopes each resource's metadata advertises (``scopes_supported``): the aggregate's are all."""
        self.policy = AudiencePolicy(canonical)
        self.tools_list: list[dict[str, Any]] = []
        self.index_tools()
        self.store = store
        tools_capability = {**self.capabilities.get("tools", {}), CAPABILITY: {}}
        self.initialize_capabilities = (
            {**self.capabilities, "tools": tools_capability} if store.idempotency_keys else self.capabilities
        )
        """What the legacy ``initialize`` declares: with ``tools.idempotency`` where the store records keys (ADR
        0029); the 2026-07-28 leg's ``server/discover`` declares it on the same condition (``ModernLeg``)."""
        self.metrics = Metrics()
        refusals = self.metrics.limit_refusals
        self.sessions = SessionRegistry(store, config.limits, lambda limit: refusals.labels(limit).inc())
        self.verifier = verifier
        self.authorization_servers = list(authorization_servers)
        self.instance = new_key(os.urandom(12))
        """This process; streams it opens are its own until it dies."""
        self.anonymous = Grant(ANONYMOUS, frozenset({canonical}))
        self.leeway = config.leeway_seconds
        self.prm_url = metadata.metadata_url(canonical)
        settings = DpopSettings(
            algorithms=config.dpop_algorithms,
            window=config.dpop_window_seconds,
            required=config.require_dpop,
            nonce=config.dpop_nonce,
        )
        public_url = config.public_url.rstrip("/") if config.public_url else None
        self.dpop = DpopGuard(settings, store, self.prm_url, public_url=public_url)
        """DPoP proofs, their replay cache and nonces: checked on every request with a token (both eras)."""
        self._codec: EventIdCodec | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def dpop_metadata(self) -> dict[str, object] | None:
        """The DPoP members of the protected resource metadata, when the server takes tokens at all."""
        return self.dpop.metadata() if self.config.issuer is not None or self.verifier is not None else None

    @property
    def codec(self) -> EventIdCodec:
        if self._codec is None:
            raise RuntimeError("server not started: the event-id secret comes from the store at startup")
        return self._codec

    @property
    def keys_loaded(self) -> bool:
        """The event-id secret is read from the store and tokens can be verified (no verifier without auth)."""
        return self._codec is not None and (self.verifier is not None or self.config.issuer is None)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the server runs on. Asking asyncio for it costs a ``getpid`` system call each time."""
        if self._loop is None:
            raise RuntimeError("server not started")
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.store.open()
        self._codec = EventIdCodec(await self.store.secret())

    def live_stream(
        self, record: StreamRecord, *, answers_only: bool = False, opening: asyncio.Future[None] | None = None
    ) -> LiveStream:
        """``opening``: the store's write of ``record`` (:meth:`EventStore.enqueue_open`), if it may be pending."""
        observe = self.metrics.append_latency.observe
        # positional: keyword arguments to a class cost a dict per call (about 1,200 instructions)
        return LiveStream(record, self.store, self.codec, observe, self.config.limits, answers_only, opening)

    def index_tools(self) -> None:
        """Derive resources, tags, policy and the ``tools/list`` answer from the registry (again, after it changed:
        a gateway's upstream announced ``list_changed``). Stored events keep the tags they were stored with."""
        canonical = self.canonical
        self.tool_resource = {name: tool_resource(canonical, name, tool.resource) for name, tool in self.tools.items()}
        self.tool_tags = {name: requirement({uri}, self.tools[name].scopes) for name, uri in self.tool_resource.items()}
        self.scopes_for = {uri: frozenset(self.tools[name].scopes) for name, uri in self.tool_resource.items()}
        self.scopes_for[canonical] = self.method_scopes.union(*self.scopes_for.values())
        self.policy = AudiencePolicy(canonical, self.tool_resource.values())
        self.tools_list = [self._describe(name) for name in self.tools]

    def _describe(self, name: str) -> dict[str, Any]:
        tool = self.tools[name]
        entry: dict[str, Any] = {"name": name, "description": tool.description, "inputSchema": tool.input_schema()}
        if tool.annotations:
            entry["annotations"] = tool.annotations
        entry["_meta"] = {RESOURCE_META_KEY: self.tool_resource[name]}
        if tool.scopes:
            entry["_meta"][SCOPES_META_KEY] = list(tool.scopes)
        return entry

    def resources(self) -> list[str]:
        """Every resource indicator this server answers for: the aggregate first, then each tool's."""
        return [self.canonical, *self.tool_resource.values()]
