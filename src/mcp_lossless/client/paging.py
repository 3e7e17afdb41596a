"""Paged list results (``tools/list`` and kin): every page in order, and a bound on how many.

One loop for every caller (both eras of the client, the gateway's stdio upstreams). A server that keeps handing
out cursors must not hold its caller forever, and a listing cut short would hide tools silently: past
:data:`MAX_PAGES` pages the listing fails with :class:`~.errors.ProtocolViolation`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .errors import ProtocolViolation

MAX_PAGES = 100
"""Pages one listing may take; honest servers page far fewer."""

Fetch = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]
"""Sends the list request with these params (``{}`` or ``{"cursor": ...}``) and returns its result."""


async def collect_pages(fetch: Fetch, key: str) -> list[dict[str, Any]]:
    """The objects under ``key`` of every page, in order; entries that are not objects are left out."""
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    for _ in range(MAX_PAGES):
        page = await fetch(params)
        entries = page.get(key)
        if isinstance(entries, list):
            items += [entry for entry in entries if isinstance(entry, dict)]
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str):
            return items
        params = {"cursor": cursor}
    raise ProtocolViolation(f"{key} listing: more than {MAX_PAGES} pages, the server keeps returning nextCursor")
