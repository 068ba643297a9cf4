"""``relay tail``: the real command in a subprocess on real journal files, some written by a real
relay while the command follows them."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from conftest import finish, start_publisher, wait_for
from relay.wire.lines import encode_line
from sinks.events import attempt_base
from watch_helpers import (
    RELAY_RANK,
    LiveCommand,
    cli_env,
    event,
    relay_cmd,
    training_journal,
    write_journal,
)


def training_events(t0: float) -> list[dict]:
    """Two ranks, steps 1-7: rank 1 turns slow at step 4 and is flagged a straggler at step 6 by
    the relay, step 7 has only the ranks' own step times (no cluster event), then rank 1 is lost."""
    seqs = {0: 0, 1: 0, RELAY_RANK: 0}

    def ev(rank: int, ts: float, kind: str, data: dict, **kw) -> dict:
        seqs[rank] += 1
        return event("job", rank, seqs[rank] - 1, ts, kind, data, **kw)

    out = [ev(0, t0, "lifecycle", {"event": "train_begin", "world_size": 2}, step=0)]
    for step in range(1, 7):
        ts = t0 + step
        slow = 0.25 if step >= 4 else 0.10
        out += [ev(0, ts, "metrics", {"step_time": 0.10, "samples_per_second": 80.0}, step=step, stage="rank"),
                ev(1, ts, "metrics", {"step_time": slow, "samples_per_second": 32.0}, step=step, stage="rank"),
                ev(0, ts, "metrics", {"loss": round(2.0 - 0.1 * step, 3), "learning_rate": 1e-3 * (1 - step / 10),
                                      "grad_norm": float("nan") if step == 2 else 0.5, "num_tokens": 500.0 * step},
                   step=step, stage="train"),
                ev(RELAY_RANK, ts + 0.05, "metrics", {
                    "step_time_min": 0.10, "step_time_median": (0.10 + slow) / 2, "step_time_max": slow,
                    "step_time_spread": slow / ((0.10 + slow) / 2), "slowest_rank": 1 if step >= 4 else 0,
                    # step 3: the ranks' own work, which names rank 1 where step times do not
                    **({"own_time_max": 0.3, "own_time_spread": 2.0, "own_slowest_rank": 1} if step == 3 else {}),
                    "ranks": 2}, step=step, stage="cluster")]
    out.append(ev(0, t0 + 6.1, "metrics", {"loss": 1.5}, step=6, stage="eval"))
    out.append(ev(RELAY_RANK, t0 + 6.1, "lifecycle", {"event": "straggler", "rank": 1, "step_time": 0.25,
                                                      "median": 0.175, "ratio": 0.25 / 0.175, "steps": 3},
                  step=6, stage="cluster"))
    out += [ev(0, t0 + 7, "metrics", {"step_time": 0.30, "own_time": 0.05}, step=7, stage="rank"),
            ev(1, t0 + 7, "metrics", {"step_time": 0.10, "own_time": 0.30}, step=7, stage="rank"),
            ev(RELAY_RANK, t0 + 20, "lifecycle", {"event": "rank_lost", "rank": 1, "silent_s": 12.0, "last_step": 7},
               stage="cluster")]
    return out


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "job.jsonl"
    write_journal(path, training_events(time.time() - 7200))
    return path


def rows(stdout: str) -> dict[int, list[str]]:
    """The step lines of --view steps output, by step, split into columns."""
    found = {}
    for line in stdout.splitlines():
        cols = line.split()
        if len(cols) > 2 and cols[1].isdigit() and "rank_lost" not in line:
            found[int(cols[1])] = cols
    return found


def test_steps_view_one_line_per_step(journal: Path) -> None:
    proc = relay_cmd("tail", str(journal), "--view", "steps")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "run job (2 ranks)"
    assert lines[1].split() == ["time", "step", "loss", "lr", "tok/s", "slowest", "own_s", "own_x", "step_s",
                                 "step_x", "flag"]
    steps = rows(proc.stdout)
    assert list(steps) == [1, 2, 3, 4, 5, 6, 7]
    assert [steps[s][2] for s in (1, 6)] == ["1.9", "1.4"]
    assert steps[1][3] == "9.000e-04"
    assert all(steps[s][4] == "500" for s in range(1, 7)), "500 tokens a second: the first since train_begin"
    assert steps[7][2:5] == ["-", "-", "-"]
    assert steps[2][5:10] == ["r0", "-", "-", "0.1", "1.00"]  # from the relay's cluster event
    assert steps[3][5:] == ["r1", "0.3", "2.00", "0.1", "1.00", "slow", "r1", "x2.00"]  # judged by own work
    assert steps[6][5:] == ["r1", "-", "-", "0.25", "1.43", "STRAGGLER", "r1", "x1.43", "(3", "steps)"]
    assert steps[4][10:] == ["slow", "r1", "x1.43"]  # spread over the ratio, no straggler event yet
    # from the ranks' own figures: rank 0 took longer (it waited), rank 1 did more of its own work
    assert steps[7][5:] == ["r1", "0.3", "1.71", "0.3", "1.50", "slow", "r1", "x1.71"]
    assert "rank_lost rank=1 silent_s=12 last_step=7" in lines[-1]
    assert "\x1b" not in proc.stdout, "no colour into a pipe"

    calm = rows(relay_cmd("tail", str(journal), "--view", "steps", "--straggler-ratio", "2").stdout)
    assert len(calm[4]) == 10 and calm[6][10] == "STRAGGLER"
    last = relay_cmd("tail", str(journal), "--view", "steps", "-n", "2").stdout
    assert list(rows(last)) == [7] and "rank_lost" in last  # the last two lines: step 7 and the lost rank


def test_steps_view_filters(journal: Path) -> None:
    custom = relay_cmd("tail", str(journal), "--view", "steps", "--metric", "grad_norm", "--metric", "eval/loss")
    assert custom.stdout.splitlines()[1].split()[:4] == ["time", "step", "grad_norm", "eval/loss"]
    steps = rows(custom.stdout)
    assert steps[2][2:4] == ["nan", "-"] and steps[6][2:] == ["0.5", "1.5", "r1", "-", "-", "0.25", "1.43", "STRAGGLER",
                                                              "r1", "x1.43", "(3", "steps)"]
    cluster_only = rows(relay_cmd("tail", str(journal), "--view", "steps", "--stage", "cluster").stdout)
    assert cluster_only[5][2:10] == ["-", "-", "-", "r1", "-", "-", "0.25", "1.43"]
    ranks_only = rows(relay_cmd("tail", str(journal), "--view", "steps", "--stage", "rank").stdout)
    assert ranks_only[5][5:10] == ["r1", "-", "-", "0.25", "1.43"]  # the same figures, from the ranks' step times
    rank0 = rows(relay_cmd("tail", str(journal), "--view", "steps", "--rank", "0").stdout)
    assert rank0[5][2] == "1.5" and rank0[5][5:10] == ["r0", "-", "-", "0.1", "1.00"]


def test_event_filters(journal: Path) -> None:
    def shown(*args: str) -> list[str]:
        proc = relay_cmd("tail", str(journal), "-n", "1000", *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    everything = shown()
    assert len(everything) == len(journal.read_bytes().splitlines())
    assert len(shown("--rank", "1")) == 7 and all(" job r1 " in line for line in shown("--rank", "1"))
    relay_lines = shown("--rank", str(RELAY_RANK))
    assert len(relay_lines) == 8 and all(" job relay " in line for line in relay_lines)
    assert len(shown("--rank", "0", "--rank", "1")) == len(everything) - 8
    assert [line.split("  ")[1] for line in shown("--metric", "loss")] == \
        ["loss=1.9", "loss=1.8", "loss=1.7", "loss=1.6", "loss=1.5", "loss=1.4", "loss=1.5"]
    assert shown("--metric", "eval/loss")[0].endswith("metrics/eval step=6  loss=1.5")
    assert len(shown("--stage", "cluster", "--type", "metrics")) == 6
    assert len(shown("--stage", "cluster")) == 8
    assert shown("--run", "other") == []
    assert shown("-n", "2") == everything[-2:]
    assert len(relay_cmd("tail", str(journal)).stdout.splitlines()) == 20  # -n 20 unless told


def test_since(tmp_path: Path) -> None:
    now = time.time()
    path = tmp_path / "j.jsonl"
    write_journal(path, [event("old", 0, 0, now - 7200, "metrics", {"x": 1}, step=1, stage="train"),
                         event("new", 0, 0, now - 60, "metrics", {"x": 2}, step=2, stage="train")])
    for since, runs in (("10m", ["new"]), ("3h", ["old", "new"]), ("90s", ["new"]), ("30s", []),
                        (datetime.fromtimestamp(now - 600).isoformat(timespec="seconds"), ["new"]),
                        (str(int(now - 3600)), ["new"]), (str(now - 8000), ["old", "new"])):
        proc = relay_cmd("tail", str(path), "--since", since)
        assert proc.returncode == 0, proc.stderr
        assert [line.split()[1] for line in proc.stdout.splitlines()] == runs, since
    bad = relay_cmd("tail", str(path), "--since", "yesterday")
    assert bad.returncode == 2 and "'yesterday' is no time" in bad.stderr


def test_json_lines_are_the_journal_bytes(journal: Path, tmp_path: Path) -> None:
    blob = journal.read_bytes() + encode_line(event("job", 0, 99, time.time() - 7000, "params",
                                                    {"dataset": "café ☕", "note": "NaN"}, stage="run"))
    journal.write_bytes(blob)
    raw = subprocess.run([sys.executable, "-m", "relay", "tail", "--json", "-n", "1000", str(journal)],
                         capture_output=True, timeout=60, env=cli_env())
    assert raw.returncode == 0 and raw.stdout == blob
    ranked = subprocess.run([sys.executable, "-m", "relay", "tail", "--json", "-n", "1000", "--rank", "1",
                             str(journal)], capture_output=True, timeout=60, env=cli_env()).stdout
    assert ranked == b"".join(line for line in blob.splitlines(keepends=True) if json.loads(line)["rank"] == 1)
    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed")
    piped = subprocess.run(["bash", "-c", f"'{sys.executable}' -m relay tail --json -n 1000 --stage cluster "
                                          f"--type metrics '{journal}' | jq -c '[.step, .data.slowest_rank]'"],
                           capture_output=True, text=True, timeout=60, env=cli_env())
    assert piped.stdout.split() == ["[1,0]", "[2,0]", "[3,0]", "[4,1]", "[5,1]", "[6,1]"]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    proc = relay_cmd("tail", str(tmp_path / "nowhere.jsonl"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("relay: error: ") and proc.stderr.count("\n") == 1


def test_follow_a_directory_that_appears_with_a_real_relay(tmp_path: Path, relays) -> None:
    logs = tmp_path / "logs"
    tail = LiveCommand("tail", "-f", "-n", "0", f"{logs}/")
    try:
        wait_for(lambda: "waiting for" in tail.stderr(), 30, "tail waiting for a directory not there yet")
        assert tail.proc.poll() is None
        relay = relays(["--path", f"{logs}/"])
        finish(start_publisher(relay.address, "live-a", 0, 40, rate=200))
        wait_for(lambda: tail.text().count(" live-a r0 metrics/train") == 40, 60, "run a's 40 events shown")
        finish(start_publisher(relay.address, "live-b", 0, 10, rate=200))
        wait_for(lambda: tail.text().count(" live-b r0 metrics/train") == 10, 60, "a new run file picked up")

        (logs / "live-a.jsonl").write_bytes(b"")  # truncated under the relay, which goes on appending
        finish(start_publisher(relay.address, "live-a", 1, 5, rate=200))
        wait_for(lambda: tail.text().count(" live-a r1 metrics/train") == 5, 60, "the truncated file read again")
        assert relay.stop() == 0
        code, stderr = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert code == 0 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "waiting for" in stderr and "live-a.jsonl was truncated" in stderr
    assert tail.text().count(" live-a r0 metrics/train") == 40, "nothing shown twice"


def test_follow_a_file_created_rotated_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "later" / "j.jsonl"
    lines = [encode_line(event("rot", 0, i, 1.7e9 + i, "metrics", {"i": i}, step=i, stage="train")) for i in range(9)]
    tail = LiveCommand("tail", "-f", "--json", str(path))
    try:
        path.parent.mkdir()
        with open(path, "ab") as fh:
            fh.write(b"".join(lines[:3]))
        wait_for(lambda: len(tail.lines) == 3, 30, "the new file's lines")
        with open(path, "ab") as fh:  # a last line for the old file, then it is rotated away at once
            fh.write(lines[3])
        path.rename(path.with_suffix(".1"))
        with open(path, "ab") as fh:
            fh.write(b"".join(lines[4:7]))
        wait_for(lambda: len(tail.lines) == 7, 30, "the rotated file's last line, then the new file's")
        with open(path, "r+b") as fh:  # truncated in place (same file), then a shorter content
            fh.truncate(0)
            fh.write(b"".join(lines[7:9]))
        wait_for(lambda: len(tail.lines) == 9, 30, "the truncated file read again")
        code, stderr = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert b"".join(tail.lines) == b"".join(lines)
    assert code == 0 and "Traceback" not in stderr, stderr
    assert "was replaced" in stderr and "was truncated" in stderr


def test_follow_a_directory_of_many_runs_with_few_descriptors(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = [f"run-{i:03d}" for i in range(150)]  # more than relay/cli/follow.py's MAX_OPEN

    def append(i: int) -> None:
        for run in runs:
            with open(logs / f"{run}.jsonl", "ab") as fh:
                fh.write(encode_line(event(run, 0, i, 1.7e9 + i, "metrics", {"i": i}, step=i, stage="train")))

    append(0)
    tail = LiveCommand("tail", "-f", "--json", "-n", "1000", str(logs))
    try:
        wait_for(lambda: len(tail.lines) == 150, 30, "every run's first line")
        append(1)
        wait_for(lambda: len(tail.lines) == 300, 30, "every run's second line")
        assert psutil.Process(tail.proc.pid).num_fds() < 80
        code, _ = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert code == 0
    assert sorted(json.loads(line)["run"] for line in tail.lines) == sorted(runs * 2)


def test_follow_steps_view_prints_each_step_once_it_is_in(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    first = [e for e in training_events(time.time()) if e["step"] in (0, 1, 2)]  # train_begin, steps 1 and 2
    path.write_bytes(b"")
    tail = LiveCommand("tail", "-f", "--view", "steps", str(path))
    try:
        with open(path, "ab") as fh:
            fh.write(b"".join(encode_line(e) for e in first))
        wait_for(lambda: 1 in rows(tail.text()), 30, "step 1 shown once step 2 began")
        wait_for(lambda: 2 in rows(tail.text()), 30, "step 2 shown after a quiet while, with no step 3")
        assert rows(tail.text())[2][2] == "1.8"
        code, stderr = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert code == 0 and "Traceback" not in stderr, stderr


def _read_pty(leader: int) -> bytes:
    """What a pseudo-terminal's program wrote next; b"" once it is closed."""
    try:
        return os.read(leader, 65536)
    except OSError:  # EIO: the terminal's other side is closed
        return b""


def run_on_pty(args: list[str], env: dict[str, str]) -> bytes:
    """Run ``python -m relay ARGS`` with stdout on a pseudo-terminal; everything it wrote there."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "relay", *args], stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    out = b""
    while chunk := _read_pty(leader):
        out += chunk
    os.close(leader)
    assert proc.wait(60) == 0, proc.stderr.read()
    return out


def test_colour_only_on_a_terminal(journal: Path) -> None:
    for view in ("steps", "events"):
        assert b"\x1b[" in run_on_pty(["tail", str(journal), "--view", view], cli_env())
        assert b"\x1b[" not in run_on_pty(["tail", str(journal), "--view", view], cli_env(NO_COLOR="1"))
        assert "\x1b[" not in relay_cmd("tail", str(journal), "--view", view).stdout


def test_closed_pipe_ends_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    write_journal(path, [event("big", 0, i, 1.7e9 + i, "metrics", {"loss": 1.0, "i": i, "pad": "x" * 200},
                               step=i, stage="train") for i in range(3000)])  # far more than a pipe holds
    for args in (["--json"], [], ["--view", "steps"]):
        proc = subprocess.run(["bash", "-c", f"'{sys.executable}' -m relay tail -n 100000 {' '.join(args)} '{path}' "
                                             "| head -3; echo \"tail exited ${PIPESTATUS[0]}\" >&2"],
                              capture_output=True, text=True, timeout=60, env=cli_env())
        assert len(proc.stdout.splitlines()) == 3, args
        assert proc.stderr == "tail exited 0\n", (args, proc.stderr)

    growing = tmp_path / "growing.jsonl"
    write_journal(growing, [])
    follow = subprocess.Popen(["bash", "-c", f"'{sys.executable}' -m relay tail -f '{growing}' | head -3; "
                                             "echo \"tail exited ${PIPESTATUS[0]}\" >&2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    deadline, i = time.monotonic() + 60, 0
    while follow.poll() is None and time.monotonic() < deadline:
        with open(growing, "ab") as fh:
            fh.write(encode_line(event("grow", 0, i, 1.7e9 + i, "metrics", {"i": i}, step=i, stage="train")))
        i += 1
        time.sleep(0.1)
    out, err = follow.communicate(timeout=30)
    assert len(out.splitlines()) == 3 and err == "tail exited 0\n", err


def test_steps_view_shows_a_straggler_episode_from_its_start_to_its_end() -> None:
    """The relay says a straggler once per episode and when it ends (relay/daemon/cross_rank.py): both
    are flags on their step's line, a late one on the next line."""
    from relay.cli.step_view import StepView

    view = StepView()
    cluster = {"step_time_max": 0.2, "step_time_spread": 1.0, "slowest_rank": 1, "own_time_max": 0.3,
               "own_slowest_rank": 1, "ranks": 2}
    said = {3: {"event": "straggler", "rank": 1, "by": "own_time", "ratio": 1.8, "steps": 3},
            6: {"event": "straggler_cleared", "rank": 1, "why": "recovered", "named_step": 3, "ratio": 1.0, "steps": 3},
            8: {"event": "straggler_cleared", "rank": 0, "why": "lost", "named_step": 5}}
    for step in range(1, 10):
        spread = 1.8 if step <= 3 else 1.0
        view.feed({"run": "r", "rank": RELAY_RANK, "world_size": 2, "type": "metrics", "stage": "cluster",
                   "step": step, "ts": 0.0, "data": {**cluster, "own_time_spread": spread}}, 0.0)
        if step in said:
            view.feed({"run": "r", "rank": RELAY_RANK, "world_size": 2, "type": "lifecycle", "stage": "cluster",
                       "step": step if step != 8 else 7, "ts": 0.0, "data": said[step]}, 0.0)
    lines = {int(row.text.split()[1]): row.text for row in view.ready(0.0, final=True)}
    assert lines[3].endswith("STRAGGLER r1 x1.80 (3 steps)")  # (an older relay's event: its ratio)
    assert lines[2].endswith("slow r1 x1.80")  # over --straggler-ratio, not (yet) named
    assert lines[6].endswith("cleared r1 (named at 3)")
    assert lines[7].endswith("cleared r0 (named at 5, lost)")  # said for step 7 once step 8 was in
    assert not any(lines[s].endswith(")") for s in (4, 5, 8, 9))


def test_steps_view_shows_a_resumed_jobs_attempt_and_its_steps_again(tmp_path: Path) -> None:
    """A job resumed from checkpoint-3 continues its run as attempt 1: the steps the first attempt
    logged after the checkpoint (4, 5) are shown, then the attempt's own line, then its steps 4-6."""
    t0 = time.time() - 3600

    def log(seq: int, step: int, loss: float, ts: float) -> dict:
        return event("job", 0, seq, ts, "metrics", {"loss": loss, "learning_rate": 1e-3}, step=step, stage="train")

    first = [event("job", 0, 0, t0, "lifecycle", {"event": "train_begin", "attempt": 0}, step=0)]
    first += [log(s, s, 2.0 - 0.1 * s, t0 + s) for s in range(1, 6)]  # killed after step 5, checkpoint at 3
    base = attempt_base(1)
    second = [event("job", 0, base, t0 + 60, "lifecycle", {"event": "train_begin", "attempt": 1, "resumed_from": 3},
                    step=3)]
    second += [log(base + s, s, 1.0 - 0.1 * s, t0 + 60 + s) for s in range(4, 7)]
    write_journal(tmp_path / "job.jsonl", first + second)
    out = relay_cmd("tail", str(tmp_path / "job.jsonl"), "--view", "steps").stdout.splitlines()
    shown = [(line.split()[1], line.split()[2]) for line in out[2:]]
    assert shown == [("1", "1.9"), ("2", "1.8"), ("3", "1.7"), ("4", "1.6"), ("5", "1.5"), ("3", "attempt"),
                     ("4", "0.6"), ("5", "0.5"), ("6", "0.4")], out
    assert out[7].endswith("3  attempt 1: resumed from step 3")
    events = relay_cmd("tail", str(tmp_path / "job.jsonl"), "--type", "lifecycle").stdout
    assert "attempt=1" in events and "resumed_from=3" in events, events


def test_steps_view_fits_the_terminal(tmp_path: Path) -> None:
    """80 columns ($COLUMNS, or the terminal's own size): fewer columns and a short flag, no line
    wider; with no terminal and no $COLUMNS, every column (what scripts read)."""
    path = tmp_path / "j.jsonl"
    training_journal(path, "wide-run", 60, t0=time.time() - 600, ranks=12, straggler_every=20)
    narrow = relay_cmd("tail", str(path), "--view", "steps", "-n", "30", env=cli_env(COLUMNS="80")).stdout
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    assert narrow.splitlines()[1].split() == ["time", "step", "loss", "lr", "tok/s", "slowest", "spread", "flag"]
    assert "STRAGGLER r1 60%" in narrow and "(0.30 s/step)" not in narrow and "cleared r1" in narrow
    wide = relay_cmd("tail", str(path), "--view", "steps", "-n", "30").stdout
    assert wide.splitlines()[1].split()[5:] == ["slowest", "own_s", "own_x", "step_s", "step_x", "flag"]
    assert "STRAGGLER r1 60% (0.30 s/step)" in wide and max(map(len, wide.splitlines())) > 80
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "relay", "tail", str(path), "--view", "steps", "-n", "30"],
                            stdout=follower, stderr=subprocess.PIPE, env=cli_env(NO_COLOR="1"))
    os.close(follower)
    out = b""
    while chunk := _read_pty(leader):
        out += chunk
    os.close(leader)
    assert proc.wait(60) == 0
    assert out.decode().replace("\r\n", "\n") == narrow
