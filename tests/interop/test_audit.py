"""``mcp-lossless audit`` against our server (nothing to report), the official SDK server (its hazards), the
SDK's modern leg alone, FastMCP with ``fastmcp-tasks`` (the task checks' verdicts on the one tasks runtime), and
the report's rendering and redaction."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.audit.redact import Redactor
from mcp_lossless.audit.report import (
    CHECKS,
    EXIT_NOT_RUN,
    AuditReport,
    CheckResult,
    report_document,
    to_markdown,
)
from mcp_lossless.audit.tokens import ClientCredentialsGrant
from mcp_lossless.audit.wire import Credential, Exchange, Wire, WireEvent, all_answered, call_message
from mcp_lossless.cli import main
from mcp_lossless.core.idempotency import CONFLICT, IN_PROGRESS, REPLAYED_META_KEY
from mcp_lossless.core.tasks import Purpose
from mcp_lossless.devauth import DevAuthServer
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.interop.peers.sdk_modern_server import modern_only_sdk_server
from tests.interop.peers.sdk_resumable_server import CLIENTS as SDK_CLIENTS
from tests.interop.peers.sdk_resumable_server import FOREIGN_RESOURCE, SdkPeer, sdk_resumable_server
from tests.support.python_peers import fastmcp_tasks_python
from tests.support.uvicorn_server import base_url, loopback_socket, lossless_server, serve_app

CALL = ("fetch", "url=https://example.com/report", "steps:=4", "delay_ms:=150")
TIMING = ("--open-seconds", "2", "--read-seconds", "8")
MINT = Path(__file__).with_name("dev_token_command.py")
FASTMCP_TASKS_PEER = Path(__file__).parent / "peers" / "fastmcp_tasks_server.py"
SDK_FINDINGS = {
    "replay_leak_narrowed",  # research §3 R03: the narrowed token gets fetch's progress and result
    "unknown_event_id_empty_200",  # R11: 200, no events, clean close
    "cross_session_replay",  # R12: another principal's session replays this one's events by id
    "resumed_stream_never_ends",  # R14: resuming a completed stream leaves it open
}
TASK_CHECKS = ("task_leak_narrowed", "task_denial_unknown_alike", "task_other_principal")
STREAM_CHECK = "task_stream_narrowed"
KEY_CHECKS = (
    "idempotency_duplicate_runs",
    "idempotency_concurrent_runs",
    "idempotency_conflict_accepted",
    "idempotency_replay_narrowed",
    "idempotency_other_principal",
)


def run_audit(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, dict[str, Any], str]:
    """The real command in a subprocess: exit status, stdout (the table), the JSON and Markdown reports."""
    json_path, markdown_path = tmp_path / "audit.json", tmp_path / "audit.md"
    outputs = ("--json", str(json_path), "--markdown", str(markdown_path))
    done = subprocess.run(
        [sys.executable, "-m", "mcp_lossless", "audit", *args, *TIMING, *outputs],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )
    assert json_path.exists(), done.stderr
    return done.returncode, done.stdout, orjson.loads(json_path.read_bytes()), markdown_path.read_text()


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def exchange(check: dict[str, Any], label_part: str) -> dict[str, Any]:
    return next(e for e in check["evidence"] if label_part in e["label"])


def texts(item: dict[str, Any]) -> str:
    return "\n".join(e["data"] for e in item["response"].get("events", []))


def mint_command(keys: Path, issuer: str, client_id: str) -> str:
    program = " ".join(shlex.quote(p) for p in (sys.executable, str(MINT), str(keys), issuer, client_id))
    return f"{program} {{resources}}"


def audit_two_principals(
    tmp_path: Path, front: Callable[[Any], object] = lambda app: app
) -> tuple[str, tuple[int, str, dict[str, Any], str]]:
    """Our app over loopback (behind ``front``, an ASGI wrapper that breaks or hides something) audited with the
    operator's call, a narrowed resource and two dev principals: the run in which every check can reach a verdict.
    Returns the endpoint's URL and :func:`run_audit`'s result."""
    keys = tmp_path / "dev-keys.json"
    clients = {"dev-client": "dev-secret", "mallory": "mallory-secret"}

    def make(port: int) -> object:
        return front(create_app(ServerConfig(port=port, store="memory", dev_clients=clients, dev_keys=str(keys))))

    with lossless_server(make) as base:
        url = f"{base}/mcp"
        return url, run_audit(
            tmp_path,
            url,
            "--call",
            *CALL,
            "--narrow-resource",
            f"{url}/tools/search",
            "--token-command",
            mint_command(keys, f"{base}/dev-as", "dev-client"),
            "--second-token-command",
            mint_command(keys, f"{base}/dev-as", "mallory"),
        )


def test_our_server_has_no_findings_and_every_check_runs(tmp_path: Path) -> None:
    url, (status, table, report, _) = audit_two_principals(tmp_path)

    assert status == 0, table
    assert {name: c["outcome"] for name, c in checks_of(report).items()} == dict.fromkeys(CHECKS, "ok")
    assert report["findings"] == [] and report["not_run"] == []
    assert report["settings"]["call_resource"] == f"{url}/tools/fetch"
    assert report["settings"]["call_resource_from"] == "tools/list _meta"
    assert "findings: none" in table

    checks = checks_of(report)
    refused = exchange(checks["refusal_clean_end"], "narrowed token")
    assert refused["request"]["headers"]["authorization"] == "Bearer [redacted principal narrowed token]"
    assert refused["response"]["status"] == 403 or '"code":-32041' in texts(refused)
    assert "contents of https://example.com/report" not in texts(refused)
    control = exchange(checks["replay_leak_narrowed"], "control")
    assert "contents of https://example.com/report" in texts(control), "the refusal lost nothing"
    # session B is the second principal's: A's real id reads exactly as an unknown one (invariant 4)
    assert exchange(checks["cross_session_replay"], "session B resumes")["response"]["status"] == 400
    assert exchange(checks["session_other_principal"], "second principal")["response"]["status"] == 404
    assert exchange(checks["wrong_audience_accepted"], "initialize")["response"]["status"] == 401
    assert {e["response"]["status"] for e in checks["unknown_event_id_empty_200"]["evidence"][1:]} == {400}

    denied = exchange(checks["task_denial_unknown_alike"], "task with the narrowed token")["response"]
    unknown = exchange(checks["task_denial_unknown_alike"], "random task id")["response"]
    assert denied["status"] == 403 and '"code":-31041' in denied["body"] and "resumable" in denied["body"]
    assert "contents of https://example.com/report" not in denied["body"], "not a byte of the result"
    assert unknown["status"] == 200 and '"code":-32602' in unknown["body"]
    control = exchange(checks["task_leak_narrowed"], "control")["response"]
    assert "contents of https://example.com/report" in control["body"], "the denial cost nothing"
    streamed = checks[STREAM_CHECK]
    first = exchange(streamed, "cut after its first event")
    assert first["response"]["end"] == "dropped" and '"seq":0' in texts(first)
    resumed = exchange(streamed, "after the cut with the narrowed token")
    assert orjson.loads(resumed["request"]["body"])["params"]["after"] == 0
    assert resumed["response"]["status"] == 403 and '"code":-31041' in resumed["response"]["body"]
    assert (
        '"lastSeq":0' in resumed["response"]["body"] and "notifications/tasks/event" not in resumed["response"]["body"]
    )
    rest = exchange(streamed, "control: resume")
    assert '"seq":1' in texts(rest) and "contents of https://example.com/report" in texts(rest)
    assert "an explicit denial" in streamed["summary"] and "lastSeq 0" in streamed["summary"]
    other = exchange(checks["task_other_principal"], "first principal's task")["response"]
    random = exchange(checks["task_other_principal"], "random task id")["response"]
    assert other["status"] == random["status"] == 200
    assert orjson.loads(other["body"])["error"] == orjson.loads(random["body"])["error"], "no existence oracle"

    duplicate = exchange(checks["idempotency_duplicate_runs"], "duplicate: the same key")
    assert "notifications/progress" not in texts(duplicate) and f'"{REPLAYED_META_KEY}":true' in texts(duplicate)
    assert "contents of https://example.com/report" in texts(duplicate), "the first's outcome, replayed"
    running = exchange(checks["idempotency_concurrent_runs"], "while the first still runs")
    assert f'"type":"{IN_PROGRESS}"' in texts(running) and "notifications/progress" not in texts(running)
    conflict = exchange(checks["idempotency_conflict_accepted"], "other arguments")
    assert orjson.loads(conflict["request"]["body"])["params"]["arguments"]["steps"] == 5
    assert f'"type":"{CONFLICT}"' in texts(conflict) and "contents of" not in texts(conflict)
    narrowed = exchange(checks["idempotency_replay_narrowed"], "narrowed token")["response"]
    assert narrowed["status"] == 403 and "contents of" not in narrowed["body"], "refused before any byte"
    covering = exchange(checks["idempotency_replay_narrowed"], "control")
    assert f'"{REPLAYED_META_KEY}":true' in texts(covering), "the key then answered the covering token"
    for label in ("key A, the same arguments", "key B, other arguments"):
        theirs = exchange(checks["idempotency_other_principal"], label)
        assert theirs["request"]["headers"]["authorization"] == "Bearer [redacted second principal wide token]"
        assert "notifications/progress" in texts(theirs) and REPLAYED_META_KEY not in texts(theirs), "ran anew"


@pytest.fixture(scope="module")
def sdk_peer() -> Iterator[SdkPeer]:
    with sdk_resumable_server() as peer:
        yield peer


def test_sdk_server_hazards_are_reported_with_evidence(tmp_path: Path, sdk_peer: SdkPeer) -> None:
    status, table, report, markdown = run_audit(
        tmp_path,
        sdk_peer.url,
        "--call",
        *CALL,
        "--resource",
        f"fetch={sdk_peer.resources['fetch']}",
        "--narrow-resource",
        sdk_peer.resources["search"],
        "--token-endpoint",
        sdk_peer.token_endpoint,
        "--client",
        "dev-client",
        "--second-client",
        "mallory:mallory-secret",
        env={"MCP_LOSSLESS_AUDIT_SECRET": "dev-secret"},
    )

    assert status == 1, table
    assert set(report["findings"]) == SDK_FINDINGS
    assert report["not_run"] == ["refusal_clean_end", *TASK_CHECKS, STREAM_CHECK], "the SDK never refused; no tasks"
    checks = checks_of(report)
    assert report["not_applicable"] == list(KEY_CHECKS), "mcp 2.3 declares no tools.idempotency"
    duplicate = checks["idempotency_duplicate_runs"]["summary"]
    assert "does not declare tools.idempotency" in duplicate and "ran the tool again" in duplicate, duplicate
    assert {
        n: c["outcome"]
        for n, c in checks.items()
        if n not in {*SDK_FINDINGS, "refusal_clean_end", *TASK_CHECKS, STREAM_CHECK, *KEY_CHECKS}
    } == {
        "cross_stream_replay": "ok",  # stream ids are request ids, unique within a session
        "session_other_principal": "ok",  # R09: sessions are bound to (client_id, iss, sub)
        "wrong_audience_accepted": "ok",  # the peer's verifier checks the audience names this server
        "batch_multiplexing": "ok",  # R17: batches are rejected with 400
    }

    leak = exchange(checks["replay_leak_narrowed"], "narrowed token")
    assert leak["request"]["headers"]["authorization"] == "Bearer [redacted principal narrowed token]"
    assert leak["response"]["status"] == 200
    assert "contents of https://example.com/report" in texts(leak)
    assert "notifications/progress" in texts(leak)

    stolen = checks["cross_session_replay"]
    own = exchange(stolen, "session A: the call")
    replay = exchange(stolen, "session B resumes")
    assert replay["request"]["headers"]["authorization"] == "Bearer [redacted second principal wide token]"
    assert replay["request"]["headers"]["mcp-session-id"] != own["request"]["headers"]["mcp-session-id"]
    assert replay["request"]["headers"]["last-event-id"] == own["response"]["events"][0]["id"]
    assert "contents of https://example.com/report" in texts(replay)

    unknown = checks["unknown_event_id_empty_200"]["evidence"][1:]
    assert [(e["response"]["status"], e["response"]["events"], e["response"]["end"]) for e in unknown] == [
        (200, [], "closed"),
        (200, [], "closed"),
    ]
    assert exchange(checks["resumed_stream_never_ends"], "final event id")["response"]["end"] == "deadline"
    assert exchange(checks["batch_multiplexing"], "batch")["response"]["status"] == 400
    assert exchange(checks["session_other_principal"], "second principal")["response"]["status"] == 404
    for name in (*TASK_CHECKS, STREAM_CHECK):  # the SDK has no tasks runtime: its modern leg runs calls in the request
        assert "did not run the call as a task (HTTP 200" in checks[name]["summary"], checks[name]["summary"]
        created = exchange(checks[name], "the call at 2026-07-28")
        assert created["request"]["headers"]["mcp-protocol-version"] == "2026-07-28"

    for name in SDK_FINDINGS:
        assert checks[name]["evidence"], name
        assert f"## {name}: FINDING" in markdown
    outputs = table + markdown + orjson.dumps(report).decode()
    assert "eyJ" not in outputs and "dev-secret" not in outputs and "mallory-secret" not in outputs


async def _fetch_with(peer: SdkPeer, *resources: str) -> dict[str, Any]:
    """Call the peer's fetch directly with a token for ``resources``; its answer."""
    async with httpx.AsyncClient(timeout=10) as http:
        token = await ClientCredentialsGrant(http, peer.token_endpoint, "dev-client", "dev-secret").token(resources)
        wire = Wire(http, peer.url, read_seconds=5)
        session = await wire.open_session(Credential("direct", token), "2025-11-25", "initialize")
        message = call_message(1, "fetch", {"url": "u", "steps": 1, "delay_ms": 0}, "p")
        answer = (await wire.post(session, message, label="call", stop=all_answered(1))).terminal_for(1)
    assert answer is not None
    return answer


def test_sdk_peer_checks_the_tool_audience_at_call_time(sdk_peer: SdkPeer) -> None:
    """The control for the leak above: the peer's per-tool check works, the replay path just never runs it."""
    refused = anyio.run(_fetch_with, sdk_peer, sdk_peer.resources["search"])
    served = anyio.run(_fetch_with, sdk_peer, sdk_peer.resources["fetch"])
    assert refused["result"]["isError"] is True
    assert "insufficient audience" in refused["result"]["content"][0]["text"]
    assert served["result"]["isError"] is False


def test_report_renders_and_redacts_every_secret() -> None:
    token, stray = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl", "eyJraWQiOiJ4In0.eyJhdWQiOiJ4In0.AAAA"
    redactor = Redactor()
    redactor.register(token, "principal wide token")
    redactor.register("s3cret", "client secret")
    leaked = Exchange(
        "resume with the narrowed token",
        "GET",
        "http://mcp.example/mcp",
        {"authorization": f"Bearer {token}", "last-event-id": "7"},
        None,
        status=200,
        response_headers={"content-type": "text/event-stream"},
        events=[
            WireEvent("8", "message", '{"echo": "' + token + '", "other": "' + stray + '"}', 0.1),
            WireEvent("9", "message", "a ``` b", 0.1),
            *(WireEvent(str(10 + i), "message", "x" * 2000, 0.2) for i in range(12)),
        ],
        end="deadline",
        seconds=2.0,
    )
    refused = Exchange(
        "token request", "POST", "http://as.example/token", {"authorization": "Basic czNjcmV0"}, "a=s3cret"
    )
    refused.status, refused.body = 401, '{"error": "invalid_client"}'
    report = AuditReport(
        "http://mcp.example/mcp",
        "2026-01-01T00:00:00+00:00",
        {"call": "fetch url=x"},
        [
            CheckResult("replay_leak_narrowed", "finding", f"leaked to {token}", [leaked]),
            CheckResult("wrong_audience_accepted", "ok", "refused: HTTP 401", [refused]),
            CheckResult("batch_multiplexing", "not_run", "no 2025-03-26 session"),
        ],
    )

    document = report_document(report, redactor)
    markdown = to_markdown(document)
    rendered = orjson.dumps(document).decode() + markdown
    assert token not in rendered and stray not in rendered and "s3cret" not in rendered and "czNjcmV0" not in rendered
    assert document["checks"][0]["summary"] == "leaked to [redacted principal wide token]"
    first = document["checks"][0]["evidence"][0]
    assert first["request"]["headers"]["authorization"] == "Bearer [redacted principal wide token]"
    assert "[redacted jwt]" in first["response"]["events"][0]["data"]
    assert len(first["response"]["events"]) == 12 and first["response"]["events_left_out"] == 2
    assert first["response"]["events"][2]["data"].endswith("… [1400 more characters]")
    assert document["checks"][1]["evidence"][0]["request"]["body"] == "a=[redacted client secret]"
    assert (document["exit_status"], document["findings"], document["not_run"]) == (
        1,
        ["replay_leak_narrowed"],
        ["batch_multiplexing"],
    )
    assert "| `replay_leak_narrowed` | FINDING | leaked to [redacted principal wide token] |" in markdown
    assert "## batch_multiplexing: not run" in markdown
    assert "\n````\n" in markdown, "a fence longer than any backtick run in the evidence"
    assert "→ 200 (still open when the audit stopped waiting after 2.0 s)" in markdown
    assert AuditReport("u", "t", {}, [CheckResult("batch_multiplexing", "ok", "fine")]).exit_status == 0
    skipped = [CheckResult("batch_multiplexing", "ok", "fine"), CheckResult("cross_stream_replay", "not_run", "no")]
    assert AuditReport("u", "t", {}, skipped).exit_status == EXIT_NOT_RUN
    assert AuditReport("u", "t", {}, skipped, allow_not_run=True).exit_status == 0


def test_unreachable_target_and_bad_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    for argv, message in (
        (["audit", f"http://127.0.0.1:{port}/mcp", "--call", "fetch"], "did not complete initialize"),
        (["audit", "http://127.0.0.1:1/mcp", "--call", "fetch", "steps"], "is neither KEY=TEXT nor KEY:=JSON"),
        (["audit", "http://127.0.0.1:1/mcp", "--call", "fetch", "steps:=x"], "is not JSON"),
        (["audit", "http://127.0.0.1:1/mcp", "--call", "fetch", "--token-endpoint", "http://x/t"], "needs --client"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


def test_a_server_that_asks_for_a_token_is_answered_with_the_flags_that_give_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        lossless_server(lambda port: create_app(ServerConfig(port=port, store="memory"))) as base,
        pytest.raises(SystemExit) as exited,
    ):
        main(["audit", f"{base}/mcp", "--call", "fetch", "url=x"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "answered HTTP 401" in err and "give --token-endpoint URL --client ID:SECRET" in err


def test_a_check_that_could_not_run_fails_the_audit_unless_allowed(tmp_path: Path) -> None:
    """Without a second principal the checks that need one cannot run: no finding, yet not a clean pass (3)."""
    keys = tmp_path / "dev-keys.json"

    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_keys=str(keys)))

    with lossless_server(make) as base:
        url = f"{base}/mcp"
        args = (url, "--call", *CALL, "--narrow-resource", f"{url}/tools/search")
        tokens = ("--token-command", mint_command(keys, f"{base}/dev-as", "dev-client"))
        status, table, report, markdown = run_audit(tmp_path, *args, *tokens)
        allowed, _, allowed_report, _ = run_audit(tmp_path, *args, *tokens, "--allow-not-run")

    assert report["findings"] == [] and report["not_run"], table
    assert status == EXIT_NOT_RUN == report["exit_status"]
    assert f"not run: {', '.join(report['not_run'])}" in table
    assert f"Not run: {', '.join(report['not_run'])}. Exit status {EXIT_NOT_RUN}." in markdown
    assert allowed == 0 == allowed_report["exit_status"]
    assert allowed_report["not_run"] == report["not_run"] and allowed_report["settings"]["allow_not_run"] is True


def test_a_2026_only_server_is_listed_the_modern_way_and_its_task_checks_say_why_they_did_not_run(
    tmp_path: Path,
) -> None:
    """The Python SDK's modern leg alone: no initialize, so discovery lists tools at 2026-07-28; it creates no
    tasks, so the task checks name that rather than pass."""
    with modern_only_sdk_server() as sdk:
        status, table, report, _ = run_audit(tmp_path, sdk.url, "--call", "count", "n:=3")
        seen = list(sdk.requests)
    assert status == EXIT_NOT_RUN, table
    assert report["findings"] == [] and set(report["not_run"]) == set(CHECKS) - set(KEY_CHECKS)
    assert report["not_applicable"] == list(KEY_CHECKS), "server/discover declares no tools.idempotency"
    assert "(its server/discover)" in checks_of(report)["idempotency_conflict_accepted"]["summary"]
    duplicate = checks_of(report)["idempotency_duplicate_runs"]["summary"]
    assert "observed: the duplicate ran the tool again: 3 progress notification(s)" in duplicate, duplicate
    checks = checks_of(report)
    for name in ("task_leak_narrowed", "task_denial_unknown_alike"):
        assert "did not run the call as a task (HTTP 200" in checks[name]["summary"], checks[name]["summary"]
    assert "no second principal" in checks["task_other_principal"]["summary"]
    assert "could not open a session" in checks["unknown_event_id_empty_200"]["summary"]
    assert seen[0] == ("tools/list", "2026-07-28") and ("tools/call", "2026-07-28") in seen


@dataclass(frozen=True)
class TasksPeer:
    url: str
    token_endpoint: str
    resources: dict[str, str]


@contextmanager
def fastmcp_tasks_server(log: Path) -> Iterator[TasksPeer]:
    """FastMCP with ``fastmcp-tasks`` in its own venv and process, on a socket bound here; our dev AS beside it."""
    python = fastmcp_tasks_python()
    sock, as_sock = loopback_socket(), loopback_socket()
    sock.listen()  # connections wait in the backlog until the peer accepts: no readiness to poll
    aggregate, issuer = f"{base_url(sock)}/mcp", base_url(as_sock)
    tools = {name: f"{aggregate}/tools/{name}" for name in ("search", "fetch")}
    authority = DevAuthServer(
        issuer, resources=[*tools.values(), FOREIGN_RESOURCE], aggregate=aggregate, clients=SDK_CLIENTS
    )
    with serve_app(authority, sock=as_sock), log.open("wb") as out:
        command = [str(python), str(FASTMCP_TASKS_PEER), str(sock.fileno()), aggregate, issuer]
        proc = subprocess.Popen(command, pass_fds=[sock.fileno()], stdout=out, stderr=out)
        sock.close()
        try:
            yield TasksPeer(aggregate, f"{issuer}/token", tools)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _authorized_once(app: Any) -> None:
    """The bug the SEP forbids: a task's stream authorized once, by the token that first streamed it, and every
    later ``tasks/stream`` of that task served under that token, whatever the request's own."""
    tasks = app.modern.tasks
    serve, first = tasks.streams.serve, {}

    async def leaky(receive: Any, send: Any, grant: Any, rid: Any, params: Any, connection: Any, look: Any,
                    refuse: Any) -> None:  # fmt: skip
        task_id = params["taskId"]
        held = first.setdefault(task_id, grant)

        async def looked() -> Any:
            return await tasks.look(held, task_id, Purpose.POLL)

        await serve(receive, send, held, rid, params, connection, looked, refuse)

    tasks.streams.serve = leaky


def _ends_silently(app: Any) -> None:
    """A resumed task stream (``after`` given) answered with the empty result, as a finished stream ends."""
    tasks = app.modern.tasks
    serve = tasks.streams.serve

    async def silent(receive: Any, send: Any, grant: Any, rid: Any, params: Any, *rest: Any) -> None:
        if params.get("after") is None:
            await serve(receive, send, grant, rid, params, *rest)
            return
        body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete"}})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    tasks.streams.serve = silent


@pytest.mark.parametrize(
    ("break_it", "found"),
    [(_authorized_once, "of the task's events after the cut"), (_ends_silently, "a silent end")],
)
def test_the_task_stream_check_finds_a_leak_and_a_silent_end(tmp_path: Path, break_it: Any, found: str) -> None:
    """Our server with its task streams broken on purpose: the check's finding, and only that one."""
    keys = tmp_path / "dev-keys.json"

    def make(port: int) -> object:
        app = create_app(ServerConfig(port=port, store="memory", dev_clients={"dev-client": "dev-secret"},
                                      dev_keys=str(keys)))  # fmt: skip
        break_it(app)
        return app

    with lossless_server(make) as base:
        url = f"{base}/mcp"
        status, table, report, _ = run_audit(
            tmp_path,
            url,
            "--call",
            *CALL,
            "--narrow-resource",
            f"{url}/tools/search",
            "--token-command",
            mint_command(keys, f"{base}/dev-as", "dev-client"),
        )
    assert status == 1 and report["findings"] == [STREAM_CHECK], table
    assert found in checks_of(report)[STREAM_CHECK]["summary"], checks_of(report)[STREAM_CHECK]["summary"]


def test_fastmcp_tasks_withholds_a_task_from_a_narrowed_token_and_from_another_principal(tmp_path: Path) -> None:
    """The one tasks runtime there is. Its ``tasks/get`` re-resolves the task's tool under the polling token, so
    a token narrowed to ``search`` gets no byte of ``fetch``'s result: an error (-32603 "Component not found for
    task"), told apart from the unknown-id answer (-32602), though no challenge says what to re-authorize for;
    the wide token then still gets the result. Tasks are bound to ``client_id|sub``: another principal gets what
    a random id gets (the id it echoes aside). It keeps no events, so the resumption checks cannot run (exit 3)."""
    with fastmcp_tasks_server(tmp_path / "fastmcp-tasks.log") as peer:
        status, table, report, _ = run_audit(
            tmp_path,
            peer.url,
            "--call",
            *CALL,
            "--resource",
            f"fetch={peer.resources['fetch']}",
            "--narrow-resource",
            peer.resources["search"],
            "--token-endpoint",
            peer.token_endpoint,
            "--client",
            "dev-client",
            "--second-client",
            "mallory:mallory-secret",
            env={"MCP_LOSSLESS_AUDIT_SECRET": "dev-secret"},
        )
    checks = checks_of(report)
    assert status == EXIT_NOT_RUN, (table, (tmp_path / "fastmcp-tasks.log").read_text()[-3000:])
    assert report["findings"] == [] and "replay_leak_narrowed" in report["not_run"]
    assert report["not_applicable"] == list(KEY_CHECKS), "FastMCP declares no tools.idempotency"
    assert "ran the tool again" in checks["idempotency_duplicate_runs"]["summary"], "it ignores the key"
    assert checks[STREAM_CHECK]["outcome"] == "not_run", "it has no tasks/stream"
    assert "does not stream the task's events" in checks[STREAM_CHECK]["summary"]
    assert {name: checks[name]["outcome"] for name in TASK_CHECKS} == dict.fromkeys(TASK_CHECKS, "ok"), {
        name: checks[name]["summary"] for name in TASK_CHECKS
    }
    created = exchange(checks["task_leak_narrowed"], "the call at 2026-07-28")["response"]
    assert orjson.loads(created["body"])["result"]["resultType"] == "task"
    narrowed = exchange(checks["task_leak_narrowed"], "task with the narrowed token")
    assert narrowed["request"]["headers"]["authorization"] == "Bearer [redacted principal narrowed token]"
    assert "contents of https://example.com/report" not in narrowed["response"]["body"]
    assert orjson.loads(narrowed["response"]["body"])["error"]["code"] == -32603
    assert "www-authenticate" not in narrowed["response"]["headers"]
    control = exchange(checks["task_leak_narrowed"], "control")["response"]
    assert "contents of https://example.com/report" in control["body"], "the refusal cost nothing"
    random = exchange(checks["task_other_principal"], "random task id")["response"]
    other = exchange(checks["task_other_principal"], "first principal's task")["response"]
    assert other["status"] == random["status"] == 400
    assert orjson.loads(other["body"])["error"]["code"] == orjson.loads(random["body"])["error"]["code"] == -32602
