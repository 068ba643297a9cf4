"""Viewers on a big journal (issue 29): what ``relay tail``, ``relay tail --view steps``, ``relay runs``
and ``relay plot`` cost on a journal of a million lines (a two-rank job of 250,000 logged steps, as
the relay writes it: each rank's figures, the Trainer's log, the relay's cluster figures, a
straggler every 1,000 steps), against coreutils ``tail`` and a plain read of the same file in the
same run, contenders alternating round by round.

* whole commands (``python -m relay ...``), wall time from start to exit, and peak RSS (``wait4``);
  ``relay --version`` is the interpreter and click starting, what every command pays first;
* ``tail -f``: from starting the command to its first line of output;
* the first look in-process (``relay.cli.tail.Tail``, output to /dev/null): what the viewer itself
  costs once Python is up, on the big journal and on one of 4,000 lines, and the bytes it read
  (``read_chars`` of this process), in the single-file layout and a directory (the big run file
  beside 2,000 small runs), against a plain read of the whole big file in the same process;
* ``relay plot`` of three metrics, one million points (loss, each rank's step time, the own-work
  spread), and of a quarter of the journal: its memory must not grow with the journal.

    python -m bench.bench_viewers [--quick]
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.common import ROOT, Sample, Section, alternate_many, cli
from tests.watch_helpers import event, training_journal, write_journal

PLOT = ["--metric", "loss", "--metric", "rank/step_time", "--metric", "cluster/own_time_spread", "--by", "rank"]


def command(args: list[str], *, first_line: bool = False, tree: Path = ROOT) -> dict[str, float]:
    """Wall seconds of a command (to its first line of output with ``first_line``, then it is
    stopped), its CPU seconds, and its peak RSS in MiB: the kernel's high-water mark of the program
    (VmHWM, read every 10 ms while it runs; a child's ru_maxrss would count the benchmark's own
    memory, which a forked child starts from). ``tree``: the checkout whose code runs."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("COLUMNS", None)
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tree)  # (-m: cwd first)
    assert proc.stdout is not None
    peak = [0.0]
    watcher = threading.Thread(target=_watch_peak, args=(proc.pid, peak), daemon=True)
    watcher.start()
    if first_line:
        line = proc.stdout.readline()
        took = time.perf_counter() - started
        proc.terminate()
        if not line:
            raise RuntimeError(f"{args} printed nothing")
    else:
        while proc.stdout.read(1 << 16):
            pass
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    if not first_line:
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{args} exited {proc.returncode}")
    return {"s": took, "cpu s": usage.ru_utime + usage.ru_stime, "MiB": peak[0] / 1024}


def _watch_peak(pid: int, peak: list[float]) -> None:
    """Keep ``peak[0]`` at the process's VmHWM (kB) until it is gone."""
    path = f"/proc/{pid}/status"
    while True:
        try:
            with open(path) as fh:
                hwm = next((line.split()[1] for line in fh if line.startswith("VmHWM:")), None)
        except OSError:
            return
        if hwm is None:  # a zombie: its memory is gone
            return
        peak[0] = max(peak[0], float(hwm))
        time.sleep(0.01)


def relay(*args: str, first_line: bool = False) -> Callable[[], dict[str, float]]:
    return lambda: command([sys.executable, "-m", "relay", *args], first_line=first_line)


def first_look(path: Path, follow: bool = False, **kw: object) -> dict[str, float]:
    """The first look of ``relay tail -n 20`` (``-f``: what it shows before it follows) in this
    process: seconds, and bytes read."""
    from relay.cli.filters import Selection
    from relay.cli.tail import Tail

    me = psutil.Process()
    with io.TextIOWrapper(open(os.devnull, "wb")) as out, contextlib.redirect_stdout(out):
        before = me.io_counters().read_chars
        started, cpu = time.perf_counter(), time.process_time()
        tail = Tail(path, Selection(), **kw)  # type: ignore[arg-type]
        tail.first_look(20, follow=follow)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        tail.close()
        read = me.io_counters().read_chars - before
    return {"s": took, "cpu s": cpu, "bytes read": float(read)}


def plain_read(path: Path) -> dict[str, float]:
    """A whole read of the file in 1 MiB pieces in this process, nothing parsed: the baseline of
    the first looks."""
    me = psutil.Process()
    before = me.io_counters().read_chars
    started, cpu = time.perf_counter(), time.process_time()
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"s": took, "cpu s": cpu, "bytes read": float(me.io_counters().read_chars - before)}


def rows(got: dict[str, dict[str, Sample]], unit: str, shown: str, baseline: str) -> list[dict]:
    """One table's rows: each contender's ``unit`` figures, with its ratio to ``baseline``'s."""
    base = Sample(baseline, shown, got[baseline][unit].values)
    return [Sample(name, shown, m[unit].values).row(None if name == baseline else base) for name, m in got.items()]


def build(work: Path, steps: int, small_runs: int) -> dict[str, Path]:
    """The big journal (a file, its last line written now), a quarter of it, a small one, and a
    directory: the big run's file (a hard link) beside ``small_runs`` runs of a few steps written a
    week ago (their files' times say so, as a real journal's would)."""
    now = time.time()
    big = work / "big.jsonl"
    training_journal(big, "big", steps, t0=now - steps * 0.5 - 1, straggler_every=1000)
    quarter = work / "quarter.jsonl"
    training_journal(quarter, "quarter", steps // 4, t0=now - steps, straggler_every=1000)
    small = work / "small.jsonl"
    training_journal(small, "small", 1000, t0=now - 1000, straggler_every=1000)
    folder = work / "logs"
    folder.mkdir()
    os.link(big, folder / "big.jsonl")
    week_ago = now - 7 * 86400
    for i in range(small_runs):
        run = folder / f"run-{i:04d}.jsonl"
        write_journal(run, [event(f"run-{i:04d}", 0, s, week_ago + i + s, "metrics", {"loss": 1.0 / (s + 1)}, step=s,
                                  stage="train") for s in range(3)])
        os.utime(run, (week_ago + i + 3, week_ago + i + 3))
    return {"big": big, "quarter": quarter, "small": small, "dir": folder}


def run(quick: bool) -> Section:
    steps, small_runs, rounds = (5_000, 50, 1) if quick else (250_000, 2_000, 3)
    section = Section("viewers", "Viewers: the end of a big journal")
    with tempfile.TemporaryDirectory(prefix="bench-viewers-") as tmp:
        work = Path(tmp)
        made = time.perf_counter()
        paths = build(work, steps, small_runs)
        big, folder = paths["big"], paths["dir"]
        with open(big, "rb") as fh:
            lines = sum(1 for _ in fh)
        size = big.stat().st_size
        section.notes.append(f"The journal: {lines:,} lines, {size / 1e6:,.0f} MB, two ranks, {steps:,} logged steps "
                             f"(written in {time.perf_counter() - made:.0f} s by tests/watch_helpers.training_journal); "
                             f"the directory holds its run file and {small_runs:,} runs of 3 steps.")
        whole = alternate_many({
            "coreutils tail -n 20": lambda: command(["tail", "-n", "20", str(big)]),
            "plain read (cat)": lambda: command(["cat", str(big)]),
            "relay --version": relay("--version"),
            "relay tail -n 20 FILE": relay("tail", "-n", "20", str(big)),
            "relay tail -n 20 DIR": relay("tail", "-n", "20", str(folder)),
            "relay tail -f FILE, to its first line": relay("tail", "-f", str(big), first_line=True),
            "relay tail --view steps -n 20 FILE": relay("tail", "--view", "steps", "-n", "20", str(big)),
            "relay tail --view steps -n 20 DIR": relay("tail", "--view", "steps", "-n", "20", str(folder)),
            "relay runs FILE": relay("runs", str(big)),
            "relay runs DIR": relay("runs", str(folder)),
        }, rounds)
        looks = alternate_many({
            "plain read of the big file": lambda: plain_read(big),
            "tail -n 20, big file": lambda: first_look(big),
            "tail -n 20, 4,000-line file": lambda: first_look(paths["small"]),
            "tail -n 20, directory": lambda: first_look(folder),
            "tail -f, big file": lambda: first_look(big, follow=True),
            "tail -f, directory": lambda: first_look(folder, follow=True),
            "tail --view steps -n 20, big file": lambda: first_look(big, view="steps"),
            "tail --view steps -n 20, directory": lambda: first_look(folder, view="steps"),
        }, rounds * 3)
        plots = alternate_many({
            f"relay plot, {lines:,} lines": relay("plot", str(big), *PLOT, "-o", str(work / "big.png")),
            "relay plot, a quarter of them": relay("plot", str(paths["quarter"]), *PLOT, "-o", str(work / "q.png")),
            "relay plot, 4,000 lines": relay("plot", str(paths["small"]), *PLOT, "-o", str(work / "s.png")),
        }, rounds)
        load = os.getloadavg()
    version, read, few = "relay --version", "plain read of the big file", "relay plot, 4,000 lines"
    section.add_table(f"whole commands on the {lines:,}-line journal, {rounds} rounds: wall time",
                      rows(whole, "s", "s", version))
    section.add_table("... their CPU time (user + system)", rows(whole, "cpu s", "s", version))
    section.add_table("... and their peak RSS", rows(whole, "MiB", "MiB", version))
    section.add_table(f"relay tail's first look in-process (after Python is up), {rounds * 3} rounds: wall time",
                      rows(looks, "s", "s", read))
    section.add_table("... its CPU time", rows(looks, "cpu s", "s", read))
    section.add_table("... and the bytes it read", rows(looks, "bytes read", "bytes", read))
    section.add_table(f"relay plot {' '.join(PLOT)}: a point per line of the journal ({rounds} rounds): wall time",
                      rows(plots, "s", "s", few))
    section.add_table("... its CPU time (user + system)", rows(plots, "cpu s", "s", few))
    section.add_table("... and its peak RSS", rows(plots, "MiB", "MiB", few))
    worst_look = max(looks[name]["s"].median for name in looks if name != read and "steps" not in name)
    section.target("relay tail -n 20 and -f start (first look, file or directory) <= 50 ms after start-up",
                   worst_look, 0.05, False, f"{worst_look * 1000:.0f} ms at most")
    steps_read = looks["tail --view steps -n 20, big file"]["bytes read"].median
    section.target("--view steps -n 20 reads what it shows (< 1 MB of the journal)", steps_read, 1e6, False,
                   f"{steps_read / 1e3:,.0f} kB of {size / 1e6:,.0f} MB")
    plot_s = plots[f"relay plot, {lines:,} lines"]["s"].median
    plot_cpu = plots[f"relay plot, {lines:,} lines"]["cpu s"].median
    section.target("relay plot of 1M points <= 5 s (wall, whole command)", plot_s, 5.0, False,
                   f"{plot_s:.1f} s (CPU {plot_cpu:.1f} s)")
    section.target("relay plot of 1M points <= 5 s of CPU (user + system)", plot_cpu, 5.0, False, f"{plot_cpu:.1f} s")
    rss = plots[f"relay plot, {lines:,} lines"]["MiB"].median / plots["relay plot, a quarter of them"]["MiB"].median
    section.target("relay plot's memory bounded (RSS, whole journal / a quarter) <= 1.2", rss, 1.2, False,
                   f"{rss:.2f}x")
    section.notes.append(f"Load average at the end: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on "
                         f"{os.cpu_count()} CPUs: the wall times of whole commands stretch with it; the in-process "
                         "first looks and the bytes read do not.")
    section.data = {"lines": lines, "bytes": size, "load_end": load}
    return section


if __name__ == "__main__":
    cli(run, __doc__, None)
