"""Hot path: what one ``on_log`` costs the training process, ours against in-process trackers.

Contenders, alternated round by round in one process, each fed the same typical Hugging Face
log dict: our ``RelayCallback`` (given a publisher, relay up; made with no arguments, the one line
of docs/trainer.md, connected by its own ``on_train_begin``; relay down with its buffer full),
Aim's own ``AimCallback`` on a local repo, a file logger (fms-hf-tuning's own
``FileLoggingCallback`` where the compatibility venv .venv-fms has it, else the seed's: open, append
a ``json.dumps`` line, close, per call) and the floor, a raw ``msgpack.packb`` + ZeroMQ
non-blocking send. Each is
timed back to back and paced (a 1 ms sleep before each call, as when a step waits on the
device); wall time counts the calls only, process CPU counts every thread of the process
(our publisher thread, Aim's tracking threads, ZeroMQ's I/O thread) over the whole loop.

    python -m bench.bench_hotpath [--quick]
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bench.common import RelayRun, Section, alternate_many, cli, free_port
from relay.wire import auth

LOGS = {"loss": 1.234, "grad_norm": 0.56, "learning_rate": 2e-5, "epoch": 0.5, "entropy": 1.9,
        "mean_token_accuracy": 0.61, "num_tokens": 123456.0}
PACE = 0.001

OURS, ONE, DOWN, AIM, RAW, NONE = (
    "RelayCallback.on_log (ours)", "RelayCallback().on_log (no arguments)",
    "RelayCallback.on_log, relay down, buffer full", "aim AimCallback.on_log", "raw msgpack.packb + zmq send",
    "no tracking (an empty on_log)")
FMS_FILE, SEED_FILE = "fms-hf-tuning FileLoggingCallback.on_log", "seed file callback"
ROOT = Path(__file__).resolve().parent.parent


def _no_tracking(args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """What the loop itself costs (paced: the sleep's own wake-up), so the others can be read net of it."""


class SeedFileCallback:
    """The seed's file logger: re-opens the log file for every line and records only the loss."""

    def __init__(self, output_dir: str) -> None:
        self.path = os.path.join(output_dir, "training_logs.jsonl")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        record = {"name": "training_loss", "data": {"epoch": round(logs["epoch"], 2), "step": state.global_step,
                                                    "value": logs["loss"], "timestamp": datetime.now().isoformat()}}
        with open(self.path, "a") as fh:
            fh.write(f"{json.dumps(record, sort_keys=True)}\n")


class RawSend:
    """The floor: build the event, msgpack it, hand it to a DEALER socket without blocking."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        auth.secure_client(self.sock, address)
        self.sock.connect(address)
        self.host = socket.gethostname()
        self.seq = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.seq += 1
        data = {k: v for k, v in logs.items() if k != "epoch"}
        event = {"v": 1, "run": "bench-raw", "rank": 0, "local_rank": 0, "world_size": 1, "host": self.host,
                 "seq": self.seq, "ts": time.time(), "type": "metrics", "step": state.global_step,
                 "epoch": logs.get("epoch"), "stage": "train", "data": data}
        # (try, not contextlib.suppress: the timed floor, and suppress() adds ~0.25 us a call)
        try:  # noqa: SIM105
            self.sock.send(msgpack.packb(event), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def file_logger(output_dir: str) -> tuple[str, Callable[..., None]]:
    """fms-hf-tuning's own file logger, imported from the compatibility venv (.venv-fms, or
    METRICS_RELAY_FMS_VENV) where there is one, else the seed's; its name and its ``on_log``."""
    venv = Path(os.environ.get("METRICS_RELAY_FMS_VENV") or ROOT / ".venv-fms")
    found = sorted(venv.glob("lib/python*/site-packages/tuning/trackers/filelogging_tracker.py"))
    if not found:
        return SEED_FILE, SeedFileCallback(output_dir).on_log
    sys.path.append(str(found[0].parents[2]))  # last: only fms's own package comes from there
    from tuning.trackers.filelogging_tracker import FileLoggingCallback

    return FMS_FILE, FileLoggingCallback("training_logs.jsonl").on_log


def _measure(on_log: Callable[..., None], hf: tuple, calls: int, paced: bool,
             settle: Callable[[], None] | None) -> dict[str, float]:
    """Per-call wall time of the calls and per-call process CPU of the whole loop (+ settling)."""
    args, state, control = hf
    cpu0 = time.process_time()
    spent = 0.0
    if paced:
        for _ in range(calls):
            time.sleep(PACE)
            state.global_step += 1
            t = time.perf_counter()
            on_log(args, state, control, logs=LOGS)
            spent += time.perf_counter() - t
    else:
        t = time.perf_counter()
        for _ in range(calls):
            state.global_step += 1
            on_log(args, state, control, logs=LOGS)
        spent = time.perf_counter() - t
    if settle is not None:
        settle()
    return {"s": spent / calls, "cpu s": (time.process_time() - cpu0) / calls}


def run(quick: bool = False) -> Section:
    """Back to back and paced rounds of every contender; the relay-down case is section 2."""
    from aim.hugging_face import AimCallback
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from relay.client.publisher import Publisher
    from trainer import custom_metrics
    from trainer.callback import RelayCallback

    rounds, paced_calls = (2, 20) if quick else (7, 200)
    logging.getLogger("relay").setLevel(logging.ERROR)  # the relay-down client warns, as it should
    section = Section("hotpath", "Hot path: one on_log in the training process")
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as tmp:
        file_name, file_on_log = file_logger(tmp)
        calls = {OURS: 2000, ONE: 2000, DOWN: 2000, AIM: 150, file_name: 500, RAW: 2000, NONE: 2000}
        if quick:
            calls = {name: max(10, n // 20) for name, n in calls.items()}
        relay = RelayRun(Path(tmp) / "relay", ["--path", f"{tmp}/journal/"])
        up = Publisher("bench-hotpath", 0, address=relay.address)
        down = Publisher("bench-down", 0, address=f"tcp://127.0.0.1:{free_port()}", max_events=1000)
        raw = RawSend(relay.address)
        # log_system_params=False: Aim lists installed packages through pkg_resources, absent here.
        # No system tracking or terminal capture: their threads would tax every contender of this
        # process, and without them Aim's own figure can only be lower (the ratios conservative).
        aim = AimCallback(repo=f"{tmp}/aim", experiment="bench-hotpath", log_system_params=False,
                          system_tracking_interval=None, capture_terminal_logs=False)
        try:
            hf = (TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True),
                  TrainerState(is_world_process_zero=True), TrainerControl())
            ours, ours_down = RelayCallback(up), RelayCallback(down)
            one_line = RelayCallback(relay_address=relay.address)  # RELAY_ADDRESS's keyword
            one_line.on_train_begin(*hf)  # connects the process's publisher, as in a Trainer
            one = custom_metrics.publisher()
            assert one is not None
            contenders = {OURS: (ours.on_log, lambda: up.flush(10)), ONE: (one_line.on_log, lambda: one.flush(10)),
                          DOWN: (ours_down.on_log, None), AIM: (aim.on_log, None), file_name: (file_on_log, None),
                          RAW: (raw.on_log, None), NONE: (_no_tracking, None)}
            for name, (fn, settle) in contenders.items():  # warm up: Aim opens its run, the buffer fills
                _measure(fn, hf, max(calls[name], 1100 if name == DOWN else 0), False, settle)
            assert down.dropped > 0, "the relay-down buffer must be full"

            def contender(name: str, paced: bool) -> Callable[[], dict[str, float]]:
                fn, settle = contenders[name]
                return lambda: _measure(fn, hf, paced_calls if paced else calls[name], paced, settle)

            b2b = alternate_many({name: contender(name, False) for name in contenders}, rounds)
            paced = alternate_many({name: contender(name, True) for name in contenders}, rounds)
            one_line.on_train_end(*hf)
        finally:
            custom_metrics.stop(1)
            aim.close()
            raw.close()
            up.close(5)
            down.close(0.1)
            relay.stop()
    for label, samples in (("back to back", b2b), (f"paced ({PACE * 1e3:.0f} ms sleep before each call)", paced)):
        for unit, what in (("s", "wall time per call"), ("cpu s", "process CPU per call")):
            base = samples[RAW][unit]
            rows = [base.row()] + [samples[name][unit].row(base) for name in (OURS, ONE, DOWN, file_name, AIM, NONE)]
            for row in rows:
                row["unit"] = "s"
            section.add_table(f"{label}, {what}", rows)
    wall = {name: b2b[name]["s"].median for name in b2b}
    section.target("ours within 1.5x of the raw send (back to back, wall)", wall[OURS] / wall[RAW], 1.5, False,
                   f"{wall[OURS] / wall[RAW]:.2f}x")
    section.target("RelayCallback() >= 400x cheaper than AimCallback (back to back, wall)", wall[AIM] / wall[ONE],
                   400, True, f"{wall[AIM] / wall[ONE]:,.0f}x")
    section.target(f"RelayCallback() >= 12x cheaper than the file logger ({file_name}; back to back, wall)",
                   wall[file_name] / wall[ONE], 12, True, f"{wall[file_name] / wall[ONE]:.1f}x")
    section.target("RelayCallback() with no arguments: the same cost as given a publisher (back to back, wall)",
                   wall[ONE] / wall[OURS], 1.2, False, f"{wall[ONE] / wall[OURS]:.2f}x")
    for label, samples in (("back to back", b2b), ("paced", paced)):
        ratio = samples[DOWN]["s"].median / samples[OURS]["s"].median
        section.target(f"relay down, buffer full: <= 2x relay up ({label}, wall)", ratio, 2.0, False, f"{ratio:.2f}x")
    section.notes.append(f"{calls[OURS]} calls per round back to back ({calls[AIM]} for Aim, {calls[file_name]} for the "
                         f"file logger), {paced_calls} paced, {rounds} rounds; relay down: no relay at the address, "
                         f"1,000-event buffer full before timing (every call drops the oldest, counted); no call raised.")
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
