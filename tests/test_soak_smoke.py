"""A 25-second `python -m bench.soak`: two ranks, the hostile client and a relay killed every 8 s
still end with every event journaled exactly once, and 4 SIGKILLs of a second relay under large
events (bench/crash.py) lose and repeat nothing (the hour-long run is `make soak`, not CI)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # whole benchmark / soak processes: the full tier only

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--seconds", "25", "--restart-every", "8", "--ranks", "2",
                           "--window", "10", "--crash-kills", "4", "--out", str(tmp_path), "--report", str(tmp_path / "docs" / "reliability.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert (tmp_path / "soak.json").exists(), done.stderr[-3000:]
    summary = json.loads((tmp_path / "soak.json").read_text())
    assert done.returncode == 0, (summary["failures"], done.stderr[-3000:])
    assert summary["journal"]["lost"] == 0 and summary["journal"]["duplicated"] == 0
    assert summary["journal"]["journaled"] == summary["journal"]["expected"] > 500
    assert summary["restarts"]["planned"] >= 2 and summary["restarts"]["unplanned"] == 0
    assert sum(summary["hostile"]["sent"].values()) > 50
    assert summary["relay"]["rejected_total"] > 0
    assert (tmp_path / "soak_rss.png").stat().st_size > 0
    assert [(x["layout"], x["kills"], x["ok"]) for x in summary["crash"]] == [("dir", 2, True), ("file", 2, True)]
    page = (tmp_path / "docs" / "reliability.md").read_text()
    assert "python -m bench.soak --seconds 25" in page and (tmp_path / "docs" / "soak_rss.png").exists()
