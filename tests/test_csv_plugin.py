"""docs/plugins.md's CSV sink, run as printed there: its package (the python and toml blocks, as
written) built and installed with pip, behind a real relay through its entry point, loaded as
``module:Class`` from its project folder without installing, and the doc's own replay commands run
as written, twice without adding a row."""
from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import ROOT
from relay.client.publisher import Publisher

DOC = ROOT / "docs" / "plugins.md"
_BUILT: dict[str, Path] = {}  # this process's build of the package: project folder, and where pip installed it


def doc_block(lang: str) -> str:
    (code,) = re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)
    return code


def doc_example() -> str:
    return doc_block("python")


def package() -> tuple[Path, Path]:
    """The doc's project folder (``my_sinks/``) and the folder ``pip install ./my_sinks`` installed it
    into (``--target``: no network, nothing added to this environment), built once per process."""
    if not _BUILT:
        root = Path(tempfile.mkdtemp(prefix="csv-plugin-"))
        project = root / "my_sinks"
        (project / "my_sinks").mkdir(parents=True)
        (project / "pyproject.toml").write_text(doc_block("toml"))
        (project / "my_sinks" / "__init__.py").write_text("")
        (project / "my_sinks" / "csv_sink.py").write_text(doc_example())
        site = root / "site"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                               "--no-build-isolation", "--target", str(site), "./my_sinks"], cwd=root,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        _BUILT.update(project=project, site=site)
    return _BUILT["project"], _BUILT["site"]


def install(tmp_path: Path, entry_point: bool) -> dict[str, str]:
    """This environment with the doc's sink importable: installed (its entry point found), or only its
    project folder on PYTHONPATH (``package.module:Class`` only)."""
    project, site = package()
    where = site if entry_point else project
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]))


def rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def replay(journal: Path, sink: str, csv_file: Path, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", sink,
                           "--csv-file", str(csv_file)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_example_is_short() -> None:
    assert len(doc_example().rstrip("\n").splitlines()) <= 30  # the four abstract methods, three of them one line each


def test_the_docs_replay_commands_run_as_written(relays, tmp_path: Path) -> None:
    """The bash block's replay lines, run with the package installed as its pip line says (into a
    --target folder on PYTHONPATH) and with the relay's journal in relay-logs/."""
    env = install(tmp_path, entry_point=True)
    relay = relays(["--path", f"{tmp_path / 'relay-logs'}/"], env=env)
    pub = Publisher("doc-run", 0, world_size=1, address=relay.address)
    for step in range(1, 4):
        pub.publish("metrics", {"loss": 1.0 / step}, step=step, stage="train")
    assert pub.close(20) == 0 and relay.stop() == 0
    lines = [line for line in doc_block("bash").splitlines() if line.startswith(("relay replay", "PYTHONPATH="))]
    assert len(lines) == 2 and doc_block("bash").splitlines()[0].startswith("pip install ./my_sinks")
    bin_dir = Path(sys.executable).parent
    shell_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}
    for line, written in zip(lines, ("rebuilt.csv", "by-path.csv"), strict=True):
        command = line.split("  #")[0].strip().replace("PYTHONPATH=my_sinks", f"PYTHONPATH={shlex.quote(str(package()[0]))}")
        seen = []
        for _ in range(2):  # twice: the second adds nothing
            done = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, env=shell_env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, (command, done.stderr[-2000:])
            seen.append(rows(tmp_path / written))
        assert seen[0] == seen[1] and [r[2] for r in seen[0] if r[5] == "loss"] == ["1", "2", "3"], seen
    assert sorted(rows(tmp_path / "rebuilt.csv")) == sorted(rows(tmp_path / "by-path.csv"))


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
    replay(journal, "my_sinks.csv_sink:CsvSink", by_path, plain)
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


class Killed(BaseException):
    """The sink's process dies here: no ``except Exception`` runs, nothing is rolled back."""


def test_rows_written_but_not_recorded_when_the_process_died_are_written_once(tmp_path: Path, monkeypatch) -> None:
    """The doc's sink, killed after writing a batch's rows and before it recorded them (its state file's
    write): the next process on the same files, fed the whole run again as the relay's catch-up feeds it
    from the journal, cuts those rows (``appends_to``) and writes them once: its file is the file of one
    process that wrote every event once."""
    from sink_helpers import training_events
    from sinks import tracker_base
    from sinks.base import SinkContext

    example: dict = {}
    exec(doc_example(), example)
    events = training_events("job-cut", steps=6)

    def sink(path: Path):
        made = example["CsvSink"](str(path))
        made.open(SinkContext())
        return made

    first = sink(tmp_path / "m.csv")
    first.write(events[:10])
    recorded = (tmp_path / "m.csv").stat().st_size

    def killed(path, text) -> None:
        raise Killed
    monkeypatch.setattr(tracker_base, "write_atomic", killed)
    try:
        first.write(events[10:])
    except Killed:
        pass
    else:
        raise AssertionError("the state file was not written after the rows")
    monkeypatch.undo()
    assert (tmp_path / "m.csv").stat().st_size > recorded, "no row was written before the kill: it proves nothing"
    sink(tmp_path / "m.csv").write(events)
    sink(tmp_path / "once.csv").write(events)
    assert (tmp_path / "m.csv").read_text() == (tmp_path / "once.csv").read_text()
