"""benchmarks/abuse.py runs end to end against this checkout's server and measures what it claims to.

Two cheap rows only (the others are load, run by hand): timing is not asserted, the outcome each row records is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_abuse_rows_l1_and_l2_run_and_record_the_refusals(tmp_path: Path) -> None:
    out = tmp_path / "abuse.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "abuse.py"), "--rows", "L1,L2", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"L1", "L2"}
    assert rows["L1"].count(": 400 ") + rows["L1"].count("| 400 ") == 2, rows["L1"]
    assert "HTTP 403" in rows["L2"], rows["L2"]
