"""What the viewers must show of the fleet's folders (docs/deployment.md, "Reading a run from the
fleet"): every viewer's output, through the real ``relay`` command, against the node journals'
lines: each run whole, each event once, each rank's events in sequence order, the true last step,
the same values."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from watch_helpers import relay_cmd

Key = tuple[str, int, int]


def _events(lines: list[bytes]) -> list[dict]:
    return [json.loads(line) for line in lines]


def in_rank_order(events: list[dict]) -> bool:
    """Whether each (run, rank)'s seqs rise through ``events``."""
    last: dict[tuple[str, int], int] = {}
    for ev in events:
        key = (ev["run"], ev["rank"])
        if ev["seq"] <= last.get(key, -1):
            return False
        last[key] = ev["seq"]
    return True


def last_steps(expected: dict[Key, bytes]) -> dict[str, int]:
    """Each run's last step: the highest step of its metrics events."""
    steps: dict[str, int] = {}
    for ev in _events(list(expected.values())):
        if ev["type"] == "metrics" and isinstance(ev["step"], int):
            steps[ev["run"]] = max(steps.get(ev["run"], ev["step"]), ev["step"])
    return steps


def check_viewers(folders: list[Path], expected: dict[Key, bytes], tmp: Path, metric: str) -> None:
    """``relay runs``, ``tail``, ``plot``, ``replay`` and ``status`` given ``folders`` (consuming relays'
    folders) show what ``expected`` (the node journals' lines by (run, rank, seq)) holds."""
    args = [str(f) for f in folders]
    runs = relay_cmd("runs", "--json", *args)
    assert runs.returncode == 0, runs.stderr
    listed = {r["run"]: r for r in json.loads(runs.stdout)}
    assert {run: r["last_step"] for run, r in listed.items()} == last_steps(expected), runs.stdout
    assert not any(r["stale"] for r in listed.values()), runs.stdout

    tail = relay_cmd("tail", "--json", "-n", str(len(expected) + 10), *args)
    assert tail.returncode == 0, tail.stderr
    shown = tail.stdout.encode().splitlines()
    assert Counter(shown) == Counter(expected.values()), "relay tail: not every line once"
    events = _events(shown)
    assert in_rank_order(list(events)), "relay tail: a rank's events out of order"
    assert Counter((ev["run"], ev["rank"]) for ev in events) == Counter(key[:2] for key in expected)

    out = tmp / "replayed"
    replay = relay_cmd("replay", *args, "--sink", "jsonl", "--path", f"{out}/")
    assert replay.returncode == 0, replay.stderr
    replayed = [line for path in sorted(out.glob("*.jsonl")) for line in path.read_bytes().splitlines()]
    assert Counter(replayed) == Counter(expected.values()), "relay replay: not every line once"
    assert in_rank_order(_events(replayed)), "relay replay: a rank's events out of order"

    plot = relay_cmd("plot", *args, "--metric", metric, "--by", "rank", "-o", str(tmp / "plot.png"))
    assert plot.returncode == 0 and (tmp / "plot.png").stat().st_size > 0, plot.stderr
    from relay.cli.filters import selection
    from relay.cli.fleet_read import FleetRead
    from relay.cli.plot import collect
    with FleetRead(folders) as read:  # what relay plot drew: each rank's points, in step order
        series = collect(read.folder, selection(metrics=(metric,)), by_rank=True)
    lines = next(iter(series.values()))
    want: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for ev in sorted(_events(list(expected.values())), key=lambda ev: (ev["run"], ev["rank"], ev["seq"])):
        value = ev["data"].get(metric.rsplit("/", 1)[-1]) if ev["type"] == "metrics" else None
        if value is not None:
            want.setdefault((ev["run"], ev["rank"]), []).append((ev["step"], value))
    assert {(run, rank) for run, _, rank in lines} == set(want)
    for (run, _, rank), points in lines.items():
        drawn = points.points()
        if points.decimated:  # each bucket's lowest and highest: the node's points, in step order
            assert [p[0] for p in drawn] == sorted(p[0] for p in drawn) and set(drawn) <= set(want[(run, rank)])
        else:
            assert drawn == want[(run, rank)], f"relay plot: {run} rank {rank}: other points than the node's"

    for folder in folders:
        status = relay_cmd("status", str(folder))
        assert status.returncode == 0 and status.stdout.startswith("consuming relay "), status
