"""docs/plugins.md's CSV sink, run as printed there: installed through an entry point behind a real
relay, loaded as ``module:Class`` without one, and replayed into twice without adding a row."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from relay.client.publisher import Publisher

MODULE = "csv_docs_sink"


def doc_example() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    return code


def install(tmp_path: Path, entry_point: bool) -> dict[str, str]:
    """The example as a module on PYTHONPATH, with or without a distribution registering it."""
    site = tmp_path / ("site-ep" if entry_point else "site-plain")
    site.mkdir()
    (site / f"{MODULE}.py").write_text(doc_example())
    if entry_point:
        meta = site / "csv_docs_sink-0.1.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: csv-docs-sink\nVersion: 0.1\n")
        (meta / "entry_points.txt").write_text(f"[metrics_relay.sinks]\ncsv = {MODULE}:CsvSink\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


def rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def replay(journal: Path, sink: str, csv_file: Path, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", sink,
                           "--csv-file", str(csv_file)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_example_is_short() -> None:
    assert len(doc_example().rstrip("\n").splitlines()) <= 25


def test_csv_sink_live_and_replayed(relays, tmp_path: Path) -> None:
    env = install(tmp_path, entry_point=True)
    live, journal = tmp_path / "live.csv", tmp_path / "journal.jsonl"
    relay = relays(["--path", str(journal), "--sink", "csv", "--csv-file", str(live)], env=env)
    ranks = [Publisher("csv-run", rank, world_size=2, address=relay.address) for rank in (0, 1)]
    for step in range(1, 6):
        for pub in ranks:
            pub.publish("metrics", {"loss": 2.0 / step, "eval_loss": 3.0}, step=step, epoch=step / 5, stage="train")
            pub.publish("metrics", {"step_time": 0.1 * (pub.rank + 1)}, step=step, stage="rank")
    assert all(pub.close(20) == 0 for pub in ranks)
    assert relay.stop() == 0
    got = rows(live)
    run_level = [r for r in got if r[1] == ""]  # rank None: the Trainer's series and the relay's cluster_*
    trainer = [r for r in run_level if not r[5].startswith("cluster_")]
    assert len(trainer) == 5 * 3  # loss, epoch, and eval loss under {"subset": "eval"}, from rank 0 only
    cluster = [r for r in run_level if r[5] == "cluster_slowest_rank"]  # derived by the relay from step_time
    assert [(r[2], r[6]) for r in cluster] == [(str(step), "1") for step in range(1, 6)]
    assert ["csv-run", "", "1", "0.2", "[('subset', 'eval')]", "loss", "3.0"] in trainer
    per_rank = [r for r in got if r[5] == "rank_step_time_s"]  # the wire's step_time, named for display
    assert sorted({r[1] for r in per_rank}) == ["0", "1"] and len(per_rank) == 10

    rebuilt = tmp_path / "rebuilt.csv"
    replay(journal, "csv", rebuilt, env)
    assert sorted(rows(rebuilt)) == sorted(got)
    before = rows(rebuilt)
    replay(journal, "csv", rebuilt, env)
    assert rows(rebuilt) == before, "replaying twice must add nothing"

    plain = install(tmp_path, entry_point=False)
    by_path = tmp_path / "by_path.csv"
    replay(journal, f"{MODULE}:CsvSink", by_path, plain)
    assert rows(by_path) == before


def test_serve_help_lists_installed_sinks_third_party_too(tmp_path: Path) -> None:
    env = install(tmp_path, entry_point=True)
    done = subprocess.run([sys.executable, "-m", "relay", "serve", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = done.stdout.split("Installed sinks", 1)[1]
    names = re.findall(r"^  (\S+)  ", listed, re.M)
    assert names == ["jsonl", "aim", "clearml", "csv", "forward", "mlflow", "nats", "tensorboard", "wandb"], listed
    assert re.search(r"^  csv +\S", listed, re.M), "one line about each sink, from its docstring"
