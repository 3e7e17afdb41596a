"""Structured authorization denials (SEP-2643, experimental): one envelope on every refusal, and how a client reads it.

Every authorization refusal the server makes, in both eras and before or after commit (the legacy 403 and
in-band ``-32041``, a refused ``tools/call`` ``-32043`` / ``-31043``, the task denial ``-31041``), carries its
facts in our own fields (``requiredResources``, ``requiredScopes``, ``resumable``…) *and* in the SEP's envelope,
rendered here and only here (:func:`refusal_fields`), so a client written to the SEP alone can tell an
authorization denial from any other error and see what to ask for. The envelope is written under
``data.authorization`` (where the SEP's text puts it) and repeated under ``data._meta`` with the key
:data:`ENVELOPE_META_KEY` (where the PR's second pass moves it): the same object, so the two cannot disagree
(docs/decisions/0031).

The other half is the client's: :func:`remedy` reads the envelope where present and our own fields where not,
and says whether a new grant can help and what it should hold. The ledger, the session and the modern client
all ask it, so the rule "re-authorize only when the server says it can help" has one home.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .resources import resources_in, scopes_in

DENIALS_EXTENSION = "io.modelcontextprotocol/structured-authorization-denials"
"""The experimental extension ``server/discover`` declares (SEP-2643 is a draft)."""
ENVELOPE_META_KEY = "io.modelcontextprotocol/authorization"
"""Where ``data._meta`` repeats the envelope."""
CONTEXT_ECHO_META_KEY = "io.modelcontextprotocol/authorization-context-id"
"""Where a retry's ``params._meta`` echoes the denial's ``authorizationContextId`` (the SEP's "Retry Echo")."""
REASON = "insufficient_authorization"
HINT_TYPE = "io.github.mcp-lossless/oauth-grant"
"""Our remediation hint: the resource indicators (RFC 8707) and scopes a new token must hold. The SEP's two hint
types do not fit: ``url`` is server-side approval, and ``oauth_authorization_details`` is RFC 9396, which our
authorization servers need not speak; a SEP client ignores a type it does not know, as it must."""


def context_id(subject: str, missing: Iterable[str]) -> str:
    """The envelope's ``authorizationContextId``: a correlation handle, never authorization material (the SEP).

    Derived from what was refused (``subject``: a task id, an event id, a tool's requirement) and what is
    missing, so the same refusal names the same handle on every replica and every retry, with no state kept;
    it reveals nothing beyond what the denial itself names.
    """
    digest = hashlib.blake2b(orjson.dumps([subject, sorted(missing)]), digest_size=8).hexdigest()
    return f"authzctx_{digest}"


def envelope(subject: str, missing: Iterable[str]) -> dict[str, Any]:
    """The SEP-2643 envelope of a refusal whose token lacks ``missing`` (resource and scope tags)."""
    tags = sorted(set(missing))
    resources, scopes = list(resources_in(tags)), list(scopes_in(tags))
    return {
        "reason": REASON,
        "remediation": "available",
        "authorizationContextId": context_id(subject, tags),
        "credentialDisposition": "replacement",
        "remediationHints": [{"type": HINT_TYPE, "resources": resources, "scopes": scopes}],
    }


def refusal_fields(subject: str, missing: Iterable[str], **fields: Any) -> dict[str, Any]:
    """The ``data`` of every authorization refusal: ``fields`` (each refusal's own: ``reason``, ``taskId``,
    ``eventId``…), what is missing in our fields, and the envelope (under ``authorization`` and ``_meta``)."""
    tags = sorted(set(missing))
    sealed = envelope(subject, tags)
    return {
        **fields,
        "requiredResources": list(resources_in(tags)),
        "requiredScopes": list(scopes_in(tags)),
        "authorization": sealed,
        "_meta": {ENVELOPE_META_KEY: sealed},
    }


# -- the client's reading ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Remedy:
    """What a refusal says a client can do: whether a new grant can help, what it should hold, and the handle
    to echo on the retry."""

    reauthorize: bool | None
    """``True``: the server says a new grant can help; ``False``: it says none can (the envelope's ``remediation:
    unavailable``); ``None``: it said neither (not a denial of ours, no envelope), so a transport challenge, which
    the SEP keeps authoritative, decides alone."""
    resources: frozenset[str]
    scopes: frozenset[str]
    context: str | None = None


def _strings(value: object) -> frozenset[str]:
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()


def _envelope_of(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    found = data.get("authorization")
    if not isinstance(found, dict):
        meta = data.get("_meta")
        found = meta.get(ENVELOPE_META_KEY) if isinstance(meta, dict) else None
    return found if isinstance(found, dict) and found.get("reason") == REASON else None


def remedy(data: object) -> Remedy:
    """Read a refusal's ``data``: the envelope where present, our own fields where not.

    With the envelope, a new grant helps unless the server says remediation is ``unavailable`` (``undisclosed``
    and absent still leave trying to the client, as the SEP's default disposition does); what to ask for is our
    hint's, else our own fields'. Without it, the refusal is ours only if it names what is missing or says it is
    resumable. Anything else (``data`` not an object, another server's error) says nothing (``None``).
    """
    if not isinstance(data, dict):
        return Remedy(None, frozenset(), frozenset())
    resources, scopes = _strings(data.get("requiredResources")), _strings(data.get("requiredScopes"))
    sealed = _envelope_of(data)
    if sealed is None:
        ours = bool(resources or scopes) or data.get("resumable") is True
        return Remedy(True if ours else None, resources, scopes)
    for hint in sealed.get("remediationHints") or ():
        if isinstance(hint, dict) and hint.get("type") == HINT_TYPE:
            resources |= _strings(hint.get("resources"))
            scopes |= _strings(hint.get("scopes"))
    handle = sealed.get("authorizationContextId")
    return Remedy(
        sealed.get("remediation") != "unavailable", resources, scopes, handle if isinstance(handle, str) else None
    )
