"""The official conformance suite's client scenarios against our client (``peers/conformance_client.py``).

The suite (pinned in tests/support/node.py) starts its mock MCP server and mock authorization server per
scenario and spawns the driver. Runs, each a real ``conformance client`` process whose exit status must be 0:

- ``--suite auth`` and ``--suite backcompat`` (their scenarios run in parallel inside the suite);
- ``initialize``, ``tools_call`` and ``json-schema-2020-12-preservation`` one by one;
- the authorization scenarios the suite files under 2026-07-28 (``auth/resource-mismatch``, ``auth/iss-*``,
  ...) and the authorization extensions (``auth/client-credentials-basic`` and ``-jwt``, ``auth/wif-jwt-bearer``,
  ``auth/enterprise-managed-authorization``, ``auth/dpop``, ``auth/dpop-nonce``), at the 2025-11-25 wire with
  ``--force``: what they check is the OAuth flow of the legacy client;
- ``sse-retry`` last and alone: it times the reconnection;
- in a test of its own, every client scenario the suite runs at the 2026-07-28 wire (:data:`MODERN_SCENARIOS`
  and :data:`MODERN_AUTH`, plus the :data:`EXTENSIONS` with ``--force``), each with
  ``--spec-version 2026-07-28``: the suite passes the wire as ``MCP_CONFORMANCE_PROTOCOL_VERSION`` and the
  driver plays them with the client ``open_client`` picks, which must be the 2026-07-28 one. They include every
  client scenario of the suite's frozen 2026-07-28 requirement set (checked against its file). A few
  ``http-standard-headers`` checks stay SKIPPED (:data:`NOT_EXERCISED`): methods this client never sends.

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
    "auth/client-credentials-jwt",
    "auth/wif-jwt-bearer",
    "auth/enterprise-managed-authorization",
    "auth/dpop",
    "auth/dpop-nonce",
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
    "auth/client-credentials-jwt": {"client-credentials-jwt-verified"},
    "auth/wif-jwt-bearer": {"wif-assertion-verified"},
    "auth/enterprise-managed-authorization": {"complete-flow-token-exchange", "complete-flow-jwt-bearer"},
    "auth/dpop": {
        "sep-1932-client-token-request-proof",
        "sep-1932-client-dpop-auth-scheme",
        "sep-1932-client-fresh-proof",
    },
    "auth/dpop-nonce": {
        "sep-1932-client-token-request-proof",
        "sep-1932-client-dpop-auth-scheme",
        "sep-1932-client-fresh-proof",
        "sep-1932-client-as-nonce",
        "sep-1932-client-rs-nonce",
    },
    "sse-retry": {"client-sse-graceful-reconnect", "client-sse-retry-timing", "client-sse-last-event-id"},
    "tools_call": {"tool-add-numbers"},
    "initialize": {"mcp-client-initialization"},
}
"""Checks that must be SUCCESS: proof the scenario reached what it is about, not just that nothing failed."""
MODERN = "2026-07-28"
MODERN_SCENARIOS = {
    "tools_call": {"tool-add-numbers"},
    "json-schema-2020-12-preservation": {
        "json-schema-2020-12-client-echo-completed",
        "json-schema-2020-12-client-$schema-preserved",
        "json-schema-2020-12-client-$defs-preserved",
        "sep-2106-client-composition-keywords-preserved",
    },
    "request-metadata": {
        "sep-2575-http-client-sends-version-header",
        "sep-2575-client-populates-meta",
        "sep-2575-client-sends-client-info",
        "sep-2575-http-version-header-matches-meta",
        "sep-2575-client-declares-elicitation-capability",
        "sep-2575-client-retry-supported-version",
    },
    "sep-2322-client-request-state": {
        "sep-2322-client-request-state-echoed",
        "sep-2322-client-jsonrpc-id-different",
        "sep-2322-client-no-state-omitted",
        "sep-2322-client-parallel-isolation",
        "sep-2322-default-result-type-complete",
    },
    "http-standard-headers": {"sep-2243-client-includes-standard-headers"},
    "http-custom-headers": {
        "sep-2243-client-supports-custom-headers",
        "sep-2243-client-mirrors-designated-params",
        "sep-2243-client-encode-values",
        "sep-2243-client-base64-unsafe",
        "sep-2243-client-omit-null",
    },
    "http-invalid-tool-headers": {
        "sep-2243-client-reject-invalid-tool",
        "sep-2243-x-mcp-header-not-empty",
        "sep-2243-x-mcp-header-primitive-only",
        "sep-2243-x-mcp-header-unique",
        "sep-2243-x-mcp-header-charset",
    },
    "json-schema-ref-no-deref": {"sep-2106-no-network-ref-deref"},
}
"""The 2026-07-28 client scenarios besides ``auth/*``, and the checks each must show SUCCESS."""
EXTENSIONS = (
    "auth/client-credentials-basic",
    "auth/client-credentials-jwt",
    "auth/wif-jwt-bearer",
    "auth/enterprise-managed-authorization",
    "auth/dpop",
    "auth/dpop-nonce",
)
"""Extension scenarios: not on the suite's spec timeline, so run with ``--force`` at either wire."""
MODERN_AUTH = sorted((SUITES["auth"] | set(FORCED)) - set(EXTENSIONS))
"""The authorization scenarios the suite runs at 2026-07-28 (its extensions, :data:`EXTENSIONS`, are run there
too, with ``--force``), with the same evidence and refusals as at 2025-11-25."""
MODERN_REFUSALS = {**REFUSALS, "auth/scope-retry-limit": "server/discover was still refused after 2 fresh grants"}
"""The 2026-07-28 client's own reason where the scope step-up never succeeds (its first request is the probe)."""
NOT_EXERCISED = {
    ("http-standard-headers", f"ClientMcp{header}Header_{method}")
    for header, method in (
        ("Method", "initialize"),
        ("Method", "notifications_initialized"),
    )
}
"""Checks the suite reports SKIPPED because this client never sends the method: there is no handshake at
2026-07-28. Only these may be SKIPPED; every other check must be SUCCESS or INFO."""
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


def _required_client_scenarios() -> set[str]:
    """The client scenarios of the suite's frozen 2026-07-28 requirement set (``--requirements 2026-07-28``)."""
    text = (conformance_cli().parents[1] / "requirements" / f"{MODERN}.yaml").read_text()
    section = text.split("\nclient:\n", 1)[1].split("\n\n", 1)[0]
    return {line.removeprefix("  - ").strip() for line in section.splitlines() if line.startswith("  - ")}


def test_every_2026_07_28_client_scenario_passes(tmp_path: Path) -> None:
    node_binary(), conformance_cli()
    required = _required_client_scenarios()
    assert len(required) > 20 and required <= {*MODERN_SCENARIOS, *MODERN_AUTH}, "every required scenario is run"
    jobs = [(name, ["--scenario", name, "--spec-version", MODERN]) for name in [*MODERN_SCENARIOS, *MODERN_AUTH]]
    jobs += [(name, ["--scenario", name, "--spec-version", MODERN, "--force"]) for name in EXTENSIONS]
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        runs = list(pool.map(lambda job: Run(job[0], job[1], tmp_path / job[0].replace("/", "_")), jobs))
    failed_runs = [run.report for run in runs if run.returncode != 0]
    assert failed_runs == [], "\n\n".join(failed_runs)

    folders = {scenario: folder for run in runs for scenario, folder in run.results().items()}
    assert set(folders) == {*MODERN_SCENARIOS, *MODERN_AUTH, *EXTENSIONS}
    problems = defaultdict(list)
    for scenario, folder in folders.items():
        found = orjson.loads((folder / "checks.json").read_bytes())
        for check in found:
            skipped_here = check["status"] == "SKIPPED" and (scenario, check["name"]) in NOT_EXERCISED
            if check["status"] not in PASSING and not skipped_here:
                problems[scenario].append(f"{check['status']} {check['name']}: {check.get('errorMessage') or ''}")
        succeeded = {c["id"] for c in found if c["status"] == "SUCCESS"}
        missing = (MODERN_SCENARIOS.get(scenario) or EVIDENCE.get(scenario, set())) - succeeded
        if missing or not succeeded:
            problems[scenario].append(f"never reached {sorted(missing) or 'any SUCCESS'}")
        stdout, stderr = (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text()
        if scenario in MODERN_REFUSALS:
            if f"{scenario}: authorization: " not in stderr or MODERN_REFUSALS[scenario] not in stderr:
                problems[scenario].append(f"not the expected refusal: {stderr[-2000:]}")
        elif f"{scenario}: ok: " not in stdout:
            problems[scenario].append(f"the driver did not succeed: {stderr[-3000:]}")
    assert dict(problems) == {}


def test_the_driver_refuses_scenarios_it_does_not_play() -> None:
    """Excluded scenarios (docs/conformance.md) end with exit 2 and a usage line, never a false pass."""
    env = {**os.environ, "MCP_CONFORMANCE_SCENARIO": "elicitation-sep1034-client-defaults"}
    command = [sys.executable, "-m", "tests.interop.peers.conformance_client", "http://127.0.0.1:9/mcp"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "usage: MCP_CONFORMANCE_SCENARIO=" in done.stderr
    assert set(SCENARIOS) == CLAIMED | set(MODERN_SCENARIOS), "the driver plays exactly the scenarios claimed here"
