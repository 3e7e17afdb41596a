"""Properties of the limit verdicts: within a limit nothing is refused, past it the refusal names the limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import limits as verdicts
from mcp_lossless.core.errors import LIMIT_EXCEEDED
from mcp_lossless.core.limits import FD_RESERVE_MIN, LimitExceeded, Limits

SIZES = st.integers(0, 1 << 20)
CAPS = st.integers(1, 100_000)


def _names_its_limit(exceeded: LimitExceeded, limit: str, value: float) -> None:
    body = exceeded.body()
    assert body["error"]["code"] == LIMIT_EXCEEDED
    assert body["error"]["data"]["limit"] == limit == exceeded.limit
    assert body["error"]["data"]["maximum"] == value
    assert str(value).removesuffix(".0") in body["error"]["message"]


@given(size=SIZES, count=st.integers(0, 1000), max_bytes=CAPS, max_headers=CAPS)
def test_a_request_head_is_refused_exactly_past_either_limit(
    size: int, count: int, max_bytes: int, max_headers: int
) -> None:
    limits = Limits(max_header_bytes=max_bytes, max_headers=max_headers)
    verdict = verdicts.request_head(limits, size, count)
    if size <= max_bytes and count <= max_headers:
        assert verdict is None
    else:
        assert verdict is not None and verdict.status == 431 and verdict.retry_after is None
        limit = "max_header_bytes" if size > max_bytes else "max_headers"
        _names_its_limit(verdict, limit, getattr(limits, limit))


@given(held=st.integers(0, 5000), cap=st.integers(1, 5000))
def test_sessions_are_refused_from_the_cap_on_with_a_retry_after(held: int, cap: int) -> None:
    verdict = verdicts.new_session(Limits(sessions_per_principal=cap), held)
    assert (verdict is None) == (held < cap)
    if verdict is not None:
        assert verdict.status == 429 and verdict.retry_after is not None and verdict.retry_after > 0
        assert verdict.headers() == [(b"retry-after", b"%d" % verdict.retry_after)]
        _names_its_limit(verdict, "sessions_per_principal", cap)


@given(running=st.integers(0, 5000), calls=st.integers(1, 500), cap=st.integers(1, 5000))
def test_calls_are_refused_when_the_batch_would_pass_the_cap(running: int, calls: int, cap: int) -> None:
    verdict = verdicts.new_calls(Limits(calls_per_principal=cap), running, calls)
    assert (verdict is None) == (running + calls <= cap)
    if verdict is not None:
        assert verdict.status == 429 and verdict.retry_after
        _names_its_limit(verdict, "calls_per_principal", cap)


@given(open_streams=st.integers(0, 5000), cap=st.integers(1, 5000))
def test_streams_are_refused_from_the_cap_on(open_streams: int, cap: int) -> None:
    verdict = verdicts.new_stream(Limits(streams_per_session=cap), open_streams)
    assert (verdict is None) == (open_streams < cap)


@given(
    open_streams=st.integers(0, 50),
    running=st.integers(0, 50),
    calls=st.integers(0, 20),
    stream_cap=st.integers(1, 50),
    call_cap=st.integers(1, 50),
)
def test_a_post_stream_gets_the_stream_verdict_then_the_calls_verdict(
    open_streams: int, running: int, calls: int, stream_cap: int, call_cap: int
) -> None:
    limits = Limits(streams_per_session=stream_cap, calls_per_principal=call_cap)
    stream = verdicts.new_stream(limits, open_streams)
    expected = stream if stream is not None or not calls else verdicts.new_calls(limits, running, calls)
    assert verdicts.new_post_stream(limits, open_streams, running, calls) == expected


@given(configured=st.integers(1, 1 << 20), fd_limit=st.integers(1, 1 << 20))
def test_the_connection_cap_leaves_descriptors_free_and_never_exceeds_the_setting(
    configured: int, fd_limit: int
) -> None:
    cap = verdicts.connection_cap(Limits(max_connections=configured), fd_limit)
    assert 1 <= cap <= configured
    if fd_limit > 2 * FD_RESERVE_MIN:
        assert cap <= fd_limit - FD_RESERVE_MIN
        assert cap <= fd_limit - fd_limit // 8


def test_deadline_and_connection_refusals_name_their_limit() -> None:
    limits = Limits(header_timeout=2.5, body_timeout=7)
    _names_its_limit(verdicts.head_overdue(limits), "header_timeout", 2.5)
    _names_its_limit(verdicts.body_overdue(limits), "body_timeout", 7)
    full = verdicts.connections_full(limits, 12)
    assert full.status == 503 and full.retry_after == 1
    _names_its_limit(full, "max_connections", 12)


@pytest.mark.parametrize("bad", [0, -1, 0.0, True, "10"])
def test_a_limit_must_be_a_positive_number(bad: object) -> None:
    with pytest.raises(ValueError, match=r"limits\.max_headers"):
        Limits(max_headers=bad)  # type: ignore[arg-type]


@given(running=st.integers(0, 5000), cap=st.integers(1, 5000))
def test_tasks_are_refused_from_the_cap_on_with_a_retry_after(running: int, cap: int) -> None:
    verdict = verdicts.new_running_task(Limits(running_tasks=cap), running)
    assert (verdict is None) == (running < cap)
    if verdict is not None:
        _names_its_limit(verdict, "running_tasks", cap)
        assert verdict.status == 503 and verdict.retry_after == verdicts.TASK_RETRY_SECONDS


@given(held=st.integers(0, 5000), size=st.integers(0, 5000), cap=st.integers(1, 5000))
def test_storage_is_refused_once_what_is_stored_would_pass_the_bound(held: int, size: int, cap: int) -> None:
    verdict = verdicts.stored(Limits(stored_bytes_per_principal=cap), held, size)
    assert (verdict is None) == (held + max(size, 1) <= cap)  # a POST (size 0) stores at least its answer
    if verdict is not None:
        assert verdict.status == 429 and verdict.retry_after == verdicts.STORAGE_RETRY_SECONDS
        assert verdict.data() == verdict.body()["error"]["data"]
        _names_its_limit(verdict, "stored_bytes_per_principal", cap)


@given(held=st.integers(0, 5000), keys=st.integers(1, 500), cap=st.integers(1, 5000))
def test_keys_are_refused_when_the_posts_first_uses_would_pass_the_cap(held: int, keys: int, cap: int) -> None:
    verdict = verdicts.new_keys(Limits(idempotency_keys_per_principal=cap), held, keys)
    assert (verdict is None) == (held + keys <= cap)
    if verdict is not None:
        assert verdict.status == 429 and verdict.retry_after
        _names_its_limit(verdict, "idempotency_keys_per_principal", cap)
