"""relay/daemon/cross_rank.py on its own: the per-step figures, stragglers, lost and returning ranks, and a
rebuild from journal events, with the clock given by the test."""
from __future__ import annotations

import math

import pytest

from relay.daemon.cross_rank import MAX_WAITING, Cluster, ClusterConfig, Standing
from relay.daemon.stragglers import StragglerRule
from relay.wire.lines import Derived
from sinks.events import RELAY_RANK, attempt_base

#: a window of 5 logged steps: named at the third slow one, cleared at the third calm one
CONFIG = ClusterConfig(StragglerRule(cost=0.1, min_excess=0.02, window=5), silence=10.0)


def report(rank: int, step: int | None, took: object = 0.1, world: int = 4, run: str = "r", own: object = None,
           seq: int = 0) -> dict:
    data = {"step_time": took} if own is None else {"step_time": took, "own_time": own}
    return {"run": run, "rank": rank, "world_size": world, "type": "metrics", "stage": "rank", "step": step,
            "epoch": None if step is None else step / 100, "data": data, "seq": seq}


def feed(cluster: Cluster, times: dict[int, object], step: int, now: float = 0.0, world: int = 4) -> list[Derived]:
    out = []
    for rank, took in times.items():
        out += cluster.observe(report(rank, step, took, world), now)
    return out


def kinds(out: list[Derived]) -> list[str]:
    return [d.data.get("event", "figures") for d in out]


def test_a_step_is_summed_up_once_every_rank_reported_it() -> None:
    cluster = Cluster(CONFIG)
    assert feed(cluster, {0: 0.1, 1: 0.2, 2: 0.9}, step=5) == []
    (figures,) = cluster.observe(report(3, 5, 0.3), 0.0)
    assert figures == Derived("r", 4, "metrics", 5, 0.05, {
        "step_time_min": 0.1, "step_time_median": 0.25, "step_time_max": 0.9, "step_time_spread": 0.9 / 0.25,
        "slowest_rank": 2, "cost_rank": 2, "cost_s": pytest.approx(0.7), "cost": pytest.approx(0.7 / 0.9), "ranks": 4})
    assert cluster.observe(report(1, 5, 5.0), 1.0) == []  # a late repeat of a settled step changes nothing


def test_a_resumed_jobs_steps_are_summed_up_again_and_the_killed_attempts_late_reports_ignored() -> None:
    """A job resumed from checkpoint 4 logs steps 5 and 6 again as attempt 1 (its seqs from
    attempt_base(1)): each is summed up again, from the new attempt's reports alone."""
    cluster = Cluster(CONFIG)
    for step in range(1, 7):
        feed(cluster, {0: 0.1, 1: 0.2}, step=step, world=2)
    base = attempt_base(1)
    assert cluster.observe(report(0, 5, 0.3, world=2, seq=base), 1.0) == []
    (figures,) = cluster.observe(report(1, 5, 0.4, world=2, seq=base), 1.0)
    assert (figures.step, figures.data["step_time_max"], figures.data["ranks"]) == (5, 0.4, 2)
    assert cluster.observe(report(1, 6, 9.0, world=2, seq=7), 2.0) == [], "the killed attempt's late report"


def test_a_straggler_is_named_after_n_slow_steps_and_not_before() -> None:
    cluster = Cluster(CONFIG)
    normal = {0: 0.10, 1: 0.11, 3: 0.09}
    for step in (1, 2):
        assert kinds(feed(cluster, {**normal, 2: 0.4}, step)) == ["figures"]
    out = feed(cluster, {**normal, 2: 0.4}, 3)
    assert kinds(out) == ["figures", "straggler"]
    # its excess: its step time less the others' median; its cost: that over the job's step (the slowest's)
    assert out[1] == Derived("r", 4, "lifecycle", 3, 0.03, {
        "event": "straggler", "rank": 2, "by": "step_time", "cost_s": pytest.approx(0.3), "cost": pytest.approx(0.75),
        "step_time": 0.4, "others_median": pytest.approx(0.1), "job_step_s": 0.4, "window": 5})
    assert out[0].data["slowest_rank"] == 2
    assert (out[0].data["cost_rank"], out[0].data["cost_s"], out[0].data["cost"]) == (2, pytest.approx(0.3),
                                                                                     pytest.approx(0.75))
    assert kinds(feed(cluster, {**normal, 2: 0.4}, 4)) == ["figures"]  # said once while it stays slow
    assert kinds(feed(cluster, {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.14}, 9)) == ["figures"]


def test_standing_names_the_straggler_while_it_stays_slow_and_the_lost_ranks() -> None:
    cluster = Cluster(CONFIG)
    assert cluster.standing("r") is None  # not followed
    normal = {0: 0.10, 1: 0.11, 3: 0.09}
    for step in (1, 2):
        feed(cluster, {**normal, 2: 0.4}, step, now=step)
    assert cluster.standing("r")[:2] == ((), ())  # slow, not yet a straggler
    feed(cluster, {**normal, 2: 0.4}, 3, now=3)
    assert cluster.standing("r")[:2] == ((2,), ())
    assert dict(cluster.standing("r").costs)[2] == pytest.approx(0.75)  # the median over its window
    feed(cluster, {**normal, 2: 0.1}, 4, now=4)
    assert cluster.standing("r")[:2] == ((2,), ())  # one calm step: the episode goes on
    feed(cluster, {**normal, 2: 0.1}, 5, now=5)
    feed(cluster, {**normal, 2: 0.1}, 6, now=6)
    assert cluster.standing("r")[:2] == ((), ())  # three of the window's five calm: cleared
    feed(cluster, {0: 0.1, 1: 0.1, 2: 0.1}, 7, now=7)  # rank 3 silent from t=6 while its peers go on
    cluster.check(17.0)
    standing = cluster.standing("r")
    assert standing[:2] == ((), (3,)) and 3 not in dict(standing.costs)


def test_a_straggler_is_said_once_per_episode_and_its_recovery_once() -> None:
    """Dips in an episode do not end it: a persistent straggler with dips is named once; a window
    whose majority is calm clears it, and only then can it be named again."""
    cluster = Cluster(CONFIG)
    normal = {0: 0.10, 1: 0.11, 3: 0.09}
    said = []
    for step, rank2 in enumerate([0.4, 0.4, 0.4, 0.4, 0.1, 0.4, 0.1, 0.4, 0.4, 0.1, 0.4, 0.4, 0.1], start=1):
        said += [(d.step, d.data["event"]) for d in feed(cluster, {**normal, 2: rank2}, step) if d.type == "lifecycle"]
    assert said == [(3, "straggler")], said  # dips of one and two steps in the episode: said once
    out = feed(cluster, {**normal, 2: 0.1}, 14)
    assert kinds(out) == ["figures", "straggler_cleared"]  # 3 of the last 5 calm: 10, 13, 14
    assert out[-1] == Derived("r", 4, "lifecycle", 14, 0.14, {
        "event": "straggler_cleared", "rank": 2, "why": "recovered", "named_step": 3, "by": "step_time",
        "cost_s": pytest.approx(0.0), "cost": pytest.approx(0.0), "window": 5})
    for step in (15, 16):
        assert kinds(feed(cluster, {**normal, 2: 0.1}, step)) == ["figures"]  # cleared once
    for step in (17, 18):
        assert kinds(feed(cluster, {**normal, 2: 0.4}, step)) == ["figures"]
    assert kinds(feed(cluster, {**normal, 2: 0.4}, 19)) == ["figures", "straggler"]  # a new episode


def test_a_straggler_that_is_lost_ends_its_episode() -> None:
    cluster = Cluster(CONFIG)
    for step in (1, 2, 3):
        out = feed(cluster, {0: 0.1, 1: 0.1, 2: 0.5}, step, now=step, world=3)
    assert kinds(out) == ["figures", "straggler"]
    for step in (4, 5):  # rank 2 is silent from t=3
        feed(cluster, {0: 0.1, 1: 0.1}, step, now=step, world=3)
    lost, cleared, *figures = cluster.check(14.0)
    assert (lost.data["event"], lost.data["rank"]) == ("rank_lost", 2)
    assert cleared == Derived("r", 3, "lifecycle", 5, 0.05, {"event": "straggler_cleared", "rank": 2, "why": "lost",
                                                            "named_step": 3})
    assert kinds(cluster.observe(report(2, 6, 0.5, world=3), 15.0)) == ["rank_back"]
    for step in (6, 7):  # back and still slow: a new episode, named after its own 3 steps
        assert kinds(feed(cluster, {0: 0.1, 1: 0.1}, step, now=15.0, world=3)
                     + ([] if step == 6 else cluster.observe(report(2, step, 0.5, world=3), 15.0))) == ["figures"]
    assert kinds(feed(cluster, {0: 0.1, 1: 0.1, 2: 0.5}, 8, now=16.0, world=3)) == ["figures", "straggler"]


def feed_own(cluster: Cluster, reports: dict[int, tuple[float, object]], step: int, world: int = 2) -> list[Derived]:
    """Reports of (step time, own work) per rank."""
    out = []
    for rank, (took, own) in reports.items():
        out += cluster.observe(report(rank, step, took, world, own=own), 0.0)
    return out


def test_own_work_names_the_straggler_that_equal_step_times_hide() -> None:
    """Under DDP the ranks' step times come out equal (rank 0 waits inside its step for rank 1);
    their own work tells rank 1 is the slow one."""
    cluster = Cluster(CONFIG)
    under_ddp = {0: (0.30, 0.10), 1: (0.29, 0.50)}
    for step in (1, 2):
        (figures,) = feed_own(cluster, under_ddp, step)
    assert figures.data == {
        "step_time_min": 0.29, "step_time_median": pytest.approx(0.295), "step_time_max": 0.30,
        "step_time_spread": pytest.approx(0.30 / 0.295), "slowest_rank": 0,
        "own_time_min": 0.10, "own_time_median": pytest.approx(0.30), "own_time_max": 0.50,
        "own_time_spread": pytest.approx(0.50 / 0.30), "own_slowest_rank": 1,
        "cost_rank": 1, "cost_s": pytest.approx(0.4), "cost": pytest.approx(0.4 / 0.3), "ranks": 2}
    figures, straggler = feed_own(cluster, under_ddp, 3)
    assert straggler == Derived("r", 2, "lifecycle", 3, 0.03, {
        "event": "straggler", "rank": 1, "by": "own_time", "cost_s": pytest.approx(0.4),
        "cost": pytest.approx(0.4 / 0.3), "own_time": 0.50, "step_time": 0.29, "others_median": pytest.approx(0.10),
        "job_step_s": 0.30, "window": 5})


def test_a_step_where_a_rank_sent_no_own_work_is_judged_by_step_time() -> None:
    """A publisher that does not send own_time (or sends no usable one) puts the whole step back
    on step time: no figure of one kind is compared with one of the other."""
    cluster = Cluster(CONFIG)
    for step, rank1_own in ((1, None), (2, math.nan), (3, "x")):
        out = feed_own(cluster, {0: (0.1, 0.05), 1: (0.5, rank1_own)}, step)
        assert "own_time_median" not in out[0].data and out[0].data["slowest_rank"] == 1
    assert out[1].data == {"event": "straggler", "rank": 1, "by": "step_time", "cost_s": pytest.approx(0.4),
                           "cost": pytest.approx(0.8), "step_time": 0.5, "others_median": pytest.approx(0.1),
                           "job_step_s": 0.5, "window": 5}
    balanced = Cluster(CONFIG)
    for step in range(1, 51):  # own work within the factor: never a straggler, whatever the step times
        out = feed_own(balanced, {0: (0.1, 0.09), 1: (0.4, 0.12)}, step)
        assert kinds(out) == ["figures"] and out[0].data["own_slowest_rank"] == 1


def test_a_later_step_settles_one_a_rank_skipped() -> None:
    cluster = Cluster(CONFIG)
    assert feed(cluster, {0: 0.1, 1: 0.1, 2: 0.1}, step=1) == []
    assert feed(cluster, {3: 0.2, 0: 0.1, 1: 0.1}, step=2) == []  # rank 3 never sent step 1 (dropped)
    out = cluster.observe(report(2, 2, 0.1), 0.0)
    assert [(d.step, d.data["ranks"]) for d in out] == [(1, 3), (2, 4)]


def test_one_rank_runs_and_ranks_beyond_the_world_size_get_nothing() -> None:
    cluster = Cluster(CONFIG)
    assert feed(cluster, {0: 0.1}, step=1, world=1) == []
    assert cluster.observe(report(7, 1, 0.1, world=4), 0.0) == []
    assert cluster.runs == {}


def test_a_report_without_a_usable_step_time_counts_but_adds_no_figure() -> None:
    cluster = Cluster(CONFIG)
    (figures,) = feed(cluster, {0: 0.1, 1: math.nan, 2: "fast", 3: 0.3}, step=1)
    assert figures.data["ranks"] == 4 and figures.data["step_time_median"] == pytest.approx(0.2)
    assert feed(cluster, {0: None, 1: -1.0, 2: math.inf, 3: True}, step=2) == []  # no figure at all: no event


def test_a_rank_that_stops_while_its_peers_go_on_is_lost_then_back() -> None:
    cluster = Cluster(CONFIG)
    for step in (1, 2, 3):
        feed(cluster, {0: 0.1, 1: 0.1, 2: 0.1}, step, now=step, world=3)
    for step in (4, 5, 6):  # rank 2 is silent from t=3
        assert feed(cluster, {0: 0.1, 1: 0.1}, step, now=step, world=3) == []
    assert cluster.check(12.0) == []  # silent for 9 s of 10
    out = cluster.check(13.5)
    assert out[0] == Derived("r", 3, "lifecycle", 6, 0.06, {"event": "rank_lost", "rank": 2, "why": "silent",
                                                            "silent_s": 10.5, "last_step": 3, "peers_step": 6})
    assert [(d.step, d.data["ranks"]) for d in out[1:]] == [(4, 2), (5, 2), (6, 2)]  # no longer awaited
    assert cluster.check(30.0) == []  # said once
    assert kinds(feed(cluster, {0: 0.1, 1: 0.1}, 7, now=14.0, world=3)) == ["figures"]
    out = cluster.observe(report(2, 8, 0.1, world=3), 20.0)
    assert out == [Derived("r", 3, "lifecycle", 8, 0.07, {"event": "rank_back", "rank": 2, "silent_s": 17.0})]
    assert feed(cluster, {0: 0.1}, 8, now=20.0, world=3) == []  # awaited again
    assert kinds(cluster.observe(report(1, 8, 0.1, world=3), 20.0)) == ["figures"]


def test_ranks_that_all_stop_at_the_same_step_are_not_lost() -> None:
    cluster = Cluster(CONFIG)
    for step in (1, 2):
        feed(cluster, {0: 0.1, 1: 0.1, 2: 0.1}, step, now=step, world=3)
    cluster.observe(report(0, 3, 0.1, world=3), 3.0)
    cluster.observe(report(1, 3, 0.1, world=3), 5.0)  # the last report comes a little later
    cluster.observe(report(2, 3, 0.1, world=3), 6.0)
    assert cluster.check(14.0) == [] and cluster.check(100.0) == []


def train_end(rank: int, status: str = "completed", world: int = 2) -> dict:
    return {"run": "r", "rank": rank, "world_size": world, "type": "lifecycle", "stage": None, "step": None,
            "epoch": None, "data": {"event": "train_end", "status": status}}


def killed_at_12() -> Cluster:
    """A synchronous 2-rank job: rank 1 is killed after reporting step 12, rank 0 reports step 13,
    blocks at its next collective and, when the job is stopped, reports train_end failed at t=15."""
    cluster = Cluster(CONFIG)
    for step in range(1, 13):
        feed(cluster, {0: 0.1, 1: 0.1}, step, now=step, world=2)
    cluster.observe(report(0, 13, 0.1, world=2), 13.0)
    cluster.ended(train_end(0, "failed"), 15.0)
    return cluster


def test_a_rank_a_synchronous_job_ended_without_is_lost_after_the_grace() -> None:
    """Nobody went on (rank 0 waited in a collective), so silence names no one; the end does."""
    cluster = killed_at_12()
    assert cluster.check(15.0 + CONFIG.end_grace - 0.5) == []  # its last steps might still come
    lost, figures = cluster.check(15.0 + CONFIG.end_grace + 0.5)
    assert lost == Derived("r", 2, "lifecycle", 13, 0.13, {"event": "rank_lost", "rank": 1, "why": "ended",
                                                           "silent_s": 8.5, "last_step": 12, "peers_step": 13})
    assert (figures.step, figures.data["ranks"]) == (13, 1)  # no longer awaited
    assert cluster.check(100.0) == []  # said once


def test_a_rank_killed_mid_step_is_lost_when_the_run_fails_without_its_own_end() -> None:
    """Killed inside step 13 (forward, backward, optimizer): both ranks reported step 12 and no more,
    so rank 1 is behind no one; the run failed and every rank that lived through it sent its own
    train_end, so the one that did not is lost. A completed run at the same steps loses no one."""
    cluster = Cluster(CONFIG)
    for step in range(1, 13):
        feed(cluster, {0: 0.1, 1: 0.1}, step, now=step, world=2)
    cluster.ended(train_end(0, "failed"), 15.0)
    assert cluster.check(15.0 + CONFIG.end_grace - 0.5) == []
    (lost,) = cluster.check(15.0 + CONFIG.end_grace + 0.5)
    assert lost == Derived("r", 2, "lifecycle", 12, 0.12, {"event": "rank_lost", "rank": 1, "why": "ended",
                                                           "silent_s": 8.5, "last_step": 12, "peers_step": 12})
    completed = Cluster(CONFIG)
    for step in range(1, 13):
        feed(completed, {0: 0.1, 1: 0.1}, step, now=step, world=2)
    completed.ended(train_end(0), 15.0)
    assert completed.check(100.0) == [] and completed.close("r", 100.0) == []


def test_a_rank_killed_before_any_report_of_it_got_out_is_lost_when_the_run_ends_without_it() -> None:
    """SIGKILLed ranks lose what their send thread had not sent: on a loaded machine rank 1's every
    report died with it, so only its peer tells the relay the run has two ranks. The run failed
    without rank 1's own end: it is lost, never having reported a step (test_rank_death.py's CI failure)."""
    cluster = Cluster(CONFIG)
    for step in (1, 2):
        cluster.observe(report(0, step, 0.1, world=2), float(step))
    cluster.ended(train_end(0, "failed"), 5.0)
    assert cluster.check(5.0 + CONFIG.end_grace - 0.5) == []
    lost = [d for d in cluster.check(5.0 + CONFIG.end_grace + 0.5) if d.type == "lifecycle"]
    assert [d.data for d in lost] == [{"event": "rank_lost", "rank": 1, "why": "ended", "silent_s": 9.5,
                                       "last_step": -1, "peers_step": 2}]
    assert cluster.standing("r") == Standing((), (1,))
    (back,) = [d for d in cluster.observe(report(1, 3, 0.1, world=2), 20.0) if d.type == "lifecycle"]
    assert back.data["event"] == "rank_back"  # its reports were late after all


def test_forgetting_or_stopping_judges_an_ended_run_at_once_and_a_running_one_not_at_all() -> None:
    cluster = killed_at_12()
    lost, figures = cluster.close("r", 15.1)
    assert lost.data == {"event": "rank_lost", "rank": 1, "why": "ended", "silent_s": 3.1, "last_step": 12,
                         "peers_step": 13}
    assert figures.step == 13 and cluster.close("r", 16.0) == [] and cluster.check(100.0) == []
    running = Cluster(CONFIG)  # a relay restarted mid-run: rank 1's step 2 is merely in flight
    feed(running, {0: 0.1, 1: 0.1}, 1, world=2)
    running.observe(report(0, 2, 0.1, world=2), 1.0)
    assert running.close("r", 1.0) == [] and running.close("missing", 1.0) == []


def test_a_balanced_job_whose_rank_0_ends_first_loses_no_rank() -> None:
    """Rank 0's train_end can arrive before rank 1's last step (each rank has its own connection),
    and only rank 0 sends train_end when training completes."""
    cluster = Cluster(CONFIG)
    for step in range(1, 50):
        feed(cluster, {0: 0.1, 1: 0.1}, step, now=step / 10, world=2)
    cluster.observe(report(0, 50, 0.1, world=2), 5.0)
    cluster.ended(train_end(0), 5.01)
    assert cluster.check(5.5) == []
    assert kinds(cluster.observe(report(1, 50, 0.1, world=2), 5.6)) == ["figures"]
    assert cluster.check(60.0) == [] and cluster.close("r", 60.0) == []
    late = Cluster(CONFIG)  # rank 1 still at work on its last steps after the end: not lost while it reports
    feed(late, {0: 0.1, 1: 0.1}, 1, world=2)
    late.observe(report(0, 3, 0.1, world=2), 1.0)
    late.ended(train_end(0), 1.0)
    late.observe(report(1, 2, 0.1, world=2), 1.0 + CONFIG.end_grace)
    assert late.check(2.0 + CONFIG.end_grace) == []
    assert kinds(late.observe(report(1, 3, 0.1, world=2), 2.0 + CONFIG.end_grace)) == ["figures", "figures"]
    assert late.check(100.0) == []


def test_a_rank_that_ended_itself_is_never_lost() -> None:
    """A rank that failed on its own says so in its train_end; it is not lost, however far behind."""
    cluster = Cluster(CONFIG)
    feed(cluster, {0: 0.1, 1: 0.1}, 1, world=2)
    cluster.observe(report(0, 2, 0.1, world=2), 1.0)
    cluster.ended(train_end(1, "failed"), 2.0)
    cluster.ended(train_end(0, "failed"), 2.5)
    assert kinds(cluster.check(3.0 + CONFIG.end_grace)) == [] and kinds(cluster.close("r", 100.0)) == ["figures"]
    cluster.ended({**report(0, 3), "type": "lifecycle", "data": {"event": "checkpoint"}}, 3.0)  # not an end
    cluster.ended({**train_end(0), "run": "other"}, 3.0)  # a run of no per-rank figures: nothing to judge
    assert "other" not in cluster.runs


def test_a_step_waits_at_most_the_silence_and_a_run_holds_a_bounded_number_of_reports() -> None:
    cluster = Cluster(CONFIG)
    feed(cluster, {0: 0.1, 1: 0.1}, step=1, now=0.0)  # ranks 2 and 3 never report at all
    assert cluster.check(9.0) == []
    (figures,) = cluster.check(10.5)
    assert figures.step == 1 and figures.data["ranks"] == 2
    out = []
    last = 1 + MAX_WAITING // 2
    for step in range(2, last + 2):  # each step waits with two reports of four
        out += feed(cluster, {0: 0.1, 1: 0.1}, step, now=11.0)
    assert [d.step for d in out] == [2]  # the oldest, settled as it stood to make room
    run = cluster.runs["r"]
    assert run.waiting == sum(len(e.times) for e in run.pending.values()) == MAX_WAITING
    out = cluster.check(30.0)
    assert [d.step for d in out] == list(range(3, last + 2)) and (run.waiting, run.pending) == (0, {})


def test_restore_from_journal_events_says_nothing_twice() -> None:
    """The relay's own events in the journal tell a restarted relay what it settled and said."""
    first = Cluster(CONFIG)
    journal: list[dict] = []

    def publish(out: list[Derived]) -> None:
        journal.extend({"run": d.run, "rank": RELAY_RANK, "world_size": d.world_size, "type": d.type,
                        "stage": "cluster", "step": d.step, "epoch": d.epoch, "data": d.data} for d in out)

    for step in (1, 2, 3):
        for rank, took in {0: 0.1, 1: 0.1, 2: 0.5}.items():
            journal.append(report(rank, step, took, world=3))
            publish(first.observe(journal[-1], float(step)))
    journal.append(report(0, 4, 0.1, world=3))  # step 4: only rank 0 is in when the relay dies
    publish(first.observe(journal[-1], 4.0))
    said = [e["data"].get("event", "figures") for e in journal if e["rank"] == RELAY_RANK]
    assert said == ["figures", "figures", "figures", "straggler"]

    again = Cluster(CONFIG)
    again.restore(journal, 100.0)
    assert again.observe(report(2, 3, 0.5, world=3), 100.0) == []  # step 3 was settled before
    assert again.observe(report(1, 4, 0.1, world=3), 100.0) == []
    out = again.observe(report(2, 4, 0.5, world=3), 100.0)
    assert [(d.step, d.data["ranks"]) for d in out] == [(4, 3)]  # rank 0's report came from the journal
    assert kinds(feed(again, {0: 0.1, 1: 0.1, 2: 0.5}, 5, now=101.0, world=3)) == ["figures"]  # no 2nd straggler
    calm = [kinds(feed(again, {0: 0.1, 1: 0.1, 2: 0.1}, step, now=102.0, world=3)) for step in (6, 7, 8)]
    assert calm == [["figures"], ["figures"], ["figures", "straggler_cleared"]]  # the episode it read back ends
    cleared = Cluster(CONFIG)  # ... and one whose end the journal holds is not ended twice
    cleared.restore(journal + [{"run": "r", "rank": RELAY_RANK, "world_size": 3, "type": "lifecycle",
                                "stage": "cluster", "step": 8, "epoch": None,
                                "data": {"event": "straggler_cleared", "rank": 2, "why": "recovered"}}], 100.0)
    out = [d for step in (9, 10, 11) for d in feed(cleared, {0: 0.1, 1: 0.1, 2: 0.1}, step, now=101.0, world=3)]
    assert set(kinds(out)) == {"figures"}

    journal.append({"run": "r", "rank": RELAY_RANK, "world_size": 3, "type": "lifecycle", "stage": "cluster",
                    "step": 9, "epoch": None, "data": {"event": "rank_lost", "rank": 1, "silent_s": 60.0,
                                                       "last_step": 4}})
    ended = Cluster(CONFIG)  # a train_end in the journal: the run ended; its rank_lost said before
    ended.restore(journal + [train_end(0, "failed", world=3)], 150.0)
    assert ended.close("r", 150.0)[0].data == {"event": "rank_lost", "rank": 2, "why": "ended", "silent_s": 0.0,
                                               "last_step": 3, "peers_step": 4}  # rank 1 was said already
    lost = Cluster(CONFIG)
    lost.restore(journal, 200.0)
    feed(lost, {0: 0.1, 2: 0.1}, 10, now=250.0, world=3)
    assert lost.check(300.0) == []  # already said
    assert kinds(lost.observe(report(1, 11, 0.1, world=3), 300.0)) == ["rank_back"]
