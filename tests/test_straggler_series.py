"""The straggler rule (relay/daemon/stragglers.py, in relay/daemon/cross_rank.py) over series: what
real two-rank jobs recorded (tests/straggler_series/, each rank's step time, time between steps and
own work per logged step), and made-up series that reproduce the failures of the rule it replaced
(issue 41): with two ranks a rank a third slower was never named, noisy own work named balanced runs,
episodes cleared while the rank was still slow. Milliseconds each; the default rule throughout.

The recorded series (2 CPU cores, gloo, every step logged; ``relay tail --json --stage rank`` of the
journal, reduced to ``[step, steps, (step_time, outside_time, own_time) of rank 0, of rank 1]``):

- ``ddp-*``: the trainer on the demo model (tests/slow_rank_job.py, load average about 1): balanced
  (150 steps), and rank 1 slowed by 0.05 s a step in its forward (0.025 s a micro-batch, 40 steps),
  its collator (40 steps) and after its optimizer step (0.05 CPU-s at steps 1-30 of 50).
- ``ddp-loaded-*``: the same on a crowded machine (load average 7-12), every rank also sleeping 0.1 s
  per batch between steps (a step of ~0.35 s; tests/straggler_runs.py): rank 1 slow by 0.05 CPU-s at
  steps 1-20 of 50 in its forward, after the all-reduce, after its optimizer step, in its collator;
  and balanced (600 steps), where the rule does name ranks: see
  ``test_a_balanced_run_on_a_crowded_machine_gets_only_short_marginal_episodes``.
- ``ddp-noisy-forward``: the straggler tests' forward run (tests/straggler_runs.py) at load 1.2,
  where rank 1's forward burn slows its peer too (on its own vCPU): its excess came out at
  0.008-0.095 s a step, under the bar at 4 of the first 11 steps (the rule that counted steps not
  yet logged as not slow named it at step 12; in CI at step 15).
- ``fsdp2-none-start``: the balanced FSDP2 run of tests/test_fsdp_stragglers.py in a fresh-clone
  ``make test`` (load 1-2.5): rank 0 costs the job 13-37% at steps 2-6 while its embedded relay
  starts, then nothing for 600 steps.
- ``fsdp*``: tests/fsdp_rank_job.py beside tests/burn.py's 2 busy loops (load average 2-7): FSDP2
  balanced (80 steps) and rank 1 slow in a layer's forward (20 steps), FSDP1 balanced (30 steps).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.daemon.cross_rank import Cluster, ClusterConfig
from relay.daemon.stragglers import StragglerRule, excess
from relay.wire.lines import Derived

SERIES = Path(__file__).resolve().parent / "straggler_series"


def report(rank: int, step: int, step_time: float, outside: float, own: float | None, steps: int = 1,
           world: int = 2) -> dict:
    data = {"step_time": step_time, "outside_time": outside, "steps": steps}
    if own is not None:
        data["own_time"] = own
    return {"run": "r", "rank": rank, "world_size": world, "type": "metrics", "stage": "rank", "step": step,
            "epoch": None, "data": data, "seq": 0}


def findings(rows: list[list[float]], config: ClusterConfig | None = None, own: bool = True) -> list[tuple]:
    """(step, event, rank, cost) of what the relay says over ``rows``."""
    cluster = Cluster(config or ClusterConfig())
    out: list[Derived] = []
    for step, steps, *figures in rows:
        for rank in range(len(figures) // 3):
            took, outside, work = figures[3 * rank:3 * rank + 3]
            out += cluster.observe(report(rank, int(step), took, outside, work if own else None, int(steps),
                                          world=len(figures) // 3), 0.0)
    return [(d.step, d.data["event"], d.data["rank"], round(d.data.get("cost", 0), 2)) for d in out
            if d.type == "lifecycle"]


def rank_1_costs(costs: list[float]) -> list[tuple]:
    """What the relay says of two ranks of 1 s steps where rank 1 costs the job ``costs`` in turn."""
    return findings([[s, 1, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5 + c] for s, c in enumerate(costs, start=1)])


def recorded(name: str) -> list[list[float]]:
    return json.loads((SERIES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["ddp-balanced", "fsdp2-none", "fsdp1-none"])
def test_balanced_recorded_runs_name_nobody(name: str) -> None:
    rows = recorded(name)
    assert findings(rows) == []
    # (single steps do cost the job: one rank descheduled for a step; the window takes them for noise)
    assert name != "ddp-balanced" or any(abs(r[7] - r[4]) > 0.05 for r in rows)


#: The recorded slow runs, and the last step rank 1 was slow at (None: to the end).
SLOW = {"ddp-forward": None, "ddp-collator": None, "ddp-optimizer": 30, "fsdp2-forward": None,
        "ddp-loaded-forward": 20, "ddp-loaded-allreduce": 20, "ddp-loaded-optimizer": 20,
        "ddp-loaded-collator": 20, "ddp-noisy-forward": 20}


@pytest.mark.parametrize("name", list(SLOW))
def test_a_rank_slow_by_0_05_s_a_step_is_named_within_10_logged_steps_once(name: str) -> None:
    said = findings(recorded(name))
    (step, event, rank, cost), *rest = said
    assert (event, rank) == ("straggler", 1) and step <= 10 and cost >= 0.1, said
    end = SLOW[name]
    if end is not None:  # cleared within 2 windows after it ends
        assert [(s, e, r) for s, e, r, _ in rest] == [(rest[0][0], "straggler_cleared", 1)], said
        assert end < rest[0][0] <= min(50, end + 30), said
    else:
        assert rest == [], said  # one slowness, one episode
    assert name != "ddp-noisy-forward" or step == 8, said  # 6 slow of its first 8 logged steps


def test_a_balanced_run_on_a_crowded_machine_gets_only_short_marginal_episodes() -> None:
    """What the rule cannot tell from a straggler (docs/watching.md): on two cores at load 11 one rank
    of a balanced job costs it 10-14% of each step for a few seconds on end (descheduled, or rank 0's
    logging stretched by the load). Each such episode is short and just over the bar, unlike the
    slow runs' 24-31% until the slowness ends."""
    said = findings(recorded("ddp-loaded-balanced"))
    named = [(s, r, c) for s, e, r, c in said if e == "straggler"]
    cleared = [(s, r) for s, e, r, _ in said if e == "straggler_cleared"]
    assert len(named) == len(cleared) == 3, said
    # (6 without the steadiness test: three more where the rank's excess swung)
    assert len([e for _, e, _, _ in findings(recorded("ddp-loaded-balanced"),
                                             ClusterConfig(StragglerRule(steadiness=0.0)))
                if e == "straggler"]) == 6
    assert all(0.10 <= c < 0.20 for _, _, c in named), said
    pairs = zip(named, cleared, strict=True)
    assert all(0 < end - start <= 20 for (start, _, _), (end, _) in pairs), said


def test_two_ranks_one_a_third_slower_is_named_with_what_it_costs() -> None:
    """Under DDP both ranks take 0.45 s a step; rank 1 does 0.15 s of own work more than rank 0's
    0.30 s: its own work is 1.5x its peer's, 1.2x their median (the old rule needed 1.5x the median,
    3x the peer). It costs the job a third of each step."""
    rows = [[step, 1, 0.45, 0.0, 0.30, 0.45, 0.0, 0.45] for step in range(1, 21)]
    cluster = Cluster(ClusterConfig())
    out = [d for step, steps, *f in rows for rank in (0, 1)
           for d in cluster.observe(report(rank, step, *f[3 * rank:3 * rank + 3]), 0.0)]
    (named,) = [d for d in out if d.type == "lifecycle"]
    assert named.step == 8 and named.data == {  # 8 of a window of 15 logged steps
        "event": "straggler", "rank": 1, "by": "own_time", "cost_s": pytest.approx(0.15),
        "cost": pytest.approx(1 / 3), "own_time": 0.45, "step_time": 0.45, "others_median": pytest.approx(0.30),
        "job_step_s": 0.45, "window": 15}
    assert dict(cluster.standing("r").costs) == {0: pytest.approx(-1 / 3), 1: pytest.approx(1 / 3)}


@pytest.mark.parametrize("extra, named", [(0.05, True), (0.025, False), (0.015, False)])
def test_the_bars_a_slowness_must_pass(extra: float, named: bool) -> None:
    """0.05 s on a 0.3 s step (17%) is named; 0.025 s (8%) is under --straggler-cost; 0.015 s on a
    0.1 s step (15%) is under --straggler-min (20 ms)."""
    step_s = 0.1 if extra == 0.015 else 0.3
    rows = [[s, 1, step_s + extra, 0.0, step_s * 0.6, step_s + extra, 0.0, step_s * 0.6 + extra] for s in range(1, 31)]
    assert bool(findings(rows)) is named


def test_at_the_start_of_a_run_the_logged_half_of_the_window_decides() -> None:
    """Before the window is full, over half of the steps logged so far must be slow, and at least half
    the window must be logged: a rank slow at 5 of its first 8 logged steps is named at step 8 (with
    the steps not yet logged counted as not slow, it needed 8 slow ones: step 12), one slow at 4
    of 8 is not, and none is named before step 8."""
    assert rank_1_costs([0.2, 0.0, 0.2, 0.2, 0.0, 0.2, 0.0, 0.2, 0.0, 0.2, 0.2])[0][:2] == (8, "straggler")
    assert rank_1_costs([0.2, 0.0, 0.2, 0.0, 0.2, 0.0, 0.2, 0.0]) == []
    assert rank_1_costs([0.3] * 7) == []
    assert rank_1_costs([0.3] * 8)[0][:2] == (8, "straggler")


def test_a_rank_slow_only_at_the_start_of_a_run_is_not_named() -> None:
    """Slow at 5 of its first 8 logged steps, but not at the newest: the majority says slow, the
    newest step says it is over, and nobody is named; slow at the newest too, it is named at step 8.
    Recorded: a balanced FSDP2 run whose rank 0 cost the job 13-37% at steps 2-6 while its embedded
    relay started (named at step 8 without that check), then nothing for 600 steps."""
    assert rank_1_costs([0.3] * 5 + [0.0] * 20) == []
    assert rank_1_costs([0.3] * 4 + [0.0] * 3 + [0.3])[0][:2] == (8, "straggler")
    assert findings(recorded("fsdp2-none-start")) == []


def test_a_rank_whose_excess_swings_is_not_named() -> None:
    """FSDP1 on two CPU cores beside tests/burn.py: a balanced run whose own work swings by as much as
    the bar (excess -0.08..0.09 s on 0.15-0.39 s steps). Over its first 9 logged steps 5 are slow,
    just over the bar, but its median excess (0.036 s) is less than 1.5 times their median distance
    from it: not steady, not named. Without that test it is named at step 9 and cleared at 14."""
    unsteady = ClusterConfig(StragglerRule(steadiness=0.0))
    assert findings(recorded("fsdp1-none"), unsteady) == [(9, "straggler", 1, 0.13),
                                                          (14, "straggler_cleared", 1, -0.02)]
    assert findings(recorded("fsdp1-none")) == []


def test_noisy_sharded_own_work_is_no_straggler() -> None:
    """Under FSDP most of a step is waiting on both ranks: own work is small beside the step, and a
    rank's is twice its peer's now and then (the old rule named balanced FSDP runs 4 times in 520
    steps). Its cost to a 5 s step is what it is: a few percent."""
    rows = []
    for step in range(1, 521):
        spike = step % 7 in (0, 1, 2)  # three steps in a row of seven: rank 1's own work doubles
        rows.append([step, 1, 5.0, 0.05, 0.25, 5.0, 0.05, 0.55 if spike else 0.27])
    assert findings(rows) == []
    # (the spikes cost 6%: a rule of 5%, over windows of 5 steps, takes them for slowness)
    assert findings(rows, ClusterConfig(StragglerRule(cost=0.05, window=5)))[0][1:3] == ("straggler", 1)


def test_an_episode_does_not_clear_while_the_rank_is_still_slow() -> None:
    """A rank costing the job 12-25% a step, hovering near the bar (10%): named once, never cleared
    while it stays above half the bar; cleared once most of a window is calm."""
    costs = [0.25, 0.12, 0.09, 0.2, 0.08, 0.15, 0.11, 0.07, 0.13, 0.09] * 4 + [0.0] * 10
    rows = [[s, 1, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5 + cost] for s, cost in enumerate(costs, start=1)]
    said = findings(rows)
    assert [(e, r) for _, e, r, _ in said] == [("straggler", 1), ("straggler_cleared", 1)], said
    assert said[0][0] <= 15 and said[1][0] > 40, said


def test_logged_every_10_steps_a_window_is_3_logged_steps() -> None:
    """At --logging_steps 10 each report sums up 10 steps: the window (15 steps) is 3 logged steps at
    least, so a slow rank is named at the second and cleared at the second calm one."""
    costs = [0.2] * 5 + [0.0] * 4
    rows = [[10 * s, 10, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5 + c] for s, c in enumerate(costs, start=1)]
    assert [(s, e) for s, e, _, _ in findings(rows)] == [(20, "straggler"), (70, "straggler_cleared")]


def test_without_own_work_step_time_is_judged_by_the_same_cost_rule() -> None:
    rows = [[s, 1, 0.3, 0.0, None, 0.36, 0.0, None] for s in range(1, 16)]
    said = findings(rows, own=False)
    assert said == [(8, "straggler", 1, round(0.06 / 0.36, 2))], said


def test_with_more_ranks_the_excess_is_over_the_other_ranks_median() -> None:
    assert excess({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.5}) == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.5}
    assert excess({0: 1.0, 1: 2.0, 2: 4.0}) == {0: -2.0, 1: -0.5, 2: 2.5}
    assert excess({0: 1.0, 1: 1.0}) == {0: 0.0, 1: 0.0}
    rows = [[s, 1, *[1.0, 0.0, 0.5] * 7, 1.0, 0.0, 0.65] for s in range(1, 16)]  # 8 ranks, rank 7 slow
    assert findings(rows) == [(8, "straggler", 7, 0.15)]


def test_every_recording_the_rule_was_chosen_on() -> None:
    """The rule's three conditions (the logged half of the window decides, the excess steady, the
    newest step slow) were chosen over these recordings (straggler_series/more/, the same row
    layout): the straggler tests' launches of 2026-12-07 idle (``ddp-idle-*``), beside tests/burn.py
    (``ddp-burn-*``, ``ddp-busy-*``) and in a fresh clone's ``make test`` (``fresh-clone-*``), and an
    earlier session's on a crowded and an overloaded machine (load 6-20). Every slow run (rank 1
    slow from step 1) is named by its 9th logged step; the balanced ones get 12 episodes in all,
    where the rule before named 26 and named the slow runs by step 11."""
    balanced, firsts = 0, []
    for path in sorted((SERIES / "more").glob("*.json")):
        said = [(s, r) for s, e, r, _ in findings(json.loads(path.read_text())) if e == "straggler"]
        if "balanced" in path.stem or "none" in path.stem:
            balanced += len(said)
        else:
            assert said and said[0][1] == 1, (path.stem, said)
            firsts.append(said[0][0])
    assert len(firsts) == 32 and max(firsts) <= 9, firsts
    assert balanced == 12
