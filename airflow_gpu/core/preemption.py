"""Preemption planning: which running gangs to stop so that a pending gang fits. It plans; it does not act.

Semantics follow Kueue's preemption (pkg/scheduler/preemption), ClusterQueue = team, cohort = cohort,
flavor = GPU product. Candidates (whole gangs, preemptible, not of a non-preemptible tier, running
for at least their tier's minimum runtime (`protected`; KAI's minruntime), which a tier may waive
for reclaim of borrowed quota):
- the preemptor's own team: gangs of lower priority (a gang admitted on borrowed quota counts at the
  quota book's best-effort `borrowed_priority`); none when its tier never preempts (PriorityClass
  preemptionPolicy: Never);
- other teams of its cohort, only while that team BORROWS (uses more than its guarantee now, on a
  key the preemptor needs) - another team's guarantee is never taken:
  * reclaim (Kueue reclaimWithinCohort: Any): when the preemptor would stay within its team's
    guarantee on some accepted product, any priority; the preemptor must then fit WITHOUT borrowing;
  * borrowWithinCohort (Kueue's opt-in, per team: TeamQuota.borrow_within_cohort = the highest
    victim priority; or per tier: PreemptionPolicy.borrow_within_cohort_tiers = any lower priority):
    a preemptor that will borrow may take borrowers of lower priority up to the threshold. Off by
    default, as in Kueue.
Attempts, as Kueue's getTargets: with only own-team candidates, or borrowWithinCohort set: all of
them, borrowing allowed; else first the reclaim set without borrowing (if the team is under its
guarantee), then own-team candidates only, borrowing allowed.

Order: one comparator, `victim_order` (its criteria are numbered there), used by every search. While
victims are taken in order, another team's gang is skipped once its team no longer borrows (Kueue's
minimalPreemptions), so reclaim takes back only what was lent, lowest priority first.

Search. When capacity (not quota) is what is missing, victims are chosen per topology domain (a node,
clique, rack, zone, as admission would place the gang): each domain's candidates in order until its
estimated room holds the gang; the cheapest domain set wins, tightest level first. Otherwise the
shortest feasible prefix of the order is found by bisection. Either way the set is then made
minimal: victims are given back, last taken first (Kueue's fillBackWorkloads), while the gang still
fits. A cheap room estimate rules out hopeless sets before a full placement is tried.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from airflow_gpu.constants import TIER_INTERACTIVE
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import GangDecision, accepted_products, admit, only_products, restricted
from airflow_gpu.core.model import Gang, Placement, RunningGang, TopologyLevel
from airflow_gpu.core.quota import (
    Demand,
    QuotaBook,
    QuotaKey,
    QuotaUsage,
    borrowing,
    demand_of_placements,
    demand_on_product,
)
from airflow_gpu.core.room import RoomEstimate
from airflow_gpu.core.topology import members_per_node

if TYPE_CHECKING:
    from airflow_gpu.core.reservation import Reservation


@dataclass(frozen=True)
class PreemptionPolicy:
    non_preemptible_tiers: frozenset[str] = field(default_factory=lambda: frozenset({TIER_INTERACTIVE}))
    never_preempting_tiers: frozenset[str] = frozenset()  # PriorityClass preemptionPolicy: Never
    # tiers whose gangs, while their team borrows, take other teams' borrowers of lower priority
    # (Kueue's borrowWithinCohort for the tier; a team's own TeamQuota.borrow_within_cohort wins)
    borrow_within_cohort_tiers: frozenset[str] = frozenset()
    # tiers whose gangs may seek a plan behind another gang's reservation (core.queue.schedule_cycle)
    preempt_behind_head_tiers: frozenset[str] = frozenset()
    # (tier, seconds): a gang of the tier running for less is no victim (core.tiers.min_runtimes)
    min_runtime: tuple[tuple[str, float], ...] = ()
    # tiers whose minimum runtime does not protect from reclaim of borrowed quota
    reclaim_ignores_min_runtime_tiers: frozenset[str] = frozenset()

    def min_runtime_of(self, tier: str) -> float:
        """Seconds a gang of `tier` runs before it may be a preemption victim (0: at once)."""
        for name, seconds in self.min_runtime:
            if name == tier:
                return seconds
        return 0.0

    def with_never_preempting(self, tiers: Iterable[str]) -> PreemptionPolicy:
        """This policy with `tiers` never preempting too: a tier whose PriorityClass says
        preemptionPolicy: Never, as kube-scheduler honours it."""
        extra = frozenset(tiers)
        if extra <= self.never_preempting_tiers:
            return self
        return replace(self, never_preempting_tiers=self.never_preempting_tiers | extra)


def protected(rg: RunningGang, now: float, policy: PreemptionPolicy, reclaim: bool = False) -> bool:
    """Younger than its tier's minimum runtime: not a victim, unless `reclaim` (another team takes
    back its guarantee from this borrower) and the tier lets reclaim ignore the minimum runtime."""
    young = now - rg.started_at < policy.min_runtime_of(rg.gang.tier)
    return young and not (reclaim and rg.gang.tier in policy.reclaim_ignores_min_runtime_tiers)


def head_takes_back(state: CycleState, res: Reservation, gang: Gang, now: float, policy: PreemptionPolicy) -> bool:
    """Whether `gang`, admitted now onto the head of line's reserved nodes, is work the head can take
    back by preemption when it can start (res.start), so the reservation's idle GPUs compute meanwhile
    and the head is delayed by no more than a SIGTERM checkpoint: preemptible, checkpointable, of
    lower priority, past its tier's minimum runtime by then, and a head whose tier preempts and that
    asks no more than its team's nominal quota (a head beyond it only borrows: attempts() gives it no
    candidates). Another team's backfill must also borrow (head_takes_back_admitted, once admitted):
    only a borrower is a victim across teams."""
    head = res.gang
    if not (gang.preemptible and gang.checkpointable and gang.priority < head.priority):
        return False
    if gang.tier in policy.non_preemptible_tiers or head.tier in policy.never_preempting_tiers:
        return False
    if now + policy.min_runtime_of(gang.tier) > res.start:
        return False
    return not beyond_nominal(state, head, policy)


def head_takes_back_admitted(state: CycleState, res: Reservation, decision: GangDecision) -> bool:
    """head_takes_back's second half, once the admission is known: a backfill admitted onto the
    head's reserved nodes stays a preemption candidate of the head: same team, no quota book, or
    (another team) admitted on borrowed quota while the head's team is under its guarantee (Kueue's
    reclaim). Off the reserved nodes any admission is fine."""
    if not {p.node for p in decision.placements} & res.nodes:
        return True
    if state.book is None or decision.gang.team == res.gang.team:
        return True
    return decision.borrowed and under_guarantee(state, res.gang)


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
    restart_gpu_seconds: float = 0.0  # what restarting the victims will cost (RunningGang.restart_cost)

    @property
    def victim_names(self) -> tuple[str, ...]:
        return tuple(v.gang.name for v in self.victims)


def effective_priority(running: RunningGang, quota: QuotaBook | None) -> int:
    return quota.effective_priority(running) if quota is not None else running.gang.priority


def victim_order(preemptor: Gang, now: float):
    """The sort key of a preemption candidate, cheapest to lose first (Kueue's CandidatesOrdering,
    with the house rule of docs/DESIGN.md: never a non-checkpointable victim while a checkpointable
    alternative exists):
    1. other teams' gangs (borrowers taken back) before the preemptor's own team;
    2. checkpointable before non-checkpointable (DESIGN.md; Kueue has no such notion);
    3. lower priority first (the gang's own priority, whatever quota it was admitted on);
    4. fewer GPU-seconds lost: since the last checkpoint, plus the restart overhead it will pay
       (RunningGang.preemption_cost);
    5. most recently started first (Kueue: most recently admitted), then most recently created;
    6. admitted on borrowed quota first (ties of second-resolution API timestamps: the gang admitted
       last, as the borrower);
    7. the name, for a deterministic order."""

    def key(rg: RunningGang):
        return (rg.gang.team == preemptor.team, not rg.gang.checkpointable, rg.gang.priority,
                rg.preemption_cost(now), -rg.started_at, -rg.gang.created_at, not rg.borrowed, rg.gang.name)

    return key


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


def product_demands(state: CycleState, gang: Gang) -> list[Demand]:
    """The gang's quota demand on each product it accepts (Kueue's flavors), preference order."""
    return [d for _, d in _labelled_demands(state, gang)]


def _labelled_demands(state: CycleState, gang: Gang) -> list[tuple[str, Demand]]:
    book = state.book
    if book is None:
        return []
    out = ((p, demand_on_product(gang, book.product(p), book.weight(p), p))
           for p in accepted_products(state.snap, gang, book))
    return [(p, d) for p, d in out if d]


def within_nominal_products(state: CycleState, gang: Gang, threshold: int | None = None) -> list[str] | None:
    """Kueue's rule (flavorassigner fitsResourceQuota): a workload may preempt on a flavor only if
    its own request fits within the nominal quota there, unless it may preempt while borrowing
    (borrowWithinCohort). The accepted products where the gang may preempt; None: everywhere (no
    quota book, no GPU demand, borrowWithinCohort, or the team's preempt_beyond_nominal)."""
    book = state.book
    tq = book.team(gang.team) if book is not None else None
    if tq is None or threshold is not None or tq.preempt_beyond_nominal:
        return None
    labelled = _labelled_demands(state, gang)
    if not labelled:
        return None
    ok = [p for p, d in labelled if all(v <= tq.n(k) for k, v in d.items())]
    return None if len(ok) == len(labelled) else ok


def beyond_nominal(state: CycleState, gang: Gang, policy: PreemptionPolicy) -> bool:
    """Larger than its team's nominal quota on every product it accepts: it waits to borrow and never
    preempts (Kueue)."""
    return within_nominal_products(state, gang, _borrow_threshold(state, gang, policy)) == []


def _borrow_threshold(state: CycleState, gang: Gang, policy: PreemptionPolicy) -> int | None:
    """borrowWithinCohort: the team's threshold, else the tier's (any lower priority), else None."""
    tq = state.book.team(gang.team) if state.book is not None else None
    threshold = tq.borrow_within_cohort if tq is not None else None
    if threshold is None and gang.tier in policy.borrow_within_cohort_tiers:
        threshold = gang.priority - 1
    return threshold


def under_guarantee(state: CycleState, gang: Gang) -> bool:
    """The team uses less than its guarantee now on every key the gang needs, for some accepted
    product (Kueue's queueUnderNominalInResourcesNeedingPreemption): it may try reclaim, and must then
    fit within the guarantee once its victims (its own lower-priority gangs among them) are gone."""
    if state.book is None or state.usage is None:
        return False
    tq = state.book.team(gang.team)
    if tq is None:
        return False
    return any(all(state.usage.of(gang.team, k) < tq.n(k) for k in d) for d in product_demands(state, gang))


def team_borrows(running: RunningGang, quota: QuotaBook | None, usage: QuotaUsage | None,
                 node_product: dict[str, str | None]) -> bool:
    """Its team uses more than its guarantee, now, on a key the gang holds (Kueue checks the
    ClusterQueue's usage, not how the workload was admitted)."""
    if quota is None or usage is None:
        return False
    return borrowing(quota, usage, running.gang.team, demand_of_placements(running.placements, node_product, quota))


@dataclass(frozen=True)
class Attempt:
    """One candidate list to search, and whether the preemptor may borrow once admitted."""

    candidates: tuple[RunningGang, ...]
    allow_borrowing: bool


def attempts(state: CycleState, gang: Gang, now: float,
             policy: PreemptionPolicy = PreemptionPolicy()) -> list[Attempt]:
    """The candidate lists to try, in order (see the module docstring)."""
    book = state.book
    if beyond_nominal(state, gang, policy):
        return []
    threshold = _borrow_threshold(state, gang, policy)
    by_priority = gang.tier not in policy.never_preempting_tiers
    reclaim = under_guarantee(state, gang)
    keys: set[QuotaKey] = {k for d in product_demands(state, gang) for k in d}
    own, others = [], []
    lender: dict[str, bool] = {}  # team -> in the preemptor's cohort and borrowing on `keys` now
    name, team_of, priority = gang.name, gang.team, gang.priority
    shielded = policy.non_preemptible_tiers
    aging = bool(policy.min_runtime)
    for rg in state.running:  # every running gang (tens of thousands at scale): plain locals
        g = rg.gang
        if g.name == name or not g.preemptible or g.tier in shielded:
            continue
        team = g.team
        if book is None or team == team_of:
            if by_priority and effective_priority(rg, book) < priority and not (aging and protected(rg, now, policy)):
                own.append(rg)
            continue
        borrows = lender.get(team)
        if borrows is None:
            borrows = lender[team] = same_cohort(book, team, team_of) and state.borrowing(team, keys)
        if not borrows or (aging and protected(rg, now, policy, reclaim)):
            continue
        if reclaim:
            others.append(rg)
        elif threshold is not None and by_priority and g.priority < priority and g.priority <= threshold:
            others.append(rg)
    # one sort (each key computed once); the own team's list is its subsequence (the keys are unique)
    everyone = tuple(sorted(own + others, key=victim_order(gang, now)))
    if not others:
        return [Attempt(everyone, True)] if own else []
    if threshold is not None:
        return [Attempt(everyone, True)]
    out = [Attempt(everyone, False)]
    if own:
        out.append(Attempt(tuple(rg for rg in everyone if rg.gang.team == team_of), True))
    return out


def candidates(state: CycleState, gang: Gang, now: float,
               policy: PreemptionPolicy = PreemptionPolicy()) -> list[RunningGang]:
    """Every running gang `gang` may preempt in some attempt, in victim order."""
    seen: dict[str, RunningGang] = {}
    for a in attempts(state, gang, now, policy):
        for rg in a.candidates:
            seen.setdefault(rg.gang.name, rg)
    return sorted(seen.values(), key=victim_order(gang, now))


def valid_order(state: CycleState, gang: Gang, victims: Iterable[RunningGang],
                keys: set[QuotaKey]) -> list[RunningGang]:
    """`victims` in order, dropping another team's gang once its team no longer borrows with the
    earlier ones gone (Kueue's minimalPreemptions). Quota only: cheap."""
    if state.usage is None:
        return list(victims)
    usage = state.usage.copy()
    out = []
    for v in victims:
        if v.gang.team != gang.team:
            if not borrowing(state.book, usage, v.gang.team, keys):
                continue
            # only other teams' usage is read again (the preemptor's own gangs are always valid)
            usage.remove(v.gang.team, state.demand_of(v))
        out.append(v)
    return out


@dataclass(frozen=True)
class CandidateRoom:
    """The candidates' pods on the gang's eligible nodes as columns (from the shape's cached rows:
    no name resolved per pod), and the room per node with every candidate gone: no victim set
    opens more, so when no domain holds the gang by `ceiling`, no plan exists."""

    rows: list
    spot_cand: np.ndarray  # [k] candidate index of each placement on an eligible node
    spot_node: np.ndarray  # [k] its node
    ceiling: np.ndarray  # [N] RoomEstimate.fit_all with every candidate gone

    @classmethod
    def of(cls, room: RoomEstimate, cands: list[RunningGang]) -> CandidateRoom:
        snap, eligible = room.snap, room.eligible
        rows = snap.shape.rows_of(cands)
        spot = np.fromiter(chain.from_iterable(r.flat_spots for r in rows), dtype=np.int64).reshape(-1, 3)
        share = np.fromiter(chain.from_iterable(r.flat_shares for r in rows), dtype=np.int64).reshape(-1, 3)
        on = eligible[spot[:, 0]]
        spot_cand = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r.nodes) for r in rows])[on]
        spot, share = spot[on], share[eligible[share[:, 0]]]
        gpu, cpu, mem = snap.gpu_free.copy(), snap.cpu_free.copy(), snap.mem_free.copy()
        np.add.at(cpu, spot[:, 0], spot[:, 1])
        np.add.at(mem, spot[:, 0], spot[:, 2])
        np.add.at(gpu, (share[:, 0], share[:, 1]), share[:, 2])
        return cls(rows, spot_cand, spot[:, 0], room.fit_all(cpu, mem, gpu))


def domain_prefixes(room: RoomEstimate, cands: list[RunningGang], now: float, released: CandidateRoom,
                    per_level: int = 3) -> Iterator[list[RunningGang]]:
    """Per topology level (tightest first), the cheapest victim sets that make room in one domain:
    each domain's candidates taken in victim order until its estimated room holds the gang.
    Lazily, level by level: a caller that stops at the first set that works never pays for the
    looser levels. `released`: CandidateRoom.of(room, cands).

    Only domains that could hold the gang with every candidate in them gone are walked (free plus
    preemptible capacity, one vectorised pass), and a walk stops once its set already costs more
    than the per_level-th cheapest found: the result is the same as walking every domain."""
    snap = room.snap
    base_fit = members_per_node(snap, room.gang, room.by_set)
    eligible = room.eligible.tolist()  # read per placement: a list index is cheaper than numpy's
    rows, spot_cand_a, spot_node_a, ceiling = released.rows, released.spot_cand, released.spot_node, released.ceiling
    # A set's cost: non-checkpointable victims first (never one while a checkpointable set would
    # do), then the last candidate it needs in victim order, then GPU-seconds lost (computed for
    # the candidates a walk reaches only).
    stuck_of = [not c.gang.checkpointable for c in cands]
    gpu_free, cpu_free, mem_free = snap.gpu_free, snap.cpu_free, snap.mem_free
    for level in room.levels:
        ids = room.ids(level)
        known = ids >= 0
        if level is TopologyLevel.NODE:
            open_ = ceiling >= room.want
            spaces = base_fit
        else:
            size = int(ids.max()) + 1 if known.any() else 0
            sums = np.bincount(ids[known], weights=ceiling[known], minlength=size)
            open_ = np.zeros(len(ids), dtype=bool)
            open_[known] = sums[ids[known]] >= room.want
            spaces = np.bincount(ids[known], weights=base_fit[known], minlength=size).astype(np.int64)
        ids_list = ids.tolist()
        by_domain = _candidates_by_domain(spot_cand_a, spot_node_a, ids, open_)
        found: list[tuple[tuple, list[int]]] = []
        bar: tuple | None = None  # (non-checkpointable count, last index) of the per_level-th best
        for d in sorted(by_domain, key=lambda d: by_domain[d][0]):
            cis = by_domain[d]
            if bar is not None and (stuck_of[cis[0]], cis[0]) > bar:
                continue  # its first candidate already costs more than per_level sets found
            space = int(spaces[d])
            rows_d: dict[int, list] = {}
            fits: dict[int, int] = {}
            taken: list[int] = []
            stuck = 0
            for ci in cis:
                stuck += stuck_of[ci]
                if bar is not None and (stuck, ci) > bar:
                    break  # costs more than per_level sets found already, whatever follows
                taken.append(ci)
                touched = set()
                for n, shares, cpu, mem in rows[ci].spots:
                    if ids_list[n] != d or not eligible[n]:
                        continue
                    r = rows_d.get(n)
                    if r is None:
                        r = rows_d[n] = [gpu_free[n].tolist(), int(cpu_free[n]), int(mem_free[n])]
                    for g, milli in shares:
                        r[0][g] += milli
                    r[1] += cpu
                    r[2] += mem
                    touched.add(n)
                for n in touched:
                    before = fits.get(n, int(base_fit[n]))
                    fits[n] = room.fit_one(*rows_d[n], n)
                    if level is not TopologyLevel.NODE:
                        space += fits[n] - before
                if level is TopologyLevel.NODE:
                    space = max(fits.values(), default=0)
                if space >= room.want:
                    lost = sum(cands[i].preemption_cost(now) for i in taken)
                    key = (stuck, ci, lost, len(taken), d)
                    found.append((key, taken))
                    if len(found) >= per_level:
                        found.sort(key=lambda kv: kv[0])
                        del found[per_level:]
                        bar = found[-1][0][:2]
                    break
        found.sort(key=lambda kv: kv[0])
        for _, taken in found[:per_level]:
            yield [cands[i] for i in taken]


def _candidates_by_domain(spot_cand: np.ndarray, spot_node: np.ndarray, ids: np.ndarray,
                          open_: np.ndarray) -> dict[int, list[int]]:
    """Domain id -> the candidates (indices, ascending) with a placement on one of its open nodes."""
    keep = open_[spot_node]
    cand, dom = spot_cand[keep], ids[spot_node[keep]]
    if not len(cand):
        return {}
    order = np.lexsort((cand, dom))
    cand, dom = cand[order], dom[order]
    first = np.r_[True, (dom[1:] != dom[:-1]) | (cand[1:] != cand[:-1])]  # one row per (domain, candidate)
    cand, dom = cand[first], dom[first]
    starts = np.flatnonzero(np.r_[True, dom[1:] != dom[:-1]]).tolist()
    ends = starts[1:] + [len(dom)]
    cand_list, dom_list = cand.tolist(), dom.tolist()
    return {dom_list[s]: cand_list[s:e] for s, e in zip(starts, ends)}


class _Feasibility:
    """Would `gang` be admitted if `victims` were gone? Memoised per victim set.

    Victim sets tried one after another differ by few gangs (bisection, then giving victims back
    one at a time), so each what-if state is built from the nearest one built before: release the
    extra victims, restore the ones given back. At 50,000 running pods this is what keeps planning
    in milliseconds rather than re-releasing the whole set every time."""

    KEEP = 8  # what-if states kept to build from

    def __init__(self, state: CycleState, gang: Gang, profile: Profile, exclude, allow_borrowing: bool):
        self.state, self.gang, self.profile, self.exclude = state, gang, profile, exclude
        self.allow_borrowing = allow_borrowing
        self.memo: dict[frozenset[str], GangDecision | None] = {}
        self.room: RoomEstimate | None = None  # set once the candidates are known
        self.built: dict[frozenset[str], tuple[tuple[RunningGang, ...], CycleState]] = {}

    def _work(self, key: frozenset[str], victims: Sequence[RunningGang]) -> CycleState:
        cost = lambda gangs: sum(len(g.placements) for g in gangs)  # noqa: E731
        base, release, restore = None, list(victims), []
        best = cost(victims)
        for done, (done_victims, work) in self.built.items():
            extra = [v for v in victims if v.gang.name not in done]
            back = [v for v in done_victims if v.gang.name not in key]
            c = cost(extra) + cost(back)
            if c < best:
                base, release, restore, best = work, extra, back, c
        work = (base if base is not None else self.state).capacity_view()
        for v in release:
            work.release(v)
        for v in restore:
            work.restore(v)
        if len(self.built) >= self.KEEP:
            self.built.pop(next(iter(self.built)))
        self.built[key] = (tuple(victims), work)
        return work

    def __call__(self, victims: Sequence[RunningGang]) -> GangDecision | None:
        key = frozenset(v.gang.name for v in victims)
        if key in self.memo:
            return self.memo[key]
        work = self._work(key, victims)
        if self.room is not None and not self.room.may_fit(work.snap):
            self.memo[key] = None  # admission would find no domain with room either
            return None
        # only an admitted decision is kept: its wait reason is never read
        decision = admit(work.snap, self.gang, self.profile, work.book, work.usage, self.exclude, explain=False)
        ok = decision if decision.admitted and (self.allow_borrowing or not decision.borrowed) else None
        self.memo[key] = ok
        return ok


def _search(state: CycleState, gang: Gang, profile: Profile, now: float, attempt: Attempt,
            exclude, room: RoomEstimate, keys: set[QuotaKey]) -> tuple[list[RunningGang], GangDecision] | None:
    """The minimal victim set of one attempt, or None."""
    feasible = _Feasibility(state, gang, profile, exclude, attempt.allow_borrowing)
    feasible.room = room
    cands = valid_order(state, gang, attempt.candidates, keys)
    if not cands:
        return None
    released = CandidateRoom.of(room, cands)
    if not room.holds(released.ceiling):
        return None  # not even with every candidate gone (an upper bound: admission agrees)
    ok = lambda vs: feasible(vs) if len(valid_order(state, gang, vs, keys)) == len(vs) else None  # noqa: E731
    demands = product_demands(state, gang)
    quota_short = bool(demands) and not any(state.check(gang.team, d).fits for d in demands)
    chosen: list[RunningGang] | None = None
    if not quota_short:
        # Capacity only: victims concentrated in one topology domain, the cheapest domain first.
        for prefix in domain_prefixes(room, cands, now, released):
            if ok(prefix) is not None:
                chosen = prefix
                break
    if chosen is None:
        if feasible(cands) is None:
            return None
        # Shortest feasible prefix of the order (bisection; room only grows).
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
    # Victims on none of the nodes the gang was placed on are most likely not needed: give them
    # back all at once (one placement), before the one-by-one pass (a placement each).
    chosen = _without_spares(chosen, feasible(chosen), ok)
    chosen = _give_back(chosen, ok)
    decision = feasible(chosen)
    assert decision is not None
    return chosen, decision


def _without_spares(chosen: list[RunningGang], decision: GangDecision, ok) -> list[RunningGang]:
    """`chosen` less the victims most likely not needed, in a few placements: those on the nodes the
    gang was placed on are kept, of the others only the shortest prefix (victim order, bisection)
    that still lets the gang in (quota may need more victims than capacity does). The caller's
    one-by-one pass then makes the set minimal."""
    used = {p.node for p in decision.placements}
    on_used = {v.gang.name for v in chosen if any(p.node in used for p in v.placements)}
    others = [v for v in chosen if v.gang.name not in on_used]
    if not others:
        return chosen

    def with_prefix(k: int) -> list[RunningGang]:
        keep = on_used | {v.gang.name for v in others[:k]}
        return [v for v in chosen if v.gang.name in keep]

    lo, hi = 0, len(others)  # with_prefix(hi) is chosen itself
    while lo < hi:
        mid = (lo + hi) // 2
        if with_prefix(mid) and ok(with_prefix(mid)) is not None:
            hi = mid
        else:
            lo = mid + 1
    best = with_prefix(lo)
    return best if best and (lo == len(others) or ok(best) is not None) else chosen


def _give_back(chosen: list[RunningGang], ok) -> list[RunningGang]:
    """Give back victims not needed, last taken first, until no single one can be spared (Kueue's
    fillBackWorkloads). Runs of victims are tried first, halving the run each pass (a long set
    that needs few victims costs about log placements per victim kept, not one per victim)."""
    run = max(1, len(chosen) // 4)
    while True:
        changed = False
        end = len(chosen)
        while end > 0 and len(chosen) > 1:
            start = max(0, end - run)
            rest = chosen[:start] + chosen[end:]
            if rest and ok(rest) is not None:
                chosen = rest
                changed = True
            end = start
        if run > 1:
            run //= 2
        elif not changed:
            return chosen


def _narrowed(tries: list[Attempt], room: RoomEstimate) -> list[Attempt]:
    """Each attempt first with only the candidates that free nodes the gang may use (Kueue: those on
    the flavor that needs preemption), then with all. Otherwise a borrower on nodes the gang may not
    use (spot, for work that must stay on-demand) could be taken first, and the borrowing team would
    then no longer borrow: the gang would wait forever behind the borrower it could have displaced."""
    rows_of = room.snap.shape.rows_of
    eligible = set(np.flatnonzero(room.eligible).tolist())
    out = []
    for a in tries:
        useful = tuple(c for c, r in zip(a.candidates, rows_of(a.candidates)) if not eligible.isdisjoint(r.nodes))
        if useful and len(useful) < len(a.candidates):
            out.append(Attempt(useful, a.allow_borrowing))
        out.append(a)
    return out


def plan_preemption(state: CycleState, gang: Gang, profile: Profile, now: float,
                    policy: PreemptionPolicy = PreemptionPolicy(),
                    exclude: np.ndarray | None = None,
                    refused: GangDecision | None = None) -> tuple[PreemptionPlan | None, str]:
    """The cheapest minimal set of running gangs whose removal lets `gang` be admitted.

    `state` holds every gang that takes capacity or quota; its `running` gangs are the candidates.
    `refused`: the caller's admission of `gang` on this very state and `exclude` that failed (it is
    not tried again). Returns (plan, "") or (None, why no plan).
    """
    if refused is not None and refused.admitted:
        raise ValueError(f"plan_preemption: gang {gang.name} was admitted, there is nothing to plan")
    tries = attempts(state, gang, now, policy)  # first: no candidates is the common no-plan, and cheap
    if tries and refused is None and _Feasibility(state, gang, profile, exclude, True)([]) is not None:
        return None, "fits without preemption"
    nominal = within_nominal_products(state, gang, _borrow_threshold(state, gang, policy))
    if nominal == []:
        return None, (f"asks more than team {gang.team}'s nominal quota on every product it accepts: only a gang "
                      f"within its nominal quota may preempt (Kueue); it may borrow idle quota")
    if nominal is not None:
        # preempt only where it is within its nominal quota; the plan is for the gang as it is
        plan, why = plan_preemption(state, only_products(gang, nominal), profile, now, policy, exclude, refused)
        return (replace(plan, gang=gang) if plan is not None else None), why
    if not tries:
        also = " and no borrower in its cohort" if under_guarantee(state, gang) else ""
        return None, f"no preemptible gang of lower priority than {gang.priority}{also} to make room"
    prof = profile if exclude is None else restricted(profile, ~exclude, "reserved")
    room = RoomEstimate.for_gang(state.snap, gang, prof)
    keys = {k for d in product_demands(state, gang) for k in d}
    for attempt in _narrowed(tries, room):
        found = _search(state, gang, profile, now, attempt, exclude, room, keys)
        if found is None:
            continue
        chosen, decision = found
        victims = tuple(sorted(chosen, key=victim_order(gang, now)))
        lost = sum(v.gpu_seconds_at_risk(now) for v in victims)
        reclaim = any(v.gang.team != gang.team for v in victims)
        restart = sum(v.restart_cost() for v in victims)
        return PreemptionPlan(gang, victims, decision.placements, lost, decision.borrowed, reclaim, restart), ""
    n = len({rg.gang.name for a in tries for rg in a.candidates})
    return None, f"stopping all {n} preemptible gangs of lower priority or borrowing would not make room"
