"""The gateway's configuration and exposed-tool table: every mistake named, names and idempotence as documented."""

from __future__ import annotations

import re

import pytest

from mcp_lossless.gateway.config import (
    BearerFromEnv,
    ClientCredentialsFromEnv,
    GatewayConfigError,
    parse_upstream,
    parse_upstreams,
)
from mcp_lossless.gateway.table import expose, expose_prompts, expose_resources
from mcp_lossless.gateway.upstream import UpstreamTool


def tool(name: str, **annotations: object) -> UpstreamTool:
    return UpstreamTool(name, "", {"type": "object"}, annotations)


def test_a_full_upstream_parses() -> None:
    http = parse_upstream(
        {
            "name": "docs",
            "url": "http://127.0.0.1:9001/mcp",
            "auth": {"bearer_env": "DOCS_TOKEN"},
            "deny": ["drop"],
            "idempotent": ["search"],
            "timeout": 5,
        }
    )
    assert http.auth == BearerFromEnv("DOCS_TOKEN") and http.timeout == 5.0
    assert http.exposed_prefix == "docs_" and http.exposes("search") and not http.exposes("drop")
    stdio = parse_upstream(
        {"name": "ev", "command": ["npx", "-y", "x"], "prefix": "", "allow": ["echo"], "auth": {"client_id": "c"}}
    )
    assert stdio.command == ("npx", "-y", "x") and stdio.exposed_prefix == ""
    assert stdio.auth == ClientCredentialsFromEnv("c") and stdio.exposes("echo") and not stdio.exposes("other")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"url": "http://x/mcp"}, "name must be"),
        ({"name": "a b", "url": "http://x/mcp"}, "name must be"),
        ({"name": "a"}, "exactly one of url"),
        ({"name": "a", "url": "http://x", "command": ["x"]}, "exactly one of url"),
        ({"name": "a", "url": "ftp://x"}, "http(s) URL"),
        ({"name": "a", "command": []}, "must not be empty"),
        ({"name": "a", "command": "npx x"}, "list of non-empty strings"),
        ({"name": "a", "url": "http://x", "auth": {"bearer": "literal-token"}}, "auth has unknown keys"),
        ({"name": "a", "url": "http://x", "auth": "secret"}, "auth must be"),
        ({"name": "a", "url": "http://x", "timeout": 0}, "timeout must be"),
        ({"name": "a", "url": "http://x", "prefix": "a/b"}, "prefix may hold"),
        ({"name": "a", "url": "http://x", "typo": 1}, "unknown keys typo"),
        ({"nmae": "a", "url": "http://x"}, "unknown keys nmae (did you mean name"),
        (
            {"name": "a", "url": "http://x", "timout": 5, "alow": ["t"]},
            "alow (did you mean allow.), timout (did you mean timeout",
        ),
        ({"name": "a", "url": "http://x", "sessions": 0}, "sessions must be"),
        ({"name": "a", "url": "http://x", "scopes": ["docs:read"]}, "scopes must be a table"),
        ({"name": "a", "url": "http://x", "scopes": {"t": "docs:read"}}, "scopes.t must be a list"),
        ({"name": "a", "url": "http://x", "scopes": {"t": ["two words"]}}, "scope tokens"),
        ({"name": "a", "url": "http://x", "scopes": {"t": ['q"uote']}}, "scope tokens"),
        ({"name": "a", "url": "http://x", "era": "2026"}, "era must be one of auto, modern, legacy"),
        ({"name": "a", "command": ["x"], "era": "2026"}, "era must be one of auto, modern, legacy"),
    ],
)
def test_mistakes_are_named(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(GatewayConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_upstream(raw)


def test_the_file_needs_unique_upstreams() -> None:
    with pytest.raises(GatewayConfigError, match="at least one"):
        parse_upstreams(None)
    with pytest.raises(GatewayConfigError, match=re.escape("write each upstream as [[upstream]], not [upstream]")):
        parse_upstreams({"name": "a", "url": "http://x"})  # [upstream]: it said "needs at least one [[upstream]]"
    with pytest.raises(GatewayConfigError, match="unique"):
        parse_upstreams([{"name": "a", "url": "http://x"}, {"name": "a", "command": ["y"]}])


def test_bearer_from_an_unset_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_LOSSLESS_TEST_UNSET", raising=False)
    with pytest.raises(GatewayConfigError, match="MCP_LOSSLESS_TEST_UNSET"):
        BearerFromEnv("MCP_LOSSLESS_TEST_UNSET").token()


def test_exposed_names_filters_collisions_and_idempotence() -> None:
    config = parse_upstream({"name": "up", "url": "http://x", "deny": ["secret"], "idempotent": ["put"]})
    tools = [
        tool("get", readOnlyHint=True),
        tool("put"),
        tool("post"),
        tool("secret"),
        tool("same", idempotentHint=True),
    ]
    exposed = expose(config, tools, taken={"up_post"})
    assert [(e.name, e.tool.name, e.idempotent) for e in exposed] == [
        ("up_get", "get", True),
        ("up_put", "put", True),
        ("up_same", "same", True),
    ], "denied and colliding names are left out; annotations or the config make a tool idempotent"
    assert expose(config, [tool("post", idempotentHint=False)])[0].idempotent is False


def test_scopes_per_tool_add_the_upstreams_own_and_reach_the_table() -> None:
    config = parse_upstream(
        {"name": "up", "url": "http://x", "scopes": {"*": ["up:use"], "put": ["up:write", "up:use"]}, "era": "legacy"}
    )
    assert config.era == "legacy" and parse_upstream({"name": "b", "url": "http://x"}).era == "auto"
    assert parse_upstream({"name": "s", "command": ["x"], "era": "modern"}).era == "modern", "stdio too"
    assert parse_upstream({"name": "s", "command": ["x"]}).era == "auto"
    assert config.scopes_of("put") == ("up:use", "up:write") and config.scopes_of("get") == ("up:use",)
    exposed = {e.name: e.scopes for e in expose(config, [tool("get"), tool("put")])}
    assert exposed == {"up_get": ("up:use",), "up_put": ("up:use", "up:write")}
    assert parse_upstream({"name": "c", "url": "http://x"}).scopes_of("any") == ()


def test_prompt_and_resource_rules_parse_and_default_to_the_tools_star_scopes() -> None:
    upstream = parse_upstream(
        {
            "name": "docs",
            "url": "http://h/mcp",
            "scopes": {"*": ["docs:read"], "search": ["docs:search"]},
            "prompts": {"deny": ["internal"]},
            "resources": {"allow": ["file:///a"], "scopes": ["files:read"]},
        }
    )
    assert upstream.prompts.exposes("review") and not upstream.prompts.exposes("internal")
    assert upstream.resources.exposes("file:///a") and not upstream.resources.exposes("file:///b")
    assert upstream.catalog_scopes(upstream.prompts) == ("docs:read",), "guarded tools do not leave prompts open"
    assert upstream.catalog_scopes(upstream.resources) == ("files:read",)
    closed = parse_upstream({"name": "x", "url": "http://h/mcp", "prompts": False})
    assert not closed.prompts.exposes("anything") and closed.resources.exposes("file:///a")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"prompts": True}, "prompts must be false or a table of allow, deny and scopes lists"),
        ({"resources": {"only": ["a"]}}, "resources must be false or a table of allow, deny and scopes lists"),
        ({"prompts": {"scopes": ["a b"]}}, "scopes must be a tuple of RFC 6749 scope tokens"),
        ({"resources": {"deny": "file:///a"}}, "resources.deny must be a list of non-empty strings"),
    ],
)
def test_prompt_and_resource_rule_mistakes_are_named(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(GatewayConfigError, match=re.escape(problem)):
        parse_upstream({"name": "x", "url": "http://h/mcp", **raw})


def test_prompts_are_named_as_tools_and_resources_keep_their_uris_first_upstream_first() -> None:
    docs = parse_upstream({"name": "docs", "url": "http://h/mcp", "prompts": {"deny": ["internal"]}})
    entries = [{"name": "review", "title": "Review"}, {"name": "internal"}, {"title": "no name"}]
    listed = expose_prompts(docs, entries, taken={"docs_other"})
    assert [(p.key, p.name, p.entry) for p in listed] == [
        ("docs_review", "review", {"name": "docs_review", "title": "Review"})
    ]
    assert not expose_prompts(docs, [{"name": "review"}], taken={"docs_review"}), "a taken name is skipped"
    resources = expose_resources(docs, [{"uri": "file:///a", "name": "a"}, {"uri": "file:///b"}], taken={"file:///b"})
    assert [(r.key, r.upstream, r.entry) for r in resources] == [
        ("file:///a", "docs", {"uri": "file:///a", "name": "a"})
    ]
