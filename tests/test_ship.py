"""The shippers (relay/ship/): ``--sink forward`` and ``--sink nats`` name shippers, which the host
tells from sinks by class; ``relay replay`` takes none (a relay on the journal ships it)."""
from __future__ import annotations

from pathlib import Path

from relay.fleet.nats_sink import NatsSink
from relay.forward.sink import ForwardSink
from relay.ship.base import is_shipper, load
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
