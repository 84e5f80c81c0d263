"""Which capacity type (spot or on-demand) a gang may run on: one rule for the scheduler, the
simulator and the operator's dry run (docs/DESIGN.md, "Spot")."""

from __future__ import annotations

from dataclasses import dataclass, replace

from airflow_gpu.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT
from airflow_gpu.core.model import PodRequest


def is_spot_eligible(tier_allows_spot: bool, checkpointable: bool) -> bool:
    """Spot only for work whose tier allows it AND that can resume from a checkpoint."""
    return tier_allows_spot and checkpointable


def confine_to_eligible_capacity(members: tuple[PodRequest, ...], spot_eligible: bool,
                                 spot_fallback: bool = False) -> tuple[PodRequest, ...]:
    """The capacity types each member accepts, in preference order (placement's CapacityPreference
    score takes the first listed type first). Members with an explicit capacity type keep it.
    - spot-eligible work: spot first, then on-demand (DESIGN.md: best-effort "spot first"), so it
      leaves on-demand capacity to the work that may run nowhere else;
    - `spot_fallback` (checkpointable work of a tier that allows spot only when on-demand is full:
      DESIGN.md's production "spot only if allowed and slack remains"): on-demand first, then spot;
    - anything else never goes to spot: pinned to on-demand."""
    if spot_eligible:
        order = (CAPACITY_SPOT, CAPACITY_ON_DEMAND)
    elif spot_fallback:
        order = (CAPACITY_ON_DEMAND, CAPACITY_SPOT)
    else:
        order = (CAPACITY_ON_DEMAND,)
    return tuple(m if m.capacity_types else replace(m, capacity_types=order) for m in members)


# --- the operator's `spot` argument ---------------------------------------------------------------
SPOT_AUTO = "auto"  # spot when the tier allows it, the work checkpoints and may be retried
SPOT_NEVER = "never"  # always on-demand
SPOT_ALWAYS = "always"  # the author's explicit opt-in: spot whatever the tier's default
SPOT_MODES = (SPOT_AUTO, SPOT_NEVER, SPOT_ALWAYS)


def spot_request_problem(spot: str, checkpointable: bool, retriable: bool) -> tuple[str, str] | None:
    """(argument, why) when a `spot` request can never be honoured safely, else None. Spot capacity is
    taken back at short notice: work pinned there must resume from a checkpoint, and must have a retry
    left for an interruption the operator cannot absorb within the try."""
    if spot not in SPOT_MODES:
        return "spot", f"must be one of {', '.join(repr(m) for m in SPOT_MODES)} (got {spot!r})"
    if spot == SPOT_ALWAYS and not checkpointable:
        return "spot", ("spot='always' needs checkpoint=<s3:// or file:// URI prefix>: work pinned to spot "
                              "must be able to resume after an interruption; set checkpoint or use spot='auto'")
    if spot == SPOT_ALWAYS and not retriable:
        return "retries", ("spot='always' needs retries >= 1: a task that cannot be retried fails for good on an "
                           "interruption the operator cannot absorb; set retries or use spot='auto'")
    return None


@dataclass(frozen=True)
class CapacityChoice:
    """The capacity type one launch of a gang goes to, and why (logged by the operator)."""

    capacity_type: str  # CAPACITY_SPOT | CAPACITY_ON_DEMAND
    reason: str


def choose_capacity(spot: str, tier_allows_spot: bool, checkpointable: bool, retriable: bool,
                    interruptions: int = 0, max_interruptions: int = 3, last_try: bool = False,
                    seconds_to_deadline: float | None = None, seconds_run: float = 0.0) -> CapacityChoice:
    """Spot or on-demand for the next launch (docs/DESIGN.md, "Spot"): spot only for checkpointable
    work, with `spot='auto'` only where the tier allows it and the task may be retried. On-demand
    after `max_interruptions` interruptions in this try, on the last Airflow try ('auto'), and once
    the deadline slack runs out: the slack is gone when the time left is no more than the time the
    job has already run, i.e. an interruption that costs that much again could miss the deadline."""
    def on_demand(reason: str) -> CapacityChoice:
        return CapacityChoice(CAPACITY_ON_DEMAND, reason)

    if spot == SPOT_NEVER:
        return on_demand("spot='never'")
    if not checkpointable:
        return on_demand("no checkpoint: work that cannot resume never goes to spot")
    if spot == SPOT_AUTO and not is_spot_eligible(tier_allows_spot, checkpointable):
        return on_demand("the tier is not spot-eligible (spot='auto')")
    if spot == SPOT_AUTO and not retriable:
        return on_demand("retries=0: an interruption could not be absorbed (spot='auto')")
    if interruptions >= max_interruptions:
        return on_demand(f"{interruptions} interruption(s) reached max_interruptions={max_interruptions}")
    if spot == SPOT_AUTO and last_try:
        return on_demand("last Airflow try (spot='auto')")
    if seconds_to_deadline is not None and seconds_to_deadline <= max(seconds_run, 0.0):
        return on_demand(f"deadline slack ran out: {max(seconds_to_deadline, 0):.0f} s left, "
                         f"{seconds_run:.0f} s already run")
    return CapacityChoice(CAPACITY_SPOT, f"spot='{spot}', checkpointable")
