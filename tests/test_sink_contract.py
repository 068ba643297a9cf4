"""The sink contract, one test per promise, run for every sink: replayed twice adds nothing; a relay
SIGKILLed mid-run delivers exactly once; an event the tool refuses for good is dead-lettered and the
rest written; a backend outage is caught up. Real relay processes, real publishers, real tracker
libraries read back through their own API (tests/sink_readback.py); each sink driven as its
process drives it (relay/sinkhost/driver.py). What is particular to one sink stays in its own file.
The shippers (``forward``, ``nats``: relay/ship/base.py) are no sinks: tests/test_forward.py and
tests/test_nats_sink.py hold them to theirs (exactly once through kills, ordering, back-pressure).
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sink_readback as rb
from conftest import line_count, read_jsonl, wait_for
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.sinkhost.catch_up import CatchUp
from relay.sinkhost.child import build_sink
from relay.sinkhost.driver import SinkDriver
from relay.sinkhost.replay import ReplayResult, replay_files
from relay.sinkhost.spec import SinkSpec
from relay.wire.lines import encode_line
from sink_helpers import Events, fill, finish_ranks, small_fs, start_rank, training_events  # noqa: F401 (small_fs: a fixture)
from sinks.base import CatchesUp, PermanentError, SinkContext, SinkError
from sinks.events import RELAY_RANK
from sinks.tracker_base import TrackerSink


@dataclass
class Target:
    """One sink as the contract sees it: its options for a workspace ``ws``, the run read back
    through its tool, what that must show, and when two read-backs are the same."""

    name: str
    options: Callable[[Path], dict[str, str]]
    read: Callable[[Path, str], Any]
    check: Callable[[Any, int], None]
    same: Callable[[Any, Any], None]
    refused: Callable[[Events], dict] | None = None  # an event the tool refuses for good, if there is one
    module: str | None = None  # the tracker library (skipped where not installed)
    env: Callable[[Path], dict[str, str]] | None = None  # for a plugin: where it is installed
    source: str = ""  # what a sink built in this process loads (a plugin: module:Class, on env's PYTHONPATH)
    after_restart: Callable[[Any], None] | None = None  # what a relay restarted mid-run leaves, particular to the tool
    run_open: str = ""  # what the relay's log says once the tool has the run on disk ({run}), where it says so


def journal_view(path: Path) -> dict[tuple[int, int], dict]:
    """A journal file as {(rank, seq): event}, each there exactly once."""
    found: dict[tuple[int, int], dict] = {}
    for line in path.read_bytes().splitlines():
        event = json.loads(line)
        key = (event["rank"], event["seq"])
        assert key not in found, f"rank {key[0]} seq {key[1]} twice in {path}"
        found[key] = event
    return found


def check_journal(view: dict[tuple[int, int], dict], steps: int) -> None:
    """Every rank's events, seqs 0.. without a gap, each once; the trainer's loss at every step."""
    for rank in (0, 1):
        seqs = sorted(seq for r, seq in view if r == rank)
        assert seqs == list(range(len(seqs))) and seqs, f"rank {rank}: seqs {seqs[:5]}..."
    loss = sorted(e["step"] for e in view.values() if e["stage"] == "train" and "loss" in e["data"])
    assert loss == list(range(1, steps + 1))


def same_journal(a: dict, b: dict) -> None:
    ranks = {k: v for k, v in a.items() if k[0] != RELAY_RANK}
    assert ranks == {k: v for k, v in b.items() if k[0] != RELAY_RANK}


def csv_rows(path: Path, run: str) -> list[list[str]]:
    with path.open(newline="") as fh:
        return [row for row in csv.reader(fh) if row[0] == run]


def check_csv(rows: list[list[str]], steps: int) -> None:
    """Each point once (the epoch comes again with each eval log, as HF logs it); the trainer's loss
    from rank 0 only, every step; each rank's step time."""
    points = [(r[1], r[2], r[4], r[5]) for r in rows if r[5] != "epoch"]
    assert len(points) == len(set(points)), "a point written twice"
    loss = sorted(int(r[2]) for r in rows if r[1] == "" and r[4] == "[]" and r[5] == "loss")
    assert loss == list(range(1, steps + 1)), loss
    for rank in ("0", "1"):
        assert sorted(int(r[2]) for r in rows if r[1] == rank and r[5] == "rank_step_time_s") == list(
            range(1, steps + 1))


def same_csv(a: list[list[str]], b: list[list[str]]) -> None:
    assert sorted(a) == sorted(b)


def csv_env(tmp_path: Path) -> dict[str, str]:
    """docs/plugins.md's CSV sink installed through an entry point, as tests/test_csv_plugin.py does."""
    from test_csv_plugin import install

    return install(tmp_path, entry_point=True)


def same_aim(a: rb.AimRunView, b: rb.AimRunView) -> None:
    assert a.metrics.keys() == b.metrics.keys()
    for key, series in a.metrics.items():
        assert series.keys() == b.metrics[key].keys(), key
        assert all(rb.same_float(series[s], b.metrics[key][s]) for s in series), key
    assert {k: v for k, v in a.params.items() if k != "relay"} == {k: v for k, v in b.params.items() if k != "relay"}
    assert a.experiment == b.experiment


def same_tensorboard(a: rb.Board, b: rb.Board) -> None:
    assert rb.values(a) == rb.values(b) and a.hparams == b.hparams and a.status == b.status
    assert {t: [json.loads(x) for x in v] for t, v in a.texts.items()} == {
        t: [json.loads(x) for x in v] for t, v in b.texts.items()}


def same_wandb(a: rb.WandbView, b: rb.WandbView) -> None:
    assert a.points() == b.points()
    for key, series in a.series.items():
        assert all(series[x] == b.series[key][x] or math.isnan(series[x]) for x in series), key
    assert {k: v for k, v in a.config.items() if not k.startswith("relay.")} == \
        {k: v for k, v in b.config.items() if not k.startswith("relay.")}


def same_clearml(a: rb.TaskView, b: rb.TaskView) -> None:
    assert a.scalars == b.scalars and a.params == b.params and a.model_config == b.model_config


def same_mlflow(a: rb.RunView, b: rb.RunView) -> None:
    strip = lambda h: {k: [(s, v) for s, v, _ in points] for k, points in h.items()}  # noqa: E731
    assert strip(a.history) == strip(b.history) and a.params == b.params and a.info.status == b.info.status


def tensorboard_restarted(board: rb.Board) -> None:
    """The run ended well, in one event file per process that wrote to it."""
    assert board.status == "STATUS_SUCCESS" and len(board.files) >= 2


def wandb_restarted(view: rb.WandbView) -> None:
    """The last W&B directory exited cleanly. (The killed sink process's directory is there too,
    unless it was killed while W&B was still setting it up: then the next process moved it aside,
    sinks/wandb_run.py; either way every point is there once, which check_wandb sees.)"""
    assert view.instances and view.instances[-1]["exit_code"] == 0, view.instances


TARGETS = {
    "jsonl": Target("jsonl", lambda ws: {"--path": f"{ws}/journal/"},
                    lambda ws, run: journal_view(ws / "journal" / f"{run}.jsonl"), check_journal, same_journal),
    "aim": Target("aim", lambda ws: {"--repo": str(ws / "aim")}, lambda ws, run: rb.read_repo(str(ws / "aim"))[run],
                  rb.check_aim, same_aim, module="aim"),
    "mlflow": Target("mlflow", lambda ws: {"--mlflow-tracking-uri": str(ws / "mlruns"),
                                           "--mlflow-experiment": rb.EXPERIMENT},
                     lambda ws, run: rb.read_run(str(ws / "mlruns"), run), rb.check_mlflow, same_mlflow,
                     module="mlflow"),
    "tensorboard": Target("tensorboard", lambda ws: {"--logdir": str(ws / "tb")},
                          lambda ws, run: rb.read_logdir(ws / "tb")[run], rb.check_tensorboard, same_tensorboard,
                          module="tensorboard", after_restart=tensorboard_restarted),
    "wandb": Target("wandb", lambda ws: {"--wandb-project": "relay-tests", "--wandb-dir": str(ws)},
                    lambda ws, run: rb.read_wandb(ws)[run], rb.check_wandb, same_wandb,
                    refused=lambda ev: ev(0, "metrics", {"_step": 1.0}, step=2, stage="additional_metrics"),
                    module="wandb", after_restart=wandb_restarted, run_open="W&B run {run} opened"),
    "clearml": Target("clearml", lambda ws: {"--clearml-project": "relay-tests", "--clearml-dir": str(ws / "clearml")},
                      lambda ws, run: rb.read_sessions(ws / "clearml")[run], rb.check_clearml, same_clearml,
                      module="clearml"),
    "csv": Target("csv", lambda ws: {"--csv-file": str(ws / "m.csv")}, lambda ws, run: csv_rows(ws / "m.csv", run),
                  check_csv, same_csv, env=csv_env, source="my_sinks.csv_sink:CsvSink"),
}


def target(name: str) -> Target:
    t = TARGETS[name]
    if t.module:
        pytest.importorskip(t.module)
    return t


@pytest.fixture(autouse=True)
def quiet_trackers(monkeypatch, tmp_path: Path) -> None:
    """Nothing lands in ~/.clearml or phones home; what the sinks set for their own process is put back."""
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml-default"))
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the directory store the MLflow target uses


@pytest.fixture
def workspace(tmp_path: Path, request):
    """``workspace(name)`` -> (target, ws, env)."""

    def make(name: str) -> tuple[Target, Path, dict[str, str] | None]:
        t = target(name)
        ws = tmp_path / "ws"
        ws.mkdir(exist_ok=True)
        return t, ws, t.env(tmp_path) if t.env else None
    return make


def cli_args(t: Target, ws: Path) -> list[str]:
    return ["--sink", t.name, *[x for kv in t.options(ws).items() for x in kv]]


def built(t: Target, ws: Path, env: dict[str, str] | None) -> Any:
    """The sink, built in this process as its process builds it (a plugin from its PYTHONPATH)."""
    if env and env["PYTHONPATH"].split(os.pathsep)[0] not in sys.path:
        sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
    return build_sink(SinkSpec(t.name, {k.lstrip("-").replace("-", "_"): v for k, v in t.options(ws).items()},
                               source=t.source))


def replay_here(journal: Path, t: Target, ws: Path, env: dict[str, str] | None) -> tuple[ReplayResult, Any]:
    """``relay replay`` in this process (what the command runs, without starting Python again), and its sink."""
    if t.name == "jsonl":
        return replay_files([journal], [], journal=Journal(f"{ws}/journal/")), None
    sink = built(t, ws, env)
    return replay_files([journal], [sink]), sink


def settled(t: Target, ws: Path, run: str, sent: list[dict]) -> Any:
    """The run read back."""
    return t.read(ws, run)


SINKS = list(TARGETS)
HEAVY = {"aim", "mlflow", "wandb"}  # their libraries take 10-20 s a test here: the full tier


def params(names: list[str]) -> list:
    """``names`` as parameters, the heavy trackers' marked slow, so the fast tier stays fast."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in names]


def files(t: Target, ws: Path) -> list[tuple[Path, int]]:
    """What a sink wrote under ``ws``, with sizes (not its state files, not links out of it, such as W&B's
    debug-core.log into the log its wandb-core shares with every run of the process, and not for Aim
    and MLflow, whose stores touch index files on every open)."""
    if t.name in ("aim", "mlflow"):
        return []
    return sorted((p.relative_to(ws), p.stat().st_size) for p in ws.rglob("*") if p.is_file() and not p.is_symlink()
                  and "relay-applied" not in p.parts and not p.name.endswith((".json", ".db-journal", ".lock", ".zip")))


@pytest.mark.parametrize("name", params(SINKS))
def test_replayed_twice_adds_nothing(workspace, tmp_path: Path, name: str) -> None:
    t, ws, env = workspace(name)
    source = tmp_path / "source"
    source.mkdir()
    events = training_events("job-replay")
    (source / "job-replay.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    replay_here(source / "job-replay.jsonl", t, ws, env)
    first = settled(t, ws, "job-replay", events)
    t.check(first, 6)
    written = files(t, ws)
    done, sink = replay_here(source / "job-replay.jsonl", t, ws, env)
    second = settled(t, ws, "job-replay", events)
    t.same(first, second)
    t.check(second, 6)
    assert done.events == len(events) and done.dead_lettered == 0 and done.bad_lines == 0
    assert files(t, ws) == written, "the second replay wrote something"
    if name == "jsonl":
        assert done.new == 0
    if isinstance(getattr(sink, "counters", None), dict) and "duplicates" in sink.counters:
        assert sink.counters["events"] == 0 and sink.counters["duplicates"] == len(events), sink.counters
    if name == "aim":
        runs = rb.read_repo(str(ws / "aim"))
        assert list(runs) == ["job-replay"] and runs["job-replay"].hash == first.hash


@pytest.mark.slow  # two relays, two rank processes, a tracker opened twice: 10-40 s each
@pytest.mark.parametrize("name", SINKS)
def test_relay_sigkill_mid_run_is_exactly_once(relays, workspace, tmp_path: Path, name: str) -> None:
    """Real publishers for two ranks; the relay is SIGKILLed mid-run once its sink has written, and
    started again on the same journal and address; every point lands once. Then the journal,
    replayed twice into a fresh place, gives what the live sink shows."""
    t, ws, env = workspace(name)
    journal, steps = tmp_path / "logs", 120
    args = ["--path", f"{journal}/", "--stats-interval", "0.3"] + ([] if name == "jsonl" else cli_args(t, ws))
    relay = relays(args, env=env)
    gate = tmp_path / "gate"  # the ranks' second halves wait for it: the kill comes mid-run, whatever the load
    procs = [start_rank(relay.address, "job-kill", rank, steps, pause=0.05, gate=gate, env=env) for rank in (0, 1)]
    wait_for(lambda: line_count(journal / "job-kill.jsonl") > 40, 120, "the ranks under way")
    if name != "jsonl":
        wait_for(lambda: relay.sink_stats(journal, name).get("written", 0) > 0
                 and t.run_open.format(run="job-kill") in relay.log.read_text(), 300, f"the {name} sink writing",
                 relay.log_tail)
    gate.touch()
    assert any(proc.poll() is None for proc in procs), "the publishers finished before the kill"
    relay.kill()
    killed_at = len((journal / "job-kill.jsonl").read_bytes().splitlines())
    time.sleep(0.5)
    restarted = relays(args, address=relay.address, env=env)
    finish_ranks(procs)
    # The new relay's sink has read the journal back (its first catch-up pass) before the relay
    # stops: a sink still opening when its relay stops leaves
    # that to the next relay, which here never comes.
    if name != "jsonl":
        wait_for(lambda: (s := restarted.sink_stats(journal, name)).get("open") and not s["queued"]
                 and s["catch_up_passes"] >= 1, 300, "the restarted relay's sink caught up",
                 lambda: f"{restarted.sink_stats(journal, name)}\n{relay.log_tail()}")
    assert restarted.stop() == 0
    assert 0 < killed_at < len((journal / "job-kill.jsonl").read_bytes().splitlines())  # killed mid-run
    sent = read_jsonl(journal / "job-kill.jsonl")
    live = journal_view(journal / "job-kill.jsonl") if name == "jsonl" else settled(t, ws, "job-kill", sent)
    t.check(live, steps)
    if t.after_restart:
        t.after_restart(live)
    if name == "jsonl":
        return
    fresh = tmp_path / "rebuilt"
    fresh.mkdir()
    for attempt in range(2):  # in this process: `relay replay` as a command is tested in each tool's own file
        replay_here(journal / "job-kill.jsonl", t, fresh, env)
        t.same(live, settled(t, fresh, "job-kill", sent))
        if attempt == 0:
            written = files(t, fresh)
    assert files(t, fresh) == written, "the second replay wrote something"


def poisoned(t: Target) -> tuple[list[dict], dict, Callable | None]:
    """training_events() with one more event the tool refuses (a real refusal where the tool has one,
    else the driver's fault hook refuses it)."""
    events = training_events("job-dl")
    ev = Events("job-dl")
    ev.seqs = {0: max(e["seq"] for e in events if e["rank"] == 0) + 1}
    bad = t.refused(ev) if t.refused else ev(0, "metrics", {"poison": 1.0}, step=2, stage="train")
    def fault(batch: list[dict]) -> None:  # by (rank, seq): the event read back from the journal too
        if any((e["rank"], e["seq"]) == (bad["rank"], bad["seq"]) for e in batch):
            raise PermanentError("poison: refused for good")
    return events[:12] + [bad] + events[12:], bad, None if t.refused else fault


@pytest.mark.parametrize("name", params([n for n in SINKS if n != "jsonl"]))  # the journal is not driven: it is the source
def test_a_permanent_error_is_dead_lettered_and_the_rest_written(workspace, tmp_path: Path, name: str) -> None:
    t, ws, env = workspace(name)
    events, bad, fault = poisoned(t)
    journal = tmp_path / "logs"
    journal.mkdir()
    (journal / "job-dl.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    sink = built(t, ws, env)
    sink.open(SinkContext(journal=journal / "job-dl.jsonl"))
    driver = SinkDriver(name, sink, DeadLetters(tmp_path / "dead.jsonl"), wait=lambda s: s <= 0, fault=fault)
    assert driver.write(events[:20]) and driver.write(events[20:]), driver.last_error
    if isinstance(sink, CatchesUp):
        # the run read back from the journal, refused event and all, as the sink's process does (a
        # hole's read, a pass), then by the driver of a later process (the same dead-letter file)
        later = SinkDriver(name, sink, DeadLetters(tmp_path / "dead.jsonl"), wait=lambda s: s <= 0, fault=fault)
        for again in (driver, later):
            assert all(again.write(batch, caught_up=True)
                       for batch in CatchUp(f"{journal}/", name).run_batches("job-dl")), again.last_error
        assert (later.dead_lettered, driver.caught_up, later.caught_up) == (0, len(events) - 1, len(events) - 1)
    driver.finish()
    assert (driver.dead_lettered, driver.deadletter_overflow, driver.written) == (1, 0, len(events) - 1)
    (kept,) = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert kept["reason"] == "permanent" and kept["event"]["seq"] == bad["seq"], kept
    t.check(settled(t, ws, "job-dl", [e for e in events if e is not bad]), 6)


@pytest.mark.parametrize("name", [
    "tensorboard", "clearml",
    "mlflow",
    "csv",
])  # Aim's (its read-back after the outage is not yet steady here), W&B's full disk (its sink process exits)
#      in their own files
def test_a_full_disk_is_caught_up_once_there_is_room(small_fs: Path, workspace, tmp_path: Path, name: str) -> None:
    """The tool's files fill their filesystem mid-run: writes fail, the driver retries with backoff,
    and once there is room again everything is there, each point once, as written without the outage."""
    import gc

    t, _, env = workspace(name)
    events = training_events("job-full", steps=40)
    reference = tmp_path / "reference"
    reference.mkdir()
    views = {}
    for ws, outage in ((small_fs, True), (reference, False)):
        sink = built(t, ws, env)
        sink.open(SinkContext())
        failures = []

        def wait(seconds: float, failures: list[float] = failures) -> bool:
            if seconds > 0:
                failures.append(seconds)
                if len(failures) == 3:
                    (small_fs / "filler").unlink()
            return True
        driver = SinkDriver(name, sink, wait=wait)
        assert driver.write(events[:30])
        if outage:
            fill(small_fs / "filler")
        assert driver.write(events[30:]) and driver.flush()
        driver.close()
        del sink, driver
        gc.collect()  # the tool's handles dropped after a failure, before it is read back
        assert len(failures) == (3 if outage else 0)
        views[outage] = settled(t, ws, "job-full", events)
    t.check(views[True], 40)
    t.same(views[False], views[True])


class Incomplete(TrackerSink):
    """A tracker sink whose author forgot ``finish_run``."""

    name = "incomplete"

    def start_run(self, run: str, params: dict) -> None: ...
    def log_metrics(self, run, rank, step, epoch, context, values, ts) -> None: ...  # noqa: E704
    def log_params(self, run: str, name: str, params: dict) -> None: ...  # noqa: E704


class NoSuperOpen(Incomplete):
    """Complete, with an ``open`` that does not call ``super().open()``."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple] = []

    def open(self, context: SinkContext) -> None:
        self.opened = context

    def log_metrics(self, run, rank, step, epoch, context, values, ts) -> None:
        self.points.append((run, rank, step, values))

    def finish_run(self, run: str, status: str) -> None: ...


def test_a_tracker_sink_missing_an_author_method_is_refused_when_built() -> None:
    """The relay builds each sink before it listens: a missing author method is its one-line error then."""
    with pytest.raises(SinkError, match=r"^sink incomplete failed to start: TypeError: Can't instantiate abstract "
                                        r"class Incomplete .*abstract method '?finish_run'?$"):
        build_sink(SinkSpec("incomplete", source=f"{__name__}:Incomplete"))


def test_every_tracker_sink_is_whole_and_holds_its_state_once_built(tmp_path: Path) -> None:
    """Built as the relay builds it (no tracker library imported yet), before ``open``."""
    for name in ("aim", "mlflow", "tensorboard", "wandb", "clearml"):
        options = TARGETS[name].options(tmp_path)
        sink = build_sink(SinkSpec(name, {k.lstrip("-").replace("-", "_"): v for k, v in options.items()}))
        assert isinstance(sink, TrackerSink) and not type(sink).__abstractmethods__, name
        assert sink.counters == {} and not sink.catch_up_due("r") and sink.context == SinkContext(), name


def test_an_open_that_forgets_super_still_writes() -> None:
    sink = NoSuperOpen()
    sink.open(SinkContext())
    sink.write(training_events("r1", steps=2))
    sink.flush()
    assert {p[2] for p in sink.points if p[1] is None and "loss" in p[3]} == {1, 2}
    assert sink.counters["events"] > 0 and sink.run_settled("r1")
