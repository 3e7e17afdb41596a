"""The official conformance suite's client scenarios against our client (``peers/conformance_client.py``).

The suite (pinned in tests/support/node.py) starts its mock MCP server and mock authorization server per
scenario and spawns the driver. Runs, each a real ``conformance client`` process whose exit status must be 0:

- ``--suite auth`` and ``--suite backcompat`` (their scenarios run in parallel inside the suite);
- ``initialize``, ``tools_call`` and ``json-schema-2020-12-preservation`` one by one;
- the authorization scenarios the suite files under 2026-07-28 (``auth/resource-mismatch``, ``auth/iss-*``,
  ...) and the ``auth/client-credentials-basic`` extension, at the 2025-11-25 wire with ``--force``: what
  they check is the OAuth flow, which does not change with the revision, and this client never speaks
  2026-07-28;
- ``sse-retry`` last and alone: it times the reconnection.

The suite's exit status ignores the driver's own exit status in suite mode, so the driver's verdict is
checked here too: ``ok`` for every scenario where the client must succeed, and the expected refusal where
it must stop. Every check of every claimed scenario must be SUCCESS or INFO.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.interop.peers.conformance_client import SCENARIOS
from tests.interop.test_conformance_server import PASSING
from tests.support.node import conformance_cli, node_binary

ROOT = Path(__file__).resolve().parents[2]
DRIVER = f"{sys.executable} -m tests.interop.peers.conformance_client"
WIRE = "2025-11-25"
SUITES = {
    "auth": {
        "auth/metadata-default",
        "auth/metadata-var1",
        "auth/metadata-var2",
        "auth/metadata-var3",
        "auth/basic-cimd",
        "auth/scope-from-www-authenticate",
        "auth/scope-from-scopes-supported",
        "auth/scope-omitted-when-undefined",
        "auth/scope-step-up",
        "auth/scope-retry-limit",
        "auth/token-endpoint-auth-basic",
        "auth/token-endpoint-auth-post",
        "auth/token-endpoint-auth-none",
        "auth/pre-registration",
    },
    "backcompat": {"auth/2025-03-26-oauth-metadata-backcompat", "auth/2025-03-26-oauth-endpoint-fallback"},
}
ONE_BY_ONE = ("initialize", "tools_call", "json-schema-2020-12-preservation")
FORCED = (
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/authorization-server-migration",
    "auth/iss-supported",
    "auth/iss-not-advertised",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-unexpected",
    "auth/iss-normalized",
    "auth/metadata-issuer-mismatch",
    "auth/client-credentials-basic",
)
ALONE = "sse-retry"
CLAIMED = set().union(*SUITES.values(), ONE_BY_ONE, FORCED, {ALONE})
REFUSALS = {
    "auth/resource-mismatch": "is for 'https://evil.example.com/mcp', not this server",
    "auth/iss-supported-missing": "authorization response iss None is not",
    "auth/iss-wrong-issuer": "authorization response iss 'https://evil.example.com' is not",
    "auth/iss-unexpected": "authorization response iss 'https://evil.example.com' is not",
    "auth/iss-normalized": "/' is not 'http://localhost:",
    "auth/metadata-issuer-mismatch": "names issuer 'https://attacker.example.com'",
    "auth/scope-retry-limit": "insufficient_scope: Scope upgrade will never succeed; gave up after 3 re-authorizations",
}
"""Where the client must stop with an authorization error, and the reason it must give."""
EVIDENCE = {
    "auth/metadata-default": {
        "prm-pathbased-requested",
        "resource-parameter-matches-prm",
        "pkce-verifier-matches-challenge",
    },
    "auth/metadata-var2": {"resource-parameter-matches-prm", "resource-parameter-consistency"},
    "auth/basic-cimd": {"cimd-client-id-used"},
    "auth/token-endpoint-auth-basic": {"token-endpoint-auth-method", "resource-parameter-in-token"},
    "auth/token-endpoint-auth-post": {"token-endpoint-auth-method"},
    "auth/token-endpoint-auth-none": {"token-endpoint-auth-method"},
    "auth/pre-registration": {"pre-registration-auth"},
    "auth/scope-from-www-authenticate": {"scope-from-www-authenticate"},
    "auth/scope-from-scopes-supported": {"scope-from-scopes-supported"},
    "auth/scope-omitted-when-undefined": {"scope-omitted-when-undefined"},
    "auth/scope-step-up": {"scope-step-up-initial", "scope-step-up-escalation"},
    "auth/scope-retry-limit": {"scope-retry-limit"},
    "auth/resource-mismatch": {"resource-mismatch-rejected"},
    "auth/authorization-server-migration": {"sep-2352-reregister-on-as-change", "sep-2352-no-reuse-on-as-change"},
    "auth/iss-supported": {"sep-2468-client-compare-iss-supported"},
    "auth/iss-not-advertised": {"sep-2468-client-proceed-no-iss"},
    "auth/iss-supported-missing": {"sep-2468-client-reject-missing-iss"},
    "auth/iss-wrong-issuer": {"sep-2468-client-compare-iss-supported"},
    "auth/iss-unexpected": {"sep-2468-client-compare-iss-unadvertised"},
    "auth/iss-normalized": {"sep-2468-client-no-normalization"},
    "auth/metadata-issuer-mismatch": {"sep-2468-client-validate-metadata-issuer"},
    "auth/offline-access-not-supported": {"sep-2207-offline-access-not-requested"},
    "auth/client-credentials-basic": {"client-credentials-basic-auth"},
    "sse-retry": {"client-sse-graceful-reconnect", "client-sse-retry-timing", "client-sse-last-event-id"},
    "tools_call": {"tool-add-numbers"},
    "initialize": {"mcp-client-initialization"},
}
"""Checks that must be SUCCESS: proof the scenario reached what it is about, not just that nothing failed."""
PARALLEL_RUNS = 4
RUN_TIMEOUT = 120
_RUN_DIR = re.compile(r"^(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


class Run:
    """One ``conformance client`` process and the result folders it wrote."""

    def __init__(self, name: str, args: list[str], out: Path) -> None:
        self.name = name
        self.out = out
        command = [str(node_binary()), str(conformance_cli()), "client", "--command", DRIVER, "-o", str(out), *args]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
        self.returncode = done.returncode
        self.report = f"{name}: suite exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"

    def results(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for checks in self.out.glob("**/checks.json"):
            match = _RUN_DIR.match(checks.parent.relative_to(self.out).as_posix())
            assert match is not None, f"unexpected result folder {checks.parent}"
            found[match["scenario"]] = checks.parent
        return found


def _runs(tmp: Path) -> list[Run]:
    jobs = [(suite, ["--suite", suite]) for suite in SUITES]
    jobs += [(name, ["--scenario", name]) for name in ONE_BY_ONE]
    jobs += [(name, ["--scenario", name, "--spec-version", WIRE, "--force"]) for name in FORCED]
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        runs = list(pool.map(lambda job: Run(job[0], job[1], tmp / job[0].replace("/", "_")), jobs))
    return [*runs, Run(ALONE, ["--scenario", ALONE], tmp / ALONE)]  # alone, after the others: it is timed


def test_every_claimed_client_scenario_passes(tmp_path: Path) -> None:
    node_binary(), conformance_cli()  # install first, outside the timed runs
    runs = _runs(tmp_path)
    failed_runs = [run.report for run in runs if run.returncode != 0]
    assert failed_runs == [], "\n\n".join(failed_runs)

    folders = {scenario: folder for run in runs for scenario, folder in run.results().items()}
    assert set(folders) == CLAIMED
    checks: dict[str, list[dict[str, Any]]] = {
        s: orjson.loads((f / "checks.json").read_bytes()) for s, f in folders.items()
    }
    problems = defaultdict(list)
    for scenario, found in checks.items():
        for check in found:
            if check["status"] not in PASSING:
                problems[scenario].append(f"{check['status']} {check['id']}: {check.get('errorMessage') or ''}")
        succeeded = {c["id"] for c in found if c["status"] == "SUCCESS"}
        missing = EVIDENCE.get(scenario, set()) - succeeded
        if missing or not succeeded:
            problems[scenario].append(f"never reached {sorted(missing) or 'any SUCCESS'}")
    assert dict(problems) == {}

    for scenario, folder in folders.items():
        stdout, stderr = (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text()
        if scenario in REFUSALS:
            assert f"{scenario}: authorization: " in stderr and REFUSALS[scenario] in stderr, stderr[-2000:]
            assert f"{scenario}: ok" not in stdout
        else:
            assert f"{scenario}: ok: " in stdout, f"{scenario}: the driver did not succeed\n{stderr[-3000:]}"

    def details(scenario: str, check_id: str) -> dict[str, Any]:
        (check,) = [c for c in checks[scenario] if c["id"] == check_id]
        found: dict[str, Any] = check.get("details") or {}
        return found

    union = details("auth/scope-step-up", "scope-step-up-escalation")["requestedScope"]
    assert set(union.split()) == {"mcp:basic", "mcp:write"}, "a step-up keeps the scope it already had"
    assert details("auth/scope-retry-limit", "scope-retry-limit")["authorizationAttempts"] == 3
    assert details("sse-retry", "client-sse-retry-timing")["actualDelayMs"] >= 450, "retry: 500 is respected"
    assert details("auth/token-endpoint-auth-post", "token-endpoint-auth-method")["actualAuthMethod"] == (
        "client_secret_post"
    )


def test_the_driver_refuses_scenarios_it_does_not_play() -> None:
    """Excluded scenarios (docs/conformance.md) end with exit 2 and a usage line, never a false pass."""
    env = {**os.environ, "MCP_CONFORMANCE_SCENARIO": "elicitation-sep1034-client-defaults"}
    command = [sys.executable, "-m", "tests.interop.peers.conformance_client", "http://127.0.0.1:9/mcp"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "usage: MCP_CONFORMANCE_SCENARIO=" in done.stderr
    assert set(SCENARIOS) == CLAIMED, "the driver plays exactly the scenarios this test claims"
