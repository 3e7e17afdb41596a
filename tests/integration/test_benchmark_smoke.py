"""The benchmark harness runs end to end against the official SDK server and reports sane fields.

Timing is not asserted (the box is shared); correctness of what the harness measured is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_run_against_the_sdk_reports_verified_results(tmp_path: Path) -> None:
    report_path = tmp_path / "RESULTS.md"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "run.py"),
        "--quick",
        "--only",
        "sdk-sse",
        "--results-dir",
        str(tmp_path),
        "--report",
        str(report_path),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]

    [results_file] = tmp_path.glob("*.json")
    document = json.loads(results_file.read_text())
    assert document["quick"] is True
    assert list(document["configs"]) == ["sdk-sse"]
    sdk = document["summary"]["sdk-sse"]
    assert sdk["failures"] == []

    assert set(sdk["echo"]) == {"1", "16", "64"}
    for result in sdk["echo"].values():
        assert result["errors"] == 0, result["error_samples"]
        assert result["rps"] > 0
        assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"]
        assert result["content_types"] == ["text/event-stream"]

    assert sdk["stream"]["errors"] == 0, sdk["stream"]["error_samples"]
    assert sdk["stream"]["events_per_s"] > 0

    replay = sdk["replay"]
    assert replay["error_samples"] == []
    assert replay["expected"] == 5000
    assert replay["verified"] == replay["attempts"] == document["plan"]["replays"]
    assert replay["replay_events_per_s"] > 0

    sessions = sdk["sessions"]
    assert sessions["pings"] == "10/10"
    assert sessions["rss_after_kb"] > sessions["rss_before_kb"]  # the SDK keeps state per session

    report = report_path.read_text()
    assert "| sdk-sse |" in report
    assert results_file.name in report
