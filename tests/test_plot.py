"""``relay plot``: the real command on a journal a real relay wrote from real publishers."""
from __future__ import annotations

import importlib
import io
import re
import struct
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from conftest import RelayProcess, free_port
from relay.cli.filters import MetricName, Selection
from relay.client.publisher import Publisher
from watch_helpers import cli_env, event, relay_cmd, training_journal, write_journal

plotting = importlib.import_module("relay.cli.plot")  # (relay.cli.plot, the attribute, is the click command)

STEPS = 20


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of two ranks, 20 steps: train loss (run-a's step 10 is NaN), eval loss every 5 steps,
    each rank's step time (run-b's rank 1 slow), all published through a real relay into its journal,
    which adds its own cluster figures of each step."""
    workdir = tmp_path_factory.mktemp("plot")
    path = workdir / "journal.jsonl"
    relay = RelayProcess(workdir, ["--path", str(path)], f"tcp://127.0.0.1:{free_port()}").start()
    try:
        for run in ("run-a", "run-b"):
            pubs = {rank: Publisher(run, rank, world_size=2, address=relay.address) for rank in (0, 1)}
            for step in range(1, STEPS + 1):
                times = {0: 0.1, 1: 0.3 if run == "run-b" else 0.1}
                for rank, took in times.items():
                    pubs[rank].publish("metrics", {"step_time": took}, step=step, stage="rank")
                loss = float("nan") if run == "run-a" and step == 10 else 3.0 / step
                pubs[0].publish("metrics", {"loss": loss, "learning_rate": 1e-3}, step=step, stage="train")
                if step % 5 == 0:
                    pubs[0].publish("metrics", {"loss": 2.0 / step}, step=step, stage="eval")
            for pub in pubs.values():
                assert pub.close(30) == 0
    finally:
        assert relay.stop() == 0
    return path


def plot(journal: Path, out: Path, *args: str) -> str:
    """Run ``relay plot``; the SVG it wrote (or nothing for other formats)."""
    proc = relay_cmd("plot", str(journal), "-o", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
    return out.read_text() if out.suffix == ".svg" else ""


def labels(svg: str) -> list[str]:
    return re.findall(r"<text [^>]*>([^<]*)</text>", svg)


def test_png(journal: Path, tmp_path: Path) -> None:
    out = tmp_path / "loss.png"
    plot(journal, out, "--metric", "train/loss", "--metric", "rank/step_time")
    blob = out.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and blob[12:16] == b"IHDR"
    width, height = struct.unpack(">II", blob[16:24])
    assert 600 <= width <= 2000 and 400 <= height <= 2000, (width, height)
    assert 10_000 < len(blob) < 2_000_000


def test_one_line_per_run_and_stage(journal: Path, tmp_path: Path) -> None:
    svg = plot(journal, tmp_path / "a.svg", "--metric", "train/loss", "--metric", "rank/step_time")
    assert svg.count('id="series-') == 4  # two panels, a line per run in each
    found = labels(svg)
    assert found.count("run-a") == 2 and found.count("run-b") == 2
    assert "train/loss" in found and "rank/step_time" in found  # the panels' titles

    both = labels(plot(journal, tmp_path / "b.svg", "--metric", "loss", "--run", "run-a"))
    assert {"train/loss", "eval/loss"} <= set(both) and "run run-a" in both  # a bare name: every stage holding it


def test_by_rank(journal: Path, tmp_path: Path) -> None:
    svg = plot(journal, tmp_path / "r.svg", "--metric", "rank/step_time", "--by", "rank", "--run", "run-b")
    assert svg.count('id="series-') == 2
    assert {"rank 0", "rank 1"} <= set(labels(svg))
    cluster = plot(journal, tmp_path / "c.svg", "--metric", "cluster/step_time_max", "--by", "rank")
    assert cluster.count('id="series-') == 2 and labels(cluster).count("run-a") == 1  # one rank: no rank label
    one = plot(journal, tmp_path / "one.svg", "--metric", "rank/step_time", "--by", "rank", "--rank", "1")
    assert one.count('id="series-') == 2 and not {"rank 0", "rank 1", "run-a rank 1"} & set(labels(one))


def test_nan_is_a_gap(journal: Path, tmp_path: Path) -> None:
    svg = plot(journal, tmp_path / "n.svg", "--metric", "train/loss")
    paths = re.findall(r'<g id="series-(\d)">\s*<path d="([^"]*)"', svg)
    moves = {int(i): d.count("M") for i, d in paths}
    assert moves == {0: 2, 1: 1}, "run-a's NaN at step 10 breaks its line; run-b's is whole"


def test_pdf(journal: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.pdf"
    plot(journal, out, "--metric", "loss")
    assert out.read_bytes()[:5] == b"%PDF-"


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("relay: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_errors(journal: Path, tmp_path: Path) -> None:
    unknown = one_line_error(relay_cmd("plot", str(journal), "--metric", "losss", "-o", str(tmp_path / "x.png")))
    assert unknown.endswith("no metric losss with a step in " + str(journal) + "; did you mean 'eval/loss', "
                            "'train/loss'?\n"), unknown
    far = one_line_error(relay_cmd("plot", str(journal), "--metric", "zzz", "-o", str(tmp_path / "x.png")))
    # 13 metrics there (the cluster's own among them): the 10 nearest are named, never all
    assert "; the 10 nearest of the 13 metrics there: 'cluster/cost', " in far and far.count("'") == 20, far
    filtered = one_line_error(relay_cmd("plot", str(journal), "--metric", "loss", "--stage", "rank",
                                        "-o", str(tmp_path / "x.png")))
    assert "with these filters" in filtered and "train/loss" not in filtered
    assert "cannot tell the image format" in one_line_error(
        relay_cmd("plot", str(journal), "--metric", "loss", "-o", str(tmp_path / "x.jpg")))
    (tmp_path / "taken.png").mkdir()
    for unwritable in (tmp_path / "no" / "such" / "x.png", tmp_path / "taken.png"):
        assert "cannot write" in one_line_error(
            relay_cmd("plot", str(journal), "--metric", "loss", "-o", str(unwritable)))
    assert "does not exist" in one_line_error(
        relay_cmd("plot", str(tmp_path / "missing.jsonl"), "--metric", "loss", "-o", str(tmp_path / "x.png")))
    for name in ("x.png", "no"):
        assert not (tmp_path / name).exists()


def test_without_matplotlib(journal: Path, tmp_path: Path) -> None:
    """The relay's own command line, in an interpreter where matplotlib cannot be imported."""
    code = "import sys; sys.modules['matplotlib'] = None; from relay.cli.main import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "plot", str(journal), "--metric", "loss", "-o",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=60, env=cli_env())
    assert "pip install './[plot]' in the metrics-relay checkout" in one_line_error(proc)


def test_a_long_line_is_decimated_and_says_so(tmp_path: Path) -> None:
    """3,000 steps: each line is drawn as the lowest and highest point of 1,000 buckets, the panel
    and the command say so, and the straggler's spikes in the own-work spread are all there."""
    path = tmp_path / "long.jsonl"
    training_journal(path, "long", 3000, t0=1.7e9, straggler_every=500)
    out = tmp_path / "long.svg"
    proc = relay_cmd("plot", str(path), "-o", str(out), "--metric", "loss", "--metric", "cluster/own_time_spread")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("relay plot: 6,000 points read; 2 of 2 lines had more than 2,000 and are drawn as the "
                           "lowest and highest point of each of 1,000 buckets (every spike kept)\n")
    svg = out.read_text()
    assert labels(svg).count("min/max of 1,000 buckets") == 2
    spread = re.search(r'<g id="series-1">.*?<path d="([^"]*)"', svg, re.S).group(1)
    heights = [float(y) for y in re.findall(r"[ML] -?[\d.]+ (-?[\d.]+)", spread)]  # (matplotlib drops collinear ones)
    top = min(heights)  # SVG's y grows downwards
    episodes = sum(1 for before, y in pairwise([None, *heights]) if y == top and before != top)
    assert episodes == 7, heights  # steps 1-2, 500-502, ..., 2500-2502, 3000: every episode a spike, none averaged away


def test_the_name_test_is_kept_only_where_it_skips_a_quarter_of_the_first_lines(monkeypatch) -> None:
    monkeypatch.setattr(plotting, "_PROBE", 8)
    holds = re.compile(b'"a"').search
    half = [b'{"a":1}\n', b'{"b":1}\n'] * 10
    assert list(plotting._lines(io.BytesIO(b"".join(half)), holds)) == half[::2]  # kept: it skips half
    most = [b'{"a":1}\n'] * 7 + [b'{"b":1}\n'] + half
    assert list(plotting._lines(io.BytesIO(b"".join(most)), holds)) == most  # dropped: it skips one in eight


@pytest.mark.parametrize("probe", [4, 4096])
@pytest.mark.parametrize("metrics", [("loss", "rank/step_time", "cluster/step_time_spread"), ("eval/loss",)])
def test_what_is_drawn_is_the_same_whether_the_name_test_is_kept_or_not(journal: Path, monkeypatch, probe: int,
                                                                          metrics: tuple[str, ...]) -> None:
    """The metric names' test decides what is parsed, never what is drawn."""
    chosen = Selection(metrics=tuple(map(MetricName.parse, metrics)))

    def drawn() -> dict:
        return {m.text: {key: (line.seen, line.points()) for key, line in series.items()}
                for m, series in plotting.collect(journal, chosen, by_rank=True).items()}

    monkeypatch.setattr(plotting, "_PROBE", probe)
    tested = drawn()
    monkeypatch.setattr(plotting, "_lines", lambda fh, holds: fh)
    assert tested == drawn() and all(tested.values()), tested


def test_a_mistyped_metric_among_hundreds_is_offered_the_10_nearest_names_at_most(tmp_path: Path) -> None:
    """A journal of 300 metrics: "did you mean" names the close ones, and a name near none of them gets
    the 10 least far, never the whole list (issue 44: one ~1,000-character line of every metric)."""
    path = tmp_path / "wide.jsonl"
    names = [f"layer{i}/grad_norm" for i in range(150)] + [f"loss_part_{i}" for i in range(150)]
    write_journal(path, [event("wide", 0, 0, 1.0, "metrics", dict.fromkeys(names, 1.0), step=1, stage="train",
                               world_size=1)])
    typo = one_line_error(relay_cmd("plot", str(path), "--metric", "train/loss_part_7x", "-o", str(tmp_path / "x.png")))
    offered = re.findall(r"'([^']+)'", typo.split("did you mean ", 1)[1])
    assert "train/loss_part_7" in offered and len(offered) <= 10 and len(typo) < 400, typo
    none = one_line_error(relay_cmd("plot", str(path), "--metric", "qqqq", "-o", str(tmp_path / "x.png")))
    assert "the 10 nearest of the 300 metrics there: " in none and none.count("'") == 20 and len(none) < 500, none
