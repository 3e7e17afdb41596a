"""The one paging loop: every page in order, the cursor sent back as given, and a bound instead of a hang."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_lossless.client.errors import ProtocolViolation
from mcp_lossless.client.paging import MAX_PAGES, collect_pages

pytestmark = pytest.mark.anyio


class Pages:
    """A lister with ``count`` pages (or endless ones): what each fetch was asked for is kept."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.asked: list[dict[str, Any]] = []

    async def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(params)
        index = len(self.asked) - 1
        page: dict[str, Any] = {"tools": [{"name": f"t{index}"}, "not an object", {"name": f"u{index}"}]}
        if self.count is None or index + 1 < self.count:
            page["nextCursor"] = f"after-{index}"
        return page


async def test_every_page_in_order_with_the_cursor_sent_back() -> None:
    pages = Pages(3)
    items = await collect_pages(pages, "tools")
    assert [item["name"] for item in items] == ["t0", "u0", "t1", "u1", "t2", "u2"]
    assert pages.asked == [{}, {"cursor": "after-0"}, {"cursor": "after-1"}]


async def test_a_cursor_that_is_not_a_string_ends_the_listing() -> None:
    async def fetch(params: dict[str, Any]) -> dict[str, Any]:
        return {"tools": [{"name": "only"}], "nextCursor": None}

    assert await collect_pages(fetch, "tools") == [{"name": "only"}]


async def test_a_server_that_never_stops_paging_is_an_error_not_a_hang_or_a_cut() -> None:
    pages = Pages(None)
    with pytest.raises(ProtocolViolation, match=f"more than {MAX_PAGES} pages"):
        await collect_pages(pages, "tools")
    assert len(pages.asked) == MAX_PAGES


async def test_exactly_the_maximum_of_pages_is_listed_whole() -> None:
    items = await collect_pages(Pages(MAX_PAGES), "tools")
    assert len(items) == 2 * MAX_PAGES
