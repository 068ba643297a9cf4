"""The straggler tests' trainer runs (tests/test_stragglers_torchrun.py,
tests/test_straggler_episodes_torchrun.py): five real two-rank torchrun runs of the trainer on the demo
model, each with the embedded relay and its own output folder, run one after another in ONE launch of
tests/slow_rank_job.py, once per test run (``once_per_run``), for every test that reads one.

A launch costs about 17 CPU-s, nearly all of it three processes importing torch, transformers and trl;
the runs' steps cost little (docs/development.md, "A torchrun launch"): five launches became one. Each
run still starts its own process group, model, Trainer and embedded relay and writes its own journal.
The run whose rank 1 is SIGKILLed goes last: the launch ends with it (torchrun stops rank 0 and fails).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import free_port, once_per_run, read_jsonl
from trainer_fixtures import ROOT, seed_flags, torchrun, trainer_env

JOB = Path(__file__).resolve().parent / "slow_rank_job.py"
#: Seconds rank 1 sleeps per batch (two per step: --gradient_accumulation_steps 2). With two ranks
#: the median is their mean, so rank 1 must do 3x the own work of rank 0 to pass the default factor 1.5.
#: On a loaded machine the demo model's own step (0.15 s idle) stretches to a second or more, so the
#: sleep is what no load can make rank 0 match: 4 s a step against rank 0's compute.
SLEEP = "2.0"
#: Seconds every rank sleeps per batch in the balanced run: equal work that load does not stretch.
#: The demo model's compute alone, on two cores shared with other jobs, differs between the ranks by
#: more than 3x for steps on end (a run at load 4-20 named a straggler); the detector is right
#: about such a run, which is not balanced. With 0.5 s of equal work a step, a rank would need over
#: 1 s more compute than 3x its peer's for three steps in a row.
BALANCED = "0.25"
#: The episodes run: rank 1 burns 0.5 CPU-s after its optimizer step at these steps, of EPISODE_STEPS.
SLOW_STEPS = [*range(1, 6), *range(7, 11)]
EPISODE_STEPS = 20
#: name: (rank, where, value, steps), in launch order; "killed" last (it ends the launch).
RUNS = {"collator": ("1", "collator", SLEEP, 4), "forward": ("1", "forward", SLEEP, 4),
        "balanced": ("all", "collator", BALANCED, 30),
        "episodes": ("1", "optimizer", "0.5@1-5,7-10", EPISODE_STEPS),
        "killed": ("1", "kill", "5", 12)}


@dataclass
class Run:
    """One run of the launch: its journal, and what each rank's ``main`` returned (none: it did not return)."""
    journal: Path
    statuses: dict[int, int]
    returncode: int  # the launch's
    stderr: str  # the launch's last 4000 characters

    def events(self) -> list[dict]:
        return read_jsonl(self.journal)


@pytest.fixture(scope="session")
def straggler_runs(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every run of RUNS, by name (the launch: 3-4 minutes of wall at load 10)."""
    with once_per_run(tmp_path_factory, "straggler-runs") as workdir:
        if not (workdir / "done.json").exists():
            shutil.rmtree(workdir, ignore_errors=True)  # what a launch killed on another worker left
            workdir.mkdir()
            cmd = torchrun(free_port())[:-2] + [str(JOB)]
            for i, (name, (rank, where, value, steps)) in enumerate(RUNS.items()):
                cmd += (["--then"] if i else []) + [rank, where, value, "--"]
                cmd += seed_flags(demo_model, workdir / name, steps=steps, eval_steps=None)
            done = subprocess.run(cmd, cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=1500)
            (workdir / "done.json").write_text(json.dumps({"returncode": done.returncode, "stdout": done.stdout,
                                                           "stderr": done.stderr[-4000:]}))
    done = json.loads((workdir / "done.json").read_text())
    statuses: dict[str, dict[int, int]] = {name: {} for name in RUNS}
    names = list(RUNS)
    for run, rank, status in re.findall(r"^slow_rank_job: run (\d+) rank (\d+) returned (\d+)$", done["stdout"],
                                        re.MULTILINE):
        statuses[names[int(run)]][int(rank)] = int(status)
    return {name: Run(workdir / name / "training_logs.jsonl", statuses[name], done["returncode"], done["stderr"])
            for name in RUNS}
