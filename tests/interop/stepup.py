"""The step-up scenario for stock OAuth clients: our server with its embedded dev AS (consent on), a
resource owner who first approves only ``search``, and a record of what happened on the wire.

A stock client connects with no registration and no token. It registers (RFC 7591), sends its user to
``/authorize`` for the whole server, and the owner ticks only the ``search`` tool on the consent page,
so the token the client gets is narrowed to ``…/tools/search``. Its ``fetch`` call then gets our 403
``insufficient_scope``; the client must re-authorize by itself (the owner now approves everything it
asks for) and return ``fetch``'s true result, exactly once. Nothing here sleeps: the owner acts when the
client hands it an authorization URL, and the server counts what ran.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson

from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from tests.support.uvicorn_server import lossless_server

FETCH_URL = "https://example.com/step-up"
FETCH_RESULT = f"contents of {FETCH_URL}: {len(FETCH_URL)} bytes"


@dataclass
class Seen:
    """What the server answered, noted by an ASGI wrapper (thread-safe: uvicorn runs in another thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: list[tuple[str, str, int, str | None]] = field(default_factory=list)
    """(method, path, status, www-authenticate) of every request."""
    fetch_runs: int = 0

    def statuses(self, path: str, method: str = "POST") -> list[int]:
        with self.lock:
            return [status for m, p, status, _ in self.answers if p == path and m == method]

    def challenges(self, status: int) -> list[str]:
        with self.lock:
            return [c for _, _, s, c in self.answers if s == status and c is not None]


class _Noting:
    def __init__(self, app: Any, seen: Seen) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def noting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                challenge = dict(message.get("headers", [])).get(b"www-authenticate")
                with self.seen.lock:
                    self.seen.answers.append(
                        (scope["method"], scope["path"], message["status"], challenge.decode() if challenge else None)
                    )
            await send(message)

        await self.app(scope, receive, noting_send)


def step_up_tools(seen: Seen) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(read_only=True)
    async def search(ctx: ToolContext, query: str) -> str:
        """Search for ``query``."""
        return f"search results for {query!r}: 3 documents"

    @registry.tool(idempotent=True, read_only=True)
    async def fetch(ctx: ToolContext, url: str) -> str:
        """Fetch ``url`` (counted: the test proves it ran once)."""
        with seen.lock:
            seen.fetch_runs += 1
        await ctx.report_progress(1, 1)
        return f"contents of {url}: {len(url)} bytes"

    return registry


@dataclass
class StepUpServer:
    base: str
    seen: Seen

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def tool_resource(self, name: str) -> str:
        return f"{self.url}/tools/{name}"

    @property
    def issuer(self) -> str:
        return f"{self.base}/dev-as"


@contextmanager
def step_up_server(dev_clients: dict[str, str] | None = None) -> Iterator[StepUpServer]:
    """Our server: demo-like tools, embedded dev AS with its consent page (no auto-approval), memory store."""
    seen = Seen()

    def make(port: int) -> _Noting:
        config = ServerConfig(port=port, store="memory", retry_ms=200, dev_clients=dev_clients or {})
        return _Noting(create_app(config, step_up_tools(seen)), seen)

    with lossless_server(make) as base:
        yield StepUpServer(base, seen)


@dataclass
class Visit:
    offered: list[str]
    approved: list[str]
    location: str


class ResourceOwner:
    """The user at the consent page: the first time approves only ``first_only``; later, all it is asked.

    :meth:`consent` is what the user's browser does with an authorization URL: load the page (keeping its
    cookie), post the form with the CSRF token, and return where the AS redirected (the client's callback).
    """

    def __init__(self, first_only: list[str], subject: str = "alice") -> None:
        self.first_only = first_only
        self.subject = subject
        self.visits: list[Visit] = []
        self._browser = httpx.AsyncClient(timeout=10)

    async def close(self) -> None:
        await self._browser.aclose()

    async def consent(self, authorization_url: str) -> str:
        page = await self._browser.get(authorization_url)
        assert page.status_code == 200, f"expected the consent page, got {page.status_code}: {page.text[:500]}"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        hidden = dict(re.findall(r'<input type="hidden" name="(consent|csrf)" value="([^"]+)">', page.text))
        offered = re.findall(r'name="resource" value="([^"]+)" checked', page.text)
        approved = self.first_only if not self.visits else offered
        form = {**hidden, "decision": "approve", "subject": self.subject, "resource": approved}
        action = re.search(r'<form method="post" action="([^"]+)">', page.text)
        assert action is not None
        decided = await self._browser.post(action[1].replace("&amp;", "&"), data=form)
        assert decided.status_code == 302, decided.text
        location = decided.headers["location"]
        self.visits.append(Visit(offered, approved, location))
        return location

    async def deliver(self, authorization_url: str) -> None:
        """Consent, then follow the redirect to the client's loopback callback, as a browser would."""
        location = await self.consent(authorization_url)
        delivered = await self._browser.get(location)
        assert delivered.status_code < 400, f"the client's callback answered {delivered.status_code}"


def callback_params(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def jwt_audience(token: str) -> Any:
    """The ``aud`` of a JWT, unverified (for assertions about which token a client held)."""
    import base64

    payload = token.split(".")[1]
    return orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["aud"]
