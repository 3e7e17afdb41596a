"""Pure helpers of the client: reconnect delays, challenges, discovery order, unverified audience, PKCE."""

from __future__ import annotations

import base64
import hashlib
import random
import socket
import ssl
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.client.errors import describe_failure, unreachable
from mcp_lossless.client.oauth import (
    Challenge,
    authorization_server_metadata_urls,
    parse_challenge,
    pkce_pair,
    protected_resource_metadata_urls,
    unverified_audience,
)
from mcp_lossless.client.transport import (
    RECONNECT_WINDOW,
    REISSUE_BACKOFF,
    Backoff,
    HttpTransport,
    ReconnectWindow,
)
from mcp_lossless.core.actions import CallSpec, RecoveryPolicy, Resume
from mcp_lossless.core.ledger import Ledger
from mcp_lossless.core.sse import SseEvent


def test_first_reconnect_waits_exactly_the_server_retry() -> None:
    backoff = Backoff(initial=0.5, factor=2, maximum=10, jitter=0.25)
    assert backoff.delay(0, 500, 0.99) == 0.5
    assert backoff.delay(0, None, 0.99) == 0.5
    assert backoff.delay(0, 2000, 0.0) == 2.0


class _Chunks:
    """A response whose body arrives in the given chunks."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks
        self.status_code = 200
        self.headers: dict[str, str] = {"content-type": "text/event-stream"}

    async def aread(self) -> bytes:
        return b"".join(self.chunks)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


@pytest.mark.anyio
async def test_a_retry_in_a_block_of_its_own_reaches_the_reconnect_delay() -> None:
    # a block of retry: alone dispatches no event; its reconnection time was decoded, then never read
    transport = HttpTransport("http://127.0.0.1:9/mcp", httpx.AsyncClient())
    response = _Chunks(b"id: p1\ndata: \n\n", b"retry: 2500\n\n")
    read = [item async for item in transport.events(response)]
    assert read == [([SseEvent("message", "", "p1")], "p1", None), ([], "p1", 2500)]
    ledger = Ledger("p")
    _, (send,) = ledger.begin(CallSpec("tools/call", {"name": "fetch", "arguments": {}}))
    for events, last_event_id, reconnection_ms in read:
        ledger.received(send.link, events, last_event_id, reconnection_ms)
    (resume,) = ledger.ended(send.link, "server closed")
    assert isinstance(resume, Resume) and resume.cursor == "p1" and resume.retry_ms == 2500
    assert Backoff().delay(resume.attempt, resume.retry_ms, 0.5) == 2.5


@given(st.integers(1, 30), st.one_of(st.none(), st.integers(0, 60_000)), st.floats(0, 1, exclude_max=True))
def test_later_reconnects_back_off_but_never_below_retry_nor_above_cap(
    attempt: int, retry_ms: int | None, rand: float
) -> None:
    backoff = Backoff(initial=0.5, factor=2, maximum=10, jitter=0.25)
    base = retry_ms / 1000 if retry_ms is not None else 0.5
    delay = backoff.delay(attempt, retry_ms, rand)
    assert delay >= base
    assert delay <= max(base, 10)


def test_backoff_grows() -> None:
    backoff = Backoff(initial=0.1, factor=2, maximum=10, jitter=0)
    assert [backoff.delay(n, None, 0.5) for n in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.6]


class _Fixed(random.Random):
    """An rng whose every draw is ``value``: the jitter chosen by the test."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_reissues_to_a_restarting_server_back_off_until_the_window_is_spent() -> None:
    window = ReconnectWindow(Backoff(initial=1, factor=2, maximum=4, jitter=0), _Fixed(0.5), window=10)
    waits = [window.next_wait(float("inf")) for _ in range(5)]
    assert waits == [1, 2, 4, 3, None], "the last wait is cut to the window, then the call gives up"
    window.reset()
    assert window.next_wait(float("inf")) == 1, "a try that reached the server starts a fresh window"


def test_the_injected_rng_jitters_the_waits() -> None:
    backoff = Backoff(initial=1, factor=2, maximum=8, jitter=0.5)
    window = ReconnectWindow(backoff, _Fixed(0.5), window=100)
    assert [window.next_wait(float("inf")) for _ in range(3)] == [1, 1.5, 3]


def test_a_wait_that_would_outlast_the_calls_deadline_gives_up_now() -> None:
    window = ReconnectWindow(Backoff(initial=1, factor=2, maximum=4, jitter=0), _Fixed(0.0), window=10)
    assert window.next_wait(5) == 1
    assert window.next_wait(2) is None, "a 2 s wait with 2 s left would end the call as its deadline"
    assert window.waited == 1 and window.failures == 1, "giving up spends nothing"


def test_the_default_window_is_spent_within_the_keyed_reissue_bound() -> None:
    # the most jitter gives the shortest waits, so the most re-issues: the bound must not end the window first
    window = ReconnectWindow(REISSUE_BACKOFF, _Fixed(0.999999))
    waits = list(iter(lambda: window.next_wait(float("inf")), None))
    assert sum(waits) == pytest.approx(RECONNECT_WINDOW)
    assert len(waits) < RecoveryPolicy().max_keyed_reissues


def test_parse_our_refusal_challenge() -> None:
    header = (
        'Bearer error="insufficient_scope", error_description="token audience does not cover x, \\"y\\"", '
        'resource="https://a/mcp/tools/fetch https://a/mcp/tools/search", '
        'resource_metadata="https://a/.well-known/oauth-protected-resource/mcp/tools/fetch"'
    )
    assert parse_challenge(header) == Challenge(
        error="insufficient_scope",
        description='token audience does not cover x, "y"',
        scope=None,
        resource_metadata="https://a/.well-known/oauth-protected-resource/mcp/tools/fetch",
        resources=("https://a/mcp/tools/fetch", "https://a/mcp/tools/search"),
    )


def test_parse_challenge_edge_cases() -> None:
    assert parse_challenge(None) is None
    assert parse_challenge('Basic realm="x"') is None
    assert parse_challenge("Bearer") == Challenge()
    assert parse_challenge("bearer scope=read, error=invalid_token") == Challenge(error="invalid_token", scope="read")


def test_protected_resource_metadata_order() -> None:
    assert protected_resource_metadata_urls("https://h:8/mcp", "https://h:8/custom/prm") == [
        "https://h:8/custom/prm",
        "https://h:8/.well-known/oauth-protected-resource/mcp",
        "https://h:8/.well-known/oauth-protected-resource",
    ]
    assert protected_resource_metadata_urls("https://h/") == ["https://h/.well-known/oauth-protected-resource"]


def test_authorization_server_metadata_order() -> None:
    assert authorization_server_metadata_urls("https://as.example/tenant1") == [
        "https://as.example/.well-known/oauth-authorization-server/tenant1",
        "https://as.example/.well-known/openid-configuration/tenant1",
        "https://as.example/tenant1/.well-known/openid-configuration",
    ]
    assert authorization_server_metadata_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration",
    ]


def _jwt(claims: object) -> str:
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(value)).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}.sig"


def test_unverified_audience() -> None:
    assert unverified_audience(_jwt({"aud": "HTTPS://A.example/mcp/"})) == frozenset({"https://a.example/mcp"})
    assert unverified_audience(_jwt({"aud": ["https://a/x", "https://a/y"]})) == frozenset(
        {"https://a/x", "https://a/y"}
    )
    assert unverified_audience(_jwt({"sub": "x"})) is None
    assert unverified_audience("opaque-token") is None
    assert unverified_audience("a.!!!.c") is None


def test_pkce_pair_is_s256() -> None:
    verifier, challenge = pkce_pair()
    assert 43 <= len(verifier) <= 128
    expected = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert challenge == expected
    assert pkce_pair()[0] != verifier


def _raised(exc: BaseException, cause: Exception) -> BaseException:
    """``exc`` as httpx raises it: the OS error that made it is its cause (one for every address anyio tried)."""
    try:
        try:
            raise OSError("All connection attempts failed") from ExceptionGroup("attempts", [cause])
        except OSError as os_error:
            raise exc from os_error
    except BaseException as raised:
        return raised


def _tls_error() -> ssl.SSLError:
    error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    error.reason = "WRONG_VERSION_NUMBER"  # set by the ssl module on the errors it raises
    return error


def _untrusted() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    error.verify_message = "self-signed certificate"
    return error


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (_raised(httpx.ConnectError("All attempts failed"), ConnectionRefusedError(111, "x")), "connection refused"),
        (_raised(httpx.ConnectError("[Errno -2]"), socket.gaierror(-2, "x")), "the host name did not resolve"),
        (_raised(httpx.ConnectError("[SSL]"), _tls_error()),
         "the TLS handshake failed (WRONG_VERSION_NUMBER: a plain http:// server?)"),
        (_raised(httpx.ConnectError("[SSL]"), _untrusted()),
         "its TLS certificate was not accepted (self-signed certificate)"),
        (httpx.ConnectTimeout(""), "connecting timed out"),
        (httpx.ReadError(""), "the connection broke while reading the response"),
        (httpx.ReadTimeout(""), "the server sent nothing within the read timeout"),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."),
         "the server broke off the HTTP exchange: Server disconnected without sending a response."),
        (EOFError(), "input ended"),
        (ValueError("no such user"), "ValueError: no such user"),
    ],
)  # fmt: skip
def test_failures_are_described_in_words_never_as_a_repr(exc: BaseException, words: str) -> None:
    assert describe_failure(exc) == words
    assert "Error(" not in describe_failure(exc)


def test_an_unreachable_server_is_named_with_what_to_check() -> None:
    failure = unreachable("http://127.0.0.1:9/mcp", _raised(httpx.ConnectError("x"), ConnectionRefusedError(111, "x")))
    assert failure.reason == (
        "cannot reach http://127.0.0.1:9/mcp: connection refused; check that the server is running at that URL"
    )
