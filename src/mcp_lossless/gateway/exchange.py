"""An upstream that learns who is calling: the caller's token exchanged for one of the upstream's (RFC 8693).

With ``auth = { exchange = { client_id = …, secret_env = … } }`` the gateway calls such an upstream, for each of
its own callers, with a token whose ``sub`` is the caller, whose audience is the upstream and whose ``act`` names
the gateway, holding the scopes the exposed tool needs (what the gateway already required of the caller, so the
exchange only narrows). The caller's own token never travels on, and no call falls back to the gateway's own
credentials: an exchange the authorization server refuses ends the call (:class:`ExchangeRefused`) before
anything reaches the upstream.

The authorization server is the one the upstream names (RFC 9728, then RFC 8414), found and authenticated to by
the gateway's own :class:`~..client.OAuth` client. That client's own ``client_credentials`` tokens serve the
requests that have no caller: the handshake, tool listings, the list-change stream.

Exchanged tokens are cached per (caller, scopes) for each upstream, until shortly before they (or the caller's
token) expire, the least recently used dropped past ``size``: a caller's calls cost one exchange per token
lifetime, and concurrent first calls share one exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import httpx

from ..client import AuthorizationFailed, OAuth
from ..client.oauth import Auth, Challenge, ExchangedToken, TokenEndpointError
from ..core.principal import Principal
from ..server.auth import CALLER

CACHE_SIZE = 10_000
LEEWAY_SECONDS = 30.0
"""An exchanged token is not presented in its last seconds: the upstream's clock may be ahead."""

_NEEDED: ContextVar[tuple[str, ...]] = ContextVar("mcp_lossless_exchange_scopes", default=())


@contextlib.contextmanager
def needing(scopes: tuple[str, ...]) -> Iterator[None]:
    """Within the block (and the tasks it starts), exchanged tokens are asked for ``scopes``: what the exposed tool,
    prompt or resource needs."""
    reset = _NEEDED.set(scopes)
    try:
        yield
    finally:
        _NEEDED.reset(reset)


class ExchangeRefused(AuthorizationFailed):
    """The authorization server would not exchange the caller's token for the upstream: the call is not made."""


_Key = tuple[Principal, tuple[str, ...]]


class TokenExchange(Auth):
    """The credentials of one upstream: an exchanged token inside a caller's request, ``own``'s token outside."""

    def __init__(
        self,
        upstream: str,
        own: OAuth,
        *,
        audience: str | None = None,
        size: int = CACHE_SIZE,
        clock: Callable[[], float],
    ) -> None:
        self.upstream = upstream
        self._own = own
        self._audience = audience
        self._size = size
        self._clock = clock
        self._cache: OrderedDict[_Key, tuple[str, float]] = OrderedDict()
        self._pending: dict[_Key, asyncio.Future[ExchangedToken]] = {}
        self.exchanges = 0
        """Token requests made (tests prove the cache with it)."""

    def bind(self, http: httpx.AsyncClient, server_url: str) -> None:
        self._own.bind(http, server_url)

    def challenged(self, challenge: Challenge) -> None:
        self._own.challenged(challenge)  # where the metadata is: the same for every caller

    async def token(self, resources: frozenset[str]) -> str | None:
        caller = CALLER.get()
        if caller is None:
            return await self._own.token(resources)
        grant, subject_token = caller
        key = (grant.principal, _NEEDED.get())
        cached = self._cache.get(key)
        if cached is not None and self._clock() < cached[1]:
            self._cache.move_to_end(key)
            return cached[0]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._exchange(subject_token, key[1]))

            def settled(done: asyncio.Future[ExchangedToken]) -> None:
                self._pending.pop(key, None)
                if not done.cancelled():
                    done.exception()  # retrieved: a refusal every waiter gave up on is not reported as unseen

            pending.add_done_callback(settled)
        exchanged = await asyncio.shield(pending)  # one waiter cancelled does not cancel the others' exchange
        # Kept until shortly before it (or the caller's token, which the AS may not have bounded it by) expires;
        # a token whose lifetime nobody states is used for this request only.
        ends = [t for t in (exchanged.expires_at, grant.expires_at) if t is not None]
        if ends and min(ends) - LEEWAY_SECONDS > self._clock():
            self._cache[key] = (exchanged.value, min(ends) - LEEWAY_SECONDS)
            self._cache.move_to_end(key)
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return exchanged.value

    async def _exchange(self, subject_token: str, scopes: tuple[str, ...]) -> ExchangedToken:
        self.exchanges += 1
        try:
            return await self._own.exchange(subject_token, scopes, self._audience)
        except TokenEndpointError as exc:
            raise ExchangeRefused(
                f"the authorization server refused to exchange the caller's token for upstream {self.upstream!r}: "
                f"{exc.error}: {exc.description}"
            ) from None

    async def reauthorize(self, resources: frozenset[str], scopes: frozenset[str] = frozenset()) -> None:
        """Inside a caller's request: the upstream refused its exchanged token, so the next one is exchanged anew
        (the client gives up after a few); outside, the gateway's own grant is renewed."""
        caller = CALLER.get()
        if caller is None:
            await self._own.reauthorize(resources, scopes)
            return
        self._cache.pop((caller[0].principal, _NEEDED.get()), None)
