"""The shippers (relay/ship/): ``--sink forward`` and ``--sink nats`` name shippers, which the host
tells from sinks by class; ``relay replay`` takes none (a relay on the journal ships it). Their
state files are read and written by one store, the files the forward and nats shippers wrote before
it included (a node relay upgraded mid-life must not send everything again); and the journal is
read source by source from saved positions."""
from __future__ import annotations

import json
from pathlib import Path

from relay.fleet.chunks import position_file, positions
from relay.fleet.nats_sink import NatsSink
from relay.forward.sender import Forwarder
from relay.forward.sink import ForwardSink
from relay.ship.base import is_shipper, load
from relay.ship.sources import JournalSources
from sinks.base import Sink
from watch_helpers import relay_cmd


def test_the_forward_and_nats_destinations_are_shippers_and_the_trackers_sinks() -> None:
    assert load("forward") is ForwardSink and load("nats") is NatsSink
    assert is_shipper(ForwardSink) and is_shipper(NatsSink) and not is_shipper(Sink)
    assert not issubclass(ForwardSink, Sink) and not hasattr(Sink, "wants_events")


def test_replay_refuses_a_shipper_with_the_command_that_ships(tmp_path: Path) -> None:
    source = tmp_path / "src.jsonl"
    source.write_text("")
    done = relay_cmd("replay", str(source), "--sink", "forward", "--to", "tcp://127.0.0.1:9", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--sink forward ships a relay's journal as it grows and takes no replay" in done.stderr


TO = "tcp://127.0.0.1:1"


def forwarder(journal: Path, to: str = TO) -> Forwarder:
    return Forwarder(journal, to, server_key=None, client_cert=None, max_events=100)


def test_a_forward_state_file_the_old_code_wrote_is_read_and_written_back_the_same(tmp_path):
    journal = tmp_path / "node"
    journal.mkdir()
    old = '{"acked": {"r1": {"0": 12, "3": 7}}, "done": {"r1": 345}, "to": "tcp://127.0.0.1:1"}'
    (journal / "_relay_forward.json").write_text(old)  # as relay/forward/sender.py wrote it
    fw = forwarder(journal)
    assert fw.floors == {("r1", 0): 12, ("r1", 3): 7} and fw.read_size == {"r1": 345}
    fw._save()  # nothing read since: the same positions, in the same layout
    assert json.loads((journal / "_relay_forward.json").read_text()) == json.loads(old)
    other = forwarder(journal, "tcp://127.0.0.1:2")  # kept for another central: no positions
    assert other.floors == {} and other.read_size == {}
    (journal / "_relay_forward.json").write_text('{"to": "tcp://127.0.0.1:1", "acked": [1]}')
    assert forwarder(journal).floors == {}  # unreadable: no positions, no failure


def test_a_nats_state_file_the_old_code_wrote_is_read(tmp_path):
    journal = tmp_path / "node"
    journal.mkdir()
    target = {"node": "n1", "prefix": "relay", "stream": "RELAY"}
    old = {"sources": {"a": ["a.jsonl", 500, 9], "b": ["b.jsonl", 40]}, "target": target}
    (journal / "_relay_nats.json").write_text(json.dumps(old, sort_keys=True))
    state = position_file(journal, target)
    assert state.load(positions) == {"a": ("a.jsonl", 500, 9), "b": ("b.jsonl", 40, None)}
    state.save({"sources": {"a": ("a.jsonl", 500, 9), "b": ("b.jsonl", 40, None)}})
    saved = json.loads(state.path.read_text())
    assert saved["target"] == target and saved["sources"]["a"] == ["a.jsonl", 500, 9]
    assert position_file(journal, {**target, "node": "n2"}).load(positions) is None


def test_sources_are_runs_or_the_one_file_each_read_from_its_position(tmp_path):
    folder = tmp_path / "j"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"1\n2\n")
    (folder / "b.jsonl").write_bytes(b"3\n")
    runs = JournalSources(folder)
    assert dict(runs.sources()) == {"a": folder / "a.jsonl", "b": folder / "b.jsonl"}
    assert runs.of(["a"]) == {"a"} and runs.size("a") == 4 and runs.size("c") is None
    runs.seek("a", 2)
    assert runs.next_lines("a", 10) == [b"2"] and runs.position("a") == 4 and not runs.behind("a")
    assert runs.behind("b")
    one = JournalSources(tmp_path / "all.jsonl")
    assert one.of(["a", "b"]) == {None} and one.size(None) is None
    (tmp_path / "all.jsonl").write_bytes(b"x\ny\n")
    assert one.next_lines(None, 1) == [b"x"] and one.position(None) == 2 and one.behind(None)
