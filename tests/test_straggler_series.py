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
  and balanced (600 steps), where the rule that named a rank slow at half its window named rank 0
  twice and rank 1 twice
  (``test_a_crowded_machine_makes_a_balanced_rank_look_slow_for_a_few_steps``).
- ``ddp-crowded-*``: the launch of tests/straggler_runs.py (warm-less, 2026-12-07 10:43-10:53 UTC)
  beside tests/burn.py's 2 busy loops and five other sessions' tests (``/proc/loadavg`` 1-minute
  1.4 at its start, 8-11 through the slow runs, 10-17 through the balanced one; 6.7 per core, the
  higher of the 1- and 5-minute figures, when it ended): rank 1 slow by 0.05 CPU-s at steps 1-20 of
  50 in its forward, backward, after the all-reduce, after its optimizer step, in its collator; and
  balanced (600 steps): the half-window rule named ranks 7 times (4-21 steps each, costs 10-16%),
  rank 0 (which also logs and runs the embedded relay) in 5; at most 80% of any window's steps
  were slow for rank 0, 60% for rank 1.
- ``fsdp*``: tests/fsdp_rank_job.py beside tests/burn.py's 2 busy loops (load average 2-7): FSDP2
  balanced (80 steps) and rank 1 slow in a layer's forward (20 steps), FSDP1 balanced (30 steps).
- ``ddp-overloaded-*``: the same launch, warm (tests/warm_ranks.py), 11:02-11:19 UTC, more crowded
  still (``/proc/loadavg`` 1-minute 6-20, median 14.7; 7.5 per core when it ended): rank 1 slow
  after the all-reduce and in its collator, where the run's first two steps and one more of its
  first 8 cost the job under 10% (named at step 14), and balanced (600 steps; the half-window rule
  named rank 0 3 times).
- ``fsdp*-crowded-*``: tests/test_fsdp_stragglers.py's launch right after ddp-crowded's, as crowded
  (``/proc/loadavg`` 1-minute 11-20 through it, 7.3 per core when it ended): FSDP2 balanced (600
  steps), rank 1 slow by 0.05 CPU-s in a layer's forward, backward, after its optimizer step, and
  FSDP1 in a layer's forward (20 steps each).
- ``fsdp2-overloaded-none``: that launch, warm, 11:19-11:27 UTC (``/proc/loadavg`` 1-minute 10-14,
  6.3 per core when it ended): FSDP2 balanced, 600 steps (the half-window rule named rank 0 twice).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.daemon.cross_rank import Cluster, ClusterConfig
from relay.daemon.stragglers import StragglerRule, excess
from relay.wire.lines import Derived

SERIES = Path(__file__).resolve().parent / "straggler_series"
#: Where rank 1 is slow in the ddp-crowded series.
PLACES = ("forward", "backward", "allreduce", "optimizer", "collator")


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


def recorded(name: str) -> list[list[float]]:
    return json.loads((SERIES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["ddp-balanced", "fsdp2-none", "fsdp1-none", "ddp-loaded-balanced",
                                  "ddp-crowded-balanced", "ddp-overloaded-balanced",
                                  "fsdp2-overloaded-none"])
def test_balanced_recorded_runs_name_nobody(name: str) -> None:
    rows = recorded(name)
    assert findings(rows) == []
    # (single steps do cost the job: one rank descheduled for a step; the window takes them for noise)
    assert name != "ddp-balanced" or any(abs(r[7] - r[4]) > 0.05 for r in rows)


@pytest.mark.parametrize("name", ["ddp-loaded-balanced", "ddp-crowded-balanced",
                                  "ddp-overloaded-balanced", "fsdp2-overloaded-none"])
def test_a_crowded_machine_makes_a_balanced_rank_look_slow_for_a_few_steps(name: str) -> None:
    """On two cores at load 2-12 one rank of a balanced job costs it over 10% of a step at most of
    the steps of a window now and then (descheduled, or rank 0's logging stretched by the load):
    named by a rule that takes more than half the window for slowness (the rule before issue 41's
    balanced runs were recorded), never at nearly every step as a slow rank is."""
    said = findings(recorded(name), ClusterConfig(StragglerRule(share=0.5)))
    assert [e for _, e, _, _ in said].count("straggler") >= 1, said


@pytest.mark.parametrize("name", ["ddp-forward", "ddp-collator", "ddp-optimizer", "fsdp2-forward",
                                  "ddp-loaded-forward", "ddp-loaded-allreduce", "ddp-loaded-optimizer",
                                  "ddp-loaded-collator", *(f"ddp-crowded-{w}" for w in PLACES),
                                  "fsdp2-crowded-forward", "fsdp2-crowded-optimizer",
                                  "fsdp1-crowded-forward"])
def test_a_rank_slow_by_0_05_s_a_step_is_named_within_10_logged_steps_once(name: str) -> None:
    said = findings(recorded(name))
    (step, event, rank, cost), *rest = said
    assert (event, rank) == ("straggler", 1) and step <= 10 and cost >= 0.1, said
    if name == "ddp-optimizer" or name.startswith(("ddp-loaded", "ddp-crowded")):
        end = 30 if name == "ddp-optimizer" else 20  # slow at 1-30 (1-20) of 50: cleared within 2
        # windows after it ends
        assert [(s, e, r) for s, e, r, _ in rest] == [(rest[0][0], "straggler_cleared", 1)], said
        assert end < rest[0][0] <= min(50, end + 30), said
    else:
        assert rest == [], said  # one slowness, one episode


def test_beyond_burn_py_a_balanced_sharded_rank_can_cost_the_job_for_seconds_on_end() -> None:
    """What the rule cannot tell from a straggler (docs/watching.md): at 7-10 per core a balanced
    FSDP2 rank costs the job 20-40% at nearly every step for 3-10 s (rank 0 at steps 251-282, rank 1
    at 418-426), as a slow rank does; and a rank slow by 0.05 CPU-s whose first 8 steps hold 2 or 3
    that cost the job under 10% (FSDP2 backward, DDP after the all-reduce and in the collator) is
    named at step 14, not 8."""
    said = findings(recorded("fsdp2-crowded-none"))
    assert [(e, r) for _, e, r, _ in said] == [("straggler", 0), ("straggler_cleared", 0),
                                               ("straggler", 1), ("straggler_cleared", 1)], said
    assert all(c >= 0.25 for _, e, _, c in said if e == "straggler"), said
    old = findings(recorded("fsdp2-crowded-none"), ClusterConfig(StragglerRule(share=0.5)))
    assert [e for _, e, _, _ in old].count("straggler") == 12, old
    assert findings(recorded("fsdp2-crowded-backward")) == [(14, "straggler", 1, 0.29)]
    for where in ("allreduce", "collator"):  # (DDP at 7.5 per core)
        (step, event, rank, _), cleared = findings(recorded(f"ddp-overloaded-{where}"))
        assert (step, event, rank) == (14, "straggler", 1) and 20 < cleared[0] <= 50, cleared


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


def test_noisy_sharded_own_work_is_no_straggler() -> None:
    """Under FSDP most of a step is waiting on both ranks: own work is small beside the step, and a
    rank's is twice its peer's now and then (the old rule named balanced FSDP runs 4 times in 520
    steps). Its cost to a 5 s step is what it is: a few percent."""
    rows = []
    for step in range(1, 521):
        spike = step % 7 in (0, 1, 2)  # three steps in a row of seven: rank 1's own work doubles
        rows.append([step, 1, 5.0, 0.05, 0.25, 5.0, 0.05, 0.55 if spike else 0.27])
    assert findings(rows) == []
    # (the spikes cost 6%: a rule of 5% that names a rank slow at half of a 5-step window takes them
    # for slowness)
    rule = StragglerRule(cost=0.05, window=5, share=0.5)
    assert findings(rows, ClusterConfig(rule))[0][1:3] == ("straggler", 1)


def test_an_episode_does_not_clear_while_the_rank_is_still_slow() -> None:
    """A rank slow at nearly every step, then costing the job 6-20% a step, hovering near the bar
    (10%): named once, never cleared while it stays above half the bar; cleared once most of a
    window is calm."""
    costs = [0.25, 0.12, 0.2, 0.15, 0.11, 0.3, 0.13, 0.2, 0.09, 0.12]
    costs += [0.07, 0.12, 0.08, 0.2, 0.06] * 6 + [0.0] * 10
    rows = [[s, 1, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5 + cost] for s, cost in enumerate(costs, start=1)]
    said = findings(rows)
    assert [(e, r) for _, e, r, _ in said] == [("straggler", 1), ("straggler_cleared", 1)], said
    assert said[0][0] <= 10 and said[1][0] > 40, said


def test_a_slowness_is_named_when_nearly_every_step_of_the_window_is_slow() -> None:
    """From a run's start 7 slow steps of its first 8 name a rank (more than half the window of 15
    logged); mid-run, the window holds the calm steps before: 13 of its 15 must be slow, so a rank
    slow from step 101 is named at step 113, and one slow for only 12 steps is not named."""
    def costs(slow: set[int]) -> list[list[float]]:
        return [[s, 1, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5 + (0.2 if s in slow else 0.0)]
                for s in range(1, 161)]

    assert findings(costs(set(range(1, 30)) - {4}))[0][:2] == (8, "straggler")
    assert findings(costs(set(range(101, 160))))[0][:2] == (113, "straggler")
    assert findings(costs(set(range(101, 113)))) == []


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
