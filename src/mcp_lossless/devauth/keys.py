"""The development AS's signing keys: one RSA and one EC key per generation, all generations published."""

from __future__ import annotations

import secrets
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, Key, KeyParameters, KeySet, RSAKey

SIGNING_ALGORITHMS = ("RS256", "ES256")


def _generate(alg: str) -> Key:
    kid = f"{alg.lower()}-{secrets.token_hex(6)}"
    params: KeyParameters = {"kid": kid, "use": "sig", "alg": alg}
    if alg == "RS256":
        return RSAKey.generate_key(2048, parameters=params)
    return ECKey.generate_key("P-256", parameters=params)


class SigningKeys:
    """Keys generated at start; :meth:`rotate` adds a newer pair that signs from then on.

    Older keys stay in the JWKS so tokens signed before a rotation keep verifying, like a real AS.
    """

    def __init__(self) -> None:
        self._current: dict[str, Key] = {}
        self._all: list[Key] = []
        self.rotate()

    def rotate(self) -> None:
        fresh = {alg: _generate(alg) for alg in SIGNING_ALGORITHMS}
        self._current = fresh
        self._all = [*fresh.values(), *self._all]

    def current_kid(self, alg: str) -> str:
        return str(self._current[alg].kid)

    @property
    def public(self) -> KeySet:
        return KeySet.import_key_set(self.jwks())

    def jwks(self) -> Any:
        return KeySet(self._all).as_dict(private=False)

    def sign(self, claims: dict[str, Any], alg: str = "RS256") -> str:
        key = self._current[alg]
        header = {"alg": alg, "typ": "at+jwt", "kid": key.kid}
        return jwt.encode(header, claims, key, algorithms=[alg])
