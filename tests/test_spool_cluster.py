"""A spool replayed into a journal gets the relay's own events (stage ``cluster``) a live relay would
have derived from its events (relay/daemon/rederive.py): the same job told to a relay that stays up,
and to one SIGKILLed before rank 0's last steps and its failed end (which rank 0 then spools and
``relay replay`` delivers), ends with the same cross-rank events, rank 1 named lost in both, and a
second replay adds nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT, read_jsonl
from relay.client.publisher import Publisher
from sinks.events import RELAY_RANK

STEP_TIME = {0: 0.1, 1: 0.5}  # rank 1 is slow: named a straggler at step 8 (8 of a window of 15)
BOTH = 8  # the steps both ranks report


def report(pub: Publisher, step: int) -> None:
    pub.publish("metrics", {"step_time": STEP_TIME[pub.rank]}, step=step, stage="rank")


def job(relay, tmp_path: Path, run: str, kill_before: int | None) -> Path:
    """Two ranks; rank 1 reports steps 1-8 and is gone; rank 0 reports steps 1-10 and ends failed.
    ``kill_before``: the relay is SIGKILLed before rank 0's step ``kill_before``: the rest is spooled."""
    ranks = [Publisher(run, rank, world_size=2, address=relay.address, spool_dir=tmp_path / "spool")
             for rank in (0, 1)]
    for step in range(1, BOTH + 1):
        for pub in ranks:
            report(pub, step)
    assert ranks[1].close(20) == 0  # rank 1 is done for: it never says train_end
    assert ranks[0].flush(20) == 0
    if kill_before is not None:
        relay.kill()
    for step in (BOTH + 1, BOTH + 2):
        report(ranks[0], step)
    ranks[0].publish("lifecycle", {"event": "train_end", "status": "failed", "error": "RuntimeError: peer gone"})
    ranks[0].close(1 if kill_before is not None else 20)
    return tmp_path / "spool" / f"{run}.rank0.spool.jsonl"


def relays_own(journal: Path) -> list[tuple]:
    """The relay's own events, without what depends on the clock (ts, how long a rank was silent)."""
    return [(e["seq"], e["type"], e["step"], sorted((k, v) for k, v in e["data"].items() if k != "silent_s"))
            for e in read_jsonl(journal) if e["rank"] == RELAY_RANK]


def replay(spool: Path, journal: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "relay", "replay", str(spool), "--sink", "jsonl", "--path",
                           str(journal)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_replayed_spool_gets_the_cluster_events_a_live_relay_would_have_journaled(relays, tmp_path: Path) -> None:
    live = tmp_path / "live.jsonl"
    relay = relays(["--path", str(live)])
    job(relay, tmp_path / "live", "live-run", kill_before=None)
    assert relay.stop() == 0  # it judges the ended run as it stops: rank 1 left behind

    journal = tmp_path / "spooled.jsonl"
    killed = relays(["--path", str(journal)])
    spool = job(killed, tmp_path / "spooled", "spooled-run", kill_before=BOTH + 1)
    assert spool.exists() and max(e[2] for e in relays_own(journal)) == BOTH, "the relay died before step 9"
    said = replay(spool, journal)
    assert "of the relay's own derived from them" in said, said
    expected = relays_own(live)
    events = [(e[1], e[2], dict(e[3]).get("event"), dict(e[3]).get("rank")) for e in expected if e[1] == "lifecycle"]
    assert events == [("lifecycle", 8, "straggler", 1), ("lifecycle", 10, "rank_lost", 1),
                      ("lifecycle", 10, "straggler_cleared", 1)], expected
    assert [e[2] for e in expected if e[1] == "metrics"] == list(range(1, BOTH + 3)), "every step's figures"
    assert relays_own(journal) == expected
    before = journal.read_bytes()
    replay(spool, journal)
    assert journal.read_bytes() == before, "a second replay adds nothing, derived events included"
