"""Reclaim of borrowed quota within a cohort (core.preemption, Kueue reclaimWithinCohort) and the
per-gang back-off of the queue (core.backoff.Backoff)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from fixtures.core_gang import cluster, gang, plan_for, profile, run_cycle, start, state_of
from hypothesis import event, given, settings
from hypothesis import strategies as st

from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING, TIER_INTERACTIVE, TIER_PRODUCTION_TRAINING
from airflow_gpu.core.backoff import Backoff, NoPlanMemo
from airflow_gpu.core.reservation import ReservationHold
from airflow_gpu.core.gang import admit
from airflow_gpu.core.preemption import PreemptionPolicy, team_borrows, within_guarantee
from airflow_gpu.core.queue import Queue
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota, demand_of_placements
from airflow_gpu.core.snapshot import Snapshot

PROD, BE = TIER_PRODUCTION_TRAINING, TIER_BEST_EFFORT_TRAINING
NEVER = PreemptionPolicy(never_preempting_tiers=frozenset({BE}))  # best-effort never preempts by priority


def lent_out(borrower_priority=1000, borrower_tier=BE, borrowed=True):
    """Team a (8 GPUs guaranteed, may borrow 8) runs 16 on 2 x 8 GPUs: 8 of them are team b's idle quota."""
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 8}),
                    "b": TeamQuota.from_gpus("b", {"H100": 8})}, borrowed_priority=1000)
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("a-own", 1, 8, priority=1000, team="a"), profile(), at=0.0),
               start(snap, gang("a-borrow", 1, 8, priority=borrower_priority, team="a", tier=borrower_tier,
                                checkpointable=True), profile(), at=0.0, borrowed=borrowed)]
    return qb, snap, running


def test_owner_within_its_guarantee_reclaims_from_a_borrower_of_the_same_tier():
    qb, snap, running = lent_out()
    b_job = gang("b-job", 1, 8, priority=1000, team="b")  # same tier and priority as the borrower
    plan, why = plan_for(snap, b_job, running, profile(), 10.0, qb, policy=NEVER)
    assert plan is not None, why
    assert plan.victim_names == ("a-borrow",) and plan.reclaim and not plan.borrowed
    res = run_cycle(snap, [b_job], running, profile(), 10.0, qb, NEVER)
    assert [p.victim_names for p in res.preemptions] == [("a-borrow",)]
    assert "borrowing in the cohort" in res.waiting["b-job"]


def test_reclaim_ignores_the_borrowers_priority_but_not_a_non_preemptible_tier():
    qb, snap, running = lent_out(borrower_priority=100_000, borrower_tier=PROD)  # a higher tier borrows
    plan, why = plan_for(snap, gang("b-job", 1, 8, priority=1000, team="b"), running, profile(), 10.0, qb)
    # any priority is reclaimed; of the two, the checkpointable one (DESIGN.md: never a
    # non-checkpointable victim while a checkpointable one would do), before priority
    assert plan is not None and plan.victim_names == ("a-borrow",), why
    qb, snap, running = lent_out(borrower_tier=TIER_INTERACTIVE)
    plan, why = plan_for(snap, gang("b-job", 1, 8, priority=1000, team="b"), running, profile(), 10.0, qb)
    # never the interactive borrower: the reclaim takes team a's other gang (team a is over its guarantee)
    assert plan is not None and plan.victim_names == ("a-own",), why
    policy = PreemptionPolicy(non_preemptible_tiers=frozenset({TIER_INTERACTIVE, BE}))
    plan, why = plan_for(snap, gang("b-job", 1, 8, priority=1000, team="b"), running, profile(), 10.0, qb,
                                policy=policy)
    assert plan is None and "no preemptible gang" in why


def test_no_reclaim_beyond_the_guarantee_or_from_a_team_within_its_own():
    qb, snap, running = lent_out()
    # 12 GPUs is past b's guarantee of 8: only strictly lower priority could be preempted, and there is none
    plan, why = plan_for(snap, gang("b-big", 2, 6, priority=1000, team="b"), running, profile(), 10.0, qb)
    assert plan is None, plan
    # team a within its guarantee (the flag says borrowed, but a-own ended): not reclaimable at equal priority
    snap2 = Snapshot.from_nodes(cluster(2))
    only = [start(snap2, gang("a-borrow", 1, 8, priority=1000, team="a"), profile(), borrowed=True)]
    usage = QuotaUsage.from_running(only, {n.name: n.gpu_product for n in snap2.nodes}, qb)
    assert not team_borrows(only[0], qb, usage, {n.name: n.gpu_product for n in snap2.nodes})
    plan, why = plan_for(snap2, gang("b-job", 2, 8, priority=1000, team="b"), only, profile(), 10.0, qb, usage)
    assert plan is None
    # another cohort's borrower is not ours to reclaim
    other = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 8}, cohort="x"),
                       "c": TeamQuota.from_gpus("c", {"H100": 8}, cohort="x"),
                       "b": TeamQuota.from_gpus("b", {"H100": 8}, cohort="y")}, borrowed_priority=1000)
    plan, why = plan_for(snap, gang("b-job", 1, 8, priority=1000, team="b"), running, profile(), 10.0, other)
    assert plan is None


def test_within_guarantee_counts_current_usage():
    qb = QuotaBook({"b": TeamQuota.from_gpus("b", {"H100": 8})})
    usage = QuotaUsage({"b": {("H100", None): 4000}})
    assert within_guarantee(qb, usage, "b", {("H100", None): 4000})
    assert not within_guarantee(qb, usage, "b", {("H100", None): 4001})
    assert not within_guarantee(qb, usage, "nobody", {("H100", None): 1})


# --- property: reclaim never touches a non-borrower of equal/higher priority, never a protected tier ---

@st.composite
def cohort_scenes(draw):
    n = draw(st.integers(1, 3))
    snap = Snapshot.from_nodes(cluster(n, gpus=8, clique=2))
    teams = ["a", "b", "c"]
    qb = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": draw(st.integers(0, 12))}, {"H100": draw(st.integers(0, 16))},
                                           cohort=draw(st.sampled_from(["x", "x", "y"]))) for t in teams},
                   borrowed_priority=draw(st.sampled_from([None, 0, 2])))
    running = []
    for i in range(draw(st.integers(1, 10))):
        g = gang(f"r{i}", draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4, 8])), priority=draw(st.integers(0, 5)),
                 team=draw(st.sampled_from(teams)), tier=draw(st.sampled_from([BE, BE, PROD, TIER_INTERACTIVE])),
                 preemptible=draw(st.sampled_from([True, True, True, False])), checkpointable=draw(st.booleans()))
        if admit(snap, g, profile()).admitted:
            running.append(start(snap, g, profile(), at=float(draw(st.integers(0, 50))),
                                 checkpoint=float(draw(st.integers(50, 90))), borrowed=draw(st.booleans())))
    pending = gang("p", draw(st.integers(1, 2)), draw(st.sampled_from([2, 4, 8])), priority=draw(st.integers(0, 5)),
                   team=draw(st.sampled_from(teams)), tier=draw(st.sampled_from([BE, PROD])))
    policy = draw(st.sampled_from([PreemptionPolicy(), NEVER]))
    return qb, snap, running, pending, policy


@settings(max_examples=200, deadline=None)
@given(cohort_scenes())
def test_reclaim_only_takes_borrowers_of_other_teams_in_the_cohort(scene):
    qb, snap, running, pending, policy = scene
    node_product = {n.name: n.gpu_product for n in snap.nodes}
    usage = QuotaUsage.from_running(running, node_product, qb)
    plan, why = plan_for(snap, pending, running, profile(), 100.0, qb, usage, policy)
    if plan is None:
        assert why
        return
    own = demand_of_placements(plan.placements, node_product, qb)
    after = usage.copy()  # the preemptor's team once the victims (its own among them) are gone
    for v in plan.victims:
        after.remove(v.gang.team, demand_of_placements(v.placements, node_product, qb))
    for v in plan.victims:
        assert v in running  # whole gangs
        assert v.gang.preemptible and v.gang.tier not in policy.non_preemptible_tiers
        by_priority = qb.effective_priority(v) < pending.priority and pending.tier not in policy.never_preempting_tiers
        if not by_priority:
            # equal or higher priority (or a tier that never preempts): only a reclaim of lent quota
            event("victim taken by reclaim, not by priority")
            assert v.gang.team != pending.team
            assert qb.team(v.gang.team).cohort == qb.team(pending.team).cohort
            assert team_borrows(v, qb, usage, node_product), "a non-borrower of equal/higher priority was taken"
            assert within_guarantee(qb, after, pending.team, own), "reclaim by a gang beyond its guarantee"
        if v.gang.team != pending.team:
            assert v.borrowed or team_borrows(v, qb, usage, node_product)  # another team's guarantee is never taken


# --- back-off -----------------------------------------------------------------------------------

def test_backoff_doubles_per_failure_up_to_the_cap_and_resets():
    b = Backoff(base=1.0, cap=8.0)
    assert [b.failed("g", 0.0) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert not b.ready("g", 7.9) and b.ready("g", 8.0)
    assert b.ready("other", 0.0)
    b.reset()
    assert b.ready("g", 0.0) and b.failed("g", 0.0) == 1.0
    b.forget("g")
    assert b.failures == {} and b.not_before == {}
    with pytest.raises(ValueError, match="base"):
        Backoff(base=0.0)
    with pytest.raises(ValueError, match="cap"):
        Backoff(base=2.0, cap=1.0)


def test_gangs_in_backoff_are_skipped_but_the_head_keeps_its_reservation():
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("r", 1, 8, priority=9, expected_duration=100.0), profile(), at=0.0),
               start(snap, gang("r2", 1, 6, priority=9, expected_duration=1000.0), profile(), at=0.0)]
    head = gang("head", 1, 8, priority=5, created_at=0.0)  # waits for n0 at t=100
    small = gang("small", 1, 4, priority=1, created_at=1.0)  # does not fit anywhere outside the reservation
    b = Backoff(base=1.0, cap=30.0)
    pending = [head, small]
    res = run_cycle(snap, pending, running, profile(), 0.0, backoff=b)
    assert res.reservation.gang.name == "head" and set(res.waiting) == {"head", "small"}
    b.record(res, pending, 0.0)
    assert b.failures == {"head": 1, "small": 1}
    # 0.5 s later both are in back-off: the head is still tried (it comes first) and keeps its nodes;
    # the gang behind it is skipped, its last reason standing
    res = run_cycle(snap, pending, running, profile(), 0.5, backoff=b)
    assert res.reservation.gang.name == "head" and res.reservation.nodes == {"n0000"}
    assert res.deferred == ["small"] and "small" not in res.waiting
    b.record(res, pending, 0.5)
    assert b.failures == {"head": 2, "small": 1}  # a deferred gang is not charged again
    res = run_cycle(snap, pending, running, profile(), 1.0, backoff=b)
    assert "small" in res.waiting  # its 1 s back-off has passed
    # an admitted gang, or one no longer pending, is forgotten
    b.record(res, [head], 1.0)
    assert set(b.failures) == {"head"}
    res = run_cycle(Snapshot.from_nodes(cluster(2)), [head], [], profile(), 2.0, backoff=b)
    assert [d.gang.name for d in res.admitted] == ["head"]
    b.record(res, [head], 2.0)
    assert b.failures == {}


def test_the_queue_books_its_own_cycles_as_the_callers_did():
    # Queue.cycle = schedule_cycle + Backoff.record + ReservationHold.record + the no-plan memo's reset
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("r", 1, 8, priority=9), profile(), at=0.0),
               start(snap, gang("r2", 1, 6, priority=9), profile(), at=0.0)]  # unknown ends
    head = gang("head", 1, 8, priority=5, created_at=0.0)
    small = gang("small", 1, 2, priority=1, created_at=1.0)  # fits on n0001's 2 free GPUs
    memo = NoPlanMemo()
    q = Queue(profile(), backoff=Backoff(base=1.0, cap=30.0), hold=ReservationHold(60.0, 30.0), no_plan=memo)
    res = q.cycle(state_of(snap, running), [head, small], 0.0)
    assert [d.gang.name for d in res.admitted] == ["small"] and math.isinf(res.reservation.start)
    assert q.backoff.failures == {"head": 1}  # admitted: forgotten; left waiting: backs off
    assert q.hold.since == {"head": 0.0}  # a reservation of unknown start counts towards its bound
    assert not memo.failed(head)  # an admission changed the running set: the memo was reset
    res = q.cycle(state_of(snap, running), [head], 60.0)
    assert q.hold.paused_until == {"head": 90.0} and q.backoff.failures == {"head": 2}
    assert memo.failed(head)  # nothing admitted: the failed search is remembered
    q.room_appeared(snap, [0])
    assert not memo.failed(head)
    res = q.cycle(state_of(snap, running), [head], 61.0)
    assert res.reservation is None and "no reservation" in res.waiting["head"]


def test_backoff_never_changes_what_is_admitted_when_everything_is_ready():
    snap = Snapshot.from_nodes(cluster(2))
    gangs = [gang(f"g{i}", 1, 4, priority=i % 3, created_at=float(i)) for i in range(6)]
    plain = run_cycle(snap, gangs, [], profile(), 0.0)
    with_b = run_cycle(snap, gangs, [], profile(), 0.0, backoff=Backoff())
    assert [d.gang.name for d in plain.admitted] == [d.gang.name for d in with_b.admitted]
    assert plain.waiting == with_b.waiting and with_b.deferred == []


def test_replace_keeps_borrowed_flag_for_reclaim_ordering():
    # two borrowers of team a: the one admitted as borrowed goes first, whatever else differs
    qb, snap, running = lent_out()
    running = [replace(running[0], borrowed=False), running[1]]
    plan, _ = plan_for(snap, gang("b-job", 1, 8, priority=1000, team="b"), running, profile(), 10.0, qb)
    assert plan.victim_names == ("a-borrow",)
