"""``--dev-keys``: replicas sharing one private JWKS file accept each other's dev tokens; bad input is explained."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mcp_lossless.devauth.keys import SigningKeys
from mcp_lossless.devauth.server import DevAuthServer
from mcp_lossless.server.auth import InvalidToken, JwtVerifier, StaticJwks

pytestmark = pytest.mark.anyio

ISSUER = "http://127.0.0.1:9/dev-as"
AUDIENCE = "http://127.0.0.1:9/mcp"
REPO_ROOT = Path(__file__).resolve().parents[2]


def dev_as(signing: SigningKeys | None) -> DevAuthServer:
    return DevAuthServer(ISSUER, resources=[AUDIENCE], aggregate=AUDIENCE, clients={}, signing=signing)


async def test_replicas_with_one_keys_file_verify_each_others_tokens(tmp_path: Path) -> None:
    path = tmp_path / "dev-keys.json"
    with ThreadPoolExecutor(4) as pool:  # replicas starting together: one file, whoever writes it first
        keys = list(pool.map(SigningKeys.shared, [path] * 4))
    signer, verifier_side = dev_as(keys[0]), dev_as(keys[3])
    stranger = dev_as(None)

    verifier = JwtVerifier(ISSUER, StaticJwks(verifier_side.keys))
    for alg in ("RS256", "ES256"):
        token = signer.mint(subject="alice", client_id="c", audience=[AUDIENCE], alg=alg)
        grant = await verifier.verify(token)
        assert grant.principal.subject == "alice"
    with pytest.raises(InvalidToken):
        await verifier.verify(stranger.mint(subject="alice", client_id="c", audience=[AUDIENCE]))

    check_keys_file(path)


def check_keys_file(path: Path) -> None:
    document = json.loads(path.read_text())
    assert {k["alg"] for k in document["keys"]} == {"RS256", "ES256"}
    assert all("d" in k for k in document["keys"]), "the file holds private keys"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file left behind"


def test_unusable_keys_files_are_refused_with_a_reason(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    with pytest.raises(ValueError, match="not a JWKS of private keys"):
        SigningKeys.shared(garbage)

    public = tmp_path / "public.json"
    SigningKeys.shared(tmp_path / "private.json")
    document = json.loads((tmp_path / "private.json").read_text())
    public_parts = {"kty", "n", "e", "crv", "x", "y", "kid", "alg", "use"}
    stripped = [{k: v for k, v in key.items() if k in public_parts} for key in document["keys"]]
    public.write_text(json.dumps({"keys": stripped}))
    with pytest.raises(ValueError, match="private part"):
        SigningKeys.shared(public)

    rsa_only = tmp_path / "rsa-only.json"
    rsa_only.write_text(json.dumps({"keys": [k for k in document["keys"] if k["alg"] == "RS256"]}))
    with pytest.raises(ValueError, match="no private signing key for ES256"):
        SigningKeys.shared(rsa_only)

    nowhere = tmp_path / "missing" / "keys.json"
    with pytest.raises(ValueError, match=f"dev keys {nowhere}: cannot create it"):
        SigningKeys.shared(nowhere)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--store", "redis://127.0.0.1:9?retention_seconds=soon"], "retention_seconds='soon' is not a valid float"),
        (["--store", "redis://127.0.0.1:9?prefix={x}"], "free of '{' and '}'"),
        (["--store", "postgres://db"], "unknown store 'postgres://db'"),
        (["--dev-keys", "KEYS"], "not a JWKS of private keys"),
        (["--dev-keys", "NO_DIR/keys.json"], "cannot create it"),
    ],
)
def test_serve_explains_bad_store_and_keys_flags_without_a_traceback(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text("{}")
    args = [str(keys) if flag == "KEYS" else flag.replace("NO_DIR", str(tmp_path / "missing")) for flag in flags]
    command = [sys.executable, "-m", "mcp_lossless", "serve", "--port", "9", *args]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2  # a bad flag's value, like every other usage error
    assert "mcp-lossless serve: " in done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
