"""Reading a run from the fleet (issue 40, section 1), without NATS: two consuming relays' folders as
they are left by a takeover. c2 holds partition 0, whose view has a batch delivered again after
``--ack-wait`` committed last (each rank's seqs 40-59 at the end); c3 took partition 1 from c2, so
c2's view of it is a stale part. The viewers read each run whole, each rank in order, with the true
last step, and say where a view is stale and who holds it. (The same checks after the real fence
scenario: tests/test_fleet_fence.py.) And ``relay tail --nats-url URL RUN``, from the central
journal itself."""
from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet_read_helpers import check_viewers, in_rank_order
from relay.journal.fleet_views import ordered_lines
from relay.wire.lines import encode_line
from sinks.files import write_atomic
from watch_helpers import relay_cmd

STEPS = 100


def line(run: str, rank: int, seq: int) -> bytes:
    return encode_line({"v": 1, "run": run, "rank": rank, "local_rank": rank, "world_size": 2, "host": "h",
                        "seq": seq, "ts": 1_700_000_000.0 + seq, "type": "metrics", "step": seq, "epoch": None,
                        "stage": "train", "data": {"loss": round(1.0 / (seq + 1), 6)}})


def whole(run: str) -> list[bytes]:
    return [line(run, rank, seq) for seq in range(STEPS) for rank in (0, 1)]


def relay_folder(root: Path, name: str, held: list[int], views_: dict[int, list[bytes]], run: dict[int, str]) -> Path:
    folder = root / name
    for k, lines in views_.items():
        (folder / f"p{k}").mkdir(parents=True)
        (folder / f"p{k}" / f"{run[k]}.jsonl").write_bytes(b"".join(lines))
        (folder / f"p{k}" / "_relay_view.json").write_text(json.dumps({"central": "RELAY-journal@1", "position": 7}))
    write_stats(folder, held)
    return folder


def write_stats(folder: Path, held: list[int]) -> None:
    """The stats file a running consuming relay writes every second (at once, as it does)."""
    write_atomic(folder / f"_relay_consume_{folder.name}.json", json.dumps(
        {"name": folder.name, "pid": 1, "ts": time.time(), "errors": 0, "held": held, "partitions_total": 2,
         "holders": {"0": "c2", "1": "c3"}, "partitions": {}}))


@contextmanager
def running(*relays: tuple[Path, list[int]]) -> Iterator[None]:
    """The relays' stats files kept fresh, as running relays keep them, while the viewers look (at load
    10 the viewers of a test took longer than the 15 s a stats file counts as a running relay's)."""
    done = threading.Event()

    def write() -> None:
        while not done.wait(0.5):
            for folder, held in relays:
                write_stats(folder, held)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def fleet(tmp_path: Path) -> tuple[Path, Path, dict]:
    a, b = whole("run-a"), whole("run-b")
    late = [ln for ln in a if 40 <= json.loads(ln)["seq"] < 60]  # delivered again after --ack-wait: committed last
    c2 = relay_folder(tmp_path, "c2", [0], {0: [ln for ln in a if ln not in late] + late, 1: b[:120]},
                      {0: "run-a", 1: "run-b"})
    c3 = relay_folder(tmp_path, "c3", [1], {1: b}, {1: "run-b"})
    expected = {(ev["run"], ev["rank"], ev["seq"]): ln.rstrip(b"\n") for ln in a + b if (ev := json.loads(ln))}
    return c2, c3, expected


def test_a_view_read_in_order_puts_each_rank_in_sequence_and_keeps_an_ordered_view_as_written(tmp_path):
    c2, _, _ = fleet(tmp_path)
    view = c2 / "p0" / "run-a.jsonl"
    ordered = ordered_lines([view])
    assert ordered == whole("run-a")
    assert not in_rank_order([json.loads(ln) for ln in view.read_bytes().splitlines()])
    assert ordered_lines([c2 / "p1" / "run-b.jsonl"]) == (c2 / "p1" / "run-b.jsonl").read_bytes().splitlines(True)


def test_one_relays_folder_shows_every_run_and_a_stale_view_names_its_holder(tmp_path):
    c2, _, _ = fleet(tmp_path)
    with running((c2, [0])):
        one_relays_folder(c2)


def one_relays_folder(c2: Path) -> None:
    runs = relay_cmd("runs", "--json", str(c2))
    assert runs.returncode == 0, runs.stderr
    listed = {r["run"]: r for r in json.loads(runs.stdout)}
    assert listed["run-a"]["last_step"] == STEPS - 1 and not listed["run-a"]["stale"]
    assert listed["run-b"]["last_step"] == 59 and listed["run-b"]["stale"]
    said = re.sub(r"\d\d:\d\d:\d\d", "HH:MM:SS", runs.stderr.strip())
    assert said == (f"relay runs: {c2}/p1 is a stale view of partition 1: c2 no longer holds partition 1; c3 "
                    "holds it (as c2 read the leases at HH:MM:SS); it may lack the partition's latest lines: "
                    "give the holder's folder too (every consuming relay's folder reads each run whole)")
    table = relay_cmd("runs", str(c2))
    assert "unfinished (stale)" in table.stdout.splitlines()[2] and "run-b" in table.stdout.splitlines()[2]
    tail = relay_cmd("tail", "-n", "1", str(c2 / "p1"))
    assert tail.returncode == 0 and "c3 holds it" in tail.stderr and "step=59" in tail.stdout
    status = relay_cmd("status", str(c2))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].startswith("consuming relay c2 (pid 1, running, ") and "holds partitions 0 of 2" in lines[0]
    assert lines[1].startswith("p0 held: runs run-a step 99 (unfinished)")
    assert lines[2].startswith("p1 stale: runs run-b step 59 (unfinished) (") and "c3 holds it" in lines[2]
    assert json.loads(relay_cmd("status", "--json", str(c2)).stdout)["holders"] == {"0": "c2", "1": "c3"}


def test_two_relays_folders_show_each_run_whole_in_every_viewer(tmp_path):
    c2, c3, expected = fleet(tmp_path)
    with running((c2, [0]), (c3, [1])):
        check_viewers([c2, c3], expected, tmp_path, "train/loss")
        quiet = relay_cmd("runs", str(c2), str(c3))
    assert quiet.stderr == "" and "stale" not in quiet.stdout  # c3, given too, holds what c2 no longer does


def test_tail_follow_shows_each_line_committed_later_once(tmp_path):
    from relay.cli.filters import selection
    from relay.cli.fleet_read import FleetRead, FleetTail
    c2, c3, _ = fleet(tmp_path)
    with FleetRead([c2, c3], follow=True) as read:
        tail = FleetTail(read, selection(), as_json=True)
        tail.first_look(0, follow=True)
        more = [line("run-b", 0, STEPS), line("run-b", 1, STEPS)]
        with open(c3 / "p1" / "run-b.jsonl", "ab") as fh:
            fh.write(b"".join(more))
        with open(c2 / "p0" / "run-a.jsonl", "ab") as fh:  # a line the view holds already: not shown again
            fh.write(line("run-a", 0, 5))
        assert [raw for _, raw in tail._wanted(tail._fresh_lines())] == more
        tail.close()


def test_tail_reads_a_run_from_the_central_journal_itself(tmp_path):
    """``relay tail --nats-url URL RUN``: the run's partition from the fleet stream, its lines from
    the central journal (committed here a batch late, as a takeover leaves them), in order, each
    once; then what is committed since."""
    import asyncio

    import pytest
    pytest.importorskip("nats")
    import nats

    from fleet_helpers import create_stream, publish_raw
    from nats_helpers import NatsCluster, read_stream
    from relay.cli.fleet_stream import StreamRead
    from relay.fleet.central import CentralJournal
    from relay.fleet.connection import settings_from_options

    a = whole("run-a")
    late = [ln for ln in a if 40 <= json.loads(ln)["seq"] < 60]

    async def commit(urls: str, k: int, bodies: list[bytes]) -> None:
        nc = await nats.connect(urls)
        central = CentralJournal(nc, nc.jetstream(timeout=30), "RELAY", "relay.events", nc.max_payload, "test")
        await central.ensure(1)
        for body in bodies:
            await central.append(k, body, await central.last(k))
        await nc.close()

    with NatsCluster(tmp_path / "nats", size=1) as server:
        create_stream(server.urls, partitions=2)
        asyncio.run(publish_raw(server.urls, "relay.events", "node", {"run-a": [a[0].rstrip(b"\n")]}, 1))
        # the partition the stream put run-a in: the consuming relays would commit it there
        k = int(asyncio.run(read_stream(server.urls, "RELAY"))[0].subject.split(".")[2])
        asyncio.run(commit(server.urls, k, [b"".join(ln for ln in a if ln not in late), b"".join(late)]))
        tail = relay_cmd("tail", "--nats-url", server.urls, "--json", "-n", "1000", "run-a")
        assert tail.returncode == 0, tail.stderr
        assert tail.stdout.encode().splitlines(keepends=True) == a  # each rank in order, every line once
        gone = relay_cmd("tail", "--nats-url", server.urls, "run-b")
        assert gone.returncode == 1 and gone.stderr == (
            "relay: error: stream RELAY holds no message of run run-b (relay.events.*.*.run-b); give the run id "
            "as the trainer named it\n")
        with StreamRead(settings_from_options(server.urls), "RELAY", "relay.events", "run-a") as read:
            more = [line("run-a", 0, STEPS), line("run-a", 1, STEPS)]
            asyncio.run(commit(server.urls, k, [more[0] + a[3], more[1]]))  # a[3]: committed already
            assert list(read.fresh()) == more
