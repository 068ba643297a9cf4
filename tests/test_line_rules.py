"""Journal lines are judged by the wire's one engine (relay/wire/lines.py): msgspec types decide
(``decode_lines``, what every reader of lines applies), the explainer says why (``explain_line``).
On lines bent every way they give the same verdict; a line taken is the values it holds, of the same
types (5 and 5.0 differ: the forward sink sends them on); and every plain line the relay writes is
taken."""
from __future__ import annotations

import random
import subprocess
import sys

import orjson

from conftest import ROOT
from line_helpers import BREAKS, JUNK, event
from relay.wire.lines import (
    decode_lines,
    encode_line,
    envelope_of,
    explain_line,
    parse_event,
    parse_line,
    row_of,
)
from sinks.events import FIELDS
from test_event_model import NEW_FIELD

#: Text-level bends of a line as the relay writes it: what orjson and msgspec might read apart.
_TEXT = [
    lambda t: t.replace(b'"seq":', b'"seq":-1,"seq":', 1),  # a duplicated key: the last one counts
    lambda t: t.replace(b'"rank":', b'"rank":1.0,"rank":', 1),
    lambda t: t.replace(b'"ts":', b'"ts":5,"ts":', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"big":123456789012345678901234567890,', 1),  # past 64 bits
    lambda t: t.replace(b'"data":{', b'"data":{"u64":18446744073709551615,', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"i64":-9223372036854775808,', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"huge":1e400,', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"neg0":-0,"e":1E2,', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"s":"\\ud800",', 1),  # a lone surrogate
    lambda t: t.replace(b'"data":{', b'"data":{"s":"\\u00e9\\n\\"",', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"t":true,"n":null,', 1),
    lambda t: t.replace(b'"host":"node"', b'"host":"n\xc3\xa9"', 1),
    lambda t: t.replace(b'"host":"node"', b'"host":"\xff"', 1),  # not UTF-8
    lambda t: t.replace(b'"ts":', b'"ts":1700000000,"x":', 1),  # an unknown field
    lambda t: t.replace(b'"ts":1', b'"ts":253402300800', 1),  # past the year 9999
    lambda t: t.replace(b'"epoch":null', b'"epoch":1000000000000000', 1),
    lambda t: t.replace(b'"epoch":null', b'"epoch":1000000000000001', 1),
    lambda t: t.replace(b'"step":', b'"step":9223372036854775807,"y":', 1),
    lambda t: t.replace(b'"seq":', b'"seq":9223372036854775808,"z":', 1),
    lambda t: t.replace(b'"v":1', b'"v":1.0', 1),
    lambda t: t.replace(b'"type":"metrics"', b'"type":"hello"', 1),
    lambda t: t.replace(b'"run":"run-a"', b'"run":"a b"', 1),
    lambda t: t.replace(b'"run":"run-a"', b'"run":"' + b"r" * 129 + b'"', 1),
    lambda t: t.replace(b'"run":"run-b"', b'"run":".hidden"', 1),
    lambda t: b" " + t + b" ",
    lambda t: t + b"{}",
    lambda t: t[:-1],
    lambda t: t.replace(b',"', b', "'),
    lambda t: t.replace(b'"data":{', b'"data":{"deep":[[[[[[[[[1]]]]]]]]],', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"' + b"k" * 256 + b'":1,', 1),
    lambda t: t.replace(b'"data":{', b'"data":{"' + "é".encode() * 256 + b'":1,', 1),  # 256 characters, 512 bytes
]


def _line(rng: random.Random, seq: int) -> bytes:
    e = event(rng, seq)
    for _ in range(rng.choice([0, 0, 1, 2])):
        rng.choice(BREAKS)(e)
    if rng.random() < 0.3:  # fields in another order, some optional ones left out
        keys = list(e)
        rng.shuffle(keys)
        e = {k: e[k] for k in keys if not (k in ("v", "local_rank", "world_size", "epoch") and rng.random() < 0.3)}
    text = encode_line(e).rstrip(b"\n")
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        text = rng.choice(_TEXT)(text)
    return text if rng.random() > 0.03 else rng.choice(JUNK)


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b or (a != a and b != b)


def test_the_types_and_the_explainer_agree_on_every_line() -> None:
    rng = random.Random(2027)
    outcomes = {"taken": 0, "refused": 0, "not an object": 0}
    for _ in range(300):
        lines = [_line(rng, seq) for seq in range(rng.randrange(1, 40))]
        for line, item in zip(lines, decode_lines(lines), strict=True):
            why = explain_line(line)
            assert (item is None) == (why is not None), (line, why)
            event = parse_event(line)
            assert (event is None) == (item is None)  # one verdict, line by line or in a chunk
            if item is None:
                outcomes["refused" if parse_line(line) is not None else "not an object"] += 1
                continue
            outcomes["taken"] += 1
            written = parse_line(line)
            assert written is not None
            assert all(_same(getattr(item, k), written[k]) for k in written), (line, item, written)
            assert envelope_of(item) + row_of(item) == tuple(event[k] for k in FIELDS)
    assert min(outcomes.values()) > 100 and outcomes["taken"] > 1500, outcomes


def test_every_plain_line_the_relay_writes_is_taken() -> None:
    rng = random.Random(7)
    lines = []
    for seq in range(500):
        e = event(rng, seq)
        e["data"] = {"loss": rng.random(), "step_time": rng.randrange(10**6), "note": rng.choice(["", "é", None, True])}
        e["epoch"] = rng.choice([None, 1, 0.25])
        e["type"] = rng.choice(["metrics", "params", "lifecycle", "stats", "hello"])
        lines.append(orjson.dumps(e))
    assert None not in decode_lines(lines)


#: The event model's one-edit new field (tests/test_event_model.py), then what the line types
#: make of it.
TYPED_NEW_FIELD = NEW_FIELD.split("print(model.FIELDS)")[0] + """
from relay.wire import lines
line = b'{"v":1,"run":"r-1","rank":0,"seq":0,"ts":1.5,"type":"metrics","data":{},"tokens":%s}'
given = [line % value for value in (b"4", b"null", b"-1", b"1.5")]
print([item.tokens if item else lines.explain_line(one).split(":")[0]
       for one, item in zip(given, lines.decode_lines(given))])
"""


def test_a_new_field_of_the_model_is_judged_with_no_edit_here() -> None:
    proc = subprocess.run([sys.executable, "-c", TYPED_NEW_FIELD], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[4, None, 'bad_type', 'bad_type']"]
