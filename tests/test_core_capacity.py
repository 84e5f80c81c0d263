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
    assert confine_to_eligible_capacity(members, spot_eligible=True) == members


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
