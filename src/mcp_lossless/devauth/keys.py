"""The development AS's signing keys: one RSA and one EC key per generation, all generations published."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
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

    def __init__(self, keys: list[Key] | None = None) -> None:
        """Fresh keys, or ``keys`` newest first (the first key of each algorithm signs)."""
        self._current: dict[str, Key] = {}
        self._all: list[Key] = []
        if keys is None:
            self.rotate()
            return
        self._all = list(keys)
        for key in reversed(self._all):
            self._current[str(key.alg)] = key
        missing = set(SIGNING_ALGORITHMS) - self._current.keys()
        if missing:
            raise ValueError(f"no private signing key for {', '.join(sorted(missing))}")

    @classmethod
    def shared(cls, path: str | Path) -> SigningKeys:
        """Keys kept in a private JWKS file, created if missing, so several replicas sign and verify alike.

        The file is created whole and only once (written aside, then hard-linked into place), so replicas
        starting together all end up with the keys of whichever created it first.
        """
        path = Path(path)
        if not path.exists():
            fresh = KeySet(cls()._all).as_dict(private=True)
            try:
                descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            except OSError as exc:  # a missing or read-only directory: said as a bad flag, not a traceback
                raise ValueError(f"dev keys {path}: cannot create it ({exc.strerror or exc})") from exc
            try:
                with os.fdopen(descriptor, "w") as handle:
                    json.dump(fresh, handle)
                os.link(temporary, path)
            except FileExistsError:
                pass
            finally:
                os.unlink(temporary)
        try:
            keys = KeySet.import_key_set(json.loads(path.read_text())).keys
        except (OSError, ValueError, TypeError, KeyError, JoseError) as exc:
            raise ValueError(f"dev keys {path}: not a JWKS of private keys ({exc})") from exc
        if not all(key.is_private for key in keys):
            raise ValueError(f"dev keys {path}: every key must include its private part")
        try:
            return cls(keys)
        except ValueError as exc:
            raise ValueError(f"dev keys {path}: {exc}") from None

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

    def verified(self, token: str) -> dict[str, Any] | None:
        """The claims of an access token signed by one of these keys (``typ`` at+jwt), else ``None``: what a token
        exchange's subject token must be. Only the signature and type are checked here; the claims are the
        caller's to judge."""
        try:
            decoded = jwt.decode(token, self.public, algorithms=list(SIGNING_ALGORITHMS))
        except (JoseError, ValueError):
            return None
        return dict(decoded.claims) if decoded.header.get("typ") == "at+jwt" else None

    def sign(self, claims: dict[str, Any], alg: str = "RS256") -> str:
        key = self._current[alg]
        header = {"alg": alg, "typ": "at+jwt", "kid": key.kid}
        return jwt.encode(header, claims, key, algorithms=[alg])
