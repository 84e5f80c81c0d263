"""core.plans.recheck_plan: a held plan read back after a restart is acted on only if the rules of
today still allow it (static fit, victims preemptible by this gang, quota)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu import constants as C
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import Placement, Taint
from airflow_gpu.core.plans import may_bind, recheck_plan
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import Snapshot


def _nodes():
    nodes = cluster(3, gpus=8)
    spot = replace(nodes[2], capacity_type=C.CAPACITY_SPOT, taints=(Taint(C.TAINT_SPOT, "true", "NoSchedule"),))
    return nodes[:2] + [spot]


def _placements(g, node):
    return [Placement(m.name, node, ((i, 1000),)) for i, m in enumerate(g.members)]


def test_a_plan_that_still_fits_the_rules_passes():
    state = CycleState.build(Snapshot.from_nodes(_nodes()))
    g = gang("g", 2, 1)
    assert recheck_plan(state, g, _placements(g, "n0000"), now=1.0) is None


def test_untolerated_taint_unknown_node_and_foreign_pod_are_refused():
    state = CycleState.build(Snapshot.from_nodes(_nodes()))
    g = gang("g", 2, 1)
    assert "untolerated taint " + C.TAINT_SPOT in recheck_plan(state, g, _placements(g, "n0002"), now=1.0)
    assert "gone" in recheck_plan(state, g, _placements(g, "nowhere"), now=1.0)
    assert "not a pending member" in recheck_plan(state, g, [Placement("other-0", "n0000")], now=1.0)


def test_victims_must_still_be_preemptible_by_the_gang():
    snap = Snapshot.from_nodes(_nodes())
    high = start(snap, gang("high", 1, 8, priority=100), profile())
    low = start(snap, gang("low", 1, 8, priority=1), profile())
    state = CycleState.build(snap, [high, low])
    g = gang("g", 1, 8, priority=50)
    node_of = {rg.gang.name: rg.placements[0].node for rg in (high, low)}
    assert recheck_plan(state, g, _placements(g, node_of["low"]), [low], now=1.0) is None
    reason = recheck_plan(state, g, _placements(g, node_of["high"]), [high], now=1.0)
    assert reason and "may not preempt" in reason and "high" in reason


def test_a_plan_beyond_the_team_quota_is_refused():
    snap = Snapshot.from_nodes(_nodes())
    book = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 4})})
    state = CycleState.build(snap, [], book)
    g = gang("g", 2, 4)  # 8 GPUs against a quota of 4
    reason = recheck_plan(state, g, [Placement(m.name, "n0000", tuple((4 * i + k, 1000) for k in range(4)))
                                     for i, m in enumerate(g.members)], now=1.0)
    assert reason and "quota" in reason


def test_a_preemptor_does_not_bind_while_its_own_teams_victim_still_saves():
    """The soak's case: nlp's production gang preempts nlp's best-effort gang (8 GPUs on a guarantee
    of 8) and has room on other nodes. While the victim runs its SIGTERM save it still holds its GPUs
    and quota: binding now would run 8 + 8. The plan itself stays valid (it fits once the victim is gone)."""
    snap = Snapshot.from_nodes(_nodes()[:2])
    book = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 8})})
    low = start(snap, gang("low", 1, 8, priority=1), profile())
    state = CycleState.build(snap, [], book, terminating=[low])  # evicted, saving
    g = gang("g", 1, 8, priority=100)
    free_node = next(n.name for n in _nodes()[:2] if n.name != low.placements[0].node)
    placements = _placements(g, free_node)
    assert recheck_plan(state, g, placements, now=1.0, leaving=[low]) is None
    assert not may_bind(state, g, placements, victims_alive=True)
    assert may_bind(CycleState.build(Snapshot.from_nodes(_nodes()[:2]), [], book), g, placements, victims_alive=False)


@settings(max_examples=150, deadline=None)
@given(quota=st.integers(0, 16), borrow=st.integers(0, 8), sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
       want=st.integers(1, 8), other_team=st.booleans())
def test_may_bind_never_takes_a_team_past_its_ceiling_while_victims_run(quota, borrow, sizes, want, other_team):
    """Property: whenever may_bind says yes with victims still running, the team's usage with the
    victims still counted and the plan bound stays within every quota limit of the book."""
    from airflow_gpu.core.quota import within_limits

    nodes = cluster(6, gpus=8)
    snap = Snapshot.from_nodes(nodes)
    book = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": quota}, borrowing_limit={"H100": borrow}),
                      "u": TeamQuota.from_gpus("u", {"H100": 16}, borrowing_limit={"H100": 16})})
    victims = [start(snap, gang(f"v{i}", 1, s, priority=1, team="u" if other_team else "t"), profile())
               for i, s in enumerate(sizes)]
    state = CycleState.build(snap, [], book, terminating=victims)
    if within_limits(book, state.usage):
        return  # the generated victims already break the book: no statement to make
    g = gang("g", 1, want, priority=100)
    decision_free = [i for i in range(len(nodes)) if snap.gpu_free[i].min() == 1000]
    if not decision_free:
        return
    placements = [Placement(g.members[0].name, nodes[decision_free[-1]].name,
                            tuple((k, 1000) for k in range(want)))]
    if may_bind(state, g, placements, victims_alive=True):
        state.hold(g.team, placements)
        assert not within_limits(book, state.usage), within_limits(book, state.usage)


def test_a_half_free_node_holds_what_is_free_of_a_plan_member_and_a_nomination_lapses_after_grace_and_slack():
    from airflow_gpu.core.model import PodRequest
    from airflow_gpu.core.plans import hold_member, nomination_lapsed

    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    snap.assume(Placement("victim", "n0000", tuple((i, 1000) for i in range(5))))
    member = PodRequest("m", cpu_milli=1000, memory_mib=1024, gpus=4)
    assert hold_member(snap, "n0000", member) is False  # 3 of its 4 GPUs are free: held, not bound
    assert int(snap.whole_free_gpus()[0]) == 0 and "m#held" in snap.placements
    assert hold_member(snap, "gone", member) is False
    fresh = Snapshot.from_nodes(cluster(1, gpus=8))
    assert hold_member(fresh, "n0000", member) is True and "m" in fresh.placements
    assert not nomination_lapsed(100.0, 100.0 + 59, grace=30, slack=30)
    assert nomination_lapsed(100.0, 100.0 + 60, grace=30, slack=30)


def test_a_never_preempting_tier_and_a_foreign_gang_are_policy_of_core():
    from airflow_gpu.core.preemption import PreemptionPolicy
    from airflow_gpu.core.tiers import placed_by

    policy = PreemptionPolicy(never_preempting_tiers=frozenset({"a"}))
    assert policy.with_never_preempting(["a"]) is policy
    assert policy.with_never_preempting(["b"]).never_preempting_tiers == {"a", "b"}
    g = gang("g", 1, 1)
    assert g.preemptible and placed_by(g, ours=True) is g
    assert placed_by(g, ours=False).preemptible is False  # another scheduler's pods are never victims here
