"""A rank that dies still closes its run (issue 25 section 3): in real two-rank torchrun jobs with an
external relay (``--rank-silence 5``), rank 1 SIGKILLs itself inside a step (tests/dying_rank_job.py:
in its forward pass, its backward pass, its optimizer step, or between steps), and torchrun's agent
stops rank 0 as it stops any failed job's survivors: SIGTERM, then SIGKILL after its grace. Ten tries
in a row, one launch each by torchrun's own agent with warm ranks (tests/warm_ranks.py: each rank a
process forked by the agent, after torch, transformers and trl were imported once) (``--max-restarts`` does not serve: with torch 2.13 the restarted
workers' gloo mesh dials the dead rank's old address, and under the c10d rendezvous they hang), and
in every one rank 0's every event (its failed ``train_end`` and its last ``stats`` included) is in
the journal or its spool, and the relay names rank 1 lost.

Each launch is kept cheap: a 16-example data set, death at step 3, one relay for all ten. Under
torchrun a launch cost 15 CPU-s, the start of three Python processes that import torch (and two
transformers and trl); warm, the imports are paid once per pytest process (docs/development.md,
"Warm ranks")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import free_port, read_jsonl, wait_for
from sinks.events import RELAY_RANK
from trainer_fixtures import DEMO_DATA, demo_model, launch_flags, seed_flags, trainer_env
from warm_ranks import WarmLauncher

pytestmark = pytest.mark.slow
__all__ = ["demo_model"]  # a fixture, used by name

JOB = Path(__file__).resolve().parent / "dying_rank_job.py"
POINTS = ("forward", "backward", "optimizer", "between")
TRIES = 10
STEP = 3  # rank 1 reported steps 1 and 2 before it dies (its last reports may die with it)


def survivor_events(journal: list[dict], out: Path, run: str) -> list[dict]:
    """Rank 0's events of ``run``: the journal's, and its spool's (what the relay never acknowledged)."""
    spool = out / "relay-spool" / f"{run}.rank0.spool.jsonl"
    spooled = read_jsonl(spool) if spool.exists() else []
    return sorted([e for e in journal if e["run"] == run and e["rank"] == 0] + spooled, key=lambda e: e["seq"])


@pytest.mark.timeout(1500)  # ten launches: 741 s in all at load 13-20 on the shared two cores under torchrun
def test_a_rank_killed_anywhere_in_a_step_still_closes_its_run_ten_times_in_a_row(
        demo_model: Path, tmp_path: Path, relays, warm_launcher: WarmLauncher) -> None:
    journal = tmp_path / "journal.jsonl"
    relay = relays(["--path", str(journal), "--rank-silence", "5"])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(DEMO_DATA.read_text().splitlines(keepends=True)[:16]))
    runs: list[tuple[str, str, Path]] = []
    for attempt in range(TRIES):
        point, out = POINTS[attempt % len(POINTS)], tmp_path / f"try{attempt}"
        flags = seed_flags(demo_model, out, steps=STEP + 2, eval_steps=None)
        flags[flags.index("--data_path") + 1] = str(data)
        cmd = launch_flags(free_port())[:-2] + [str(JOB), str(STEP), point, "--"] + flags
        done = warm_launcher.run(cmd + ["--relay_address", relay.address], trainer_env(), timeout=540)
        assert done.returncode != 0, done.stderr[-3000:]
        assert "Signal 9 (SIGKILL) received by PID" in done.stderr, f"{point}: rank 1 did not die: {done.stderr[-3000:]}"
        runs.append((json.loads((out / "tracking_run.json").read_text())["run"], point, out))

    def lost(run: str) -> list[dict]:
        return [e["data"] for e in read_jsonl(journal, live=True) if e["run"] == run and e["rank"] == RELAY_RANK
                and e["type"] == "lifecycle" and e["data"]["event"] == "rank_lost"]

    def what_the_relay_heard() -> str:
        lines = read_jsonl(journal, live=True)

        def of(run: str, rank: int) -> list:
            return [(e["type"], e["step"], e["data"].get("event")) for e in lines if e["run"] == run and e["rank"] == rank]
        return "\n".join(f"{point}: rank 1 {of(run, 1)}, rank 0 {of(run, 0)}" for run, point, _ in runs) + relay.log_tail()

    # Said 5 s (end_grace) after each run's failed end, checked once a second: a wait sized for load 30.
    wait_for(lambda: all(lost(run) for run, _, _ in runs), 120, "every run's rank_lost", what_the_relay_heard)
    assert relay.stop() == 0
    events = read_jsonl(journal)
    for run, point, out in runs:
        mine = survivor_events(events, out, run)
        seqs = [e["seq"] for e in mine]
        assert seqs == list(range(len(seqs))), f"{point}: rank 0's events have gaps or repeats: {seqs}"
        ends = [e["data"] for e in mine if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
        assert [end["status"] for end in ends] == ["failed"], f"{point}: {ends}"
        last = mine[-1]
        assert (last["type"], last["stage"]) == ("stats", "client"), f"{point}: rank 0 did not close: {last}"
        assert last["data"]["published"] - last["data"]["dropped"] == last["seq"], f"{point}: {last['data']}"
        assert [d["rank"] for d in lost(run)] == [1], f"{point}: {lost(run)}"  # why=ended, or silent if rank 0's
        # end came over --rank-silence after rank 1's last report (it had reported a step rank 1 had not); with
        # last_step -1 where rank 1's every report died with it (its send thread had sent none yet)
