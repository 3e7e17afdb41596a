"""Access tokens for a given set of RFC 8707 resources, from wherever the operator gets theirs.

Two sources: an OAuth token endpoint with client credentials (``client_credentials`` grant, one
``resource`` parameter per indicator), or a command that prints a token, for every other setup (a
device flow, a vault, a script around a corporate AS). A source that cannot produce a token for a set
says why, so a check that needs it is reported "not run" with that reason.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import anyio
import httpx
import orjson

from .redact import Redactor
from .wire import Credential

COMMAND_SECONDS = 30.0
RESOURCES_PLACEHOLDER = "{resources}"


class TokenUnavailable(Exception):
    """The source could not mint a token for the requested resources; the message is safe to print."""


class TokenSource(Protocol):
    @property
    def description(self) -> str:
        """Where tokens come from, without any secret."""
        ...

    async def token(self, resources: Sequence[str]) -> str: ...


@dataclass(frozen=True, slots=True)
class ClientCredentialsGrant:
    """``grant_type=client_credentials`` at ``endpoint``, authenticated with HTTP Basic (RFC 6749 §2.3.1)."""

    http: httpx.AsyncClient
    endpoint: str
    client_id: str
    client_secret: str

    @property
    def description(self) -> str:
        return f"client_credentials for {self.client_id!r} at {self.endpoint}"

    async def token(self, resources: Sequence[str]) -> str:
        form = [("grant_type", "client_credentials"), *(("resource", r) for r in resources)]
        auth = httpx.BasicAuth(quote(self.client_id, safe=""), quote(self.client_secret, safe=""))
        try:
            response = await self.http.post(
                self.endpoint,
                content=urlencode(form),
                headers={"content-type": "application/x-www-form-urlencoded", "accept": "application/json"},
                auth=auth,
            )
        except httpx.HTTPError as exc:
            raise TokenUnavailable(f"token endpoint unreachable: {type(exc).__name__}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("access_token"), str):
            error = body.get("error") if isinstance(body, dict) else None
            detail = body.get("error_description") if isinstance(body, dict) else None
            raise TokenUnavailable(
                f"token endpoint answered {response.status_code}"
                + (f" {error}" if error else "")
                + (f": {detail}" if detail else "")
            )
        token: str = body["access_token"]
        return token


@dataclass(frozen=True, slots=True)
class TokenCommand:
    """A shell command that prints a token; ``{resources}`` becomes the indicators, shell-quoted, space-separated."""

    template: str

    @property
    def description(self) -> str:
        """The program only: the rest of the command line may hold a secret."""
        program = self.template.split(maxsplit=1)[0] if self.template.strip() else ""
        return f"token command ({program} …)"

    async def token(self, resources: Sequence[str]) -> str:
        command = self.template.replace(RESOURCES_PLACEHOLDER, " ".join(shlex.quote(r) for r in resources))
        try:
            with anyio.fail_after(COMMAND_SECONDS):
                done = await anyio.run_process(command, check=False)
        except TimeoutError:
            raise TokenUnavailable(f"token command did not finish within {COMMAND_SECONDS:.0f} s") from None
        except OSError as exc:
            raise TokenUnavailable(f"token command could not run: {exc}") from None
        token = done.stdout.decode("utf-8", errors="replace").strip()
        if done.returncode != 0 or not token or any(c.isspace() for c in token):
            stderr = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
            why = stderr[-1] if stderr else "no single token on stdout"
            raise TokenUnavailable(f"token command exited {done.returncode}: {why}")
        return token


def unverified_claims(token: str) -> dict[str, Any] | None:
    """A JWT's claims read WITHOUT verification, only to catch a source that ignored the resources asked for."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return claims if isinstance(claims, dict) else None


def principal_of(token: str) -> tuple[object, object, object] | None:
    """(iss, sub, client_id) of a JWT (unverified), only to refuse a comparison of a principal with itself."""
    claims = unverified_claims(token)
    if claims is None:
        return None
    return claims.get("iss"), claims.get("sub"), claims.get("client_id", claims.get("azp"))


def audience(token: str) -> set[str] | None:
    """The ``aud`` of a JWT (unverified), or ``None`` for an opaque token."""
    claims = unverified_claims(token)
    aud = claims.get("aud") if claims is not None else None
    if isinstance(aud, str):
        return {aud}
    if isinstance(aud, list):
        return {a for a in aud if isinstance(a, str)}
    return None


class Tokens:
    """Tokens of one principal, fetched once per resource set and registered with the redactor."""

    def __init__(self, source: TokenSource, principal: str, redactor: Redactor) -> None:
        self.source = source
        self.principal = principal
        self._redactor = redactor
        self._cache: dict[tuple[str, ...], str] = {}

    async def credential(self, resources: Sequence[str], label: str) -> Credential:
        key = tuple(resources)
        if key not in self._cache:
            token = await self.source.token(resources)
            self._redactor.register(token, f"{self.principal} {label} token")
            self._cache[key] = token
        token = self._cache[key]
        return Credential(self._redactor.label_of(token), token)
