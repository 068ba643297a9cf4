"""`python -m bench --quick` still runs end to end and writes its report (no speed is asserted:
benchmarks are not timed tests)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from warm_ranks import WarmLauncher

pytestmark = pytest.mark.slow  # whole benchmark / soak processes: the full tier only

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ["hotpath", "ingest", "auth", "latency", "scale", "aim", "core", "transport", "forward", "sink_mlflow",
            "sink_tensorboard", "sink_wandb", "sink_clearml", "viewers"]


def raised(stderr: str, key: str) -> str:
    """The bench's log from where section ``key`` failed (its traceback), else the log's end."""
    at = stderr.find(f"section {key} failed")
    return stderr[at:at + 3000] if at >= 0 else stderr[-3000:]


def test_bench_quick_writes_every_section(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path), "--only", *SECTIONS],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [s["key"] for s in report["sections"]] == SECTIONS
    assert all(s["targets"] for s in report["sections"])
    failed = [s for s in report["sections"] for t in s["targets"] if t["target"] == "section ran"]
    assert not failed, "sections that raised: " + "; ".join(  # each one's error and its traceback
        f"{s['key']}: {s['notes']}\n{raised(done.stderr, s['key'])}" for s in failed)
    page = (tmp_path / "benchmarks.md").read_text()
    assert "python -m bench --quick" in page and "## Targets" in page
    for plot in ("bench_hotpath.png", "bench_ingest.png", "bench_latency.png", "bench_scale.png"):
        assert (tmp_path / plot).stat().st_size > 0
    scale = next(s for s in report["sections"] if s["key"] == "scale")
    assert all(p["lost"] == 0 and p["duplicated"] == 0 for p in scale["data"]["points"])  # correctness, not speed


def test_bench_quick_training_section_runs_all_three_contenders(
        tmp_path: Path, warm_launcher: WarmLauncher) -> None:
    """Three demo jobs (off, relay, AimCallback: in --quick one rank each under torchrun's
    launcher), the interleaved job and the two-rank collective timing job. The torchrun jobs run
    on warm ranks (a warm rank is a torchrun rank: tests/test_warm_ranks.py), the rest of the
    section in this process: what is proven is that each part runs and is reported, not how fast
    (the real bench, and `bench --quick` outside this test, launch real torchrun)."""
    import torch

    from bench import bench_training
    from bench.__main__ import training_section

    out, threads = tmp_path / "training.json", torch.get_num_threads()
    try:
        assert bench_training.main(["--quick", "--json", str(out)], launch=warm_launcher.run) == 0
    finally:
        torch.set_num_threads(threads)  # the interleaved job sets one (as OMP_NUM_THREADS=1)
    section = training_section(json.loads(out.read_text()), quick=True)
    interleaved = [row["name"] for row in section.data["interleaved"]]
    assert len(interleaved) == 4 and any("AimCallback" in name for name in interleaved)
    assert [row["n"] for row in section.data["rows"]] == [1] * 9 and section.data["ranks"] == 1
    assert len(section.targets) == 3
    # nothing timed, timed, nothing timed again
    assert [row["n"] > 0 for row in section.data["collective_timing"]] == [True] * 3
