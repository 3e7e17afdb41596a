"""How the SQLite store binds what it writes, and what it leaves of ``sqlite3`` to the rest of the process.

An event's payload is bound as a ``bytearray``, which ``sqlite3`` binds as it is (it looks for an adapter for any
other type but ``int``, ``float`` and ``str``, ``bytes`` included), and is read back as ``bytes``. The store
registers no adapter: ``sqlite3``'s adapters are one registry per process, so one registered for ``bytes`` would
apply to every other user of ``sqlite3`` in the host application, and replace any adapter of its own.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

IMPORT_THE_STORES = """
import sqlite3
before = dict(sqlite3.adapters)
import mcp_lossless.stores.sqlite
import mcp_lossless.stores.tasks_sqlite
print(sorted(str(key[0]) for key in set(sqlite3.adapters) - set(before)))
"""


def test_importing_the_stores_registers_no_sqlite3_adapter() -> None:
    # it registered one for bytes at import, for every sqlite3 user of the process
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_STORES], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_bytearray_binds_as_a_blob_without_an_adapter() -> None:
    payload = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert (bytearray, sqlite3.PrepareProtocol) not in sqlite3.adapters
    db = sqlite3.connect(":memory:")
    try:
        (stored,) = db.execute("SELECT ?", (bytearray(payload),)).fetchone()
        assert stored == payload and type(stored) is bytes  # a BLOB, read back as bytes
    finally:
        db.close()
