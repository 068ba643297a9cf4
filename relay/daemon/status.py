"""The relay's one-line status: how it reads, how a live relay answers for it on its own socket
(docs/protocol.md, "Status requests"), and how ``relay status`` gets it (from a live relay, or from
the stats file a relay left behind).

The same line is the live terminal line (relay/daemon/live_line.py), the periodic ``stats:`` log
line and what ``relay status`` prints, so one format here serves all three.
"""
from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from relay.journal.journal import Journal
from relay.wire import auth, curve
from relay.wire.address import is_ipv6, resolve_address
from relay.wire.monitor import recv_event
from relay.wire.secret import SecretError

#: The whole request frame; any other frame is an event frame (and judged as one).
STATUS_REQUEST = msgpack.packb({"status": 1})
SNAPSHOT_TTL = 0.1  # seconds a snapshot answers requests before the next is taken
ANSWER_RATE = 50.0  # answers a second, as many at once; requests beyond go unanswered (counted)
RUNS_SHOWN = 3  # runs named in the line; the rest are "+N more"
#: A run not ended that sent nothing this long is "stale" in the status (and "unfinished" in relay
#: runs)
STALE_S = 300.0
ELLIPSIS = "…"  # where a line was cut to fit (as the viewers' tables cut theirs)


class NoAnswer(Exception):
    """No relay answered the status request in time (``relay status`` exits 1)."""


class BadTarget(ValueError):
    """An address ZeroMQ refuses, or a stats file missing or not one a relay wrote (exit 2)."""


class Answers:
    """What the relay sends back to a status request: the latest snapshot, taken (``snapshot()``)
    at most once per SNAPSHOT_TTL, and at most ANSWER_RATE answers a second from a token bucket,
    so neither the snapshots nor the replies waiting in ZeroMQ for peers that never read them can
    grow with the number of requests."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot
        self._reply = b""
        self._taken = float("-inf")
        self._tokens = ANSWER_RATE
        self._since = time.monotonic()

    def reply(self, now: float) -> bytes | None:
        """The reply frame, or None when the answer budget is spent for now."""
        self._tokens = min(ANSWER_RATE, self._tokens + (now - self._since) * ANSWER_RATE)
        self._since = now
        if self._tokens < 1.0:
            return None
        self._tokens -= 1.0
        if now - self._taken >= SNAPSHOT_TTL:
            self._reply = msgpack.packb({"status": self._snapshot()}, use_bin_type=True)
            self._taken = now
        return self._reply


def format_line(snap: dict[str, Any], *, detail: bool = False, width: int | None = None,
                alive: bool = True, age: float = 0.0) -> str:
    """``1520 ev/s | 1 run: run-a 2/2 running | 30120 events, 0 duplicates, 0 rejected, 0 client
    drops |
    sinks: jsonl 0 queued, aim 812 queued (1.0 s behind)``. ``detail`` adds frames, derived,
    written, rejection reasons and each sink's written count (the log line and ``relay status``).
    Fields a stats file of an older relay lacks are left out. ``width`` (the live line on a
    terminal): the line shortened to fit, run names, zero counters and words going first, the sinks'
    queues kept (``1520 ev/s | sinks: jsonl 0q, aim 812q 1.0s behind | 1 run | 30120 ev``). A
    snapshot ``age`` seconds old (a stats file) judges its runs' states as of now; one of a relay no
    longer ``alive`` has no rate, and its runs that had not ended are stale."""
    rate = f"{snap['events_per_s']:.0f} ev/s" if "events_per_s" in snap and alive else ""
    counts = f"{snap.get('events', 0)} events"
    if detail:
        counts += f" in {snap.get('frames', 0)} frames"
        if snap.get("derived"):  # the relay's own (cluster) events: written, never received
            counts += f", {snap['derived']} derived"
        counts += f", {snap.get('written', 0)} written"
    rejected = f"{snap.get('rejected_total', 0)} rejected"
    if detail and snap.get("rejected"):
        rejected += " (" + ", ".join(f"{k} {v}" for k, v in sorted(snap["rejected"].items())) + ")"
    counts += (f", {snap.get('duplicates', 0)} duplicates, {rejected}, "
               f"{snap.get('client_dropped', 0)} client drops")
    sinks = snap.get("sinks") or {}
    queues = "sinks: " + (", ".join(_sink(name, s, detail) for name, s in sinks.items()) or "none")
    line = _joined(rate, _runs(snap, alive=alive, age=age), counts, queues)
    if width is None or len(line) <= width:
        return line
    runs = _runs(snap, named=False, alive=alive, age=age)
    trouble = [f"{snap[key]} {word}" for key, word in _TROUBLE if snap.get(key)]
    few = ", ".join([f"{snap.get('events', 0)} ev", *trouble])
    short = "sinks: " + (", ".join(_short_sink(name, s) for name, s in sinks.items()) or "none")
    for line in (_joined(rate, runs, counts, queues), _joined(rate, runs, few, queues),
                 _joined(rate, queues, runs, few), _joined(rate, short, runs, few)):
        if len(line) <= width:
            return line
    return cut(line, width)


def cut(text: str, width: int | None) -> str:
    """``text`` in ``width`` columns at most, ELLIPSIS where it was cut."""
    if width is None or len(text) <= width:
        return text
    return text[:max(0, width - 1)] + ELLIPSIS


#: The counters the shortest line names only when they are not zero, and how.
_TROUBLE = (("duplicates", "dup"), ("rejected_total", "rejected"),
            ("client_dropped", "client drops"))


def _joined(*parts: str) -> str:
    return " | ".join(part for part in parts if part)


def _short_sink(name: str, s: dict[str, Any]) -> str:
    text = f"{name} {s.get('queued', 0)}q"
    if s.get("lag_s") and s.get("queued"):
        text += f" {s['lag_s']:.0f}s behind"
    return text + "".join(f" {s[key]} {key}" for key in ("errors", "dropped") if s.get(key))


def _runs(snap: dict[str, Any], named: bool = True, alive: bool = True, age: float = 0.0) -> str:
    """``2 runs: run-a 4/4 running, run-b 0/2 failed`` (ranks that sent something lately / world
    size, run_state): the most recently active runs, shown by name (``named``)."""
    count = snap.get("runs")
    if count is None:  # an older relay's stats file
        return f"{snap.get('ranks', 0)} ranks"
    per_run = snap.get("per_run") or {}
    if not named:  # how many are not running, by state: "3 runs (1 failed, 1 stale)"
        states = collections.Counter(run_state(run, alive, age) for run in per_run.values())
        said = ", ".join(f"{n} {state}" for state, n in sorted(states.items())
                         if state not in ("running", ""))
        return f"{count} run{'' if count == 1 else 's'}" + (f" ({said})" if said else "")
    recent = sorted(per_run, key=lambda run: _number(per_run[run].get("idle_s"), float("inf")))
    shown = sorted(recent[:RUNS_SHOWN])
    text = f"{count} run{'' if count == 1 else 's'}"
    if shown:
        text += ": " + ", ".join(" ".join(filter(None, (
            run, f"{per_run[run].get('connected', 0) if alive else 0}/"
                 f"{per_run[run].get('world_size') or '?'}",
            run_state(per_run[run], alive, age)))) for run in shown)
    if count > len(shown) and shown:
        text += f" +{count - len(shown)} more"
    return text


def run_state(run: dict[str, Any], alive: bool = True, age: float = 0.0) -> str:
    """completed, failed (or whatever its train_end said), running, or stale: not ended and silent
    for STALE_S (``age`` seconds after the snapshot), or its relay is gone; "" from an older
    relay."""
    state = run.get("state")
    if not isinstance(state, str) or state != "running":
        return state if isinstance(state, str) else ""
    idle = run.get("idle_s")
    silent = isinstance(idle, (int, float)) and idle + age >= STALE_S
    return "stale" if silent or not alive else "running"


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) else default


def _sink(name: str, s: dict[str, Any], detail: bool) -> str:
    text = f"{name} {s.get('queued', 0)} queued"
    lag = s.get("lag_s")
    if lag and s.get("queued"):
        text += f" ({lag:.1f} s behind)"
    extra = [f"{s[key]} {key}" for key in ("errors", "dropped") if s.get(key)]
    if detail:
        extra.insert(0, f"{s.get('written', 0)} written")
    return text + (f" [{', '.join(extra)}]" if extra else "")


def age_note(snap: dict[str, Any], now: float | None = None) -> str:
    """How old a snapshot read from a stats file is."""
    ts = snap.get("ts")
    if not isinstance(ts, (int, float)):
        return "stats file of unknown age"
    return f"stats file written {_age(snap, now):.0f} s ago"


def _age(snap: dict[str, Any], now: float | None = None) -> float:
    ts = snap.get("ts")
    return (max(0.0, (time.time() if now is None else now) - ts) if isinstance(ts, (int, float))
            else 0.0)


def _when(ts: float | None) -> str:
    """The time of day, with the date unless it is today's."""
    if ts is None:
        return "an unknown time"
    today = time.strftime("%Y-%m-%d") == time.strftime("%Y-%m-%d", time.localtime(ts))
    return time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", time.localtime(ts))


def status_text(target: str | None, timeout: float, as_json: bool, width: int | None = None) -> str:
    """What ``relay status [TARGET] [--json]`` prints: the line (or the snapshot as JSON) of the
    relay at the address ``target`` (default $RELAY_ADDRESS or the default address), or of the stats
    file ``target`` names (itself, or beside a journal): then whether its relay still runs comes
    first, and a killed relay's figures are its last, with no rate. The line fits ``width`` (cut
    with ELLIPSIS). NoAnswer or BadTarget say what went wrong."""
    if target is None or target.startswith(("tcp://", "ipc://")):
        address = resolve_address(target)
        try:
            snap = query(address, timeout)
        except NoAnswer as exc:
            if exc.args and exc.args[0] != address:  # the relay refused us: that says it all
                raise
            raise NoAnswer(f"no relay answered at {address} within {timeout:g} s; is it running? "
                           f"start one (relay --bind {address}), or give the stats file beside its "
                           "journal (relay status relay-logs/)") from None
        return (json.dumps(snap, indent=1, sort_keys=True) if as_json
                else format_line(snap, detail=True, width=width))
    try:
        file = stats_file_for(Path(target))
        snap = read_stats(file)
    except BadTarget as exc:
        raise BadTarget(f"{exc}; give a relay address (tcp://..., ipc://...), its journal or its "
                        "stats file") from None
    from relay.daemon.liveness import judge

    how = judge(file, snap)
    if as_json:
        return json.dumps({**snap, "relay_state": how.state, "relay_since": how.since}, indent=1,
                          sort_keys=True)
    alive = how.state in ("running", "unknown")
    if how.state == "killed":
        head, tail = f"relay not running (killed?) since {_when(how.since)}", ""
    elif how.state == "stopped":
        head, tail = f"relay stopped at {_when(snap.get('ts'))}", ""
    else:
        head, tail = "", f" ({'; '.join(filter(None, (age_note(snap), how.note)))})"
    room = None if width is None else max(20, width - len(tail) - (len(head) + 3 if head else 0))
    line = format_line(snap, detail=True, width=room, alive=alive, age=_age(snap))
    return cut(_joined(head, line) + tail, width)


def query(address: str, timeout: float) -> dict[str, Any]:
    """Ask the relay at ``address`` for its snapshot. NoAnswer if none comes within ``timeout``;
    BadTarget for an address, relay secret or CURVE key that cannot be used. Proves itself as a
    publisher does (relay/wire/auth.py); NoAnswer says so in one line when the relay refuses it."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IPV6, is_ipv6(address))
    monitor = sock.get_monitor_socket(auth.HANDSHAKE_FAILED)
    try:
        try:
            how = auth.secure_client(sock, address, os.environ.get(curve.SERVER_KEY_ENV),
                                     os.environ.get(curve.CLIENT_CERT_ENV))
            sock.connect(address)
        except SecretError as exc:  # says what is wrong with it and the fix
            raise BadTarget(str(exc)) from None
        except (zmq.ZMQError, ValueError) as exc:  # a malformed address or CURVE key
            raise BadTarget(f"cannot connect to {address}: {exc}; give tcp://HOST:PORT or "
                            "ipc:///path.sock (and, for a CURVE relay, its public key in "
                            "$RELAY_CURVE_SERVER_KEY)") from None
        sock.send(STATUS_REQUEST)
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        failed: list[tuple[int, int]] = []
        while (left := deadline - time.monotonic()) > 0 and len(failed) < auth.REFUSALS_TOLD:
            ready = dict(poller.poll(int(left * 1000)))
            if monitor in ready:
                event = recv_event(monitor)
                failed.append((event.event, event.value))
            if sock in ready:
                reply = _decode_reply(sock.recv())
                if reply is not None:
                    return reply
        raise NoAnswer(auth.refusal(how, address, failed) if failed else address)
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


def _decode_reply(frame: bytes) -> dict[str, Any] | None:
    """The snapshot in a reply, or None for anything else (an old relay's ack, say)."""
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if isinstance(message, dict) and isinstance(message.get("status"), dict):
        return message["status"]
    return None


def stats_file_for(path: Path) -> Path:
    """The one beside a journal (a directory, or a file named ``*.jsonl``), else ``path`` itself. A
    run file of a directory journal (``relay-logs/my-run.jsonl``) has no stats file of its own: its
    folder's is the relay's that wrote it."""
    if path.is_dir() or path.name.endswith(".jsonl"):
        own = Journal(path).sidecar("_stats.json")
        folder = Journal(f"{path.parent}{os.sep}").sidecar("_stats.json")
        if path.is_file() and not own.exists() and folder.exists():
            return folder
        return own
    return path


def read_stats(path: Path) -> dict[str, Any]:
    """The snapshot in a stats file (or the one next to a journal). BadTarget says what is wrong."""
    file = stats_file_for(path)
    try:
        snap = json.loads(file.read_text())
    except FileNotFoundError:
        raise BadTarget(f"no stats file at {file}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadTarget(f"cannot read {file} as a relay stats file: {exc}") from None
    if not (isinstance(snap, dict) and isinstance(snap.get("sinks"), dict) and "events" in snap):
        raise BadTarget(f"{file} is not a relay stats file (no events and sinks counters)")
    try:
        format_line(snap, detail=True)
    except (TypeError, ValueError, AttributeError) as exc:
        # a counter of the wrong type: edited by hand?
        raise BadTarget(f"{file} holds counters a relay does not write: {exc}") from None
    return snap
