"""Journal lines for the line-checking tests (tests/test_chunk_check.py, tests/test_line_rules.py):
events as the relay writes them, and the ways a line breaks, or only bends, the rules."""
from __future__ import annotations

import random

from relay.wire.lines import encode_line


def event(rng: random.Random, seq: int) -> dict:
    return {"v": 1, "run": rng.choice(["run-a", "run-b"]), "rank": rng.randrange(3), "local_rank": 0,
            "world_size": 3, "host": "node", "seq": seq, "ts": 1.7e9 + seq, "type": "metrics",
            "step": seq, "epoch": rng.choice([None, 0.5, 2]), "stage": rng.choice(["train", None]),
            "data": {"loss": rng.choice([1.0 / (seq + 1), float("nan"), "x", 3])}}


#: Ways a line breaks (or, for some, only bends) the rules: each makes the line one parse_event may refuse.
BREAKS = [
    lambda e: e.update(rank=-1), lambda e: e.update(rank=True), lambda e: e.update(v=2), lambda e: e.update(v=True),
    lambda e: e.update(run="bad run/"), lambda e: e.update(seq=-3), lambda e: e.update(seq="7"),
    lambda e: e.update(ts=-1.0), lambda e: e.update(ts="NaN"), lambda e: e.update(type="nope"),
    lambda e: e.update(step=-1), lambda e: e.update(step=1.5), lambda e: e.update(epoch="NaN"),
    lambda e: e.update(stage="s" * 300), lambda e: e.update(data=[1]), lambda e: e.update(extra=1),
    lambda e: e.update(data={"deep": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {}}}}}}}}}}),
    lambda e: e.update(data={"nested": {"ok": [1, 2]}}), lambda e: e.pop("host", None), lambda e: e.pop("step", None),
    lambda e: e.pop("seq", None), lambda e: e.update(world_size=0), lambda e: e.update(host=5),
    lambda e: e.update(data={"k" * 300: 1}), lambda e: e.update(rank=1, world_size=1.0),
]
JUNK = [b"not json", b"[1, 2]", b"{}", b"42", b'{"v": 1', b"null", b'"a string"']


def lines(rng: random.Random, n: int, bad: float) -> list[bytes]:
    """``n`` lines, about a share ``bad`` of them broken (a fifth of those not JSON objects at all)."""
    out = []
    for seq in range(n):
        e = event(rng, seq)
        if rng.random() < bad:
            if rng.random() < 0.2:
                out.append(rng.choice(JUNK))
                continue
            rng.choice(BREAKS)(e)
        out.append(encode_line(e).rstrip(b"\n"))
    return out
