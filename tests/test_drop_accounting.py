"""A client's losses add up (docs/jsonl.md, "Losses are visible"): with real relay processes and a real
Publisher, a rank's lines before its last ``stats`` line number exactly ``published - dropped``, also
when the client's own earlier ``stats`` reports were among what it dropped; and a restarted relay's
``client_dropped`` holds what the journal says a rank's client reported as soon as the rank is met
again, not 0 until its next report."""
from __future__ import annotations

import time
from pathlib import Path

from conftest import free_port, read_jsonl, wait_for
from relay.client.publisher import Publisher


def test_published_less_dropped_is_the_lines_before_the_last_report_even_when_reports_were_dropped(
        relays, tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal)], address=address, start=False)
    pub = Publisher("acct", 0, address=address, max_events=4, resend_after=0.3)
    for i in range(70):  # no relay for 3.5 s: the window of 4 drops the oldest, its loss reports too
        pub.publish("metrics", {"i": i}, step=i)
        time.sleep(0.05)
    relay.start()
    assert pub.close(30) == 0, pub.stats
    assert relay.stop() == 0
    lines = read_jsonl(journal)
    final = lines[-1]
    assert (final["type"], final["stage"]) == ("stats", "client")
    published, dropped = final["data"]["published"], final["data"]["dropped"]
    assert len(lines) - 1 == published - dropped, final["data"]
    reports = published - 71  # hello and 70 metrics were published; the rest are the client's own reports
    assert reports >= 2 and len([e for e in lines[:-1] if e["type"] == "stats"]) < reports, \
        "some of the client's own loss reports were dropped: the case this holds for"
    assert final["data"]["dropped_sent"] == 0, "nothing was sent before it was dropped"
    assert relay.stats(journal)["client_dropped"] == dropped


def test_a_restarted_relay_counts_the_journaled_client_drops_of_a_rank_it_meets_again(relays, tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"], address=address, start=False)
    pub = Publisher("again", 0, address=address, max_events=3, resend_after=0.3)
    for i in range(10):
        pub.publish("metrics", {"i": i}, step=i)
    wait_for(lambda: pub.stats["dropped"] >= 5, 10, "the client dropping what it cannot hold")
    relay.start()
    assert pub.flush(20) == 0
    dropped = pub.stats["dropped"]
    wait_for(lambda: relay.stats(journal)["client_dropped"] == dropped, 30, "the report counted")
    relay.kill()
    relay.start()
    pub.publish("metrics", {"i": 10}, step=10)  # the rank is met again; no new loss to report
    assert pub.flush(20) == 0
    wait_for(lambda: relay.stats(journal)["client_dropped"] == dropped, 30,
             "the restarted relay counting what the journal holds of the rank's report")
    assert pub.close(20) == 0 and relay.stop() == 0
    assert relay.stats(journal)["client_dropped"] == dropped
