"""The Prometheus endpoint (relay/metrics/) without a Prometheus server: a real relay scraped over HTTP
while real rank processes publish, read with prometheus_client's own text parser (names, types,
help, labels against the one table, values against the journal); the table in docs/monitoring.md is
that table; bounded cardinality; usage errors; the shipped rules and dashboard name only metrics
that exist. tests/test_prometheus_torchrun.py has a real Prometheus and Alertmanager."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, finish, free_port, read_jsonl, wait_for
from relay.daemon.cross_rank import Cluster, ClusterConfig
from relay.daemon.run_health import RunHealth
from relay.metrics import relay_collector
from relay.metrics.relay_collector import RelayCollector
from relay.metrics.table import TABLE, Families
from test_cluster_relay import start_rank

prometheus_client = pytest.importorskip("prometheus_client", reason="the [prometheus] extra is not installed")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

DOCS = ROOT / "docs" / "monitoring.md"
RULES = ROOT / "docs" / "monitoring" / "relay-rules.yml"
DASHBOARD = ROOT / "docs" / "monitoring" / "grafana-dashboard.json"


def scrape(port: int) -> dict[str, prometheus_client.Metric]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels: str) -> float | None:
    family = families.get(name.removesuffix("_total"))
    for sample in family.samples if family else ():
        if sample.name == name and sample.labels == labels:
            return sample.value
    return None


def check_against_table(families: dict) -> None:
    """Every relay_ family is in TABLE with its type, help and labels (process_* are the client library's)."""
    for name, family in families.items():
        if name.startswith("process_"):
            continue
        full = name + "_total" if family.type == "counter" else name
        spec = TABLE[full]
        assert (family.type, family.documentation) == (spec.type, spec.help), name
        for sample in family.samples:
            assert set(sample.labels) == set(spec.labels), (name, sample.labels)


def test_a_sinks_flushes_and_closes_that_did_not_complete_and_its_lost_dead_letters_are_exported() -> None:
    out = Families()
    relay_collector.relay_figures(out, {"sinks": {"aim": {"written": 5, "incomplete_flushes": 3,
                                                          "incomplete_closes": 1, "deadletter_overflow": 2}}}, 0)
    samples = {sample.name: sample.value for family in out.all() for sample in family.samples
               if sample.labels == {"sink": "aim"}}
    assert samples["relay_sink_incomplete_flushes_total"] == 3 and samples["relay_sink_incomplete_closes_total"] == 1
    assert samples["relay_sink_deadletter_overflow_total"] == 2


def test_a_scrape_follows_the_table_and_the_journal(relays, tmp_path: Path) -> None:
    port = free_port()
    journal = tmp_path / "j"
    relay = relays(["--path", f"{journal}/", "--metrics-bind", f"127.0.0.1:{port}", "--metrics-loss",
                    "--straggler-window", "3", "--stats-interval", "1", "--live", "off"])
    # A client that connects and sends nothing holds the endpoint for a while, never ingest.
    idle = socket.create_connection(("127.0.0.1", port))
    ranks = [start_rank(relay.address, "r", rank, 2, 6, took) for rank, took in ((0, 0.05), (1, 0.25))]
    loss = subprocess.Popen([sys.executable, str(ROOT / "tests" / "publisher_proc.py"), relay.address, "solo", "0",
                             "5", "1", "0", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for proc in [*ranks, loss]:
        finish(proc)  # every event acknowledged: journaled while the endpoint was held
    idle.close()
    events = [e for f in sorted(journal.glob("*.jsonl")) for e in read_jsonl(f)]
    wait_for(lambda: value(scrape(port), "relay_events_journaled_total") == len(events), 30, "counters of a second ago")
    families = scrape(port)
    check_against_table(families)
    per_rank = {e["rank"]: e for e in events if e["run"] == "r" and e["stage"] == "rank"}  # the last of each rank
    assert value(families, "relay_run_last_step", run="r") == 6
    assert value(families, "relay_run_world_size", run="r") == 2
    assert value(families, "relay_run_ended", run="r") == 0
    for rank in (0, 1):
        assert value(families, "relay_rank_last_step", run="r", rank=str(rank)) == 6
        took = per_rank[rank]["data"]["step_time"]
        assert value(families, "relay_rank_step_duration_seconds", run="r", rank=str(rank)) == pytest.approx(took)
        assert value(families, "relay_rank_own_duration_seconds", run="r", rank=str(rank)) == pytest.approx(took)
    slowest = per_rank[1]["data"]["step_time"]
    assert value(families, "relay_run_step_duration_seconds", run="r") == pytest.approx(slowest)
    assert value(families, "relay_run_rank_step_duration_seconds", run="r", stat="max") == pytest.approx(
        per_rank[1]["data"]["step_time"])
    assert value(families, "relay_run_straggler_rank", run="r", rank="1") == 1
    assert value(families, "relay_run_stragglers", run="r") == 1
    # rank 1 (0.25 s a step against 0.05 s) costs the job most of each step; rank 0 less than nothing
    assert value(families, "relay_run_rank_cost_ratio", run="r", rank="1") > 0.5
    assert value(families, "relay_run_rank_cost_ratio", run="r", rank="0") < 0
    assert value(families, "relay_run_ranks_lost", run="r") == 0
    assert 1 < value(families, "relay_run_steps_per_second", run="r") < 1 / 0.05 * 1.2  # the first rank's pace
    assert 0 <= value(families, "relay_run_seconds_since_last_step", run="r") < 60
    solo_loss = [e["data"]["loss"] for e in events if e["run"] == "solo" and "loss" in e["data"]][-1]
    assert value(families, "relay_run_loss", run="solo") == pytest.approx(solo_loss)
    assert value(families, "relay_events_received_total") == len([e for e in events if e["rank"] < 2**24 - 1])
    assert value(families, "relay_sink_written_events_total", sink="jsonl") == len(events)
    assert value(families, "process_resident_memory_bytes") > 0
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert relay.stop() == 0


def test_a_run_without_per_rank_windows_gets_its_step_pace_and_stall_series(relays, tmp_path: Path) -> None:
    """Issue 44 §7: a custom loop publishing only ``train`` metrics events through ``Publisher`` (no
    stage ``rank``) was only ``relay_runs 1``; its events' steps now give it the run's step, pace and
    stall series, and per-rank series stay for the runs that send per-rank windows."""
    port = free_port()
    relay = relays(["--path", f"{tmp_path / 'j'}/", "--metrics-bind", f"127.0.0.1:{port}", "--live", "off"])
    custom = subprocess.Popen([sys.executable, str(ROOT / "tests" / "publisher_proc.py"), relay.address, "custom",
                               "0", "21", "1", "40", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT)  # steps 0..20, 40 a second
    finish(custom)
    wait_for(lambda: value(scrape(port), "relay_run_last_step", run="custom") == 20, 30, "the custom run's last step")
    families = scrape(port)
    check_against_table(families)
    assert value(families, "relay_run_world_size", run="custom") == 1
    assert 2 < value(families, "relay_run_steps_per_second", run="custom") < 400  # 40 a second, published
    assert 0 < value(families, "relay_run_step_interval_median_seconds", run="custom") < 1
    assert 0 <= value(families, "relay_run_seconds_since_last_step", run="custom") < 60
    assert value(families, "relay_run_last_step_timestamp_seconds", run="custom") > 1.7e9
    assert value(families, "relay_rank_last_step", run="custom", rank="0") is None  # no per-rank window sent
    assert relay.stop() == 0


def test_the_table_in_docs_is_the_table() -> None:
    rows = re.findall(r"^\| `(relay_\w+)` \| (\w+) \| ([^|]*) \| (.*) \|$", DOCS.read_text(), re.M)
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels)), help) for name, kind, labels, help in rows}
    assert documented == {name: (spec.type, spec.labels, spec.help) for name, spec in TABLE.items()}


def test_counters_end_in_total_and_units_are_base_units() -> None:
    for name, spec in TABLE.items():
        assert name.startswith("relay_") and (name.endswith("_total") == (spec.type == "counter")), name
        assert not re.search(r"_(ms|milliseconds|mb|mib|minutes)(_|$)", name), name


def test_per_rank_series_stop_at_the_documented_world_size_and_runs_at_theirs(monkeypatch: pytest.MonkeyPatch) -> None:
    health, cluster = RunHealth(), Cluster(ClusterConfig())
    for run, world in (("small", 2), ("big", 3)):
        for rank in range(world):
            health.observe({"run": run, "rank": rank, "world_size": world, "type": "metrics", "stage": "rank",
                            "step": 1, "data": {"step_time": 0.1 * (rank + 1)}}, now=1.0 if run == "small" else 2.0)
    collector = RelayCollector(dict, health, cluster, max_memory_mib=0, max_runs=5, max_ranks=2)
    samples = [(s.name, s.labels) for family in collector.collect() for s in family.samples]
    ranked = {labels["run"] for name, labels in samples if name.startswith("relay_rank_")}
    assert ranked == {"small"}, "the 3-rank run is over --metrics-max-ranks 2"
    assert ("relay_run_rank_step_duration_seconds", {"run": "big", "stat": "median"}) in samples
    collector.max_runs = 1
    assert {labels.get("run") for family in collector.collect() for _, labels, *_ in family.samples} == {"big"}
    collector.max_runs, collector.max_ranks = 5, 64
    monkeypatch.setattr(relay_collector, "RANK_SERIES", 4)  # "big" (3 ranks, the most recent) first, then 1 left
    assert {s.labels["run"] for family in collector.collect() for s in family.samples
            if s.name.startswith("relay_rank_")} == {"big"}


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(relay_[a-z_]+)", text))


def test_the_rules_and_the_dashboard_name_only_metrics_of_the_table() -> None:
    known = set(TABLE)
    rules = RULES.read_text()
    assert metric_names(rules) <= known
    alerts = set(re.findall(r"alert: (\w+)", rules))
    assert {"TrainingRunStalled", "TrainingRankStraggling", "MetricsRelayDown"} <= alerts
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus" and metric_names(variables["run"]["definition"]) <= known
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    for panel in dashboard["panels"]:
        assert panel["type"] in ("timeseries", "stat", "table") and panel["title"]
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
        for target in panel["targets"]:
            assert target["refId"] and metric_names(target["expr"]) <= known, target


@pytest.mark.parametrize("bind, message", [
    ("nonsense", "--metrics-bind 'nonsense' is not [HOST:]PORT"),
    ("127.0.0.1:99999", "--metrics-bind '127.0.0.1:99999' is not [HOST:]PORT"),
    ("[::1:9464", "is not [HOST:]PORT"),
])
def test_a_bad_metrics_bind_is_one_line_and_exit_2(tmp_path: Path, bind: str, message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:*", "--metrics-bind", bind],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("relay: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_a_metrics_port_in_use_is_exit_3_and_leaves_no_journal(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:*", "--metrics-bind",
                               str(port), "--live", "off"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines()[-1] == (f"relay: error: --metrics-bind 127.0.0.1:{port} is already in use; "
                                            "stop the other relay or choose another address")
    assert list(tmp_path.iterdir()) == [], "no journal lock, no empty journal folder"
