"""RFC 9728 protected resource metadata and RFC 6750 ``WWW-Authenticate`` challenges."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

PRM_WELL_KNOWN = "/.well-known/oauth-protected-resource"


def metadata_path(resource: str) -> str:
    """The path-inserted well-known path of ``resource`` (RFC 9728 §3.1)."""
    path = urlsplit(resource).path.rstrip("/")
    return PRM_WELL_KNOWN + path


def metadata_url(resource: str) -> str:
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{metadata_path(resource)}"


def metadata_document(resource: str, authorization_servers: Iterable[str], name: str) -> dict[str, Any]:
    return {
        "resource": resource,
        "authorization_servers": list(authorization_servers),
        "bearer_methods_supported": ["header"],
        "resource_name": name,
    }


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(
    error: str | None, description: str | None, resource_metadata: str, resources: Iterable[str] = ()
) -> bytes:
    """A ``WWW-Authenticate: Bearer`` value. ``resource`` lists the indicators a new token must cover."""
    params = []
    if error is not None:
        params.append(f"error={_quote(error)}")
    if description is not None:
        params.append(f"error_description={_quote(description)}")
    names = " ".join(resources)
    if names:
        params.append(f"resource={_quote(names)}")
    params.append(f"resource_metadata={_quote(resource_metadata)}")
    return ("Bearer " + ", ".join(params)).encode("latin-1", "replace")
