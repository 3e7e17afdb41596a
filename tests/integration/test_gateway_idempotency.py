"""Idempotency keys through the gateway (issue 28, ADR 0033), over real HTTP with real dev-AS JWTs and real processes:
an upstream tool runs at most once per client key, across a gateway SIGKILL restart on SQLite and a replica change
on Redis, whether the upstream records keys itself (this project's server, which declares ``tools.idempotency``)
or not (the official Python SDK's server, which does not). Each upstream counts its own runs: ours appends a line per
run of ``charge`` to a file, the SDK's server logs every ``tools/call`` it receives (it has no keys: each one runs)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.core.errors import EXECUTION_LOST, IDEMPOTENCY_IN_PROGRESS
from mcp_lossless.core.idempotency import IN_PROGRESS, KEY_PARAM, REPLAYED_META_KEY
from tests.support.charging import charging_module, runs_of
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.modern_http import ModernPeer, answer
from tests.support.processes import ServerProcess, cli_server, free_port
from tests.support.upstreams import SdkHttpUpstream

pytestmark = pytest.mark.anyio

STARTUP = 90
"""A gateway's start connects to both upstreams: on a box shared by several test runs that took a while."""
CLIENTS = ["--dev-client", "dev-client:dev-secret", "--dev-client", "mallory:mallory-secret"]
MALLORY = ("mallory", "mallory-secret")
SDK_TOKEN = "sdk-upstream-token"
RUNNING = {"notifications/progress", "notifications/message"}
"""What the upstream tool sends once it runs (the SDK's logs its start, ours reports its first step): either
arriving on the gateway's stream means the upstream runs the call."""


@dataclass
class Upstreams:
    """Both upstreams, shared by the module's gateways: each test uses labels of its own."""

    ours: ServerProcess
    runs: Path
    sdk: SdkHttpUpstream
    config: Path

    def ran(self, exposed: str, label: str) -> int:
        """How many times the upstream of ``exposed`` ran its tool for ``label``."""
        if exposed == "ours_charge":
            return runs_of(self.runs).count(label)
        calls = [m for m in self.sdk.messages() if m["method"] == "tools/call"]
        return sum(1 for m in calls if m["params"]["arguments"].get("label") == label)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    """Our server (SQLite, declares keys) and the SDK's (no keys), and the gateway's config naming both."""
    root = tmp_path_factory.mktemp("upstreams")
    module, runs = charging_module(root)
    args = [f"{module}:tools", "--store", f"sqlite:{root / 'upstream.db'}", "--retry-ms", "100"]
    sdk = SdkHttpUpstream(free_port(), root / "sdk.jsonl", SDK_TOKEN)
    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(cli_server(args, root / "ours.log"))
        sdk.start()
        stack.callback(sdk.stop)
        os.environ["GW_OURS_SECRET"], os.environ["GW_SDK_TOKEN"] = "dev-secret", SDK_TOKEN  # the gateway's own
        stack.callback(os.environ.pop, "GW_OURS_SECRET", None)
        stack.callback(os.environ.pop, "GW_SDK_TOKEN", None)
        config = root / "gateway.toml"
        config.write_text(
            f'[[upstream]]\nname = "ours"\nurl = "{ours.base}/mcp"\n'
            'auth = { client_id = "dev-client", secret_env = "GW_OURS_SECRET" }\n\n'
            f'[[upstream]]\nname = "sdk"\nurl = "{sdk.url}"\n'
            'auth = { bearer_env = "GW_SDK_TOKEN" }\nallow = ["work"]\n'
        )
        yield Upstreams(ours, runs, sdk, config)


def gateway_args(upstreams: Upstreams, store: str, *more: str) -> list[str]:
    return ["--config", str(upstreams.config), "--store", store, "--retry-ms", "100", *CLIENTS, *more]


def keyed(request_id: int, exposed: str, label: str, steps: int, key: str) -> dict[str, Any]:
    """A keyed call of ``exposed`` (either upstream's tool) doing ``label``'s work in ``steps`` steps."""
    arguments: dict[str, Any] = {"amount": label} if exposed == "ours_charge" else {"label": label, "delay_ms": 200}
    message = call(request_id, exposed, progress="p", steps=steps, **arguments)
    message["params"][KEY_PARAM] = key
    return message


def text_of(answer: dict[str, Any]) -> str:
    text: str = answer["result"]["content"][0]["text"]
    return text


async def fresh_peer(
    http: httpx.AsyncClient, base: str, resource: str, client: tuple[str, str] = ("dev-client", "dev-secret")
) -> Peer:
    """A new session with a new real JWT; the gateway declares keys (its own store records them)."""
    peer = Peer(http, base, await dev_token(http, base, resource, client=client))
    assert (await peer.initialize())["capabilities"]["tools"]["idempotency"] == {}
    return peer


def assert_after_the_loss(exposed: str, answer: dict[str, Any], label: str, key: str) -> None:
    """What a duplicate of a call whose gateway died during the upstream's run gets. From an upstream that dedups
    keys, the outcome of its one run (the gateway runs the key again and the upstream answers the key it passed
    on from its own record: replayed there); from one that does not, execution lost naming the key."""
    if exposed == "ours_charge":
        assert text_of(answer) == f"charged {label}", answer
        assert answer["result"]["_meta"][REPLAYED_META_KEY] is True, "the upstream's replay: it did not run again"
        return
    assert answer["error"]["code"] == EXECUTION_LOST, answer
    assert answer["error"]["data"] == {"reason": "execution_lost", KEY_PARAM: key, "resumable": False}


async def until_not_in_progress(peer: Peer, message: dict[str, Any], deadline_seconds: float) -> dict[str, Any]:
    """The duplicate's answer once it is no longer "in progress", asking again after each ``retryAfter`` as the SEP
    tells a client to (the owner's lease, not this test, decides when)."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        answer = (await peer.post(message)).messages[-1]
        error = answer.get("error")
        if error is None or error["code"] != IDEMPOTENCY_IN_PROGRESS or time.monotonic() > deadline:
            return answer
        assert error["data"]["type"] == IN_PROGRESS
        await anyio.sleep(error["data"]["retryAfter"])


async def test_the_gateway_passes_a_principals_key_on_only_to_an_upstream_that_declares_keys(
    upstreams: Upstreams, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """The gateway declares keys in both eras (its own store records them for every upstream's tools). On the memory
    store a restarted gateway has forgotten its keys: the upstream that records keys still knows
    the one the gateway derived from the client's (the same on every gateway process), so the tool does not run
    again; another principal's same key string is another key there too; the SDK's server is never sent one."""
    key = str(uuid.uuid4())
    args = gateway_args(upstreams, "memory")
    with cli_server(args, tmp_path / "first.log", command="gateway", timeout=STARTUP) as first:
        peer = await fresh_peer(http, first.base, f"{first.base}/mcp")
        discovered = answer(await ModernPeer(http, first.base, peer.token).request("server/discover"))
        assert discovered["result"]["capabilities"]["tools"] == {"listChanged": True, "idempotency": {}}, "both eras"
        answered = (await peer.post(keyed(1, "ours_charge", "forwarded", 1, key))).messages[-1]
        assert text_of(answered) == "charged forwarded"
        assert REPLAYED_META_KEY not in answered["result"].get("_meta", {}), "its first run"
        sdk_answer = (await peer.post(keyed(2, "sdk_work", "unkeyed-upstream", 1, key + "-sdk"))).messages[-1]
        assert text_of(sdk_answer) == "work unkeyed-upstream done"
    with cli_server(args, tmp_path / "second.log", port=first.port, command="gateway", timeout=STARTUP) as second:
        again = await fresh_peer(http, second.base, f"{second.base}/mcp")
        replayed = (await again.post(keyed(3, "ours_charge", "forwarded", 1, key))).messages
        assert [m.get("method") for m in replayed] == [None], "no progress: the upstream did not run it again"
        assert text_of(replayed[-1]) == "charged forwarded"
        assert replayed[-1]["result"]["_meta"][REPLAYED_META_KEY] is True, "the upstream's replay, passed on"
        mallory = await fresh_peer(http, second.base, f"{second.base}/mcp", MALLORY)
        own = (await mallory.post(keyed(4, "ours_charge", "forwarded", 1, key))).messages[-1]
        assert REPLAYED_META_KEY not in own["result"].get("_meta", {}), "another principal's key: a new call"
    assert upstreams.ran("ours_charge", "forwarded") == 2, (
        "once for the client (not again after the restart), once for mallory"
    )
    sent = [m["params"] for m in upstreams.sdk.messages() if m["method"] == "tools/call"]
    ours = [p for p in sent if p["arguments"].get("label") == "unkeyed-upstream"]
    assert len(ours) == 1 and KEY_PARAM not in ours[0], "no key to an upstream that does not declare keys"


@pytest.mark.parametrize("exposed", ["ours_charge", "sdk_work"])
async def test_a_sigkilled_sqlite_gateway_never_runs_a_key_twice(
    exposed: str, upstreams: Upstreams, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """Killed while the upstream ran the call: the gateway's record of the key survived, its owner died, so the
    duplicate after the restart (and every later one) never runs the upstream tool a second time: it gets the
    upstream's outcome from an upstream that dedups the key, else execution lost naming the key. A key answered
    before the kill is replayed from the gateway's store without reaching the upstream."""
    args = gateway_args(upstreams, f"sqlite:{tmp_path / 'gateway.db'}")
    done, killed = f"done-{exposed}", f"killed-{exposed}"
    done_key, killed_key = str(uuid.uuid4()), str(uuid.uuid4())
    with cli_server(args, tmp_path / "first.log", command="gateway", timeout=STARTUP) as first:
        peer = await fresh_peer(http, first.base, f"{first.base}/mcp")
        answered = (await peer.post(keyed(1, exposed, done, 1, done_key))).messages[-1]
        assert "result" in answered, answered
        started = await peer.post(keyed(2, exposed, killed, 50, killed_key), stop_after=2)  # priming + the tool's first
        assert started.status == 200 and started.messages[-1]["method"] in RUNNING
        first.kill()  # SIGKILL while the upstream runs the call

    with cli_server(args, tmp_path / "second.log", port=first.port, command="gateway", timeout=STARTUP) as second:
        again = await fresh_peer(http, second.base, f"{second.base}/mcp")
        lost = (await again.post(keyed(3, exposed, killed, 50, killed_key))).messages[-1]
        assert_after_the_loss(exposed, lost, killed, killed_key)
        again_lost = (await again.post(keyed(5, exposed, killed, 50, killed_key))).messages[-1]
        assert_after_the_loss(exposed, again_lost, killed, killed_key)
        modern = ModernPeer(http, second.base, again.token, tasks=False)  # the 2026-07-28 leg decides alike
        from_modern = answer(await modern.request("tools/call", keyed(6, exposed, killed, 50, killed_key)["params"]))
        assert_after_the_loss(exposed, from_modern, killed, killed_key)
        replayed = (await again.post(keyed(4, exposed, done, 1, done_key))).messages
        assert [m.get("method") for m in replayed] == [None], "no progress: nothing ran again"
        assert replayed[-1]["result"]["content"] == answered["result"]["content"]
        assert replayed[-1]["result"]["_meta"][REPLAYED_META_KEY] is True
    assert upstreams.ran(exposed, done) == 1 and upstreams.ran(exposed, killed) == 1, "each key ran once upstream"


@dataclass
class Replicas:
    """Two gateway processes on one Redis: one store prefix, one dev AS key file, one canonical URI."""

    a: ServerProcess
    b: ServerProcess
    canonical: str


@pytest.fixture
def replicas(redis_url: str, upstreams: Upstreams, tmp_path: Path) -> Iterator[Replicas]:
    """A dead replica's lease runs out after one second: then the other settles its calls (execution lost)."""
    store = f"{redis_url}?prefix=gw-{uuid.uuid4().hex[:12]}&lease_seconds=1.0"
    canonical = f"http://127.0.0.1:{free_port()}/mcp"
    shared = ["--dev-keys", str(tmp_path / "dev-keys.json"), "--public-url", canonical]
    args = gateway_args(upstreams, store, *shared)
    with (
        cli_server(args, tmp_path / "a.log", command="gateway", timeout=STARTUP) as a,
        cli_server(args, tmp_path / "b.log", command="gateway", timeout=STARTUP) as b,
    ):
        yield Replicas(a, b, canonical)


@pytest.mark.parametrize("exposed", ["ours_charge", "sdk_work"])
async def test_a_key_moved_to_another_gateway_replica_on_redis_runs_once(
    exposed: str, replicas: Replicas, upstreams: Upstreams, http: httpx.AsyncClient
) -> None:
    """The client re-issues on replica B what it sent to A: "in progress" while A runs it, then A's outcome
    replayed; and a call whose replica A was SIGKILLed mid-run is, once A's lease ran out, the upstream's outcome
    from an upstream that dedups the key, else execution lost naming the key: never a second upstream run."""
    token = await dev_token(http, replicas.a.base, replicas.canonical)
    on_a, on_b = Peer(http, replicas.a.base, token), Peer(http, replicas.b.base, token)
    for replica in (on_a, on_b):
        assert (await replica.initialize())["capabilities"]["tools"]["idempotency"] == {}
    moved, killed = f"moved-{exposed}", f"lost-{exposed}"
    key = str(uuid.uuid4())
    started = await on_a.post(keyed(1, exposed, moved, 5, key), stop_after=2)  # the upstream runs it for A
    busy = (await on_b.post(keyed(2, exposed, moved, 5, key))).messages[-1]
    assert busy["error"]["code"] == IDEMPOTENCY_IN_PROGRESS, busy
    assert busy["error"]["data"]["type"] == IN_PROGRESS and busy["error"]["data"][KEY_PARAM] == key
    answered = (await on_a.resume(started.ids[-1])).messages[-1]
    assert "result" in answered, answered
    replayed = (await on_b.post(keyed(3, exposed, moved, 5, key))).messages
    assert [m.get("method") for m in replayed] == [None], "no progress: B did not call the upstream"
    assert replayed[-1]["result"]["content"] == answered["result"]["content"]
    assert replayed[-1]["result"]["_meta"][REPLAYED_META_KEY] is True

    lost_key = str(uuid.uuid4())
    running = await on_a.post(keyed(4, exposed, killed, 50, lost_key), stop_after=2)
    assert running.messages[-1]["method"] in RUNNING
    replicas.a.kill()  # SIGKILL while the upstream runs A's call
    lost = await until_not_in_progress(on_b, keyed(5, exposed, killed, 50, lost_key), 30)
    assert_after_the_loss(exposed, lost, killed, lost_key)
    assert upstreams.ran(exposed, moved) == 1 and upstreams.ran(exposed, killed) == 1, "each key ran once upstream"
