from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import HealthCheck, settings

# Property tests check behaviour, not speed (speed is measured in benchmarks/): no per-example deadline and no
# too-slow health check, so a busy machine (CI's two cores running servers beside them) cannot fail them.
settings.register_profile("lossless", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lossless")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client for a test's raw requests; its timeout only ends a test that would hang."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client
