"""One writer per stream, loudly (docs/protocol.md "A stream belongs to the session sending it"):
real relay processes, real publisher processes, real sockets. A second process writing a (run, rank)
is refused and told so in one line, the relay logs it, ``relay runs`` marks the run ``conflict``;
a forger that sent seqs 0-99 and left never makes the real rank believe its events were journaled;
an elastic restart and a resumed attempt continue the stream."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

from conftest import (
    PUBLISHER,
    ROOT,
    finish,
    free_port,
    line_count,
    raw_socket,
    read_jsonl,
    wait_for,
)
from relay.wire import encoding
from sinks.events import RELAY_RANK, attempt_base, session_base

HOST = socket.gethostname()


def publisher(address: str, run: str, count: int, *, rank: int = 1, rate: float = 0.0, flush: float = 30.0,
              attempt: int = 0, restart: int = 0) -> subprocess.Popen:
    """A rank's stand-in (tests/publisher_proc.py), as torchrun's ``restart``-th start of it."""
    env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": str(restart)}
    return subprocess.Popen([sys.executable, str(PUBLISHER), address, run, str(rank), str(count), "2", str(rate),
                             str(flush), str(attempt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)


def refused_line(proc: subprocess.Popen) -> tuple[dict, str]:
    """A refused publisher's counters and the one line it said."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "is written by another process" in line]
    assert len(said) == 2 and said[1].endswith(f"were never acknowledged: {said[0]}"), err  # at once, at close
    return json.loads(out.strip().splitlines()[-1]), said[0]


def stream(events: list[dict], run: str, rank: int = 1) -> list[dict]:
    return [ev for ev in events if ev["run"] == run and ev["rank"] == rank]


def lines(path) -> int:
    """Whole lines in a journal file a relay may be writing (0: none yet)."""
    return len(read_jsonl(path, live=True)) if path.exists() else 0


def conflicts(events: list[dict], run: str) -> list[dict]:
    return [ev["data"] for ev in events if ev["run"] == run and ev["rank"] == RELAY_RANK
            and ev["data"].get("event") == "conflict"]


def refused_conflicts(port: int) -> float:
    """relay_frames_refused_total{reason="conflict"} as the relay's Prometheus endpoint says it now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        scraped = answer.read().decode()
    found = re.search(r'^relay_frames_refused_total\{reason="conflict"\} (\S+)$', scraped, re.M)
    return float(found.group(1)) if found else 0.0


def runs_status(journal, run: str) -> str:
    out = subprocess.run([sys.executable, "-m", "relay", "runs", str(journal), "--json"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, check=True).stdout
    return next(row["status"] for row in json.loads(out) if row["run"] == run)


def test_two_jobs_under_one_run_id_the_second_is_refused_and_said(relays, tmp_path) -> None:
    """The accidental case: two jobs given one explicit run id. The one that comes second, while the
    first writes and after it ended, is refused whole, never acknowledged, and says why in one line;
    the first is untouched; the relay logs it, journals a conflict event, counts it (Prometheus too)."""
    journal = tmp_path / "j.jsonl"
    port = free_port()
    relay = relays(["--path", str(journal), "--metrics-bind", f"127.0.0.1:{port}"])
    first = publisher(relay.address, "shared", 400, rate=200)
    wait_for(lambda: line_count(journal) > 10, 60, "the first job's events journaled")
    second = publisher(relay.address, "shared", 50, flush=3)
    stats, said = refused_line(second)
    done = finish(first)
    assert done["left"] == 0 and done["acked"] == done["published"]
    assert stats["acked"] == 0 and stats["left"] == stats["published"], "nothing of the second was acknowledged"
    pid = second.pid
    assert said.endswith(f"run shared rank 1 is written by another process (pid {first.pid} on host {HOST}); "
                         "use another --run_name"), said
    late = publisher(relay.address, "shared", 20, flush=3)  # after the first ended: its seqs repeat the first's
    late_stats, _ = refused_line(late)
    assert late_stats["acked"] == 0
    wait_for(lambda: refused_conflicts(port) >= 2, 30, "Prometheus counts the conflicts")
    assert relay.stop() == 0
    events = read_jsonl(journal)
    mine = stream(events, "shared")
    assert [ev["seq"] for ev in mine] == list(range(len(mine))) and len(mine) == done["published"]
    assert {ev["data"]["i"] for ev in mine if ev["type"] == "metrics"} == set(range(400))
    said_events = conflicts(events, "shared")
    assert [(c["why"], c["writer_pid"], c["refused_pid"]) for c in said_events] == [
        ("live", first.pid, pid), ("history", first.pid, late.pid)]
    log = relay.log.read_text()
    assert log.count("refused a second writer of run shared rank 1") == 2, relay.log_tail()
    assert relay.stats(journal)["rejected"]["conflict"] >= 2
    assert runs_status(journal, "shared") == "conflict"


def test_a_forger_that_sent_seqs_0_to_99_and_left_never_gets_the_real_rank_acknowledged(relays, tmp_path,
                                                                                          zmq_context) -> None:
    """A process with the user's secret sends seqs 0-99 of a run's rank and leaves. The real rank,
    coming after, is refused: it is never told that its events were acknowledged while the journal
    holds the forger's, and it says why."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    forger = raw_socket(zmq_context, relay.address)
    prefix = encoding.compact_prefix({"v": 1, "run": "victim", "rank": 1, "local_rank": 1, "world_size": 2,
                                      "host": "forger"})
    rows = [encoding.encode_row(seq, 1.0, "metrics", seq, None, "train", {"loss": 666.0}) for seq in range(100)]
    forger.send(encoding.compact_frame(prefix, rows))
    assert forger.poll(30_000), "the relay acknowledged the forger"
    forger.recv()
    forger.close()
    real = publisher(relay.address, "victim", 150, flush=3)
    stats, said = refused_line(real)
    assert stats["acked"] == 0 and stats["left"] == stats["published"] == 152
    assert said.endswith("run victim rank 1 is written by another process (on host forger); use another --run_name")
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert {ev["host"] for ev in stream(events, "victim")} == {"forger"}, "only the forger's events are there"
    assert [c["why"] for c in conflicts(events, "victim")] == ["history"]


def test_an_elastic_restart_of_a_killed_rank_continues_its_stream(relays, tmp_path) -> None:
    """torchrun restarts a rank (TORCHELASTIC_RESTART_COUNT=1) after the first was killed mid-run:
    its session numbers on above the first's and is taken whole, no conflict."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    first = publisher(relay.address, "elastic", 100_000, rate=500)
    wait_for(lambda: line_count(journal) > 20, 60, "the first run of the rank journaled something")
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    again = finish(publisher(relay.address, "elastic", 300, restart=1))
    assert again["left"] == 0 and again["acked"] == again["published"] == 302
    assert relay.stop() == 0
    events = read_jsonl(journal)
    seqs = [ev["seq"] for ev in stream(events, "elastic")]
    base = session_base(0, 1)
    assert seqs[-302:] == list(range(base, base + 302)) and all(seq < base for seq in seqs[:-302])
    assert conflicts(events, "elastic") == [] and "second writer" not in relay.log.read_text()


def test_a_resumed_attempt_continues_the_run_once_the_first_ended(relays, tmp_path) -> None:
    """Attempt 1 of a run (a job resumed from a checkpoint) after attempt 0 ended: taken whole. While
    attempt 0 still writes, attempt 1 is refused (two live writers), and taken once it has ended."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    assert finish(publisher(relay.address, "resumed", 200))["left"] == 0
    again = finish(publisher(relay.address, "resumed", 200, attempt=1))
    assert again["left"] == 0 and again["acked"] == 202
    zombie = publisher(relay.address, "resumed", 100_000, rate=300, attempt=2, flush=3)
    wait_for(lambda: any(ev["seq"] >= attempt_base(2) for ev in stream(read_jsonl(journal, live=True), "resumed")),
             60, "attempt 2 journaled")
    early = publisher(relay.address, "resumed", 50, attempt=3, flush=60)
    wait_for(lambda: "refused a second writer of run resumed" in relay.log.read_text(), 60, "attempt 3 refused")
    zombie.send_signal(signal.SIGKILL)
    zombie.wait(30)
    late = finish(early)  # its events were kept and sent again: taken once attempt 2 has gone
    assert late["left"] == 0 and late["acked"] == 52
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert [c["why"] for c in conflicts(events, "resumed")] == ["live"]
    seqs = [ev["seq"] for ev in stream(events, "resumed")]
    assert seqs[:202] == list(range(202)) and seqs[202:404] == list(range(attempt_base(1), attempt_base(1) + 202))
    assert seqs[-52:] == list(range(attempt_base(3), attempt_base(3) + 52))


def test_a_central_relay_refuses_a_second_nodes_writer_and_the_node_forwards_the_rest(relays, tmp_path) -> None:
    """Two jobs on two nodes under one run id: each node relay takes its own (it has one writer), and
    forwards its journal, hellos and their sessions as they are; the central judges them as a node
    relay does: the second node's stream is refused there, its forward sink says so and lets go of
    it, and its other streams still arrive."""
    central_dir = tmp_path / "central"
    central = relays(["--path", f"{central_dir}/"])
    dirs = [tmp_path / "node-a", tmp_path / "node-b"]
    nodes = []
    for d in dirs:
        node = relays(["--path", f"{d}/", "--sink", "forward", "--to", central.address, "--stats-interval", "0.2"],
                      start=False)
        node.log = tmp_path / f"{d.name}.log"
        nodes.append(node.start())
    first = finish(publisher(nodes[0].address, "twice", 200))
    wait_for(lambda: lines(central_dir / "twice.jsonl") >= 202, 60, "node a's run forwarded")
    assert first["left"] == 0
    second = finish(publisher(nodes[1].address, "twice", 100))  # its own node takes it: one writer there
    other = finish(publisher(nodes[1].address, "other", 100))
    assert second["left"] == other["left"] == 0
    wait_for(lambda: lines(central_dir / "other.jsonl") >= 102, 60, "node b's other run")
    wait_for(lambda: nodes[1].stats(dirs[1])["sinks"]["forward"].get("sink", {}).get("refused", 0) >= 102, 60,
             "node b's forward sink let go of the refused stream")
    for relay in (*nodes, central):
        assert relay.stop() == 0
    events = read_jsonl(central_dir / "twice.jsonl")
    assert len(stream(events, "twice")) == 202 and [c["why"] for c in conflicts(events, "twice")] == ["live"]  # node a still links it
    said = [line for line in (tmp_path / "node-b.log").read_text().splitlines() if "refuses run twice" in line]
    assert len(said) == 1 and "is written by another process" in said[0], said


def test_a_rank_torchrun_restarted_continues_its_stream(relays, tmp_path) -> None:
    """Real torchrun, ``--max-restarts=1``: the rank's first start SIGKILLs itself once its events are
    acknowledged; torchrun starts it again (TORCHELASTIC_RESTART_COUNT=1) under the same run id, and
    the restarted rank's events are all taken, above the first's: no conflict."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
                          "--max-restarts=1", "--monitor-interval=0.5", f"--master_port={free_port()}",
                          str(ROOT / "tests" / "elastic_publisher.py"), relay.address, "elastic-job", "50"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    stats = json.loads(job.stdout.strip().splitlines()[-1])
    assert stats["left"] == 0 and stats["acked"] == 52
    assert relay.stop() == 0
    events = read_jsonl(journal)
    seqs = [(ev["seq"], ev["type"]) for ev in stream(events, "elastic-job", rank=0)]
    base = session_base(0, 1)
    assert seqs[:51] == [(0, "hello")] + [(s, "metrics") for s in range(1, 51)]
    assert [s for s, _ in seqs[51:]] == list(range(base, base + 52))
    assert conflicts(events, "elastic-job") == []
