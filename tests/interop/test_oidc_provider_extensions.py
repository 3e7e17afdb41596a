"""Issue 30 item 5: DPoP and ``private_key_jwt`` against a third-party authorization server, not only our dev AS.

The npm package ``oidc-provider`` 9.x (``peers/oidc_as.mjs``) has DPoP on by default: a token request carrying a
proof gets a JWT access token bound by ``cnf.jkt``; a client registered with a public JWK authenticates with
``private_key_jwt``. Our client gets its tokens there by itself, our server (requiring bound tokens) verifies them
with the provider's JWKS, and a bound token without its key is refused. (oidc-provider has no RFC 8693 token
exchange, so the gateway's exchange is tested against the dev AS only: tests/interop/test_gateway_exchange.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import jwt
import orjson
import pytest
from joserfc.jwk import ECKey

from mcp_lossless.client import AuthorizationFailed, Client, OAuth, PrivateKeyJwt
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolRegistry
from tests.support.mcp_http import Peer, call
from tests.support.oidc_as import oidc_provider
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

CLIENT = ("mcp-client", "mcp-secret")
KEYED = "mcp-keyed"
KEY = ECKey.generate_key("P-256")


@dataclass
class Stack:
    url: str
    base: str


def echo_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(idempotent=True, read_only=True)
    async def echo(text: str) -> str:
        return f"echo {text}"

    return registry


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sock = loopback_socket()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    url = f"{base}/mcp"
    log = tmp_path_factory.mktemp("oidc") / "oidc-provider.log"
    public = KEY.as_dict(private=False) | {"kid": "keyed", "alg": "ES256", "use": "sig"}
    with oidc_provider(
        {url: 300, f"{url}/tools/echo": 300}, dict([CLIENT]), log, keyed_clients={KEYED: public}
    ) as oidc:
        config = ServerConfig(port=sock.getsockname()[1], store="memory", issuer=oidc.issuer, require_dpop=True)
        with serve_app(create_app(config, echo_tools()), sock=sock, lifespan="on"):
            yield Stack(url, base)


async def test_oidc_provider_binds_our_clients_tokens_and_our_server_holds_them_to_the_key(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    auth = OAuth(*CLIENT)  # DPoP because the provider advertises ES256 proofs
    async with Client(stack.url, auth=auth, timeout=30) as client:
        assert (await client.call_tool("echo", {"text": "bound"})).text == "echo bound"
        token = await auth.token(frozenset())
    assert token is not None and auth.dpop_key is not None
    assert jwt.decode(token, options={"verify_signature": False})["cnf"] == {"jkt": auth.dpop_key.thumbprint}
    thief = Peer(http, stack.base, token)  # the token without the key, as Bearer
    response = await http.post(thief.url, headers=thief.headers(), content=orjson.dumps(call(1, "echo", text="x")))
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("DPoP")


async def test_private_key_jwt_signs_our_client_in_at_oidc_provider(stack: Stack) -> None:
    auth = OAuth(KEYED, client_key=PrivateKeyJwt(KEY.as_pem(private=True).decode()))
    async with Client(stack.url, auth=auth, timeout=30) as client:
        assert (await client.call_tool("echo", {"text": "keyed"})).text == "echo keyed"
    impostor = OAuth(KEYED, client_key=PrivateKeyJwt(ECKey.generate_key("P-256").as_pem(private=True).decode()))
    with pytest.raises(AuthorizationFailed, match="invalid_client"):
        async with Client(stack.url, auth=impostor, timeout=30):
            pass
