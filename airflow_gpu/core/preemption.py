"""Preemption planning: which running gangs to stop so that a pending gang fits. It plans; it does not act.

Rules (DESIGN.md, Preemption and quotas):
- victims have strictly lower priority than the preemptor (a borrowed gang counts at the quota
  book's best-effort `borrowed_priority`), are preemptible, and are not of a non-preemptible tier;
- whole gangs only: a victim is a RunningGang, all of its pods go;
- with quotas, another team's gang is a candidate only while that team borrows (its guarantee is not
  touched), so reclaim is preemption of borrowers; a team's own lower-priority gangs are candidates too;
- order: borrowers first, checkpointable before non-checkpointable, then the fewest GPU-seconds lost
  since the last checkpoint, then lower priority, then the most recently started;
- the set is minimal: the shortest feasible prefix of that order is found by bisection, then each
  victim whose removal is not needed is given back, most expensive first, until none can be.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from airflow_gpu.constants import TIER_INTERACTIVE
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import GangDecision, admit
from airflow_gpu.core.model import Gang, Placement, RunningGang
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, demand_of_placements
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import eligible_nodes


@dataclass(frozen=True)
class PreemptionPolicy:
    non_preemptible_tiers: frozenset[str] = field(default_factory=lambda: frozenset({TIER_INTERACTIVE}))
    never_preempting_tiers: frozenset[str] = frozenset()  # PriorityClass preemptionPolicy: Never


@dataclass(frozen=True)
class PreemptionPlan:
    """Stop `victims` (whole gangs), then `gang` gets `placements`. lost_gpu_seconds: work lost since
    the victims' last checkpoints at planning time."""

    gang: Gang
    victims: tuple[RunningGang, ...]
    placements: tuple[Placement, ...]
    lost_gpu_seconds: float
    borrowed: bool = False  # the gang is admitted on borrowed quota once the victims are gone
    reclaim: bool = False  # some victim is another team's borrower (quota reclaim)

    @property
    def victim_names(self) -> tuple[str, ...]:
        return tuple(v.gang.name for v in self.victims)


def effective_priority(running: RunningGang, quota: QuotaBook | None) -> int:
    return quota.effective_priority(running) if quota is not None else running.gang.priority


def _node_products(snap: Snapshot) -> dict[str, str | None]:
    return {n.name: n.gpu_product for n in snap.nodes}


def is_borrower(running: RunningGang, quota: QuotaBook | None, usage: QuotaUsage | None,
                node_product: dict[str, str | None]) -> bool:
    """Admitted on borrowed quota, or its team is above its guarantee on a product the gang uses."""
    if running.borrowed:
        return True
    if quota is None or usage is None:
        return False
    tq = quota.team(running.gang.team)
    demand = demand_of_placements(running.placements, node_product, quota)
    return any(usage.of(running.gang.team, k) > (tq.n(k) if tq else 0) for k in demand)


def candidates(gang: Gang, running: Iterable[RunningGang], now: float, quota: QuotaBook | None = None,
               usage: QuotaUsage | None = None, policy: PreemptionPolicy = PreemptionPolicy(),
               node_product: dict[str, str | None] | None = None,
               below: int | None = None) -> list[RunningGang]:
    """Running gangs `gang` may preempt, cheapest to lose first. below: priority bound (default the
    gang's own priority); victims' effective priority must be strictly lower."""
    if gang.tier in policy.never_preempting_tiers:
        return []
    bound = gang.priority if below is None else below
    node_product = node_product or {}
    keyed = []
    for rg in running:
        if rg.gang.name == gang.name or not rg.gang.preemptible or rg.gang.tier in policy.non_preemptible_tiers:
            continue
        if effective_priority(rg, quota) >= bound:
            continue
        borrower = is_borrower(rg, quota, usage, node_product)
        if quota is not None and rg.gang.team != gang.team and not borrower:
            continue  # another team's guaranteed quota is not ours to take
        keyed.append(((not borrower, not rg.gang.checkpointable, rg.gpu_seconds_at_risk(now),
                       effective_priority(rg, quota), -rg.started_at, rg.gang.name), rg))
    keyed.sort(key=lambda kv: kv[0])
    return [rg for _, rg in keyed]


class _Feasibility:
    """Would `gang` be admitted if `victims` were gone? Memoised per victim set."""

    def __init__(self, snap, gang, profile, quota, usage, exclude, node_product, borrowed_bound):
        self.snap, self.gang, self.profile = snap, gang, profile
        self.quota, self.usage, self.exclude = quota, usage, exclude
        self.node_product = node_product
        self.borrowed_bound = borrowed_bound
        self.memo: dict[frozenset[str], GangDecision | None] = {}

    def without(self, victims: Sequence[RunningGang]) -> tuple[Snapshot, QuotaUsage | None]:
        snap = self.snap.copy()
        usage = self.usage.copy() if self.usage is not None else None
        for v in victims:
            for p in v.placements:
                if p.pod not in snap.placements:
                    raise ValueError(f"running gang {v.gang.name}: pod {p.pod} is not in the snapshot")
                snap.forget(p.pod)
            if usage is not None:
                usage.remove(v.gang.team, demand_of_placements(v.placements, self.node_product, self.quota))
        return snap, usage

    def __call__(self, victims: Sequence[RunningGang]) -> GangDecision | None:
        key = frozenset(v.gang.name for v in victims)
        if key in self.memo:
            return self.memo[key]
        snap, usage = self.without(victims)
        decision = admit(snap, self.gang, self.profile, self.quota, usage, self.exclude)
        ok: GangDecision | None = decision if decision.admitted else None
        if ok is not None and ok.borrowed and self.borrowed_bound is not None:
            # Admitted on borrowed quota, the gang itself runs at best-effort priority: it may only
            # displace gangs below that.
            if any(effective_priority(v, self.quota) >= self.borrowed_bound for v in victims):
                ok = None
        self.memo[key] = ok
        return ok


def plan_preemption(snap: Snapshot, gang: Gang, running: Sequence[RunningGang], profile: Profile, now: float,
                    quota: QuotaBook | None = None, usage: QuotaUsage | None = None,
                    policy: PreemptionPolicy = PreemptionPolicy(),
                    exclude: np.ndarray | None = None) -> tuple[PreemptionPlan | None, str]:
    """The cheapest minimal set of running gangs whose removal lets `gang` be admitted.

    `snap` holds every running gang's placements; `usage` is the quota usage they make up.
    Returns (plan, "") or (None, why no plan).
    """
    node_product = _node_products(snap)
    if quota is not None and usage is None:
        usage = QuotaUsage.from_running(running, node_product, quota)
    bound = None
    if quota is not None and quota.borrowed_priority is not None:
        bound = min(gang.priority, quota.borrowed_priority)
    feasible = _Feasibility(snap, gang, profile, quota, usage, exclude, node_product, bound)
    if feasible([]) is not None:
        return None, "fits without preemption"
    cands = candidates(gang, running, now, quota, usage, policy, node_product)
    if not cands:
        return None, f"no preemptible gang of lower priority than {gang.priority} to make room"
    if feasible(cands) is None:
        return None, f"stopping all {len(cands)} lower-priority preemptible gangs would not make room"

    # Drop candidates that cannot help: not on a node the gang could use, and not freeing quota.
    freed, _ = feasible.without(cands)
    useful_nodes = eligible_nodes(freed, gang, profile)
    useful = {snap.nodes[i].name for i in np.flatnonzero(useful_nodes)}
    quota_short = quota is not None and admit(freed.copy(), gang, profile, quota, usage, exclude).admitted is False
    cands = [c for c in cands if quota_short or any(p.node in useful for p in c.placements)]
    if feasible(cands) is None:  # the filter is a heuristic; never let it lose a plan
        cands = candidates(gang, running, now, quota, usage, policy, node_product)

    # Shortest feasible prefix of the preference order (bisection; more room never hurts a fit).
    lo, hi = 1, len(cands)
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(cands[:mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    chosen = list(cands[:lo])
    if feasible(chosen) is None:  # placement heuristics are not perfectly monotone
        chosen = list(cands)

    # Give back every victim not needed, most expensive first, until no single one can be spared.
    changed = True
    while changed and len(chosen) > 1:
        changed = False
        for v in reversed(list(chosen)):
            rest = [c for c in chosen if c is not v]
            if rest and feasible(rest) is not None:
                chosen = rest
                changed = True
    decision = feasible(chosen)
    assert decision is not None
    victims = tuple(chosen)
    lost = sum(v.gpu_seconds_at_risk(now) for v in victims)
    reclaim = any(v.gang.team != gang.team for v in victims)
    return PreemptionPlan(gang, victims, decision.placements, lost, decision.borrowed, reclaim), ""
