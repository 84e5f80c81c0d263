"""Scheduling semantics in the shape of Kueue's preemption / scheduler unit tests (ClusterQueue =
team, cohort = cohort, flavor = GPU product): the cluster queues with their quotas, the running gangs
with priorities, the pending gang, and the expected victims or admission (issue 9, items 1-4 and 7)."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, start
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.constants import TIER_PRODUCTION_TRAINING
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.gang import admit
from airflow_gpu.core.model import Gang, Node, RunningGang
from airflow_gpu.core.preemption import plan_preemption
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import QuotaBook, TeamQuota, within_limits
from airflow_gpu.core.snapshot import Snapshot

PROD = TIER_PRODUCTION_TRAINING


def book(**teams) -> QuotaBook:
    """team=(quota H100, borrowing limit H100[, borrow_within_cohort]) in one cohort."""
    out = {}
    for name, spec in teams.items():
        n, b, *bwc = spec
        out[name] = TeamQuota.from_gpus(name, {"H100": n}, {"H100": b} if b else None,
                                        borrow_within_cohort=bwc[0] if bwc else None)
    return QuotaBook(out)


def running_on(snap, *specs):
    """(name, team, gpus, priority[, started_at]) -> RunningGang each, held in snap."""
    out = []
    for name, team, gpus, prio, *at in specs:
        out.append(start(snap, gang(name, 1, gpus, priority=prio, team=team), profile(), at=at[0] if at else 0.0))
    return out


# --- 1. held plans and nominations count against quota ------------------------------------------

def test_a_held_plan_counts_against_its_teams_quota():
    # ClusterQueue a: nominal 8, no borrowing. A plan of 8 is held (binding in progress) on node 0.
    qb = book(a=(8, 0), b=(8, 0))
    snap = Snapshot.from_nodes(cluster(3))
    plan_gang = gang("a-plan", 1, 8, team="a")
    (held,) = start(snap, plan_gang, profile()).placements,
    second = gang("a-second", 1, 8, team="a", priority=5)
    state = CycleState.build(snap, [], qb, held=[("a", held)])
    res = schedule_cycle(state, [second], profile(), 0.0)
    assert res.admitted == [] and "team quota: a uses 8 of 8" in res.waiting["a-second"]
    # without the held plan it would be admitted: the test can fail
    assert schedule_cycle(CycleState.build(snap, [], qb), [second], profile(), 0.0).admitted


def test_a_held_plan_makes_the_next_gang_borrow_not_guaranteed():
    qb = book(a=(8, 8), b=(8, 0))
    snap = Snapshot.from_nodes(cluster(3))
    held = start(snap, gang("a-plan", 1, 8, team="a"), profile()).placements
    res = schedule_cycle(CycleState.build(snap, [], qb, held=[("a", held)]), [gang("a-second", 1, 8, team="a")],
                         profile(), 0.0)
    assert [(d.gang.name, d.borrowed) for d in res.admitted] == [("a-second", True)]


def test_terminating_gangs_count_until_their_gpus_are_free():
    qb = book(a=(8, 0))
    snap = Snapshot.from_nodes(cluster(2))
    (leaving,) = running_on(snap, ("a-leaving", "a", 8, 0))
    res = schedule_cycle(CycleState.build(snap, [], qb, terminating=[leaving]), [gang("a-next", 1, 8, team="a")],
                         profile(), 0.0)
    assert res.admitted == [] and "team quota" in res.waiting["a-next"]


# --- 2. a cohort-quota refusal gets a plan ----------------------------------------------------------

def test_cohort_quota_refusal_preempts_own_lower_priority_gang():
    # Kueue "preempt own lower priority while borrowing": a (8, borrow 8) runs a-low (8); c (8, borrow
    # 8) runs 16, borrowing b's idle 8. a-high would borrow 8 but the cohort pool is used up.
    qb = book(a=(8, 8), b=(8, 0), c=(8, 8))
    snap = Snapshot.from_nodes(cluster(3))
    running = running_on(snap, ("a-low", "a", 8, 0), ("c-1", "c", 8, 10), ("c-2", "c", 8, 10))
    high = gang("a-high", 1, 8, team="a", priority=100)
    res = schedule_cycle(CycleState.build(snap, running, qb), [high], profile(), 0.0)
    assert [p.victim_names for p in res.preemptions] == [("a-low",)]
    assert not res.preemptions[0].borrowed  # a is back within its nominal quota


def test_no_borrow_within_cohort_by_default_but_opt_in_with_a_threshold():
    # a (0 + borrow 8) wants to borrow; c borrows b's 8 with c-low (priority 10) and c-vip (60).
    base = dict(b=(8, 0), c=(8, 8))
    snap = Snapshot.from_nodes(cluster(2))
    running = running_on(snap, ("c-vip", "c", 8, 60), ("c-low", "c", 8, 10, 5.0))
    high = gang("a-high", 1, 8, team="a", priority=100)
    plan, why = plan_preemption(CycleState.build(snap, running, book(a=(0, 8), **base)), high, profile(), 0.0)
    assert plan is None, "Kueue's default: a borrowing preemptor leaves other teams' borrowers alone"
    plan, why = plan_preemption(CycleState.build(snap, running, book(a=(0, 8, 50), **base)), high, profile(), 0.0)
    assert plan is not None and plan.victim_names == ("c-low",) and plan.borrowed, why
    plan, why = plan_preemption(CycleState.build(snap, running, book(a=(0, 8, 5), **base)), high, profile(), 0.0)
    assert plan is None, "both borrowers are above the threshold"


def test_a_tier_with_borrow_within_cohort_takes_lower_priority_borrowers_only():
    # the tier rule (config tier field borrow_within_cohort): a's production-training gang, borrowing,
    # takes c's borrower of lower priority, never an equal-priority borrower nor a gang within c's guarantee
    from airflow_gpu.core.preemption import PreemptionPolicy

    base = dict(b=(8, 0), c=(8, 8))
    snap = Snapshot.from_nodes(cluster(2))
    running = running_on(snap, ("c-vip", "c", 8, 100), ("c-low", "c", 8, 10, 5.0))
    high = replace(gang("a-high", 1, 8, team="a", priority=100), tier=PROD)
    rule = PreemptionPolicy(borrow_within_cohort_tiers=frozenset({PROD}))
    state = CycleState.build(snap, running, book(a=(0, 8), **base))
    assert plan_preemption(state, high, profile(), 0.0)[0] is None, "off unless the tier sets it"
    plan, why = plan_preemption(state, high, profile(), 0.0, rule)
    assert plan is not None and plan.victim_names == ("c-low",) and plan.borrowed, why
    # c-low gone: c is within its guarantee again, and c-vip is of equal priority: nothing to take
    snap2 = Snapshot.from_nodes(cluster(2))
    only = running_on(snap2, ("c-vip", "c", 8, 100), ("c-low2", "c", 8, 10, 5.0))
    state2 = CycleState.build(snap2, only, book(a=(0, 8), b=(0, 0), c=(16, 0)))
    plan, why = plan_preemption(state2, high, profile(), 0.0, rule)
    assert plan is None, "a team within its guarantee is never a borrowWithinCohort victim"
    # a team's own threshold wins over the tier's
    plan, why = plan_preemption(CycleState.build(snap, running, book(a=(0, 8, 5), **base)), high, profile(), 0.0, rule)
    assert plan is None, "the team's threshold (5) is below both borrowers"


def test_a_second_accepted_product_where_reclaim_works_is_considered():
    # b: no H100 quota, 8 A100 (lent to a, whose a-borrow runs on them). b-job accepts H100 or A100.
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"A100": 0}, {"A100": 8}),
                    "b": TeamQuota.from_gpus("b", {"A100": 8})})
    nodes = cluster(1, product="H100") + cluster(1, product="A100", prefix="m")
    snap = Snapshot.from_nodes(nodes)
    running = [start(snap, gang("a-borrow", 1, 8, team="a", priority=100, products=("A100",)), profile())]
    job = gang("b-job", 1, 8, team="b", priority=0, products=("H100", "A100"))
    res = schedule_cycle(CycleState.build(snap, running, qb), [job], profile(), 0.0)
    (plan,) = res.preemptions
    assert plan.victim_names == ("a-borrow",) and plan.reclaim
    assert {p.node for p in plan.placements} == {"m0000"}


# --- 3. victim order: lowest priority first, then most recently admitted ---------------------------

def test_reclaim_takes_the_borrowers_lowest_priority_first_whatever_was_flagged_borrowed():
    # a (8, borrow 16) runs a-vip (priority 100, admitted last, flagged borrowed) and two others.
    qb = book(a=(8, 16), b=(16, 0))
    snap = Snapshot.from_nodes(cluster(3))
    running = running_on(snap, ("a-mid", "a", 8, 50, 1.0), ("a-low", "a", 8, 0, 2.0))
    running.append(start(snap, gang("a-vip", 1, 8, team="a", priority=100), profile(), at=3.0, borrowed=True))
    job = gang("b-job", 1, 8, team="b", priority=0)
    plan, why = plan_preemption(CycleState.build(snap, running, qb), job, profile(), 10.0)
    assert plan is not None and plan.victim_names == ("a-low",), why


def test_a_checkpointable_victim_before_a_lower_priority_non_checkpointable_one():
    # the house rule (docs/DESIGN.md) ranks before Kueue's priority order
    qb = book(a=(8, 16), b=(16, 0))
    snap = Snapshot.from_nodes(cluster(3))
    running = running_on(snap, ("a-low", "a", 8, 0), ("a-own", "a", 8, 90))
    running.append(start(snap, gang("a-ckpt", 1, 8, team="a", priority=50, checkpointable=True), profile()))
    plan, why = plan_preemption(CycleState.build(snap, running, qb), gang("b-job", 1, 8, team="b"), profile(), 10.0)
    assert plan is not None and plan.victim_names == ("a-ckpt",), why


def test_equal_priority_the_most_recently_admitted_goes_first():
    qb = book(a=(8, 16), b=(16, 0))
    snap = Snapshot.from_nodes(cluster(3))
    running = running_on(snap, ("a-1", "a", 8, 0, 1.0), ("a-2", "a", 8, 0, 3.0), ("a-3", "a", 8, 0, 2.0))
    plan, why = plan_preemption(CycleState.build(snap, running, qb), gang("b-job", 1, 8, team="b"), profile(), 10.0)
    assert plan is not None and plan.victim_names == ("a-2",), why


def test_reclaim_stops_once_the_borrower_is_back_within_its_guarantee():
    # a borrows 8 of b's 16; b needs 16: one of a's gangs goes, the other is a's guarantee.
    qb = book(a=(8, 8), b=(16, 0))
    snap = Snapshot.from_nodes(cluster(3))
    running = running_on(snap, ("a-1", "a", 8, 0), ("a-2", "a", 8, 0))
    plan, why = plan_preemption(CycleState.build(snap, running, qb), gang("b-job", 2, 8, team="b"), profile(), 1.0)
    assert plan is not None and len(plan.victims) == 1, why


# --- 7. two independent heads of line, one plan per cycle --------------------------------------------

def test_two_teams_heads_are_both_served_within_two_cycles():
    qb = book(a=(8, 0), b=(8, 0))
    snap = Snapshot.from_nodes(cluster(2))
    running = running_on(snap, ("a-low", "a", 8, 0), ("b-low", "b", 8, 0))
    heads = [gang("a-high", 1, 8, team="a", priority=100, tier=PROD),
             gang("b-high", 1, 8, team="b", priority=100, tier=PROD, created_at=1.0)]
    res1 = schedule_cycle(CycleState.build(snap, running, qb), heads, profile(), 0.0)
    (p1,) = res1.preemptions
    # cycle 2: the first plan is held as a nomination, its gang no longer pending; its victims still
    # hold their GPUs in the snapshot, their quota is the nomination's
    victims = set(p1.victim_names)
    state = CycleState.build(snap, [r for r in running if r.gang.name not in victims], qb,
                             held=[(p1.gang.team, p1.placements)])
    res2 = schedule_cycle(state, [h for h in heads if h.name != p1.gang.name], profile(), 1.0)
    (p2,) = res2.preemptions
    assert {p1.gang.name, p2.gang.name} == {"a-high", "b-high"}
    assert set(p1.victim_names) | set(p2.victim_names) == {"a-low", "b-low"}


# --- property: quota + borrowing holds counting running, held and nominated gangs ----------------------

@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_no_team_exceeds_quota_plus_borrowing_with_held_and_nominated_gangs(data):
    teams = {t: (data.draw(st.sampled_from([0, 8, 16])), data.draw(st.sampled_from([0, 8])))
             for t in ("a", "b", "c")}
    qb = book(**teams)
    snap = Snapshot.from_nodes(cluster(4))
    running: list[RunningGang] = []
    held = []
    for i in range(data.draw(st.integers(0, 4))):
        team = data.draw(st.sampled_from("abc"))
        g = gang(f"r{i}", 1, data.draw(st.sampled_from([4, 8])), team=team, priority=data.draw(st.integers(0, 3)),
                 checkpointable=data.draw(st.booleans()))
        state = CycleState.build(snap, running, qb, held=held)
        if not state.check(team, {("H100", None): g.gpu_milli_total}).fits:
            continue
        try:
            rg = start(snap, g, profile())
        except AssertionError:
            continue
        (held.append((team, rg.placements)) if data.draw(st.booleans()) else running.append(rg))
    pending = [gang(f"p{i}", data.draw(st.integers(1, 2)), data.draw(st.sampled_from([4, 8])),
                    team=data.draw(st.sampled_from("abc")), priority=data.draw(st.integers(0, 5)), created_at=i)
               for i in range(data.draw(st.integers(1, 4)))]
    state = CycleState.build(snap, running, qb, held=held)
    res = schedule_cycle(state, pending, profile(), 0.0)
    after = state.copy()
    for d in res.admitted:
        after.hold(d.gang.team, d.placements, assume=False)
    for p in res.preemptions:
        for v in p.victims:
            after.usage.remove(v.gang.team, after.demand(v.placements))
        after.hold(p.gang.team, p.placements, assume=False)
    assert within_limits(qb, after.usage) == []
    for p in res.preemptions:
        for v in p.victims:
            if v.gang.priority >= p.gang.priority:
                assert v.gang.team != p.gang.team and p.reclaim, "equal/higher priority only by reclaim"
            # lowest priority first: a spared gang of the victim's team with lower priority could not
            # have replaced it (unless it is non-checkpointable and the victim is not: DESIGN.md)
            for r in running:
                if r.gang.team != v.gang.team or r.gang.priority >= v.gang.priority or r in p.victims:
                    continue
                if v.gang.checkpointable and not r.gang.checkpointable:
                    continue
                alt = [x for x in p.victims if x is not v] + [r]
                work = state.without(alt)
                d = admit(work.snap, p.gang, profile(), qb, work.usage)
                assert not (d.admitted and d.borrowed == p.borrowed), f"{r.gang.name} would do for {v.gang.name}"


def test_reclaim_with_the_teams_own_lower_priority_gang_when_under_its_guarantee():
    # Kueue: a (nominal 8) uses 4 < 8 with a-low; a-high (8) needs c's borrower gone for room AND
    # a-low gone to stay within 8 without borrowing: both are taken.
    qb = book(a=(8, 0), b=(8, 0), c=(8, 8))
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, gang("a-low", 1, 4, team="a"), profile())] + running_on(snap, ("c-own", "c", 8, 5))
    running.append(start(snap, gang("c-borrow", 1, 4, team="c", priority=5), profile()))
    plan, why = plan_preemption(CycleState.build(snap, running, qb), gang("a-high", 1, 8, team="a", priority=9),
                                profile(), 1.0)
    assert plan is not None and set(plan.victim_names) == {"a-low", "c-borrow"} and not plan.borrowed, why


def test_a_borrower_on_nodes_the_gang_may_not_use_does_not_shield_the_one_it_can_displace():
    # research (8, borrow 8) runs sweep-spot (checkpointable, spot) and sweep-od (on-demand, borrowed);
    # nlp's production gang may not run on spot: reclaim takes sweep-od, not the cheaper spot one.
    qb = book(nlp=(8, 0), research=(8, 8))
    spot = [Node(f"spot-{i}", 64_000, 512_000, gpu_count=8, gpu_product="H100", capacity_type="spot", clique="s")
            for i in range(1)]
    snap = Snapshot.from_nodes(cluster(1) + spot)
    def on(g, capacity):
        return Gang(g.name, g.team, g.tier, g.priority, tuple(replace(m, capacity_types=(capacity,)) for m in g.members),
                    checkpointable=g.checkpointable)

    running = [start(snap, on(gang("sweep-spot", 1, 8, team="research", checkpointable=True), "spot"), profile()),
               start(snap, on(gang("sweep-od", 1, 8, team="research"), "on-demand"), profile(), at=5.0, borrowed=True)]
    assert running[0].placements[0].node == "spot-0" and running[1].placements[0].node == "n0000"
    prod = on(gang("nlp-ft", 1, 8, team="nlp", priority=100, tier=PROD), "on-demand")
    plan, why = plan_preemption(CycleState.build(snap, running, qb), prod, profile(), 10.0)
    assert plan is not None and plan.victim_names == ("sweep-od",), why
