"""The upstreams' prompts and resources as the gateway's own (docs/decisions/0021).

Lists are asked of every upstream when a client lists (they are never stale, and an upstream's
``list_changed`` needs no watching), merged into one page, and remembered as the routes of the reads
that follow: ``prompts/get`` by exposed name, ``resources/read`` by URI. A read of a name or URI the last
listing did not have lists again first; a URI no resource listing names goes to the one upstream whose
resource template (level 1, :mod:`.uri_template`) matches it (two: refused as ambiguous); still absent, it is
unknown (-32602 / -32002), as a tool is.

Authorization is the server's (:data:`~..server.tools.MethodTags`): a get or read needs the gateway's
canonical resource and the upstream's prompt or resource scopes, checked before it runs and carried by its
events. The tags come from the configuration, never from a listing alone: a name that some upstream's
prefix could hold needs what each such upstream requires, and a URI no listing routes needs what every
upstream exposing resources requires — so a stale or missing route can refuse, never leak.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ..core import denials, errors
from ..core.resources import AudiencePolicy, requirement, scopes_in
from ..server.requests import coverage_description
from ..server.tools import MethodError, MethodHandler, MethodTags, ToolContext
from .config import CatalogRule, UpstreamConfig
from .table import Listed, ListedTemplate, expose_prompts, expose_resources, expose_templates
from .upstream import LIST_METHODS, CatalogKind, CatalogRead, ListKind, Upstream, UpstreamFailure, UpstreamRpcError
from .uri_template import MAX_URI
from .vetting import Offered, Verdicts, names_entries

log = logging.getLogger("mcp_lossless.gateway")


def _rule(config: UpstreamConfig, kind: CatalogKind) -> CatalogRule:
    return config.prompts if kind == "prompts" else config.resources


class Catalog:
    """The ``prompts/*`` and ``resources/*`` methods of a gateway over its upstreams, and what each needs."""

    def __init__(
        self,
        canonical: str,
        configs: Mapping[str, UpstreamConfig],
        upstreams: Mapping[str, Upstream],
        verdicts: Verdicts,
    ) -> None:
        self.configs = configs
        self.upstreams = upstreams
        self.verdicts = verdicts
        kinds: tuple[CatalogKind, ...] = ("prompts", "resources")
        self._tags: dict[tuple[str, CatalogKind], frozenset[str]] = {
            (name, kind): requirement({canonical}, config.catalog_scopes(_rule(config, kind)))
            for name, config in configs.items()
            for kind in kinds
        }
        self._routes: dict[CatalogKind, dict[str, Listed]] = {"prompts": {}, "resources": {}}
        self._templates: list[ListedTemplate] = []
        self._policy = AudiencePolicy(canonical)

    def offers(self, kind: CatalogKind) -> bool:
        return any(_rule(config, kind).exposed for config in self.configs.values())

    def methods(self) -> dict[str, MethodHandler]:
        methods: dict[str, MethodHandler] = {}
        if self.offers("prompts"):
            methods |= {"prompts/list": self._list_prompts, "prompts/get": self._get_prompt}
        if self.offers("resources"):
            methods |= {
                "resources/list": self._list_resources,
                "resources/templates/list": self._list_templates,
                "resources/read": self._read_resource,
            }
        if methods:
            methods["completion/complete"] = self._complete
        return methods

    def scopes(self) -> frozenset[str]:
        """Every scope a get or read may need, for the gateway's protected resource metadata."""
        exposed = [tags for (name, kind), tags in self._tags.items() if _rule(self.configs[name], kind).exposed]
        return frozenset(scopes_in(frozenset().union(*exposed)))

    def tags(self) -> dict[str, MethodTags]:
        return {
            "prompts/get": self._prompt_tags,
            "resources/read": self._resource_tags,
            "completion/complete": self._complete_tags,
        }

    # ---- what a token needs ------------------------------------------------------------------------

    def _prompt_tags(self, params: dict[str, Any]) -> frozenset[str]:
        name = params.get("name")
        if not isinstance(name, str):
            return frozenset()  # answered as invalid before anything is asked upstream
        holders = [
            upstream
            for upstream, config in self.configs.items()
            if config.prompts.exposed and name.startswith(config.exposed_prefix)
        ]
        return frozenset().union(*(self._tags[upstream, "prompts"] for upstream in holders))

    def _resource_tags(self, params: dict[str, Any]) -> frozenset[str]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            return frozenset()
        routed = self._routes["resources"].get(uri)
        if routed is not None:
            holders = [routed.upstream]
        else:  # the templates the last listing had that match it, else every upstream that might hold it
            holders = self._template_holders(uri) or [n for n, c in self.configs.items() if c.resources.exposed]
        return frozenset().union(*(self._tags[upstream, "resources"] for upstream in holders))

    def _complete_tags(self, params: dict[str, Any]) -> frozenset[str]:
        """A completion needs what a get of its prompt, or a read through its template, needs."""
        ref = params.get("ref")
        if not isinstance(ref, dict):
            return frozenset()
        if ref.get("type") == "ref/prompt":
            return self._prompt_tags(ref)
        uri = ref.get("uri")
        if ref.get("type") != "ref/resource" or not isinstance(uri, str):
            return frozenset()
        routed = next((t.upstream for t in self._templates if t.template == uri), None)
        holders = [routed] if routed is not None else [n for n, c in self.configs.items() if c.resources.exposed]
        return frozenset().union(*(self._tags[upstream, "resources"] for upstream in holders))

    # ---- the methods -------------------------------------------------------------------------------

    async def _list_prompts(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        return {"prompts": [listed.entry for listed in (await self._list("prompts")).values()]}

    async def _list_resources(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        return {"resources": [listed.entry for listed in (await self._list("resources")).values()]}

    async def _list_templates(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        return {"resourceTemplates": [listed.entry for listed in await self._list_template_routes()]}

    async def _get_prompt(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str):
            raise MethodError(errors.INVALID_PARAMS, "prompts/get needs params.name, a string")
        listed = await self._route("prompts", name)
        if listed is None:
            raise MethodError(errors.INVALID_PARAMS, f"unknown prompt {name!r}")
        arguments = params.get("arguments")
        forwarded = {"name": listed.name, "arguments": arguments if isinstance(arguments, dict) else {}}
        return await self._read(ctx, listed, "prompts/get", forwarded, "prompts")

    async def _complete(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        """``completion/complete`` of a prompt (by its exposed name: the upstream gets its own) or of a resource
        template (by its ``uriTemplate``), at the upstream that exposes it."""
        ref, argument = params.get("ref"), params.get("argument")
        if not isinstance(ref, dict) or not isinstance(argument, dict):
            raise MethodError(errors.INVALID_PARAMS, "completion/complete needs params.ref and params.argument")
        forwarded = {key: value for key, value in params.items() if key in ("ref", "argument", "context")}
        if ref.get("type") == "ref/prompt" and isinstance(name := ref.get("name"), str):
            listed = await self._route("prompts", name)
            if listed is None:
                raise MethodError(errors.INVALID_PARAMS, f"unknown prompt {name!r}")
            forwarded["ref"] = {**ref, "name": listed.name}
            return await self._read(ctx, listed, "completion/complete", forwarded, "prompts")
        if ref.get("type") == "ref/resource" and isinstance(uri := ref.get("uri"), str):
            template = next((t for t in self._templates if t.template == uri), None)
            if template is None:
                template = next((t for t in await self._list_template_routes() if t.template == uri), None)
            if template is None:
                raise MethodError(errors.INVALID_PARAMS, f"unknown resource template {uri!r}", {"uri": uri})
            listed = Listed(uri, template.upstream, uri, {})
            return await self._read(ctx, listed, "completion/complete", forwarded, "resources")
        raise MethodError(
            errors.INVALID_PARAMS, "completion/complete: ref is a ref/prompt with a name or a ref/resource with a uri"
        )

    async def _read_resource(self, ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise MethodError(errors.INVALID_PARAMS, "resources/read needs params.uri, a string")
        listed = await self._route("resources", uri)
        if listed is None:
            upstream = await self._template_route(uri)
            if upstream is None:
                raise MethodError(errors.RESOURCE_NOT_FOUND, f"unknown resource {uri!r}", {"uri": uri})
            listed = Listed(uri, upstream, uri, {})
        return await self._read(ctx, listed, "resources/read", {"uri": uri}, "resources")

    # ---- resource templates ------------------------------------------------------------------------

    def _template_holders(self, uri: str) -> list[str]:
        """The upstreams whose templates of the last listing route ``uri``, in configuration order."""
        if len(uri) > MAX_URI:
            return []
        found = {t.upstream for t in self._templates if t.routes(self._config(t.upstream), uri)}
        return [name for name in self.configs if name in found]

    async def _template_route(self, uri: str) -> str | None:
        """The one upstream whose template routes ``uri`` (a URI no listing names), asking the lists again when the
        last one routed it to none or to more than one; ``None``: no template matches. Two upstreams: refused."""
        if len(uri) > MAX_URI:
            raise MethodError(
                errors.INVALID_PARAMS,
                f"resource URI of {len(uri)} characters is not listed, and longer than the {MAX_URI} matched "
                "against resource templates",
                {"maxLength": MAX_URI},
            )
        holders = self._template_holders(uri)
        if len(holders) != 1:
            await self._list_template_routes()
            holders = self._template_holders(uri)
        if len(holders) > 1:
            matching = [
                {"upstream": t.upstream, "uriTemplate": t.template}
                for t in self._templates
                if t.upstream in holders and t.routes(self._config(t.upstream), uri)
            ]
            raise MethodError(
                errors.INVALID_PARAMS,
                f"resource {uri!r} matches resource templates of {len(holders)} upstreams "
                f"({', '.join(holders)}); which one holds it is ambiguous",
                {"uri": uri, "templates": matching},
            )
        return holders[0] if holders else None

    async def _list_template_routes(self) -> list[ListedTemplate]:
        """Every upstream's exposed resource templates, in configuration order; the new template routes."""
        names = [name for name, config in self.configs.items() if config.resources.exposed]
        listings = await asyncio.gather(*(self._listing(name, "templates") for name in names))
        routes: list[ListedTemplate] = []
        for name, entries in zip(names, listings, strict=True):
            if entries is None:
                continue
            if names_entries(self.configs[name].resources):
                await self._check_resources(name, templates=entries)
            config = self.verdicts.effective(name)
            if config is not None:
                routes += expose_templates(config, entries, (t.template for t in routes))
        self._templates = routes
        return routes

    # ---- the configuration against the listings ----------------------------------------------------

    def _config(self, name: str) -> UpstreamConfig:
        """The configuration an upstream's routes follow: as checked (or narrowed by ``--lenient-config``)."""
        return self.verdicts.effective(name) or self.configs[name]

    async def check(self, name: str) -> None:
        """Check the prompts and resources ``name``'s rules name against its listings now (at its (re)connection,
        before any of it is exposed): a rule that names nothing needs no listing."""
        config = self.configs[name]
        if names_entries(config.prompts):
            self._check_prompts(name, await self._listing(name, "prompts"))
        if names_entries(config.resources):
            await self._check_resources(name)

    def _check_prompts(self, name: str, entries: list[dict[str, Any]] | None) -> None:
        if entries is not None:  # a listing that failed proves nothing either way: the last verdict stands
            self.verdicts.catalog_listed(name, "prompts", Offered(_keys(entries, "name")))

    async def _check_resources(
        self,
        name: str,
        resources: list[dict[str, Any]] | None = None,
        templates: list[dict[str, Any]] | None = None,
    ) -> None:
        """A resource rule names URIs and templates alike: it is checked against both lists (the one not given
        asked now; one that fails leaves the last verdict standing)."""
        if resources is None:
            resources = await self._listing(name, "resources")
        if templates is None:
            templates = await self._listing(name, "templates")
        if resources is None or templates is None:
            return
        offered = Offered(_keys(resources, "uri"), _keys(templates, "uriTemplate"))
        self.verdicts.catalog_listed(name, "resources", offered)

    # ---- upstream ----------------------------------------------------------------------------------

    async def _route(self, kind: CatalogKind, key: str) -> Listed | None:
        listed = self._routes[kind].get(key)
        if listed is None:
            listed = (await self._list(kind)).get(key)
        return listed

    async def _list(self, kind: CatalogKind) -> dict[str, Listed]:
        """Every upstream's exposed entries of ``kind``, in configuration order; the new routes."""
        names = [name for name, config in self.configs.items() if _rule(config, kind).exposed]
        listings = await asyncio.gather(*(self._listing(name, kind) for name in names))
        routes: dict[str, Listed] = {}
        expose = expose_prompts if kind == "prompts" else expose_resources
        for name, entries in zip(names, listings, strict=True):
            if entries is None:
                continue
            if names_entries(_rule(self.configs[name], kind)):
                if kind == "prompts":
                    self._check_prompts(name, entries)
                else:
                    await self._check_resources(name, resources=entries)
            config = self.verdicts.effective(name)
            if config is None:
                continue
            for listed in expose(config, entries, routes):
                routes[listed.key] = listed
        self._routes[kind] = routes
        return routes

    async def _listing(self, name: str, kind: ListKind) -> list[dict[str, Any]] | None:
        """One upstream's list: empty when it has none (-32601: no such capability); ``None`` when it cannot answer
        now (logged), which exposes nothing of it (as its tools are absent while it is down) and checks nothing."""
        try:
            return await self.upstreams[name].listing(kind)
        except UpstreamRpcError as exc:
            if exc.code == errors.METHOD_NOT_FOUND:
                return []
            log.warning("upstream %s: %s refused: %s %s", name, LIST_METHODS[kind][0], exc.code, exc.message)
        except UpstreamFailure as exc:
            log.warning("upstream %s: %s failed (%s: %s)", name, LIST_METHODS[kind][0], exc.reason, exc.detail)
        return None

    async def _read(
        self, ctx: ToolContext, listed: Listed, method: CatalogRead, params: dict[str, Any], kind: CatalogKind
    ) -> dict[str, Any]:
        # The server checked the tags of the route known when the request came; a listing since may have moved it.
        missing = self._policy.missing(ctx.grant.audience, self._tags[listed.upstream, kind], ctx.grant.scopes)
        if missing:
            data = denials.refusal_fields(" ".join(sorted(self._tags[listed.upstream, kind])), missing)
            raise MethodError(errors.FORBIDDEN, coverage_description(missing), data)
        try:
            return await self.upstreams[listed.upstream].read(method, params)
        except UpstreamRpcError as exc:
            raise MethodError(exc.code, exc.message, exc.data) from None
        except UpstreamFailure as exc:
            raise MethodError(
                errors.UPSTREAM_FAILED,
                f"upstream {listed.upstream}: {exc.reason}: {exc.detail}",
                {"reason": exc.reason, "upstream": listed.upstream, "mayHaveRun": False},
            ) from None


def _keys(entries: list[dict[str, Any]], key: str) -> frozenset[str]:
    return frozenset(value for entry in entries if isinstance(value := entry.get(key), str) and value)
