"""Collective timing against DDP's built-in all-reduce, whole jobs (issue 29): what timing each rank's
waits (trainer/collectives.py: every trainable gradient stamped when ready and the backward pass's
return, around DDP's own C++ all-reduce, and every blocking ``torch.distributed`` call wrapped) costs
against the same job with nothing timed. Each job (bench/ddp_whole_job.py: the demo
fine-tune on two CPU ranks under torchrun, every step logged, the trainer's RelayCallback publishing
to the job's relay) has the timing on or off (``time_collectives``, as ``--time_collectives``) from
start to end. They alternate, the order turning each round. Each job gives its median step cycle
(rank 0, begin to begin, after a warm-up): in wall time, and in the CPU time rank 0's process used
(every thread), which the load of a shared machine stretches far less than wall time; each round
gives one paired ratio of each (timed / built-in), so drift between rounds cancels. Rounds go on
until the 95% bootstrap intervals of both median paired ratios are within ±1% of them (so an effect
of 2% would show), or ``--max-rounds``.

Whole jobs on a shared machine spread far wider than 2%, so an in-process half follows
(bench/ddp_pair_job.py): two DDP copies of one small model in one process group, both on DDP's
built-in all-reduce, one timed, stepped in alternating blocks, with the Trainer's loss
gather each step; its paired ratios are per pair of adjacent blocks.

    python -m bench.bench_collectives [--steps 100] [--max-rounds 30] [--pair-blocks 60] [--only jobs|pair]
                                      [--quick] [--json FILE]

Not part of ``python -m bench`` (an hour or more on 2 shared cores); its figures are in
docs/benchmarks.md by hand, with the command and the load.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, Sample, Section, machine

log = logging.getLogger("bench")
BUILTIN, TIMED = "DDP built-in all-reduce, nothing timed", "timed (trainer/collectives.py, the default)"
MODES = {BUILTIN: "builtin", TIMED: "timed"}
MODES_BY_KEY = {key: name for name, key in MODES.items()}
MIN_ROUNDS = 8
#: The half-width of the interval the rounds stop at: resolves an effect of twice it.
RESOLVE = 0.01


def interval(ratios: list[float], resamples: int = 4000) -> tuple[float, float]:
    """The 95% bootstrap interval of the median of ``ratios`` (seeded: the same figures, the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(resamples * 0.025)], medians[int(resamples * 0.975) - 1]


def job(mode: str, steps: int, workdir: Path) -> dict[str, float]:
    """One whole two-rank job: its median step cycle, wall and CPU seconds."""
    out = workdir / "cycles.json"
    _torchrun([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
               str(ROOT / "bench" / "ddp_whole_job.py"), str(workdir), str(steps), mode, str(out)])
    cycles = json.loads(out.read_text())
    return {"wall": statistics.median(cycles["wall"]), "cpu": statistics.median(cycles["cpu"])}


def pair(blocks: int, workdir: Path) -> dict[str, dict[str, list[float]]]:
    """The in-process half: per mode, each step's wall and CPU seconds (bench/ddp_pair_job.py)."""
    out = workdir / "pair.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           str(ROOT / "bench" / "ddp_pair_job.py"), str(blocks), str(out)]
    _torchrun(cmd)
    steps = json.loads(out.read_text())
    return {MODES_BY_KEY[mode]: {"wall": [w for w, _ in values], "cpu": [c for _, c in values]}
            for mode, values in steps.items()}


def _torchrun(cmd: list[str]) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")


def pair_section(section: Section, blocks: int, workdir: Path) -> None:
    from bench.ddp_pair_job import BLOCK, LAYERS, WIDTH

    found = pair(blocks, workdir)
    rows = []
    for key, what in (("wall", "wall"), ("cpu", "CPU")):
        base, timed = (Sample(f"{name}: step, {what}", "s", found[name][key]) for name in (BUILTIN, TIMED))
        ratios = [statistics.median(timed.values[i:i + BLOCK]) / statistics.median(base.values[i:i + BLOCK])
                  for i in range(0, len(base.values), BLOCK)]
        low, high = interval(ratios)
        rows += [base.row(), timed.row(base), Sample(f"timed / built-in, adjacent blocks: {what}", "x", ratios).row()]
        median = statistics.median(ratios)
        section.target(f"collective timing within 2% of DDP's built-in all-reduce (one process, two DDP copies, "
                       f"median ratio of adjacent blocks, {what}; met when its 95% interval is)", high, 1.02, False,
                       f"{(median - 1) * 100:+.1f}% (95% interval {(low - 1) * 100:+.1f}% .. {(high - 1) * 100:+.1f}%)")
        section.data[f"pair {key}"] = {"ratios": ratios, "interval": [low, high]}
        section.notes.append(f"one process, {what}: the 95% bootstrap interval of the median ratio of adjacent blocks "
                             f"is {low:.4f} .. {high:.4f}: " + ("within ±1%, so an effect of 2% would show." if
                                                                _resolved(ratios, (low, high)) else
                                                                "wider than ±1%: this run does not resolve 2%."))
    section.add_table(f"one process group on 2 CPU ranks, two DDP copies of {LAYERS} linear layers of {WIDTH}, built-in / "
                      f"timed in turns of {BLOCK} steps, {blocks} blocks each, loss gathered every step", rows)


def run(steps: int, least: int, most: int, workdir: Path) -> Section:
    section = Section("collectives", "Collective timing against DDP's built-in all-reduce: whole jobs (issue 29)")
    found = {name: {"wall": Sample(f"{name}: median step cycle, wall", "s"),
                    "cpu": Sample(f"{name}: median step cycle, CPU of rank 0", "s")} for name in MODES}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    bounds: dict[str, tuple[float, float]] = {}
    rounds = 0
    while rounds < most:
        for name in (BUILTIN, TIMED) if rounds % 2 == 0 else (TIMED, BUILTIN):  # the order turns each round
            for key, value in job(MODES[name], steps, workdir / f"job-{time.monotonic_ns()}").items():
                found[name][key].values.append(value)
        rounds += 1
        for key in ratios:
            ratios[key].append(found[TIMED][key].values[-1] / found[BUILTIN][key].values[-1])
            bounds[key] = interval(ratios[key])
        log.info("round %d: timed / built-in wall %.4f cpu %.4f; medians %.4f (%.4f .. %.4f), %.4f (%.4f .. %.4f); "
                 "load %.1f", rounds, ratios["wall"][-1], ratios["cpu"][-1],
                 statistics.median(ratios["wall"]), *bounds["wall"], statistics.median(ratios["cpu"]),
                 *bounds["cpu"], os.getloadavg()[0])
        if rounds >= least and all(_resolved(ratios[key], bounds[key]) for key in ratios):
            break
    paired = {key: Sample(f"timed / built-in, same round: {key}", "x", values) for key, values in ratios.items()}
    section.add_table(f"the demo fine-tune on 2 CPU ranks (torchrun, DDP), {steps} steps, every step logged, "
                      f"{rounds} rounds", [found[BUILTIN]["wall"].row(), found[TIMED]["wall"].row(found[BUILTIN]["wall"]),
                                           found[BUILTIN]["cpu"].row(), found[TIMED]["cpu"].row(found[BUILTIN]["cpu"]),
                                           paired["wall"].row(), paired["cpu"].row()])
    for key, what in (("wall", "wall"), ("cpu", "CPU")):
        median, (low, high) = statistics.median(ratios[key]), bounds[key]
        section.target(f"collective timing within 2% of DDP's built-in all-reduce (whole jobs, median same-round "
                       f"ratio of the median step cycle, {what}; met when its 95% interval is)", high, 1.02, False,
                       f"{(median - 1) * 100:+.1f}% (95% interval {(low - 1) * 100:+.1f}% .. {(high - 1) * 100:+.1f}%)")
        section.notes.append(f"{what}: the 95% bootstrap interval of the median same-round ratio is {low:.4f} .. "
                             f"{high:.4f} after {rounds} rounds: " + (
                                 "within ±1%, so an effect of 2% would show." if _resolved(ratios[key], bounds[key])
                                 else "wider than ±1%, so this run does not resolve 2% by this figure."))
    section.data = {"rounds": rounds, "intervals": bounds, "ratios": ratios,
                    **{f"{name} {key}": sample.values for name, kinds in found.items() for key, sample in kinds.items()}}
    return section


def _resolved(ratios: list[float], bounds: tuple[float, float]) -> bool:
    median = statistics.median(ratios)
    return max(bounds[1] - median, median - bounds[0]) <= RESOLVE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps per job")
    parser.add_argument("--max-rounds", type=int, default=30, help="rounds at most (one job of each per round)")
    parser.add_argument("--pair-blocks", type=int, default=60, help="blocks of each mode in the in-process half")
    parser.add_argument("--only", choices=("jobs", "pair"), help="run only the whole jobs or the in-process half")
    parser.add_argument("--quick", action="store_true", help="1 round of 14 steps, 2 blocks (a smoke test)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    load = os.getloadavg()[0]
    steps, least, most, blocks = (14, 1, 1, 2) if args.quick else (args.steps, MIN_ROUNDS, args.max_rounds,
                                                                  args.pair_blocks)
    with tempfile.TemporaryDirectory(prefix="bench-collectives-") as tmp:
        if args.only == "pair":
            section = Section("collectives", "Collective timing against DDP's built-in all-reduce (issue 29)")
        else:
            section = run(steps, least, most, Path(tmp))
        if args.only != "jobs":
            pair_section(section, blocks, Path(tmp))
    print(section.render())
    print(f"\nload average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "load": [load, os.getloadavg()[0]],
                                         **section.data}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
