"""A token command for ``mcp-lossless audit --token-command``: signs a token with a dev AS's key file.

The embedded AS's token endpoint refuses resources it does not know, so it cannot mint the foreign-
audience token of the wrong-audience check; this signs any audience with the same keys (shared via
``ServerConfig.dev_keys``), exactly as an AS serving several resource servers would::

    python dev_token_command.py KEYS ISSUER CLIENT_ID RESOURCE [RESOURCE ...]
"""

from __future__ import annotations

import secrets
import sys
import time

from mcp_lossless.devauth.keys import SigningKeys

TTL_SECONDS = 300


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    keys, issuer, client_id, *audience = argv
    now = int(time.time())
    claims = {
        "iss": issuer,
        "sub": client_id,
        "client_id": client_id,
        "aud": audience[0] if len(audience) == 1 else audience,
        "iat": now,
        "exp": now + TTL_SECONDS,
        "jti": secrets.token_urlsafe(12),
    }
    print(SigningKeys.shared(keys).sign(claims))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
