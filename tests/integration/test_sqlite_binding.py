"""How the SQLite store binds what it writes: an event's payload (``bytes``) through a registered adapter that
returns it unchanged, so ``sqlite3`` does not search the object's attributes for one per event."""

from __future__ import annotations

import sqlite3

import mcp_lossless.stores.sqlite  # noqa: F401  (registers the adapter)


def test_bytes_bind_through_an_identity_adapter() -> None:
    adapter = sqlite3.adapters.get((bytes, sqlite3.PrepareProtocol))
    assert adapter is not None
    payload = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert adapter(payload) is payload  # no copy
    db = sqlite3.connect(":memory:")
    try:
        (stored,) = db.execute("SELECT ?", (payload,)).fetchone()
        assert stored == payload and type(stored) is bytes  # still a BLOB
    finally:
        db.close()
