"""Preemption planning: which running gangs to stop so that a pending gang fits. It plans; it does not act.

Rules (DESIGN.md, Preemption and quotas):
- victims have strictly lower priority than the preemptor (a borrowed gang counts at the quota
  book's best-effort `borrowed_priority`), are preemptible, and are not of a non-preemptible tier;
- reclaim (Kueue's reclaimWithinCohort: Any): a gang that stays within its team's guarantee may
  also preempt another team's gang in its cohort that is BORROWING, whatever that gang's priority
  (borrowed quota is lent, not owned); still never a non-preemptible tier or gang, still whole gangs;
- whole gangs only: a victim is a RunningGang, all of its pods go;
- with quotas, another team's gang is a candidate only while that team borrows (its guarantee is not
  touched), so reclaim is preemption of borrowers; a team's own lower-priority gangs are candidates too;
- order of candidates: borrowers first (admitted as borrowed, then the other gangs of a team above its
  guarantee), checkpointable before non-checkpointable, then the fewest
  GPU-seconds lost since the last checkpoint, then lower priority, then the most recently started.

Search. When capacity (not quota) is what is missing, victims are chosen per topology domain (a node,
clique, rack, zone, as admission would place the gang): each domain's candidates in the order above
until the domain's estimated room holds the gang; the domain whose set is cheapest wins, by
(non-checkpointable victims, victims that are not borrowers, GPU-seconds lost), tightest level
first. Otherwise (quota reclaim, or no domain works) the shortest feasible prefix of the global
order is found by bisection. Either way the set is then made minimal: each victim whose removal is
not needed is given back, most expensive first, until none can be. A cheap room estimate (the one
admission uses to pick domains) rules out hopeless sets before a full placement is tried.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from airflow_gpu.constants import TIER_INTERACTIVE
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import GangDecision, accepted_products, admit, restricted
from airflow_gpu.core.model import Gang, Placement, RunningGang, TopologyLevel
from airflow_gpu.core.quota import Demand, QuotaBook, QuotaUsage, check, demand_of_placements, demand_on_product
from airflow_gpu.core.room import RoomEstimate
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import members_per_node


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
    return running.borrowed or team_borrows(running, quota, usage, node_product)


def team_borrows(running: RunningGang, quota: QuotaBook | None, usage: QuotaUsage | None,
                 node_product: dict[str, str | None]) -> bool:
    """Its team uses more than its guarantee, now, on a key the gang holds. The admission-time
    `borrowed` flag alone may be stale (the team's other gangs ended since): reclaim regardless of
    priority needs the team to be borrowing now, as Kueue checks the ClusterQueue's usage."""
    if quota is None or usage is None:
        return False
    tq = quota.team(running.gang.team)
    demand = demand_of_placements(running.placements, node_product, quota)
    return any(usage.of(running.gang.team, k) > (tq.n(k) if tq else 0) for k in demand)


def candidates(gang: Gang, running: Iterable[RunningGang], now: float, quota: QuotaBook | None = None,
               usage: QuotaUsage | None = None, policy: PreemptionPolicy = PreemptionPolicy(),
               node_product: dict[str, str | None] | None = None,
               below: int | None = None, reclaim_within_cohort: bool = False) -> list[RunningGang]:
    """Running gangs `gang` may preempt, cheapest to lose first. below: priority bound (default the
    gang's own priority); victims' effective priority must be strictly lower, except, with `reclaim_within_cohort`
    (the gang is within its team's guarantee), for other teams' borrowers in its cohort."""
    # A tier that never preempts (PriorityClass preemptionPolicy: Never) gives up priority preemption,
    # not its team's guarantee: reclaiming lent quota stays allowed (Kueue decides reclaim per queue).
    by_priority = gang.tier not in policy.never_preempting_tiers
    if not by_priority and not reclaim_within_cohort:
        return []
    bound = gang.priority if below is None else below
    node_product = node_product or {}
    keyed = []
    for rg in running:
        if rg.gang.name == gang.name or not rg.gang.preemptible or rg.gang.tier in policy.non_preemptible_tiers:
            continue
        borrower = is_borrower(rg, quota, usage, node_product)
        reclaimable = (reclaim_within_cohort and rg.gang.team != gang.team
                       and team_borrows(rg, quota, usage, node_product)
                       and same_cohort(quota, rg.gang.team, gang.team))
        if not reclaimable and (not by_priority or effective_priority(rg, quota) >= bound):
            continue
        if quota is not None and rg.gang.team != gang.team and not borrower:
            continue  # another team's guaranteed quota is not ours to take
        # admitted as borrowed first, then other gangs of a team above its guarantee, then the rest
        keyed.append(((not rg.borrowed, not borrower, not rg.gang.checkpointable, rg.gpu_seconds_at_risk(now),
                       effective_priority(rg, quota), -rg.started_at, rg.gang.name), rg))
    keyed.sort(key=lambda kv: kv[0])
    return [rg for _, rg in keyed]


def same_cohort(quota: QuotaBook | None, team_a: str, team_b: str) -> bool:
    if quota is None:
        return False
    a, b = quota.team(team_a), quota.team(team_b)
    return a is not None and b is not None and a.cohort == b.cohort


def within_guarantee(quota: QuotaBook, usage: QuotaUsage, team: str, demand: Demand) -> bool:
    """Would the team stay within its nominal (guaranteed) quota on every key with `demand` added?
    Only then may it reclaim from borrowers regardless of their priority (Kueue: a ClusterQueue
    below its nominal quota reclaims within its cohort)."""
    tq = quota.team(team)
    demand = {k: v for k, v in demand.items() if v > 0}
    return tq is not None and bool(demand) and all(usage.of(team, k) + d <= tq.n(k) for k, d in demand.items())


def _gang_demand(gang: Gang, snap: Snapshot, quota: QuotaBook) -> Demand:
    """The gang's quota demand on its most preferred product (for "is quota the problem?")."""
    products = accepted_products(snap, gang)
    return demand_on_product(gang, quota.product(products[0]), quota.weight(products[0])) if products else {}


def domain_prefixes(room: RoomEstimate, cands: list[RunningGang], now: float, quota, usage, node_product,
                    per_level: int = 3) -> list[list[RunningGang]]:
    """Per topology level (tightest first), the cheapest victim sets that make room in one domain:
    each domain's candidates taken in preference order until its estimated room holds the gang."""
    snap = room.snap
    base_fit = members_per_node(snap, room.gang, room.eligible)
    index = snap.shape.index
    spots = []  # per candidate: its placements on eligible nodes as (node, gpu shares, cpu, mem)
    for c in cands:
        spots.append([(index[p.node], p.gpu_shares, p.cpu_milli, p.memory_mib)
                      for p in c.placements if room.eligible[index[p.node]]])
    # A set's cost: non-checkpointable victims first (never one while a checkpointable set
    # would do), then victims that are not borrowers, then GPU-seconds lost.
    cost = [((not c.gang.checkpointable), (not c.borrowed) + (not is_borrower(c, quota, usage, node_product)),
             c.gpu_seconds_at_risk(now)) for c in cands]
    out: list[list[RunningGang]] = []
    for level in room.levels:
        ids = room.ids(level)
        by_domain: dict[int, list[int]] = {}
        for ci, sp in enumerate(spots):
            for d in {int(ids[n]) for n, _, _, _ in sp if ids[n] >= 0}:
                by_domain.setdefault(d, []).append(ci)
        found = []
        for d, cis in by_domain.items():
            nodes = np.flatnonzero(ids == d)
            space = int(base_fit[nodes].max() if level is TopologyLevel.NODE else base_fit[nodes].sum())
            rows: dict[int, list] = {}
            fits: dict[int, int] = {}
            taken = []
            for ci in cis:
                taken.append(ci)
                touched = set()
                for n, shares, cpu, mem in spots[ci]:
                    if ids[n] != d:
                        continue
                    if n not in rows:
                        rows[n] = [snap.gpu_free[n].copy(), int(snap.cpu_free[n]), int(snap.mem_free[n])]
                    r = rows[n]
                    for g, milli in shares:
                        r[0][g] += milli
                    r[1] += cpu
                    r[2] += mem
                    touched.add(n)
                for n in touched:
                    before = fits.get(n, int(base_fit[n]))
                    fits[n] = room.fit_one(*rows[n])
                    if level is not TopologyLevel.NODE:
                        space += fits[n] - before
                if level is TopologyLevel.NODE:
                    space = max(fits.values(), default=0)
                if space >= room.want:
                    key = (sum(cost[i][0] for i in taken), sum(cost[i][1] for i in taken),
                           sum(cost[i][2] for i in taken), len(taken), d)
                    found.append((key, taken))
                    break
        found.sort(key=lambda kv: kv[0])
        out.extend([cands[i] for i in taken] for _, taken in found[:per_level])
    return out


class _Feasibility:
    """Would `gang` be admitted if `victims` were gone? Memoised per victim set."""

    def __init__(self, snap, gang, profile, quota, usage, exclude, node_product, borrowed_bound):
        self.snap, self.gang, self.profile = snap, gang, profile
        self.quota, self.usage, self.exclude = quota, usage, exclude
        self.node_product = node_product
        self.borrowed_bound = borrowed_bound
        self.memo: dict[frozenset[str], GangDecision | None] = {}
        self.room: RoomEstimate | None = None  # set once the candidates are known


    def without(self, victims: Sequence[RunningGang]) -> tuple[Snapshot, QuotaUsage | None]:
        snap = self.snap.copy()
        usage = self.usage.copy() if self.usage is not None else None
        for v in victims:
            for p in v.placements:
                if p.pod in snap.placements:  # a pod the snapshot does not hold frees nothing
                    snap.forget(p.pod)
            if usage is not None:
                usage.remove(v.gang.team, demand_of_placements(v.placements, self.node_product, self.quota))
        return snap, usage

    def __call__(self, victims: Sequence[RunningGang]) -> GangDecision | None:
        key = frozenset(v.gang.name for v in victims)
        if key in self.memo:
            return self.memo[key]
        snap, usage = self.without(victims)
        if self.room is not None and not self.room.may_fit(snap):
            self.memo[key] = None  # admission would find no domain with room either
            return None
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
    may_reclaim = quota is not None and within_guarantee(quota, usage, gang.team, _gang_demand(gang, snap, quota))
    cands = candidates(gang, running, now, quota, usage, policy, node_product, reclaim_within_cohort=may_reclaim)
    if not cands:
        also = " and no borrower in its cohort" if may_reclaim else ""
        return None, f"no preemptible gang of lower priority than {gang.priority}{also} to make room"

    prof = profile if exclude is None else restricted(profile, ~exclude, "reserved")
    room = RoomEstimate.for_gang(snap, gang, prof)
    feasible.room = room
    quota_short = quota is not None and not check(
        quota, usage, gang.team, _gang_demand(gang, snap, quota)).fits

    chosen: list[RunningGang] | None = None
    if not quota_short:
        # Capacity only: victims concentrated in one topology domain, the cheapest domain first.
        for prefix in domain_prefixes(room, cands, now, quota, usage, node_product):
            if feasible(prefix) is not None:
                chosen = prefix
                break
    if chosen is None:
        if feasible(cands) is None:
            return None, f"stopping all {len(cands)} preemptible gangs of lower priority or borrowing would not make room"
        # Shortest feasible prefix of the global preference order (bisection; room only grows).
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
