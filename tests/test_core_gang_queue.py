"""The queue and the scheduling cycle (core.queue): order, head-of-line reservation, backfill, preemption."""

from __future__ import annotations

import math
from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, run_cycle, start, state_of
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from airflow_gpu.constants import TIER_INTERACTIVE
from airflow_gpu.core.gang import admit, place_gang
from airflow_gpu.core.model import Placement, RunningGang, TopologyLevel
from airflow_gpu.core.preemption import team_borrows
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota, demand_of_placements, within_limits
from airflow_gpu.core.reservation import estimate_start
from airflow_gpu.core.queue import queue_order
from airflow_gpu.core.snapshot import Snapshot


def test_queue_order_is_priority_then_creation_time():
    gangs = [gang("late-high", 1, 1, priority=5, created_at=9.0), gang("early-low", 1, 1, priority=1, created_at=1.0),
             gang("early-high", 1, 1, priority=5, created_at=2.0)]
    assert [g.name for g in queue_order(gangs)] == ["early-high", "late-high", "early-low"]


def two_busy_nodes():
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("r-short", 1, 8, priority=9, expected_duration=100.0), profile(), at=0.0),
               start(snap, gang("r-long", 1, 4, priority=9, expected_duration=1000.0), profile(), at=0.0)]
    return snap, running


def test_backfill_only_when_it_does_not_delay_the_head():
    snap, running = two_busy_nodes()  # n0 full until 100, n1 half full until 1000
    head = gang("head", 2, 8, priority=5, created_at=0.0)  # needs both nodes: earliest start 1000
    quick = gang("quick", 1, 2, priority=1, created_at=1.0, expected_duration=500.0)
    slow = gang("slow", 1, 2, priority=1, created_at=2.0, expected_duration=5000.0)
    unknown = gang("unknown", 1, 2, priority=1, created_at=3.0)
    res = run_cycle(snap, [unknown, slow, quick, head], running, profile(), now=0.0)
    assert [d.gang.name for d in res.admitted] == ["quick"]  # done by 500, before the head's start
    assert res.reservation.gang.name == "head" and res.reservation.start == 1000.0
    assert res.reservation.nodes == {"n0000", "n0001"}
    assert "2 node(s) reserved, earliest start in ~1000 s" in res.waiting["head"]
    assert res.waiting["slow"].startswith("would delay head")
    assert res.waiting["unknown"].startswith("would delay head")
    assert res.preemptions == []  # running gangs have higher priority: nothing to preempt


def test_smaller_gangs_backfill_outside_the_reserved_nodes():
    snap, running = two_busy_nodes()
    head = gang("head", 1, 8, priority=0, created_at=0.0)  # n0 frees at 100: reserve n0 only
    small = gang("small", 1, 4, priority=0, created_at=1.0)  # unknown duration, fits on n1
    res = run_cycle(snap, [head, small], running, profile(), now=0.0)
    assert res.reservation.nodes == {"n0000"} and res.reservation.start == 100.0
    assert [(d.gang.name, d.placements[0].node) for d in res.admitted] == [("small", "n0001")]


def test_head_with_higher_priority_gets_a_preemption_plan_and_its_nodes_are_held():
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("be-a", 1, 8, priority=0, checkpointable=True), profile(), checkpoint=90.0),
               start(snap, gang("be-b", 1, 8, priority=0), profile())]
    prod = gang("prod", 1, 8, priority=100, created_at=5.0)
    notebook = gang("nb", 1, 2, priority=200, tier=TIER_INTERACTIVE, created_at=9.0)
    res = run_cycle(snap, [prod], running, profile(), now=100.0)
    assert [p.victim_names for p in res.preemptions] == [("be-a",)]  # checkpointable, 10 s at risk
    assert res.reservation.by_preemption and "preempting 1 gang(s) of lower priority: be-a" in res.waiting["prod"]
    # the interactive notebook comes first in the queue and takes the preemption for itself
    res = run_cycle(snap, [prod, notebook], running, profile(), now=100.0)
    assert res.reservation.gang.name == "nb" and len(res.preemptions) == 1
    assert res.waiting["prod"]  # waits this cycle: one plan per cycle


def test_quota_blocked_gang_does_not_hold_capacity_for_others():
    snap = Snapshot.from_nodes(cluster(2))
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}), "b": TeamQuota.from_gpus("b", {"H100": 8})})
    running = [start(snap, gang("a1", 1, 8, team="a"), profile())]
    res = run_cycle(snap, [gang("a2", 1, 4, team="a", priority=0), gang("b1", 1, 8, team="b")], running,
                         profile(), now=0.0, quota=qb)
    assert [d.gang.name for d in res.admitted] == ["b1"] and res.reservation is None
    assert res.waiting["a2"].startswith("team quota: a uses 8 of 8 H100")
    # with a higher priority, a2 may take its own team's quota back from a1 (and only from a1)
    res = run_cycle(snap, [gang("a2", 1, 4, team="a", priority=9)], running, profile(), now=0.0, quota=qb)
    assert [p.victim_names for p in res.preemptions] == [("a1",)]


def test_a_nominations_victims_keep_their_quota_until_they_are_gone():
    """a reclaims its quota from borrower b by preempting r2; while r2 stops, b must not refill the
    quota r2 is giving back (b would hold 21 H100 against its ceiling of 13 + 7)."""
    snap = Snapshot.from_nodes(cluster(4, clique=2))
    running = [start(snap, gang(name, 1, gpus, team="b"), profile()) for name, gpus in
               [("r0", 2), ("r1", 2), ("r2", 8), ("r3", 8)]]
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}), "b": TeamQuota.from_gpus("b", {"H100": 13}, {"H100": 7})})
    pending = [gang("a-big", 1, 8, team="a"), gang("b-small", 1, 1, team="b", created_at=1.0)]
    res = run_cycle(snap, pending, running, profile(), now=10.0, quota=qb)
    (plan,) = res.preemptions
    assert plan.gang.name == "a-big" and plan.reclaim and len(plan.victims) == 1
    assert res.admitted == [] and res.waiting["b-small"].startswith("team quota: b uses 20")
    # the same team's own victim: charged the larger of the victim and the nomination, not both
    own = [start(snap, gang("low", 1, 4, team="a", priority=0), profile())]
    state = state_of(snap, running + own, qb)
    state.nominate("a", [Placement("hi-0", "n0003", ((0, 1000), (1, 1000), (2, 1000)))], own)
    assert state.usage.of("a", ("H100", None)) == 4000


# --- property: a cycle never over-commits, never exceeds quota, never gives reserved nodes away -------

@st.composite
def queues(draw):
    snap = Snapshot.from_nodes(cluster(draw(st.integers(1, 4)), gpus=8, clique=2))
    running = []
    for i in range(draw(st.integers(0, 5))):
        g = gang(f"r{i}", draw(st.integers(1, 2)), draw(st.sampled_from([2, 4, 8])), priority=draw(st.integers(0, 2)),
                 team=draw(st.sampled_from("ab")), expected_duration=draw(st.sampled_from([None, 50.0, 500.0])))
        d = admit(snap, g, profile())
        if d.admitted:
            for p in d.placements:
                snap.assume(p)
            running.append(RunningGang(g, d.placements, started_at=0.0))
    pending = [gang(f"p{i}", draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4, 8])),
                    priority=draw(st.integers(0, 4)), team=draw(st.sampled_from("ab")),
                    created_at=float(draw(st.integers(0, 9))),
                    expected_duration=draw(st.sampled_from([None, 20.0, 300.0])))
               for i in range(draw(st.integers(1, 6)))]
    quota = None
    if draw(st.booleans()):
        quota = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": draw(st.integers(8, 24))},
                                                  {"H100": draw(st.integers(0, 8))}) for t in "ab"})
    return snap, running, pending, quota


@settings(max_examples=80, deadline=None)
@given(queues())
def test_a_cycle_is_consistent(scene):
    snap, running, pending, quota = scene
    node_product = {n.name: n.gpu_product for n in snap.nodes}
    res = run_cycle(snap, pending, running, profile(), now=10.0, quota=quota)
    work = snap.copy()
    usage = QuotaUsage.from_running(running, node_product, quota) if quota else None
    ok_before = quota is None or within_limits(quota, usage) == []
    for d in res.admitted:
        assert sorted(p.pod for p in d.placements) == sorted(m.name for m in d.gang.members)
        for p in d.placements:
            work.assume(p)  # all admitted gangs together fit
        if usage is not None:
            usage.add(d.gang.team, demand_of_placements(d.placements, node_product, quota))
    if quota is not None and ok_before:
        assert within_limits(quota, usage) == []
    names = {g.name for g in pending}
    assert {d.gang.name for d in res.admitted} | set(res.waiting) == names
    assert not {d.gang.name for d in res.admitted} & set(res.waiting)
    assert len(res.preemptions) <= 1
    r = res.reservation
    if r is not None:
        order = [g.name for g in queue_order(pending)]
        later = order[order.index(r.gang.name) + 1:]
        for d in res.admitted:
            if d.gang.name in later and not r.lets_through(d.gang, 10.0):
                assert not {p.node for p in d.placements} & r.nodes
        assert r.start >= 10.0 or math.isinf(r.start)
    for plan in res.preemptions:
        for v in plan.victims:
            # equal or higher priority only as a quota reclaim: another team's gang whose team borrows
            # (usage includes the gangs this cycle admitted before it planned)
            assert v.gang.priority < plan.gang.priority or (
                plan.reclaim and v.gang.team != plan.gang.team and team_borrows(v, quota, usage, node_product))
            assert v.gang.preemptible


def test_seed_story_production_reclaims_its_quota_from_borrowed_best_effort_training():
    """Teams of 8 GPUs; research borrows nlp's idle quota for checkpointed best-effort training; nlp's
    production gang arrives, the borrower is preempted (checkpointable, the cheapest), nlp runs."""
    from airflow_gpu.constants import TIER_PRODUCTION_TRAINING as PROD

    snap = Snapshot.from_nodes(cluster(4, product="a100-80gb"))
    qb = QuotaBook({"nlp": TeamQuota.from_gpus("nlp", {"a100-80gb": 8}),
                    "vision": TeamQuota.from_gpus("vision", {"a100-80gb": 8}),
                    "research": TeamQuota.from_gpus("research", {"a100-80gb": 16}, {"a100-80gb": 16})},
                   borrowed_priority=1000)
    running = []
    now = 0.0
    arrivals = [gang("vision-ft", 1, 8, priority=100_000, team="vision", tier=PROD, created_at=0.0)] + [
        gang(f"sweep-{i}", 1, 8, priority=1000, team="research", checkpointable=True, created_at=1.0 + i)
        for i in range(3)]
    res = run_cycle(snap, arrivals, running, profile(), now, qb)
    for d in res.admitted:
        for p in d.placements:
            snap.assume(p)
        running.append(RunningGang(d.gang, d.placements, now, last_checkpoint_at=now + 50, borrowed=d.borrowed))
    assert [(d.gang.name, d.borrowed) for d in res.admitted] == [
        ("vision-ft", False), ("sweep-0", False), ("sweep-1", False), ("sweep-2", True)]

    now = 100.0
    prod = gang("nlp-ft", 1, 8, priority=100_000, team="nlp", tier=PROD, created_at=now)
    res = run_cycle(snap, [prod], running, profile(), now, qb)
    assert res.admitted == [] and "other teams borrowed it" in res.waiting["nlp-ft"]
    (plan,) = res.preemptions
    assert plan.victim_names == ("sweep-2",) and plan.reclaim and plan.lost_gpu_seconds == 8 * 50.0
    for v in plan.victims:  # the scheduler evicts; the victim's gang goes back to the queue
        for p in v.placements:
            snap.forget(p)
        running.remove(v)
    res = run_cycle(snap, [prod, plan.victims[0].gang], running, profile(), now + 30, qb)
    assert [(d.gang.name, d.borrowed) for d in res.admitted] == [("nlp-ft", False)]
    # the guarantees add up to the cluster, so the cohort pool is short only because the cluster is:
    # the victim waits for capacity (head of line, with a reservation), not on "cohort quota"
    assert res.waiting["sweep-2"].startswith("member sweep-2-0 does not fit")
    assert res.reservation is not None and res.reservation.gang.name == "sweep-2"


@settings(max_examples=60, deadline=None)
@given(queues())
def test_estimated_start_is_the_first_release_after_which_the_gang_fits(scene):
    snap, running, pending, _ = scene
    head = max(pending, key=lambda g: len(g.members) * max(m.gpus for m in g.members))
    assume(place_gang(snap, head, profile())[0] is None)  # estimate_start is asked only for blocked gangs
    est = estimate_start(snap, head, running, profile(), now=10.0)
    ends = sorted(running, key=lambda r: (math.inf if r.expected_end is None else r.expected_end,
                                          r.started_at, r.gang.name))
    brute = None
    for k in range(1, len(ends) + 1):
        s = snap.copy()
        for r in ends[:k]:
            for p in r.placements:
                s.forget(p)
        if place_gang(s, head, profile())[0] is not None:
            brute = ends[k - 1]
            break
    if brute is None:
        assert est is None
    else:
        end = brute.expected_end
        assert est is not None and est.start == (math.inf if end is None else max(10.0, end))
        trial = snap.copy()
        for r in running:
            for p in r.placements:
                trial.forget(p)
        for p in est.placements:  # the reserved placement is a real one once those gangs are gone
            trial.assume(p)


def test_asks_no_smaller_than_a_refused_one_wait_without_being_placed_again():
    snap, running = two_busy_nodes()  # 4 GPUs free on n1 only
    head = gang("head", 2, 8, priority=5, created_at=0.0)  # reserves both nodes
    six = gang("six", 1, 6, priority=1, created_at=1.0)
    seven = gang("seven", 1, 7, priority=1, created_at=2.0)  # no smaller than six: covered
    other_team = gang("seven-u", 1, 7, priority=1, created_at=2.5, team="u")  # no quota book: teams alike
    two = gang("two", 1, 2, priority=1, created_at=3.0)  # smaller: tried, would delay the head
    two_again = gang("two-again", 1, 2, priority=1, created_at=4.0)  # the same ask: the same reason
    res = run_cycle(snap, [head, six, seven, other_team, two, two_again], running, profile(), now=0.0)
    assert res.admitted == [] and res.reservation.gang.name == "head"
    assert res.waiting["seven"].startswith("does not fit, as six (no larger ask) this cycle: member six-0")
    assert res.waiting["seven-u"].startswith("does not fit, as six")
    assert res.waiting["two"].startswith("would delay head")
    assert res.waiting["two-again"] == res.waiting["two"]
    # without the reservation in the way the small ask is admitted: it is never skipped for a bigger refusal
    res = run_cycle(snap, [six, seven, two], running, profile(), now=0.0)
    assert [d.gang.name for d in res.admitted] == ["two"]
    # with quotas the team is part of the ask (quota decides where a team may be placed)
    book = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": 64}) for t in ("t", "u")})
    res = run_cycle(snap, [head, six, seven, other_team], running, profile(), now=0.0, quota=book)
    assert res.waiting["seven"].startswith("does not fit, as six")
    assert not res.waiting["seven-u"].startswith("does not fit, as")


def test_a_cohort_pool_as_large_as_the_cluster_is_a_capacity_wait_so_the_big_gang_reserves():
    """The teams' guarantees add up to the cluster: the cohort pool is short only when the cluster
    is. A gang refused by the pool becomes head of line and holds a reservation, instead of waiting
    on "quota" while every smaller gang behind it keeps taking the GPUs it needs."""
    snap = Snapshot.from_nodes(cluster(2))
    qb = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": 8}, {"H100": 16}) for t in "ab"})
    running = [start(snap, gang("b1", 1, 8, team="b", expected_duration=100.0), profile()),
               start(snap, gang("a1", 1, 4, team="a", expected_duration=1000.0), profile())]
    big = gang("big", 2, 8, team="a", created_at=0.0)  # 16 GPUs: pool 16, drawn 12
    small = gang("small", 1, 4, team="b", created_at=1.0)  # fits in the 4 free GPUs, unknown duration
    res = run_cycle(snap, [big, small], running, profile(), now=0.0, quota=qb)
    assert res.admitted == []
    assert res.reservation is not None and res.reservation.gang.name == "big"
    assert res.reservation.start == 1000.0 and res.reservation.nodes == {"n0000", "n0001"}
    assert "needs 16 GPUs" in res.waiting["big"] and "earliest start in ~1000 s" in res.waiting["big"]
    assert res.waiting["small"].startswith("would delay big")
    # a pool smaller than the cluster is a quota wait, as before: no reservation
    tight = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": 7}, {"H100": 16}) for t in "ab"})
    res = run_cycle(snap, [big], running, profile(), now=0.0, quota=tight)
    assert res.reservation is None and res.waiting["big"].startswith("cohort quota: a would borrow")


# --- reservations: preemptible checkpointed backfill, no-plan memo ------------------------------------

def test_checkpointed_lower_priority_work_backfills_a_reservation_and_is_preempted_at_its_start():
    """Without duration estimates, only work the head can take back may use its reserved nodes:
    preemptible, checkpointable, lower priority. When the head can start, it preempts that work."""
    from airflow_gpu.constants import TIER_PRODUCTION_TRAINING as PROD

    snap = Snapshot.from_nodes(cluster(2))
    blockers = [start(snap, gang("prod-a", 1, 8, priority=100, tier=PROD, preemptible=False), profile()),
                start(snap, gang("prod-b", 1, 4, priority=100, tier=PROD, preemptible=False), profile())]
    head = gang("head", 2, 8, priority=100, tier=PROD, preemptible=False, created_at=0.0)
    sweep = gang("sweep", 1, 4, priority=1, checkpointable=True, created_at=1.0)
    plain = gang("plain", 1, 4, priority=1, created_at=2.0)  # not checkpointable: would lose its work
    prod = gang("prod-c", 1, 4, priority=100, tier=PROD, preemptible=False, created_at=3.0)
    for other in (plain, prod):
        res = run_cycle(snap, [head, other], blockers, profile(), now=0.0)
        assert res.admitted == [] and res.reservation.gang.name == "head"
        assert res.waiting[other.name].startswith("would delay head")
    res = run_cycle(snap, [head, sweep], blockers, profile(), now=0.0)
    assert res.reservation.gang.name == "head" and math.isinf(res.reservation.start)
    (d,) = res.admitted
    assert d.gang.name == "sweep" and d.placements[0].node in res.reservation.nodes
    backfill = RunningGang(sweep, d.placements, started_at=0.0, last_checkpoint_at=50.0)
    for p in d.placements:
        snap.assume(p)
    for b in blockers:  # the blockers end: the head preempts the backfill and starts
        for p in b.placements:
            snap.forget(p)
    res = run_cycle(snap, [head], [backfill], profile(), now=100.0)
    assert [p.victim_names for p in res.preemptions] == [("sweep",)]


def test_another_teams_backfill_on_a_reservation_must_be_a_reclaimable_borrower():
    """Across teams only a borrower can be reclaimed: a backfill within its own team's guarantee is
    kept off the reserved nodes (it would be no victim of the head)."""
    from airflow_gpu.constants import TIER_PRODUCTION_TRAINING as PROD

    snap = Snapshot.from_nodes(cluster(2))
    blockers = [start(snap, gang("prod-a", 1, 8, team="a", priority=100, tier=PROD, preemptible=False), profile()),
                start(snap, gang("prod-b", 1, 4, team="a", priority=100, tier=PROD, preemptible=False), profile())]
    head = gang("head", 2, 8, team="a", priority=100, tier=PROD, preemptible=False, created_at=0.0)  # both nodes
    sweep = gang("sweep", 1, 4, team="b", priority=1, checkpointable=True, created_at=1.0)
    # the head is within a's nominal 16 (a head beyond its nominal quota never preempts: nothing lent)
    lends = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 16}, {"H100": 16}),
                       "b": TeamQuota.from_gpus("b", {"H100": 2}, {"H100": 16})})  # b borrows beyond 2
    res = run_cycle(snap, [head, sweep], blockers, profile(), now=0.0, quota=lends)
    assert res.reservation.gang.name == "head" and [d.gang.name for d in res.admitted] == ["sweep"]
    assert res.admitted[0].borrowed
    guaranteed = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 16}, {"H100": 16}),
                            "b": TeamQuota.from_gpus("b", {"H100": 4}, {"H100": 16})})  # b within its 4
    res = run_cycle(snap, [head, sweep], blockers, profile(), now=0.0, quota=guaranteed)
    assert res.reservation.gang.name == "head" and res.admitted == []
    assert res.waiting["sweep"].startswith("would delay head")
    beyond = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 14}, {"H100": 16}),
                        "b": TeamQuota.from_gpus("b", {"H100": 2}, {"H100": 16})})  # the head asks 16 > 14
    res = run_cycle(snap, [head, sweep], blockers, profile(), now=0.0, quota=beyond)
    assert res.reservation.gang.name == "head" and res.admitted == []
    assert res.waiting["sweep"].startswith("would delay head")


def test_reserved_nodes_are_lent_only_to_work_the_head_can_take_back_when_it_starts():
    """The rule of attempts(): a head beyond its team's nominal quota never preempts, and a gang
    younger than its tier's minimum runtime is no victim, so neither lends the reserved nodes to a
    checkpointed gang of its own team (hypothesis found the first: the backfill could not be taken back)."""
    from airflow_gpu.core.preemption import PreemptionPolicy

    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang(f"r{i}", 1, 2, team="a"), profile()) for i in range(5)]  # n0 full, 2 on n1
    small = gang("small", 1, 1, team="b", checkpointable=True, created_at=0.0)
    big = gang("big", 2, 8, team="b", priority=1, created_at=0.0)  # both nodes: reserves them
    quota = lambda nominal: QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 0}),  # noqa: E731
                                       "b": TeamQuota.from_gpus("b", {"H100": nominal}, {"H100": 16 - nominal})})
    res = run_cycle(snap, [small, big], running, profile(), now=10.0, quota=quota(16))
    assert res.reservation.gang.name == "big" and [d.gang.name for d in res.admitted] == ["small"]
    res = run_cycle(snap, [small, big], running, profile(), now=10.0, quota=quota(8))  # big asks 16 > 8
    assert res.reservation.gang.name == "big" and res.admitted == []
    assert res.waiting["small"].startswith("would delay big")
    # finite start: the blockers end at 100 s; small would still be protected then (min runtime 600 s)
    ending = [replace(r, gang=replace(r.gang, expected_duration=100.0)) for r in running]
    res = run_cycle(snap, [small, big], ending, profile(), now=10.0, quota=quota(16))
    assert res.reservation.start == 100.0 and [d.gang.name for d in res.admitted] == ["small"]
    young = PreemptionPolicy(min_runtime=((small.tier, 600.0),))
    res = run_cycle(snap, [small, big], ending, profile(), now=10.0, quota=quota(16), policy=young)
    assert res.reservation.start == 100.0 and res.admitted == []


def test_a_gang_behind_a_reservation_preempts_off_the_reserved_nodes_with_the_tier_rule():
    """The head (2 x 8 GPUs) waits on production of unknown duration and no preemption serves it: it
    reserves n0, n1. Production behind it that a sweep's preemption would serve waited for as long
    as the head did; with the tier rule preempt_behind_head its team's first such gang gets the plan
    (Kueue: every ClusterQueue head preempts each cycle), off the reserved nodes, and the head keeps
    its reservation. One plan per cycle: a second team's gang waits for the next cycle."""
    from airflow_gpu.constants import TIER_PRODUCTION_TRAINING as PROD
    from airflow_gpu.core.preemption import PreemptionPolicy
    from airflow_gpu.core.backoff import NoPlanMemo
    from airflow_gpu.core.queue import schedule_cycle

    snap = Snapshot.from_nodes(cluster(3))
    running = [start(snap, gang("prod-a", 1, 8, team="a", priority=100, tier=PROD, preemptible=False), profile(), at=0.0),
               start(snap, gang("prod-b", 1, 4, team="a", priority=100, tier=PROD, preemptible=False), profile(), at=0.0),
               # on n1: the cheaper victim for an 8-GPU ask, but n1 is reserved for the head
               start(snap, gang("sweep-n1", 1, 4, team="a", priority=1, checkpointable=True), profile(), at=5.0),
               start(snap, gang("sweep", 1, 8, team="a", priority=1, checkpointable=True), profile(), at=6.0)]
    assert [r.placements[0].node for r in running] == ["n0000", "n0001", "n0001", "n0002"]
    head = gang("head", 2, 8, team="a", priority=100, tier=PROD, preemptible=False, created_at=0.0)
    prod_c = gang("prod-c", 1, 4, team="a", priority=100, tier=PROD, preemptible=False, created_at=1.0)
    prod_d = gang("prod-d", 1, 8, team="b", priority=100, tier=PROD, preemptible=False, created_at=2.0)
    pending = [head, prod_c, prod_d]
    res = run_cycle(snap, pending, running, profile(), now=10.0)
    assert res.reservation.gang.name == "head" and res.reservation.nodes == {"n0000", "n0001"}
    assert res.preemptions == [] and res.admitted == []  # without the rule the sweep keeps n2
    rule = PreemptionPolicy(preempt_behind_head_tiers=frozenset({PROD}))
    memo = NoPlanMemo()
    res = schedule_cycle(state_of(snap, running), pending, profile(), 10.0, rule, no_plan=memo)
    assert res.reservation.gang.name == "head" and res.reservation.nodes == {"n0000", "n0001"}
    (plan,) = res.preemptions
    assert plan.gang.name == "prod-c" and plan.victim_names == ("sweep",)
    assert {p.node for p in plan.placements} == {"n0002"}
    assert "preempting 1 gang(s) of lower priority: sweep" in res.waiting["prod-c"]
    assert "preempting" not in res.waiting["prod-d"]  # the plan's node is taken; one plan per cycle
    # the head itself is never served by it: no plan of the head's own, and the reserved nodes untouched
    assert "preempting" not in res.waiting["head"]


def test_a_failed_preemption_plan_is_not_searched_again_for_the_same_ask(monkeypatch):
    from airflow_gpu.core.backoff import NoPlanMemo
    import airflow_gpu.core.queue as queue

    calls = []
    real = queue.plan_preemption
    monkeypatch.setattr(queue, "plan_preemption", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
    snap = Snapshot.from_nodes(cluster(1))
    running = [start(snap, gang("r", 1, 8, priority=9), profile())]  # higher priority: no victim
    # 16 GPUs on one node of 8: no plan and no reservation, so every gang is tried before one is taken
    big = dict(level=TopologyLevel.NODE, hard=True)
    same = [gang(f"p{i}", 2, 8, priority=5, created_at=float(i), **big) for i in range(5)]
    other = gang("q", 2, 8, priority=6, created_at=9.0, **big)  # another priority: its own search
    memo = NoPlanMemo()
    res = queue.schedule_cycle(state_of(snap, running), same + [other], profile(), 0.0, no_plan=memo)
    assert calls == ["q", "p0"] and res.preemptions == []
    assert set(res.waiting) == {g.name for g in same} | {"q"}
    queue.schedule_cycle(state_of(snap, running), same, profile(), 1.0, no_plan=memo)
    assert calls == ["q", "p0"]  # nothing changed: the memo holds across cycles
    memo.reset()  # the caller's part: the running set or capacity changed
    queue.schedule_cycle(state_of(snap, running), same, profile(), 2.0, no_plan=memo)
    assert calls == ["q", "p0", "p0"]


# about 2 in 3 scenes hold no reservation and are filtered out: Hypothesis' early health check sometimes
# trips on that ratio (seen on some seeds before and after issue 30); the 80 examples still run
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(queues(), st.lists(st.booleans(), min_size=6, max_size=6))
def test_work_on_reserved_nodes_ends_before_the_head_starts_or_is_the_heads_to_preempt(scene, ckpt):
    """Production is never held back by work it cannot take back: every gang admitted behind the
    head onto its reserved nodes either ends before the head's start (estimate) or is a preemption
    candidate of the head once admitted (preemptible, lower priority, same team or a borrower)."""
    from dataclasses import replace as _replace

    from airflow_gpu.core.preemption import candidates

    snap, running, pending, quota = scene
    pending = [_replace(g, checkpointable=c) for g, c in zip(pending, ckpt)]
    res = run_cycle(snap, pending, running, profile(), now=10.0, quota=quota)
    r = res.reservation
    assume(r is not None and not r.by_preemption)
    after = snap.copy()
    admitted = []
    for d in res.admitted:
        for p in d.placements:
            after.assume(p)
        admitted.append(RunningGang(d.gang, d.placements, 10.0, borrowed=d.borrowed))
    state = state_of(after, running + admitted, quota)
    heads = {c.gang.name for c in candidates(state, r.gang, 10.0)}
    order = [g.name for g in queue_order(pending)]
    later = set(order[order.index(r.gang.name) + 1:])
    for d in res.admitted:
        if d.gang.name in later and {p.node for p in d.placements} & r.nodes and not r.lets_through(d.gang, 10.0):
            assert d.gang.checkpointable and d.gang.name in heads, (d.gang.name, r.gang.name)


def test_a_reservation_of_unknown_start_holds_its_nodes_for_a_bounded_time_then_pauses():
    from airflow_gpu.core.reservation import ReservationHold

    snap, running = two_busy_nodes()
    running = [RunningGang(replace_duration(r.gang), r.placements, r.started_at) for r in running]  # unknown ends
    head = gang("head", 2, 8, priority=5, created_at=0.0)
    small = gang("small", 1, 2, priority=5, created_at=1.0)  # same priority: cannot be taken back
    hold = ReservationHold(max_hold=3600.0, pause=1800.0)

    def cycle(now):
        res = run_cycle(snap, [head, small], running, profile(), now=now)
        hold.record(res, now)
        return res

    def cycle_with_hold(now):
        from airflow_gpu.core.queue import schedule_cycle

        res = schedule_cycle(state_of(snap, running), [head, small], profile(), now, hold=hold)
        hold.record(res, now)
        return res

    for now in (0.0, 1000.0, 3600.0):  # held (3,600 s in a row at the last of these)
        res = cycle_with_hold(now)
        assert res.reservation.gang.name == "head" and math.isinf(res.reservation.start)
        assert res.admitted == [] and res.waiting["small"].startswith("would delay head")
    res = cycle_with_hold(4000.0)  # paused: the small gang starts on the head's nodes
    assert res.reservation is None and [d.gang.name for d in res.admitted] == ["small"]
    assert "no reservation: it held one 3600 s without a known start; it may again in ~1400 s" in res.waiting["head"]
    res = cycle_with_hold(5400.0)  # the pause is over: it holds again
    assert res.reservation.gang.name == "head" and res.admitted == []
    assert cycle(5400.0).reservation is not None  # no hold passed: unbounded, as before
    with pytest.raises(ValueError, match="max_hold"):
        ReservationHold(max_hold=0)


def replace_duration(g):
    from dataclasses import replace as _replace

    return _replace(g, expected_duration=None)


def test_a_cycle_with_an_admission_limit_stops_there_and_the_first_admissions_are_the_unlimited_ones():
    """`limit` (the scheduler's room to bind): the queue is walked in order until that many are
    admitted; the gangs after are not tried (no wait reason, no reservation: result.cut), and the
    admitted ones are exactly the first of an unlimited cycle's."""
    from airflow_gpu.core.queue import schedule_cycle

    snap = Snapshot.from_nodes(cluster(4))
    pending = [gang(f"g{i}", 1, 8, created_at=float(i)) for i in range(6)]  # 4 fit, 2 wait
    full = schedule_cycle(state_of(snap, []), pending, profile(), 0.0)
    assert len(full.admitted) == 4 and set(full.waiting) == {"g4", "g5"} and not full.cut
    cut = schedule_cycle(state_of(snap, []), pending, profile(), 0.0, limit=2)
    assert [d.gang.name for d in cut.admitted] == ["g0", "g1"] and cut.cut
    assert [d.placements for d in cut.admitted] == [d.placements for d in full.admitted[:2]]
    assert cut.waiting == {} and cut.reservation is None and cut.preemptions == []
    none = schedule_cycle(state_of(snap, []), pending, profile(), 0.0, limit=0)
    assert none.admitted == [] and none.waiting == {} and none.cut
    assert not schedule_cycle(state_of(snap, []), pending, profile(), 0.0, limit=6).cut  # never reached
