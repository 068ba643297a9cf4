"""Warm ranks are torchrun's ranks (tests/warm_ranks.py): the same probe job (tests/launch_probe_job.py)
under real torchrun and warm gives each rank the same environment, default signal handlers, no signal
when its agent dies, argv and a real gloo process group; a rank SIGKILLed is reported by the agent as torchrun reports it and its
peer is stopped with SIGTERM; a job SIGTERMed stops both ranks with SIGTERM. The trainer's own
behaviour under a warm launch, a rank killed mid-step, is tests/test_rank_death.py's.

The probe imports only torch: a torchrun launch of it costs about 7 CPU-s (three interpreters
importing torch), the two torchrun launches here most of this module's cost."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port, wait_for
from trainer_fixtures import ROOT, launch_flags, trainer_env
from warm_ranks import WarmJob, WarmLauncher

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parent / "launch_probe_job.py"
LAUNCHERS = ("torchrun", "warm")


def start(how: str, launcher: WarmLauncher, folder: Path, mode: str) -> subprocess.Popen | WarmJob:
    folder.mkdir()
    argv = launch_flags(free_port())[:-2] + [str(PROBE), str(folder), mode]
    with open(folder / "job.log", "w") as log:
        if how == "warm":
            return launcher.start(argv, trainer_env(), stdout=log, stderr=subprocess.STDOUT)
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT, env=trainer_env(),
                                stdout=log, stderr=subprocess.STDOUT)


def outcome(job: subprocess.Popen | WarmJob, folder: Path) -> dict:
    """What the ranks saw and how the job ended, less what differs between any two launches (pids, ports)."""
    code = job.wait(300)
    seen = {rank: json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    for rank in seen.values():
        rank["argv"][0] = Path(rank["argv"][0]).name
    log = (folder / "job.log").read_text()
    return {"exit": code, "ranks": seen, "sigterm": sorted(p.name for p in folder.glob("*.sigterm")),
            "rank 1 killed": "exitcode  : -9 (pid:" in log and "Signal 9 (SIGKILL) received by PID" in log,
            "log": log[-3000:]}


@pytest.fixture(scope="module")
def outcomes(warm_launcher: WarmLauncher, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    """Each launcher's probe job in each mode: ``die`` (rank 1 SIGKILLs itself), ``hold`` (SIGTERMed
    by the test once both ranks are in the process group)."""
    found = {}
    for how in LAUNCHERS:
        folder = tmp_path_factory.mktemp(f"{how}-die") / "job"
        found[how, "die"] = outcome(start(how, warm_launcher, folder, "die"), folder)
        folder = tmp_path_factory.mktemp(f"{how}-hold") / "job"
        job = start(how, warm_launcher, folder, "hold")
        try:
            wait_for(lambda folder=folder: all((folder / f"rank{r}.json").exists() for r in (0, 1)),
                     300, "both ranks started",
                     lambda folder=folder: (folder / "job.log").read_text()[-3000:])
        finally:
            job.send_signal(signal.SIGTERM)
        found[how, "hold"] = outcome(job, folder)
    return found


@pytest.mark.parametrize("mode", ["die", "hold"])
def test_a_warm_rank_sees_what_a_torchrun_rank_sees(outcomes: dict, mode: str) -> None:
    torchrun, warm = outcomes["torchrun", mode], outcomes["warm", mode]
    assert warm["ranks"] == torchrun["ranks"], (warm["log"], torchrun["log"])
    for rank, seen in warm["ranks"].items():
        assert seen["world"] == [str(rank), str(rank), "2"] and seen["sum"] == 3
        assert seen["handlers"] == [True, True] and seen["sigint"] and seen["main"] == "__main__"
        assert seen["pdeathsig"] == 0  # an agent SIGKILLed signals no rank (test_resume kills both)
        assert {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT"} <= set(seen["env"])


def test_a_rank_sigkilled_is_reported_and_its_peer_stopped_as_under_torchrun(outcomes: dict) -> None:
    torchrun, warm = outcomes["torchrun", "die"], outcomes["warm", "die"]
    assert torchrun["rank 1 killed"] and warm["rank 1 killed"], (warm["log"], torchrun["log"])
    assert warm["sigterm"] == torchrun["sigterm"] == ["rank0.sigterm"]
    assert warm["exit"] == torchrun["exit"] == 1


def test_a_job_sigtermed_stops_its_ranks_as_under_torchrun(outcomes: dict) -> None:
    torchrun, warm = outcomes["torchrun", "hold"], outcomes["warm", "hold"]
    assert warm["sigterm"] == torchrun["sigterm"] == ["rank0.sigterm", "rank1.sigterm"], (warm["log"], torchrun["log"])
    assert warm["exit"] == torchrun["exit"] != 0, (warm["log"], torchrun["log"])
