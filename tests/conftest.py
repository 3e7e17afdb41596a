from collections.abc import AsyncIterator

import httpx
import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client for a test's raw requests; its timeout only ends a test that would hang."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client
