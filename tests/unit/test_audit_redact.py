"""The audit's redactor: credentials after ``Bearer``/``Basic`` go, a challenge's parameters stay readable."""

from __future__ import annotations

import pytest

from mcp_lossless.audit.redact import Redactor


def test_a_challenge_keeps_its_parameters() -> None:
    challenge = (
        'Bearer error="insufficient_scope", error_description="task t not delivered", '
        'resource="http://127.0.0.1:8000/mcp/tools/fetch", resource_metadata="http://127.0.0.1:8000/.well-known/x"'
    )
    assert Redactor().scrub(f"WWW-Authenticate: {challenge}") == f"WWW-Authenticate: {challenge}"
    assert Redactor().scrub('Bearer realm="mcp", scope="a b"') == 'Bearer realm="mcp", scope="a b"'


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("authorization: Bearer opaque-t0ken.value==", "authorization: Bearer [redacted]"),
        ('{"authorization": "Bearer abc=="}', '{"authorization": "Bearer [redacted]"}'),
        ("Authorization: Basic ZGV2OnNlY3JldA==", "Authorization: Basic [redacted]"),
        ("bearer errorcode123", "bearer [redacted]"),
    ],
)
def test_credentials_after_a_scheme_are_still_redacted(text: str, scrubbed: str) -> None:
    assert Redactor().scrub(text) == scrubbed
