"""The properties the fuzzer checks, one per stage an outside input goes through.

Each check takes the bytes a strategy produced (or a corpus file holds) and raises on a bug: the
code under test's own exception (a crash), or a Violation naming a broken invariant. Documented
outcomes (a frame rejected with FrameError, a replay refused with JournalError over a foreign line)
are not bugs.
"""
from __future__ import annotations

import contextlib
import io
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import orjson
from hypothesis import strategies as st

from relay.cli.filters import Selection
from relay.cli.tail import Tail, format_event
from relay.journal.journal import Journal, JournalError
from relay.journal.reader import journal_files, read_events
from relay.sinkhost.replay import replay_files
from relay.wire import encoding, schema
from relay.wire.lines import check_lines, decode_lines, encode_lines, explain_line
from sinks.events import FIELDS, from_journal

from . import strategies

#: File descriptors a check may open beyond those already open: the usual default ``ulimit -n``,
#: so a relay or replay that keeps one file per run open fails here as it would in the field.
FD_BUDGET = 1024


class Violation(AssertionError):
    """An invariant broken without the code under test raising; ``label`` names which one."""

    def __init__(self, label: str, detail: str) -> None:
        super().__init__(f"{label}: {detail}")
        self.label = label


@contextlib.contextmanager
def fd_budget(extra: int = FD_BUDGET) -> Iterator[None]:
    """Lower the soft RLIMIT_NOFILE to what is open now plus ``extra`` while a check runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        limit = len(os.listdir("/proc/self/fd")) + extra
    except OSError:  # no /proc: run with the limit as it is
        yield
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, limit), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- a: frame decoding and validation, then the journal path of what was accepted ----------------


def check_decode(frame: bytes) -> None:
    """A frame is rejected with FrameError or accepted, the same verdict as the explainer's
    (``explain_frame_bytes``: the types decide, the explainer says why; they must agree); every
    accepted event must pass ``validate_event`` too, journal as one JSON line that reads back as
    the same valid event and prints with ``relay tail``, and be acknowledgeable (the relay acks
    seq + 1)."""
    explained = schema.explain_frame_bytes(frame) if len(frame) <= schema.MAX_FRAME_BYTES else None
    try:
        decoded = schema.decode(frame)
    except schema.FrameError as exc:
        if exc.reason != "oversize" and explained is None:
            said = f"the types refused a frame the explainer takes: {exc}"
            raise Violation("verdicts", said) from None
        return
    if explained is not None:
        raise Violation("verdicts", f"the types took a frame the explainer refuses: {explained}")
    events = decoded.events
    for event in events:
        try:
            schema.validate_event(event)
        except schema.FrameError as exc:
            raise Violation("accepted_invalid", f"decode() took an event validate_event() refuses: {exc}") from None
    if decoded.first_seq is not None:
        _check_first_seq(decoded)
    chunk = encode_lines(events)
    lines = chunk.split(b"\n")
    if lines.pop() != b"" or len(lines) != len(events):
        raise Violation("journal_lines", f"{len(events)} events encoded as {len(lines)} lines")
    _check_line_bound(chunk, lines)
    for line, event in zip(lines, events, strict=True):
        _check_journaled(orjson.loads(line))
        encoding.encode_ack([(event["run"], event["rank"], event["seq"] + 1)])


def _check_line_bound(chunk: bytes, lines: list[bytes]) -> None:
    """check_lines refuses a frame (bad_value) exactly when a line or all of them pass their bounds."""
    over = (max(map(len, lines)) + 1 > schema.MAX_LINE_BYTES or len(chunk) > schema.MAX_FRAME_LINES_BYTES)
    try:
        check_lines(chunk)
        check_lines([line + b"\n" for line in lines])
    except schema.FrameError as exc:
        if not over or exc.reason != "bad_value":
            raise Violation("line_bound", f"lines within their bounds refused: {exc}") from None
        return
    if over:
        raise Violation("line_bound", f"a line of {max(map(len, lines)) + 1} bytes passed check_lines")


def _check_first_seq(decoded: schema.Frame) -> None:
    """first_seq lets the relay take a frame whole: it must mean one rank's gapless plain events; and
    derive, that the relay need hand it to its cross-rank derivation, exactly when one has stage rank
    or is a lifecycle event."""
    first = decoded.first_seq
    events = decoded.events
    if ([e["seq"] for e in events] != list(range(first, first + len(events)))
            or any(e["type"] in ("hello", "stats") for e in events)
            or len({(e["run"], e["rank"]) for e in events}) != 1):
        raise Violation("first_seq", f"first_seq={first} on a frame that is not one rank's gapless plain events")
    if decoded.derive != any(e["stage"] == "rank" or e["type"] == "lifecycle" for e in events):
        raise Violation("derive", f"derive={decoded.derive} on a frame whose stages and types say otherwise")


def _check_journaled(line: Any) -> None:
    """A journal line, as replay and the sink processes read it back, is still the event."""
    if type(line) is not dict or list(line) != list(FIELDS):
        raise Violation("journal_fields", f"journal line is not an event with the envelope fields: {line!r:.200}")
    event = from_journal(line)
    format_event(event)
    try:
        schema.validate_event(event)
    except schema.FrameError as exc:
        raise Violation("journal_roundtrip", f"an accepted event reads back from the journal invalid: {exc}") from None


# -- b: ingest (dedupe, drops, acks) without a socket: relay/daemon/ingest.py and its commit step ---


def ingest_available() -> bool:
    """The socketless ingest API (take_frame, commit) this target drives."""
    from relay.daemon.ingest import Ingest

    return hasattr(Ingest, "take_frame") and hasattr(Ingest, "commit")


def check_ingest(session: bytes) -> None:
    """Several peers' frames into one relay, then into a restarted one that meets the same journal
    and gets every frame again (clients resend what they hold): nothing escapes take_frame, the
    journal holds each (run, rank, seq) once, the counters add up, and every ack is sendable, goes to
    the stream's owner and says no more than the journal holds."""
    layout, ops = msgpack.unpackb(session, raw=False)
    frames = [op for op in ops if op is not None]
    with tempfile.TemporaryDirectory(prefix="fuzz-ingest-") as tmp, fd_budget():
        path = os.path.join(tmp, "journal") + (os.sep if layout == "dir" else ".jsonl")
        written = 0
        for session_ops in (ops, frames):
            ingest, acked = _open_ingest(path)
            try:
                for op in session_ops:
                    if op is None:
                        ingest.commit(time.monotonic())
                    elif len(op) == 1:
                        ingest.peer_gone(op[0])  # the socket found the owner gone (relay/daemon/peers.py)
                    else:
                        ingest.take_frame(op[0], op[1], time.monotonic())
                ingest.commit(time.monotonic())
                written += ingest.counters.written
                _check_ingest(ingest, Path(path), written, acked)
            finally:
                ingest.journal.close()
                ingest.deadletters.close()


Acked = dict[tuple[str, int], tuple[bytes, int]]


def _open_ingest(path: str) -> tuple[Any, Acked]:
    """Ingest as the relay builds it, on an open journal; every ack it sends lands in the dict
    returned, by stream: (the connection it went to, the ack)."""
    from relay.daemon.cross_rank import ClusterConfig
    from relay.daemon.ingest import Ingest
    from relay.journal.deadletter import DeadLetters

    journal = Journal(path)
    journal.open()
    acked: Acked = {}

    def send(peer: bytes, acks: list[tuple[str, int, int]]) -> None:
        encoding.encode_ack(acks)
        acked.update(((run, rank), (peer, ack)) for run, rank, ack in acks)

    ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), time.monotonic(),
                    send_acks=send, cluster=ClusterConfig())
    return ingest, acked


def _check_ingest(ingest: Any, path: Path, written: int, acked: Acked) -> None:
    counters = ingest.counters
    if counters.rejected.get("internal_error"):
        detail = _last_deadletter(ingest)
        raise Violation(f"internal_error ({detail.split(':', 1)[0]})", f"take_frame swallowed an exception: {detail}")
    if counters.journal_errors:
        raise Violation("journal_error", f"{counters.journal_errors} journal writes failed with a writable journal")
    pending = ingest.pending
    if counters.events + counters.derived != counters.written + counters.duplicates + pending:
        raise Violation("counters", f"events {counters.events} + derived {counters.derived} != written "
                                    f"{counters.written} + duplicates {counters.duplicates} + pending {pending}")
    dedupe = ingest.runs.dedupe
    _check_owners(ingest.owners)
    seqs: dict[tuple[str, int], set[int]] = {}
    drops: dict[tuple[str, int], set[int]] = {}
    events = [event for file in journal_files(path) for event in read_events(file)]
    longest = max((len(line) for file in journal_files(path) for line in file.read_bytes().splitlines(True)), default=0)
    if longest > schema.MAX_LINE_BYTES:
        raise Violation("line_bound", f"the relay journaled a line of {longest} bytes")
    if len(events) != written:
        raise Violation("journal_count", f"journal holds {len(events)} lines, relays counted {written} written")
    for event in events:
        key = (event["run"], event["rank"])
        if event["seq"] in seqs.setdefault(key, set()):
            raise Violation("journal_duplicate", f"{key} seq {event['seq']} is in the journal twice")
        seqs[key].add(event["seq"])
        upto = event["data"].get("dropped_upto") if event["type"] == "stats" else None
        if type(upto) is int and upto < event["seq"]:  # a client gives up only seqs it numbered before
            drops.setdefault(key, set()).add(upto)
    for key, state in dedupe.ranks.items():
        bound = 1 + max(seqs.get(key, set()) | drops.get(key, set()), default=-1)
        if state.floor > bound:
            raise Violation("floor", f"{key} floor {state.floor} beyond its highest accepted seq or plausible "
                                     f"claimed drop ({bound - 1}): later events of the rank count as duplicates")
        encoding.encode_ack([(key[0], key[1], state.floor)])
    for key, (peer, ack) in acked.items():  # the last ack each stream got, after the final commit
        state = dedupe.ranks.get(key)
        if state is not None and (ack > state.floor or ingest.owners.of(key) not in (peer, None)):
            raise Violation("ack", f"{key} acknowledged to {peer.hex()} up to {ack}: floor {state.floor}, "
                                   f"owner {ingest.owners.of(key)!r}")
    for event in events:  # last: target decode covers these lines too, so their bugs mask less here
        _check_journaled(event)


def _check_owners(owners: Any) -> None:
    """Each stream has at most one owner, and the index of what each connection owns (what its
    disconnection releases) says exactly the same."""
    owned = {key: peer for peer, keys in owners.owned.items() for key in keys}
    if sum(map(len, owners.owned.values())) != len(owned) or any(not keys for keys in owners.owned.values()):
        raise Violation("owners", "a stream is indexed under two owners, or an owner under no stream")
    held = dict(owners.owner)
    if owned != held:
        raise Violation("owners", f"owner index {sorted(owned.items())[:3]} != states' owners {sorted(held.items())[:3]}")


def _last_deadletter(ingest: Any) -> str:
    try:
        *_, last = ingest.deadletters.path.read_bytes().splitlines()
        return orjson.loads(last)["detail"]
    except (OSError, ValueError, KeyError):
        return "(no dead letter)"


# -- c: the journal readers: read_events, relay tail, replay, a restarted relay's scan -----------


def check_journal(journal_bytes: bytes) -> None:
    """Any journal bytes: read_events skips what it cannot parse, ``relay tail`` prints every event
    line, replay into a JSONL directory writes only inside it, each (run, rank, seq) once, and
    adds nothing when run again, and a relay meeting the journal again can scan it: it cuts exactly
    the bytes after the last newline and knows only the events of the whole lines before it."""
    with tempfile.TemporaryDirectory(prefix="fuzz-journal-") as tmp, fd_budget():
        root = Path(tmp)
        source = root / "in" / "run-a.jsonl"
        source.parent.mkdir()
        source.write_bytes(journal_bytes)
        _check_line_verdicts(journal_bytes)
        events = list(read_events(source, []))
        kept = {(e["run"], e["rank"], e["seq"]) for e in read_events(source, whole_lines=True)}
        with contextlib.redirect_stdout(io.StringIO()):
            for view in ("events", "steps"):  # a viewer for humans shows whatever a file holds
                for last in (None, 3):  # read forwards, and from the end (relay/cli/backlog.py)
                    Tail(source, Selection(), view=view).run(follow=False, last=last)
        out = root / "out"
        _replay(source, out, events)
        before = _tree(root)
        _replay(source, out, events)
        if _tree(root) != before:
            raise Violation("replay_not_idempotent", "a second replay into the same journal added to it")
        strays = [p for p in before if p.split(os.sep, 1)[0] not in ("in", "out")]
        if strays:
            raise Violation("replay_outside", f"replay wrote outside its journal directory: {strays[:3]}")
        _check_unique(out)
        for journal, run in ((Journal(source), "run-a"), (Journal(str(source.parent) + os.sep), "run-a")):
            journal.open()
            try:
                for other in {run} | {e.get("run") for e in events if schema.valid_run_id(e.get("run"))}:
                    seen = {(rank, seq) for rank, held in journal.seen(other).items() for seq in held.seqs()}
                    if (journal.directory and other != run) or seen == {(k, s) for r, k, s in kept if r == other}:
                        continue  # (a directory journal's other runs have files of their own: none here)
                    raise Violation("recovery_seen", f"after recovery {other!r} seen as {sorted(seen)[:5]}, its "
                                                     f"whole lines hold {sorted(kept)[:5]}")
            finally:
                journal.close()
        if source.read_bytes() != journal_bytes[:journal_bytes.rfind(b"\n") + 1]:
            raise Violation("recovery_cut", f"recovery left {source.stat().st_size} of {len(journal_bytes)} bytes, "
                                            f"not those up to the last newline")


def _check_line_verdicts(journal_bytes: bytes) -> None:
    """Each line gets one verdict: the types' (decode_lines, what readers apply) and the
    explainer's."""
    lines = journal_bytes.split(b"\n")
    for line, item in zip(lines, decode_lines(lines), strict=True):
        why = explain_line(line)
        if (item is None) != (why is not None):
            said = f"the types {'refused' if item is None else 'took'} it, the explainer: {why}"
            raise Violation("line_verdicts", f"{said}: {line!r:.200}")


def _replay(source: Path, out: Path, events: list[dict[str, Any]]) -> None:
    """replay_files into a JSONL directory; JournalError is its documented refusal, fair only for a
    line whose run id cannot name a file (the relay never writes one)."""
    try:
        replay_files([source], [], journal=Journal(str(out) + os.sep))
    except JournalError as exc:
        if all(schema.valid_run_id(e.get("run")) for e in events):
            raise Violation("replay_sink_error", f"replay of valid run ids refused: {exc}") from exc


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but lock files, by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def _check_unique(out: Path) -> None:
    seen: set[Any] = set()
    for file in journal_files(out) if out.exists() else []:
        for event in read_events(file):
            key = (event.get("run"), event.get("rank"), event.get("seq"))
            try:
                new = key not in seen
            except TypeError:  # an unhashable field: replay would have failed on it already
                continue
            if not new:
                raise Violation("replay_duplicate", f"replay wrote {key!r:.120} twice")
            seen.add(key)


@dataclass(frozen=True)
class Target:
    """A named property with the strategy for its input; ``alias`` is its letter in the issue."""

    name: str
    alias: str
    strategy: st.SearchStrategy[bytes]
    check: Callable[[bytes], None]


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("decode", "a", strategies.frames, check_decode),
    Target("ingest", "b", strategies.ingest_sessions(), check_ingest),
    Target("journal", "c", strategies.journals(), check_journal),
)}
