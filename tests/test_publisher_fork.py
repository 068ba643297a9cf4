"""A Publisher inherited by a forked child (relay/client/fork.py), tried with real forks against a real
relay: ``os.fork``, ``multiprocessing`` with fork and a torch DataLoader's workers. What a child
publishes reaches the journal once, in the parent's stream; what it cannot hand over is counted in
the parent's ``dropped`` and reported; nothing waits in a queue nobody sends."""
from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path

import pytest

from conftest import read_jsonl
from relay.client.fork import RECORD_MAX, ForkPipe
from relay.client.publisher import Publisher

PARENT = "parent"


def _publish_as_child(pub: Publisher, who: str, count: int) -> None:
    for i in range(count):
        pub.publish("metrics", {"who": who, "i": i}, step=i)


def _final(lines: list[dict]) -> dict:
    final = lines[-1]
    assert (final["type"], final["stage"]) == ("stats", "client"), final
    assert len(lines) - 1 == final["data"]["published"] - final["data"]["dropped"], final["data"]
    return final["data"]


def _values(lines: list[dict], who: str) -> list[int]:
    return [e["data"]["i"] for e in lines if e["type"] == "metrics" and e["data"].get("who") == who]


def test_events_of_forked_children_reach_the_journal_once_and_their_losses_are_counted(relays, tmp_path: Path) -> None:
    journal = tmp_path / "fork.jsonl"
    relay = relays(["--path", str(journal)])
    pub = Publisher("forked", 0, address=relay.address)
    _publish_as_child(pub, PARENT, 5)
    pid = os.fork()
    if pid == 0:  # the child: exits without running the parent's test machinery
        code = 1
        try:
            _publish_as_child(pub, "os.fork", 50)
            pub.publish("params", {"blob": "x" * (2 * RECORD_MAX)})  # more than one pipe record holds
            grandchild = os.fork()
            if grandchild == 0:
                _publish_as_child(pub, "grandchild", 10)  # to the same parent
                os._exit(0)
            code = os.waitpid(grandchild, 0)[1]
            pub.close()  # a child's close() waits for nothing: its events are the parent's to send
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    process = multiprocessing.get_context("fork").Process(target=_publish_as_child, args=(pub, "multiprocessing", 30))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    _publish_as_child(pub, "parent-after", 5)
    assert pub.close(30) == 0, pub.stats
    assert relay.stop() == 0
    lines = read_jsonl(journal)
    assert [e["seq"] for e in lines] == list(range(len(lines)))
    assert _values(lines, PARENT) == list(range(5)) and _values(lines, "parent-after") == list(range(5))
    assert _values(lines, "os.fork") == list(range(50)) and _values(lines, "multiprocessing") == list(range(30))
    assert _values(lines, "grandchild") == list(range(10))
    final = _final(lines)
    assert (final["dropped"], final["dropped_forked"]) == (1, 1), "the oversized event, counted and reported"
    assert pub.stats["forwarded"] == 90


def test_a_dataloaders_workers_can_track_metrics(relays, tmp_path: Path) -> None:
    """``track()`` from a DataLoader's worker processes (fork: the default on Linux) reaches the journal."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    from trainer import custom_metrics

    class Tracked(Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> torch.Tensor:
            custom_metrics.track({"item": i, "worker_pid": os.getpid()}, stage="data", step=i)
            return torch.tensor([i])

    journal = tmp_path / "loader.jsonl"
    relay = relays(["--path", str(journal)])
    custom_metrics.start("loader", address=relay.address)
    try:
        loader = DataLoader(Tracked(), batch_size=4, num_workers=2, multiprocessing_context="fork")
        assert sorted(int(x) for batch in loader for x in batch) == list(range(40))
    finally:
        assert custom_metrics.stop(30) == 0
    assert relay.stop() == 0
    lines = read_jsonl(journal)
    data = [e["data"] for e in lines if e["stage"] == "data"]
    assert sorted(d["item"] for d in data) == list(range(40))
    assert len({d["worker_pid"] for d in data} - {os.getpid()}) == 2, "both workers, neither the parent"
    assert _final(lines)["dropped"] == 0


class _Stray:
    """A tensor-like value whose ``tolist()`` fails (a CUDA tensor whose device is gone)."""

    def tolist(self) -> list[float]:
        raise RuntimeError("device gone")


def test_an_event_a_child_cannot_encode_is_counted_and_said(
        caplog: pytest.LogCaptureFixture) -> None:
    """A child's event that cannot be encoded never raises into its caller: the parent learns the
    drop through the pipe, and the child's log says why, with the traceback."""
    pipe = ForkPipe()
    try:
        with caplog.at_level(logging.WARNING, logger="relay.client.fork"):
            pipe.send((0.0, "metrics", 1, None, None, {"loss": _Stray()}))
            pipe.send((0.0, "metrics", 2, None, None, {"loss": 1.0}))
        events, dropped = pipe.receive()
    finally:
        pipe.close()
    assert dropped == 1 and [event[2] for event in events] == [2]
    assert "cannot encode (1 so far)" in caplog.text and "RuntimeError: device gone" in caplog.text
