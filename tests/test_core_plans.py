"""core.plans.recheck_plan: a held plan read back after a restart is acted on only if the rules of
today still allow it (static fit, victims preemptible by this gang, quota)."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu import constants as C
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import Placement, Taint
from airflow_gpu.core.plans import recheck_plan
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
