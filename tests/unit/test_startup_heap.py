"""``serve``'s start-up heap handling: frozen, and the youngest generation collected less often."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from mcp_lossless.server.serving import YOUNG_COLLECTION_EVERY, freeze_startup_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_freeze_collects_the_youngest_generation_less_often() -> None:
    gc.set_threshold(700, 11, 12)
    freeze_startup_heap()
    assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 11, 12)  # the older generations keep their settings
    assert YOUNG_COLLECTION_EVERY > 700
    assert gc.get_freeze_count() > 0
