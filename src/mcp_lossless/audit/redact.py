"""Keeping secrets out of audit evidence: every token and client secret is replaced by a label before output."""

from __future__ import annotations

import re
from typing import Any

JWT_PATTERN = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
"""Any compact JWS, even one the audit was never told about (e.g. echoed back by a server)."""

CHALLENGE_PARAMS = "realm|scope|error|error_description|error_uri|resource|resource_metadata"
BEARER_PATTERN = re.compile(rf"(?i)\b(bearer|basic)\s+(?!(?:{CHALLENGE_PARAMS})=)[A-Za-z0-9._~+/=-]+")
"""A credential after its scheme; a ``WWW-Authenticate`` challenge's parameters (RFC 6750, RFC 9728) are evidence,
not secrets, and stay readable."""


class Redactor:
    """Knows the secrets of one audit run by value and replaces each with ``[redacted <label>]``."""

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}

    def register(self, secret: str, label: str) -> None:
        if secret:
            self._secrets.setdefault(secret, label)

    def label_of(self, secret: str) -> str:
        return self._secrets.get(secret, "secret")

    def scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, f"[redacted {self._secrets[secret]}]")
        text = JWT_PATTERN.sub("[redacted jwt]", text)
        return BEARER_PATTERN.sub(lambda m: f"{m.group(1)} [redacted]", text)

    def scrub_all(self, value: Any) -> Any:
        """``value`` with every string inside it scrubbed (dicts, lists and tuples are walked)."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub(str(k)): self.scrub_all(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_all(v) for v in value]
        return value


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"
