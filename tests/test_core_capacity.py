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
