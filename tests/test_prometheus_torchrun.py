"""A real Prometheus and Alertmanager (Debian's packages) scrape a relay serving a real two-rank
job (torchrun's agent, warm ranks: tests/warm_ranks.py; CPU, gloo) on the demo model, rank 1 slowed between steps (tests/slow_rank_job.py), and
fire the shipped rules (docs/monitoring/relay-rules.yml, with short ``for:`` durations and stall bar):
the straggler alert names rank 1; the job's series hold the journal's values (through Prometheus's
HTTP query API) and every dashboard query runs; SIGSTOP rank 0 and the stall alert fires; SIGKILL
the relay and the relay-down alert fires. One job serves every check, in that order (a stopped job
cannot straggle, a dead relay shows nothing). Each server runs on loopback, started and stopped here."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import free_port, read_jsonl, wait_for
from sinks.events import RELAY_RANK
from trainer_fixtures import ROOT, demo_model, launch_flags, seed_flags, trainer_env
from warm_ranks import WarmJob, WarmLauncher

PROMETHEUS, ALERTMANAGER = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    PROMETHEUS is None or ALERTMANAGER is None,
    reason="Debian's prometheus and prometheus-alertmanager are not installed and could not be (make test installs "
           "them as root: apt-get install -y prometheus prometheus-alertmanager)")]
__all__ = ["demo_model"]  # a fixture, used by name

MONITORING = ROOT / "docs" / "monitoring"
#: Seconds rank 1's collator sleeps per batch (two a step): it costs the job most of each step
#: whatever the load, so the relay names it at the 8th logged step (a window of 15).
SLEEP = "1.5"
JOB = ROOT / "tests" / "slow_rank_job.py"


def quick_rules() -> str:
    """The shipped rules, with the stall bar at 3 x the median interval and 5 s at least, and 2 s ``for:``."""
    rules = (MONITORING / "relay-rules.yml").read_text()
    quick = rules.replace("10 * relay_run_step_interval_median_seconds, 600",
                          "3 * relay_run_step_interval_median_seconds, 5")
    quick = quick.replace("> 600 unless", "> 5 unless")
    quick, fors = re.subn(r"for: \d+m", "for: 2s", quick)
    assert quick.count(", 5)") == 1 and "> 5 unless" in quick and fors == 6, "the shipped rules changed: update here"
    return quick


class Server:
    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.fixture
def monitoring(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Alertmanager and a Prometheus that scrapes the metrics port every second and sends it alerts."""
    ports = {name: free_port() for name in ("metrics", "prometheus", "alertmanager")}
    work = tmp_path / "monitoring"
    work.mkdir()
    (work / "rules.yml").write_text(quick_rules())
    (work / "alertmanager.yml").write_text(
        "route:\n  receiver: none\n  group_wait: 1s\n  group_interval: 1s\nreceivers:\n  - name: none\n")
    (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 1s}}
rule_files: [rules.yml]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["127.0.0.1:{ports['alertmanager']}"]}}]}}]
scrape_configs:
  - job_name: metrics-relay
    static_configs: [{{targets: ["127.0.0.1:{ports['metrics']}"]}}]
""")
    servers = [Server([ALERTMANAGER, "--config.file=alertmanager.yml", "--storage.path=am-data",
                       f"--web.listen-address=127.0.0.1:{ports['alertmanager']}", "--cluster.listen-address="],
                      work / "alertmanager.log"),
               Server([PROMETHEUS, "--config.file=prometheus.yml", "--storage.tsdb.path=prom-data",
                       f"--web.listen-address=127.0.0.1:{ports['prometheus']}"], work / "prometheus.log")]
    base = {name: f"http://127.0.0.1:{ports[name]}" for name in ("prometheus", "alertmanager")}
    try:
        for name, url in base.items():
            wait_for(lambda url=url: _ready(url + "/-/ready"), 60, f"{name} ready")
        yield {"metrics_port": ports["metrics"], **base}
    finally:
        for server in servers:
            server.stop()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def query(prometheus: str, expr: str) -> list[dict]:
    try:
        answer = get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc}: {exc.read()[:500]!r}") from None
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def one(prometheus: str, expr: str) -> float | None:
    result = query(prometheus, expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def firing(alertmanager: str, alert: str, **labels: str) -> bool:
    return any(a["labels"].get("alertname") == alert and a["status"]["state"] == "active"
               and all(a["labels"].get(k) == v for k, v in labels.items())
               for a in get(f"{alertmanager}/api/v2/alerts"))


def journal_figures(journal: Path) -> dict[str, Any]:
    """What the series must show, read from the journal."""
    events = read_jsonl(journal, live=True)
    ranks = [e for e in events if e["stage"] == "rank" and e["type"] == "metrics"]
    last = {rank: [e for e in ranks if e["rank"] == rank][-1] for rank in (0, 1)}
    losses = [e["data"]["loss"] for e in events if e["stage"] == "train" and "loss" in e["data"] and e["rank"] == 0]
    return {"lines": len(events), "last_step": max(e["step"] for e in ranks),
            "rank_step": {rank: e["step"] for rank, e in last.items()},
            "step_time": {rank: e["data"]["step_time"] for rank, e in last.items()},
            "own_time": {rank: e["data"]["own_time"] for rank, e in last.items()},
            "loss": losses[-1], "received": sum(e["rank"] != RELAY_RANK for e in events)}


def series_hold_the_journal(prometheus: str, run: str, journal: Path) -> bool:
    want = journal_figures(journal)
    sel = f'run="{run}"'
    got = {"lines": one(prometheus, "relay_events_journaled_total"),
           "received": one(prometheus, "relay_events_received_total"),
           "last_step": one(prometheus, f"relay_run_last_step{{{sel}}}"),
           "rank_step": {rank: one(prometheus, f'relay_rank_last_step{{{sel},rank="{rank}"}}') for rank in (0, 1)},
           "step_time": {rank: one(prometheus, f'relay_rank_step_duration_seconds{{{sel},rank="{rank}"}}')
                         for rank in (0, 1)},
           "own_time": {rank: one(prometheus, f'relay_rank_own_duration_seconds{{{sel},rank="{rank}"}}')
                        for rank in (0, 1)},
           "loss": one(prometheus, f"relay_run_loss{{{sel}}}")}
    return got == want


def dashboard_queries(run: str) -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [target["expr"].replace("$run", run).replace("$__rate_interval", "1m")
            for panel in dashboard["panels"] for target in panel["targets"]]


def test_prometheus_scrapes_a_real_job_and_alertmanager_gets_its_alerts(demo_model: Path, tmp_path: Path, relays,
                                                                          monitoring: dict[str, Any],
                                                                          warm_launcher: WarmLauncher) -> None:
    prometheus, alertmanager = monitoring["prometheus"], monitoring["alertmanager"]
    sockets = Path(tempfile.mkdtemp(prefix="prom-", dir="/tmp"))  # ipc paths are short; secure by default
    journals = tmp_path / "journal"
    relay = relays(["--path", f"{journals}/", "--metrics-bind", f"127.0.0.1:{monitoring['metrics_port']}",
                    "--metrics-loss", "--live", "off"], address=f"ipc://{sockets}/relay.sock")
    out = tmp_path / "out"
    cmd = (launch_flags(free_port())[:-2] + [str(JOB), "1", "collator", SLEEP, "--"]
           + seed_flags(demo_model, out, steps=2000, eval_steps=None) + ["--relay_address", relay.address])
    with open(tmp_path / "job.log", "wb") as log:
        job = warm_launcher.start(cmd, trainer_env(), stdout=log, stderr=subprocess.STDOUT)
    stopped: list[psutil.Process] = []
    try:
        run_file = out / "tracking_run.json"
        wait_for(run_file.exists, 240, "the job's run file")
        run = json.loads(run_file.read_text())["run"]
        wait_for(lambda: query(prometheus, f'relay_run_last_step{{run="{run}"}}'), 240, "the run's series scraped")

        wait_for(lambda: firing(alertmanager, "TrainingRankStraggling", run=run, rank="1"), 120, "straggler alert")
        assert not firing(alertmanager, "TrainingRankStraggling", run=run, rank="0")
        assert not firing(alertmanager, "TrainingRunStalled", run=run), "a running job is not stalled"

        workers = [p for p in psutil.Process(job.pid).children() if p.pid == job.rank_pids().get(0)]
        assert len(workers) == 1, (workers, job.rank_pids())
        workers[0].send_signal(signal.SIGSTOP)  # its peer blocks at the next collective: no step from either
        stopped.append(workers[0])
        wait_for(lambda: firing(alertmanager, "TrainingRunStalled", run=run), 120, "stall alert")

        journal = journals / f"{run}.jsonl"
        wait_for(lambda: series_hold_the_journal(prometheus, run, journal), 60,
                 f"the series hold the journal's values ({journal_figures(journal)})")
        assert one(prometheus, f'relay_run_world_size{{run="{run}"}}') == 2
        assert one(prometheus, f'relay_run_attempt{{run="{run}"}}') == 0
        assert one(prometheus, f'relay_run_ended{{run="{run}"}}') == 0
        assert one(prometheus, f'relay_run_seconds_since_last_step{{run="{run}"}}') > 5
        empty = [expr for expr in dashboard_queries(run) if not query(prometheus, expr)]
        assert all("lost_rank" in e or "refused" in e for e in empty), empty  # no rank lost, no frame refused

        relay.kill()
        wait_for(lambda: firing(alertmanager, "MetricsRelayDown", instance=f"127.0.0.1:{monitoring['metrics_port']}"),
                 60, "relay-down alert")
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
        stop_job(job)
        shutil.rmtree(sockets, ignore_errors=True)


def stop_job(job: WarmJob) -> None:
    """SIGKILL the job's agent and its ranks, and what they started. Under torchrun each rank was in a
    session of its own, which torchrun's process group did not reach: killed alone, torchrun left both
    ranks training on toward step 2000, orphaned, for hours of CPU beside the rest of the suite."""
    try:
        ranks = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.kill()
    job.wait(30)
    psutil.wait_procs(ranks, timeout=30)
