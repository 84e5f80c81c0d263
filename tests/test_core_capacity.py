"""The spot rule shared by scheduler, simulator and operator: only checkpointable work of a
spot-eligible tier may land on spot; everything else is pinned to on-demand."""

from __future__ import annotations

from airflow_gpu import constants as C
from airflow_gpu.core.capacity import confine_to_eligible_capacity, is_spot_eligible
from airflow_gpu.core.model import PodRequest


def test_spot_needs_both_tier_and_checkpoint():
    assert is_spot_eligible(True, True)
    assert not is_spot_eligible(True, False)
    assert not is_spot_eligible(False, True)


def test_ineligible_members_are_pinned_to_on_demand_unless_they_chose():
    members = (PodRequest("a", gpus=1), PodRequest("b", gpus=1, capacity_types=(C.CAPACITY_SPOT,)))
    pinned = confine_to_eligible_capacity(members, spot_eligible=False)
    assert pinned[0].capacity_types == (C.CAPACITY_ON_DEMAND,)
    assert pinned[1].capacity_types == (C.CAPACITY_SPOT,)  # an explicit ask is the caller's (as before)
    eligible = confine_to_eligible_capacity(members, spot_eligible=True)
    assert eligible[0].capacity_types == (C.CAPACITY_SPOT, C.CAPACITY_ON_DEMAND)  # spot first
    assert eligible[1] == members[1]
    fallback = confine_to_eligible_capacity(members, spot_eligible=False, spot_fallback=True)
    assert fallback[0].capacity_types == (C.CAPACITY_ON_DEMAND, C.CAPACITY_SPOT)  # spot only when on-demand is full
    assert fallback[1] == members[1]


def test_placement_takes_the_preferred_capacity_type_first():
    """Spot-eligible work lands on spot while spot has room, leaving on-demand to work that may run
    nowhere else; overflow work lands on on-demand first; both still use the other type when full."""
    from dataclasses import replace

    from airflow_gpu.core.framework import place_pod
    from airflow_gpu.core.model import Node
    from airflow_gpu.core.policies import DEFAULT_POLICY, SPREAD_POLICY, make_profile
    from airflow_gpu.core.snapshot import Snapshot

    nodes = [Node(f"od{i}", cpu_milli=64_000, memory_mib=256_000, gpu_count=2, gpu_product="A100") for i in range(2)]
    nodes.append(Node("spot0", cpu_milli=64_000, memory_mib=256_000, gpu_count=2, gpu_product="A100",
                      capacity_type=C.CAPACITY_SPOT))
    pod = PodRequest("p", gpus=1, cpu_milli=1000, memory_mib=1000)
    (spot_first,) = confine_to_eligible_capacity((pod,), spot_eligible=True)
    (od_first,) = confine_to_eligible_capacity((pod,), spot_eligible=False, spot_fallback=True)
    for policy in (DEFAULT_POLICY, SPREAD_POLICY, "bestfit"):
        profile = make_profile(policy)
        snap = Snapshot.from_nodes(nodes)
        landed = []
        for i in range(3):
            placement, _ = place_pod(snap, spot_first, profile)
            snap.assume(replace(placement, pod=f"s{i}"))
            landed.append(placement.node)
        assert landed[:2] == ["spot0", "spot0"] and landed[2].startswith("od"), (policy, landed)
        snap = Snapshot.from_nodes(nodes)
        placement, _ = place_pod(snap, od_first, profile)
        assert placement.node.startswith("od"), policy


def test_choose_capacity_follows_the_spot_rules():
    from airflow_gpu.core.capacity import choose_capacity, spot_request_problem

    def cap(spot, **kw):
        args = dict(tier_allows_spot=True, checkpointable=True, retriable=True)
        args.update(kw)
        return choose_capacity(spot, **args).capacity_type

    assert cap("auto") == "spot" and cap("always") == "spot" and cap("never") == "on-demand"
    assert cap("auto", tier_allows_spot=False) == "on-demand" and cap("always", tier_allows_spot=False) == "spot"
    assert cap("always", checkpointable=False) == "on-demand"  # never spot without a checkpoint
    assert cap("auto", retriable=False) == "on-demand"
    assert cap("always", interruptions=3, max_interruptions=3) == "on-demand"
    assert cap("auto", last_try=True) == "on-demand" and cap("always", last_try=True) == "spot"
    assert cap("always", seconds_to_deadline=600, seconds_run=700) == "on-demand"
    assert cap("always", seconds_to_deadline=600, seconds_run=100) == "spot"
    assert spot_request_problem("always", checkpointable=False, retriable=True)[0] == "spot"
    assert spot_request_problem("always", checkpointable=True, retriable=False)[0] == "retries"
    assert spot_request_problem("sometimes", True, True)[0] == "spot"
    assert spot_request_problem("auto", checkpointable=False, retriable=False) is None
