"""The consent step of the development AS: pending decisions, their CSRF binding, and the two HTML pages.

An authorization request that is not auto-approved is parked here under a random id, and the page that
shows it carries that id and a CSRF token. Only a POST that presents both, from the browser that got the
page (its ``dev_as_browser`` cookie), decides it, once: a ``decision=approve`` in a link or in a
cross-site form decides nothing. The pages may not be framed (``frame-ancestors 'none'``, ``X-Frame-Options``).
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Generic, TypeVar

from .grants import OAuthError

_STYLE = "body{font-family:sans-serif;max-width:40em;margin:2em auto}label{display:block;margin:.3em 0}"
CONSENT_TTL = 600.0
MAX_PENDING = 1000
BROWSER_COOKIE = "dev_as_browser"
PAGE_HEADERS = (
    (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)

T = TypeVar("T")


@dataclass(slots=True)
class _Pending(Generic[T]):
    request: T
    csrf: str
    browser: str
    expires_at: float


class PendingConsents(Generic[T]):
    """Authorization requests waiting for the resource owner, bounded in number and in time."""

    def __init__(self, clock: Callable[[], float], max_pending: int = MAX_PENDING, ttl: float = CONSENT_TTL) -> None:
        self._clock = clock
        self._max = max_pending
        self._ttl = ttl
        self._pending: OrderedDict[str, _Pending[T]] = OrderedDict()

    def park(self, request: T, browser: str) -> tuple[str, str]:
        """Keep ``request`` for the browser ``browser``; the consent id and CSRF token for its page."""
        self._sweep()
        while len(self._pending) >= self._max:
            self._pending.popitem(last=False)  # the oldest undecided request lapses first
        consent_id, csrf = secrets.token_urlsafe(24), secrets.token_urlsafe(32)
        self._pending[consent_id] = _Pending(request, csrf, browser, self._clock() + self._ttl)
        return consent_id, csrf

    def take(self, consent_id: str, csrf: str, browser: str | None) -> T:
        """The parked request, removed (a decision is made once); ``invalid_request`` unless all three match."""
        self._sweep()
        pending = self._pending.get(consent_id)
        if (
            pending is None
            or browser is None
            or not hmac.compare_digest(pending.csrf.encode(), csrf.encode())
            or not hmac.compare_digest(pending.browser.encode(), browser.encode())
        ):
            raise OAuthError("invalid_request", "consent expired, already decided, or not from the consent page")
        del self._pending[consent_id]
        return pending.request

    def __len__(self) -> int:
        return len(self._pending)

    def _sweep(self) -> None:
        now = self._clock()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.expires_at > now:
                break
            self._pending.popitem(last=False)


def consent_page(
    action: str,
    consent_id: str,
    csrf: str,
    client: str,
    subject: str,
    resources: tuple[tuple[str, bool], ...],
    scope: str,
) -> bytes:
    """The form: who signs in, which resources (each a checkbox, ticked when requested), approve or deny."""
    boxes = "".join(
        f'<label><input type="checkbox" name="resource" value="{escape(r)}"{" checked" if ticked else ""}> '
        f"<code>{escape(r)}</code></label>"
        for r, ticked in resources
    )
    scopes = f"<p>scope: <code>{escape(scope)}</code></p>" if scope else ""
    return (
        f"<!doctype html><html><head><title>Authorize {escape(client)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>Authorize <code>{escape(client)}</code></h1>"
        f'<form method="post" action="{escape(action)}">'
        f'<input type="hidden" name="consent" value="{escape(consent_id)}">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<label>Sign in as <input name="subject" value="{escape(subject)}" required></label>'
        f"<p>Grant access to:</p>{boxes}{scopes}"
        '<button name="decision" value="approve">Approve</button> '
        '<button name="decision" value="deny">Deny</button></form></body></html>'
    ).encode()


def error_page(description: str) -> bytes:
    return (
        f"<!doctype html><html><head><title>Authorization request rejected</title><style>{_STYLE}</style>"
        f"</head><body><h1>Authorization request rejected</h1><p>{escape(description)}</p></body></html>"
    ).encode()
