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


def test_quick_modern_benchmark_of_our_server_reports_verified_calls_and_tasks(tmp_path: Path) -> None:
    """benchmarks/modern.py --quick on ours-none alone (the SDK and SQLite rows are load, run by hand): every
    stateless call answered with the expected result, every task created and polled to ``completed``."""
    report_path = tmp_path / "RESULTS-modern.md"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "modern.py"),
        "--quick",
        "--only",
        "ours-none",
        "--results-dir",
        str(tmp_path),
        "--report",
        str(report_path),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]

    [results_file] = tmp_path.glob("modern-*.json")
    document = json.loads(results_file.read_text())
    assert list(document["configs"]) == ["ours-none"] and document["plan"]["reps"] == 1
    [window] = document["windows"]
    assert "failed" not in window, window.get("failed")
    assert [row["concurrency"] for row in window["call"]] == document["plan"]["concurrency"]
    for row in [*window["call"], window["tasks"]]:
        assert row["errors"] == 0, row["error_samples"]
        assert row["operations"] > 0 and row["ops_per_s"] > 0
    assert window["tasks"]["requests"] >= 2 * window["tasks"]["operations"], "each task: its call and >= 1 poll"
    summary = document["summary"]
    assert summary["call"]["ours-none"]["16"]["rps"] > 0 and summary["tasks"]["ours-none"]["tasks_per_s"] > 0
    assert results_file.name in report_path.read_text()
