"""Preemption planning (core.preemption): who may be a victim, in which order, and minimal sets."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, full_cluster_of, gang, plan_for, profile, start
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING, TIER_INTERACTIVE, TIER_PRODUCTION_TRAINING
from airflow_gpu.core.gang import admit
from airflow_gpu.core.model import RunningGang, TopologyLevel
from airflow_gpu.core.preemption import PreemptionPolicy, team_borrows, within_guarantee
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota, check, demand_of_placements
from airflow_gpu.core.snapshot import Snapshot

PROD, BE = TIER_PRODUCTION_TRAINING, TIER_BEST_EFFORT_TRAINING


full_cluster = full_cluster_of


def test_checkpointable_victims_before_non_checkpointable_then_fewest_gpu_seconds_lost():
    snap, running = full_cluster([
        ("plain", 1, 8, 0, {}, {"at": 0.0}),
        ("ckpt-old", 1, 4, 0, {"checkpointable": True}, {"at": 0.0, "checkpoint": 10.0}),
        ("ckpt-new", 1, 4, 0, {"checkpointable": True}, {"at": 0.0, "checkpoint": 90.0}),
    ])
    plan, why = plan_for(snap, gang("prod", 1, 4, priority=100, tier=PROD), running, profile(), now=100.0)
    assert plan is not None, why
    assert plan.victim_names == ("ckpt-new",)
    assert plan.lost_gpu_seconds == 4 * 10.0
    assert len(plan.placements) == 1
    plan, _ = plan_for(snap, gang("prod", 1, 8, priority=100, tier=PROD), running, profile(), now=100.0)
    # 8 GPUs: both checkpointable gangs (on one node) rather than the non-checkpointable one
    assert set(plan.victim_names) == {"ckpt-old", "ckpt-new"}


def test_equal_or_higher_priority_and_non_preemptible_tiers_are_never_victims():
    snap, running = full_cluster([
        ("same", 1, 8, 100, {}, {}),
        ("notebook", 1, 4, 0, {"tier": TIER_INTERACTIVE}, {}),
        ("pinned", 1, 4, 0, {"preemptible": False}, {}),
    ])
    plan, why = plan_for(snap, gang("prod", 1, 4, priority=100, tier=PROD), running, profile(), now=5.0)
    assert plan is None and "no preemptible gang of lower priority" in why


def test_a_never_preempting_tier_plans_nothing_and_a_fitting_gang_needs_no_plan():
    snap, running = full_cluster([("be", 1, 8, 0, {}, {})])
    policy = PreemptionPolicy(never_preempting_tiers=frozenset({PROD}))
    assert plan_for(snap, gang("p", 1, 8, priority=9, tier=PROD), running, profile(), 1.0, policy=policy)[0] is None
    plan, why = plan_for(snap, gang("p", 1, 8, priority=9), running, profile(), 1.0)
    assert plan is None and why == "fits without preemption"


def test_whole_gangs_only_and_the_victim_set_is_minimal():
    # a gang of 2+2 GPUs spans both nodes; freeing 2 GPUs on one node takes the whole gang
    snap, running = full_cluster([
        ("a", 1, 6, 0, {}, {"at": 0.0}),
        ("b", 1, 6, 0, {}, {"at": 0.0}),
        ("wide", 2, 2, 0, {}, {"at": 50.0}),
    ])
    plan, _ = plan_for(snap, gang("prod", 1, 2, priority=10), running, profile(), now=60.0)
    assert plan.victim_names == ("wide",)  # cheapest: 4 GPU x 10 s at risk < 6 x 60
    freed = {p.node for p in running[2].placements}
    assert len(freed) == 2  # both its pods go, though one node would do


def test_reclaim_preempts_borrowers_first_and_never_another_teams_guaranteed_gang():
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 8}),
                    "b": TeamQuota.from_gpus("b", {"H100": 8})}, borrowed_priority=0)
    snap, running = full_cluster([
        ("a-own", 1, 8, 5, {"team": "a"}, {}),
        ("a-borrow", 1, 8, 5, {"team": "a"}, {"borrowed": True}),
    ])
    usage = QuotaUsage.from_running(running, {n.name: n.gpu_product for n in snap.nodes}, qb)
    d = admit(snap, gang("b-job", 1, 4, priority=5, team="b"), profile(), qb, usage)
    assert not d.admitted and d.quota.reclaimable
    plan, why = plan_for(snap, gang("b-job", 1, 4, priority=5, team="b"), running, profile(), 1.0, qb, usage)
    assert plan is not None, why
    assert plan.victim_names == ("a-borrow",) and plan.reclaim
    # team a's gang within its own guarantee is never taken by team b, whatever the priority
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 16}), "b": TeamQuota.from_gpus("b", {"H100": 8})})
    snap2, running2 = full_cluster([("a-own", 2, 8, 0, {"team": "a"}, {})])
    plan, why = plan_for(snap2, gang("b-job", 1, 8, priority=99, team="b"), running2, profile(), 1.0, qb)
    assert plan is None and "no preemptible gang" in why
    # while team a is above its guarantee (borrowing), its gangs are reclaimable
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 8}), "b": TeamQuota.from_gpus("b", {"H100": 8})})
    plan, why = plan_for(snap2, gang("b-job", 1, 8, priority=99, team="b"), running2, profile(), 1.0, qb)
    assert plan is not None and plan.victim_names == ("a-own",)


# --- properties ---------------------------------------------------------------------------------

@st.composite
def scenes(draw):
    n = draw(st.integers(1, 3))
    snap = Snapshot.from_nodes(cluster(n, gpus=8, clique=2))
    running = []
    for i in range(draw(st.integers(2, 12))):
        g = gang(f"r{i}", draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3, 4])),
                 priority=draw(st.integers(0, 3)), tier=draw(st.sampled_from([BE, BE, PROD, TIER_INTERACTIVE])),
                 preemptible=draw(st.sampled_from([True, True, True, False])), checkpointable=draw(st.booleans()))
        d = admit(snap, g, profile())
        if d.admitted:
            for p in d.placements:
                snap.assume(p)
            running.append(RunningGang(g, d.placements, started_at=float(draw(st.integers(0, 50))),
                                       last_checkpoint_at=float(draw(st.integers(50, 90)))))
    pending = gang("p", draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 6, 8])), priority=draw(st.integers(2, 5)),
                   level=draw(st.sampled_from([TopologyLevel.NODE, TopologyLevel.CLIQUE, TopologyLevel.ANY])), hard=draw(st.booleans()))
    return snap, running, pending


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_plans_only_touch_lower_priority_preemptible_whole_gangs_and_are_minimal(scene):
    snap, running, pending = scene
    plan, why = plan_for(snap, pending, running, profile(), now=100.0)
    if plan is None:
        assert why
        return
    assert plan.victims
    for v in plan.victims:
        assert v.gang.priority < pending.priority
        assert v.gang.preemptible and v.gang.tier != TIER_INTERACTIVE
        assert v in running  # whole RunningGangs, with all their placements
    # feasible: with the victims gone, the planned placements fit
    freed = snap.copy()
    for v in plan.victims:
        for p in v.placements:
            freed.forget(p)
    for p in plan.placements:
        freed.assume(p)
    assert sorted(p.pod for p in plan.placements) == sorted(m.name for m in pending.members)
    # minimal: sparing any one victim leaves the gang without room
    for spared in plan.victims:
        s = snap.copy()
        for v in plan.victims:
            if v is not spared:
                for p in v.placements:
                    s.forget(p)
        assert not admit(s, pending, profile()).admitted
    assert plan.lost_gpu_seconds == sum(v.gpu_seconds_at_risk(100.0) for v in plan.victims)


@settings(max_examples=80, deadline=None)
@given(scenes(), st.data())
def test_with_quotas_victims_are_own_lower_priority_gangs_or_borrowers(scene, data):
    snap, running, pending = scene
    teams = ["a", "b"]
    running = [replace(r, gang=replace(r.gang, team=data.draw(st.sampled_from(teams))),
                       borrowed=data.draw(st.booleans())) for r in running]
    pending = replace(pending, team=data.draw(st.sampled_from(teams)))
    qb = QuotaBook({t: TeamQuota.from_gpus(t, {"H100": data.draw(st.integers(0, 16))},
                                           {"H100": data.draw(st.integers(0, 16))}) for t in teams},
                   borrowed_priority=data.draw(st.sampled_from([None, 0, 1])))
    node_product = {n.name: n.gpu_product for n in snap.nodes}
    usage = QuotaUsage.from_running(running, node_product, qb)
    plan, why = plan_for(snap, pending, running, profile(), 100.0, qb, usage)
    if plan is None:
        return
    gone = usage.copy()  # once the victims (the preemptor's own among them) are gone
    for v in plan.victims:
        gone.remove(v.gang.team, demand_of_placements(v.placements, node_product, qb))
    for v in plan.victims:
        # equal or higher priority only as a reclaim: another team's borrower, by a gang within its guarantee
        assert qb.effective_priority(v) < pending.priority or (
            v.gang.team != pending.team and team_borrows(v, qb, usage, node_product)
            and within_guarantee(qb, gone, pending.team, demand_of_placements(plan.placements, node_product, qb)))
        assert v.gang.preemptible and v.gang.tier != TIER_INTERACTIVE
        assert v.gang.team == pending.team or team_borrows(v, qb, usage, node_product)
    # after the plan, the gang's quota check passes
    after = usage.copy()
    for v in plan.victims:
        after.remove(v.gang.team, demand_of_placements(v.placements, node_product, qb))
    assert check(qb, after, pending.team, demand_of_placements(plan.placements, node_product, qb)).fits


def test_lost_gpu_seconds_is_one_rule_since_the_later_of_start_and_checkpoint():
    """core.model.gpu_seconds_lost: preemption's cost (RunningGang.gpu_seconds_at_risk), the operator's
    and the chargeback's lost GPU-seconds; a checkpoint before the start saved none of this work."""
    from airflow_gpu.core.model import Gang, PodRequest, gpu_seconds_lost, periodic_checkpoint_work

    assert gpu_seconds_lost(2.0, 100.0, 160.0, None) == 120.0
    assert gpu_seconds_lost(2.0, 100.0, 160.0, 130.0) == 60.0
    assert gpu_seconds_lost(2.0, 100.0, 160.0, 50.0) == 120.0  # an older checkpoint: since the start
    assert gpu_seconds_lost(2.0, 100.0, 90.0, None) == 0.0
    assert periodic_checkpoint_work(3700.0, 1800.0) == 3600.0 and periodic_checkpoint_work(1799.0, 1800.0) == 0.0
    gang = Gang("g", "team-a", "t", 1, (PodRequest("p", gpus=4),), checkpointable=True)
    assert RunningGang(gang, (), started_at=100.0, last_checkpoint_at=130.0).gpu_seconds_at_risk(160.0) == 120.0
    assert RunningGang(gang, (), started_at=100.0).gpu_seconds_at_risk(160.0) == 240.0
