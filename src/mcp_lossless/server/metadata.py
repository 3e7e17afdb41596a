"""RFC 9728 protected resource metadata and RFC 6750 ``WWW-Authenticate`` challenges."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..core.resources import resources_in, scopes_in

PRM_WELL_KNOWN = "/.well-known/oauth-protected-resource"


def metadata_path(resource: str) -> str:
    """The path-inserted well-known path of ``resource`` (RFC 9728 §3.1)."""
    path = urlsplit(resource).path.rstrip("/")
    return PRM_WELL_KNOWN + path


def metadata_url(resource: str) -> str:
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{metadata_path(resource)}"


def metadata_document(
    resource: str,
    authorization_servers: Iterable[str],
    name: str,
    scopes: Iterable[str] = (),
    dpop: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``dpop``: the RFC 9449 §5.2 members (``dpop_signing_alg_values_supported``, and
    ``dpop_bound_access_tokens_required`` where the server takes nothing else), when the server checks proofs."""
    document: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": list(authorization_servers),
        "bearer_methods_supported": ["header"],
        "resource_name": name,
    }
    listed = sorted(scopes)
    if listed:
        document["scopes_supported"] = listed
    if dpop:
        document.update(dpop)
    return document


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(
    error: str | None,
    description: str | None,
    resource_metadata: str,
    resources: Iterable[str] = (),
    scopes: Iterable[str] = (),
    *,
    scheme: str = "Bearer",
    algs: Iterable[str] = (),
) -> bytes:
    """A ``WWW-Authenticate`` value, ``Bearer`` (RFC 6750 §3) or ``DPoP`` (RFC 9449 §7.1, with ``algs``: the proof
    algorithms this server takes). ``resource`` lists the indicators a new token must cover, ``scope`` the scopes
    it must hold."""
    params = []
    algorithms = " ".join(algs)
    if algorithms:
        params.append(f"algs={_quote(algorithms)}")
    if error is not None:
        params.append(f"error={_quote(error)}")
    if description is not None:
        params.append(f"error_description={_quote(description)}")
    names = " ".join(resources)
    if names:
        params.append(f"resource={_quote(names)}")
    scope = " ".join(scopes)
    if scope:
        params.append(f"scope={_quote(scope)}")
    params.append(f"resource_metadata={_quote(resource_metadata)}")
    return (f"{scheme} " + ", ".join(params)).encode("latin-1", "replace")


def insufficient_scope(
    description: str, endpoint_metadata: str, missing: Iterable[str], needed: Iterable[str]
) -> bytes:
    """The 403 challenge for a token that lacks what a call or a replay needs, in a form stock clients act on.

    ``resource_metadata`` names the *endpoint's* metadata, whose ``resource`` is the URI the client connected
    to: SDK OAuth providers accept no other (a tool's own document names a child resource, and they abort).
    ``resource`` still names the tool indicators the token lacks, for clients that request per-tool tokens.
    ``scope`` lists every scope the operation needs, held or not (the 2026-07-28 step-up rule: a client
    unions it with what it asked for before; one that replaces its scopes by it still keeps what it needs).
    """
    tags = list(missing)
    return challenge(
        "insufficient_scope", description, endpoint_metadata, resources_in(tags), sorted(set(scopes_in(needed)))
    )
