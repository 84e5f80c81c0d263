"""Which capacity type (spot or on-demand) a gang may run on: one rule for the scheduler, the
simulator and the operator's dry run (docs/DESIGN.md, "Spot")."""

from __future__ import annotations

from dataclasses import replace

from airflow_gpu.constants import CAPACITY_ON_DEMAND
from airflow_gpu.core.model import PodRequest


def is_spot_eligible(tier_allows_spot: bool, checkpointable: bool) -> bool:
    """Spot only for work whose tier allows it AND that can resume from a checkpoint."""
    return tier_allows_spot and checkpointable


def confine_to_eligible_capacity(members: tuple[PodRequest, ...], spot_eligible: bool) -> tuple[PodRequest, ...]:
    """Work that cannot resume never goes to spot, whatever its pods tolerate: members without an
    explicit capacity type are pinned to on-demand. Eligible gangs are left as asked."""
    if spot_eligible:
        return members
    return tuple(m if m.capacity_types else replace(m, capacity_types=(CAPACITY_ON_DEMAND,)) for m in members)
