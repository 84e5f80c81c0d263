"""The queue of pending gangs and one scheduling cycle over it (Kueue's queue / scheduler split).

API: `Queue(profile, policy, backoff, hold, no_plan, starts).cycle(state, pending, now)` where
`state` is a core.cycle.CycleState (capacity and quota usage of every running, terminating and held
gang; build it with `CycleState.build(snap, running, book, held=..., terminating=...)`): one cycle,
booked in the queue's back-off, memos and reservation hold (the scheduler and the replay call it).
`schedule_cycle(state, pending, profile, now, policy, backoff, ...)` is the cycle alone: it returns a
CycleResult and changes nothing passed in. Its steps, as Kueue's schedule(): order, admit (or
reserve: the head of line), backfill behind the reservation, plan a preemption behind the head.

Order: priority (high first), then creation time, then name (Gang.queue_key; tiers with a wait
bound by due time in one band: core.tiers.wait_bands). A cycle admits gangs in that order on a
working copy of the cycle state: each admission and each planned nomination counts against its
team's quota for every later gang of the cycle. The first refused gang that preemption can serve,
or that lacks capacity, is the head of line:

1. if core.preemption finds a plan (capacity, or quota: the team's own lower-priority gangs, reclaim
   from borrowers), the plan's nodes are reserved for it (nothing else may land there while the
   victims leave) and its quota counts at once, the victims' until they are gone (CycleState.nominate);
2. otherwise, if capacity blocks it, its earliest start is estimated (EASY backfilling): running
   gangs are released in order of expected end (Gang.expected_duration; unknown = never) on a copy
   until the head fits; the nodes of that future placement are reserved until then.

Every later gang may still be admitted this cycle (backfill), but only outside the reserved nodes,
unless its own expected duration ends before the head's estimated start. So a backfilled gang
never takes capacity the head is waiting for, and the head is never delayed by smaller work (as far
as the duration estimates hold). Quota-blocked gangs without a plan do not become head: waiting on
their own team's quota, they must not hold capacity other teams could use. One head, one plan per
cycle: the caller holds the plan (the scheduler writes it on the PodGroup), so the next cycle serves
the next head - k independent heads take k cycles (bench gang_decision measures it).

Behind the head (tier rule `preempt_behind_head`, PreemptionPolicy.preempt_behind_head_tiers; off by
default): while the head holds a capacity reservation (no plan of its own), the first refused gang
of each team whose ask is not known to have no plan searches a preemption plan that leaves the
reserved nodes alone (placement off them). Kueue considers every ClusterQueue's head in every cycle,
and with BestEffortFIFO an inadmissible head does not block the workloads behind it; here a head that
no preemption can serve would otherwise keep every gang behind it from preempting for as long as it
waits. Still at most one plan per cycle; its nodes are closed to the rest of the cycle, and the head
keeps its reservation. A gang that would search such a plan is never skipped by the back-off: room
is not what it waits for.

A gang of higher priority than the head (only a wait bound puts a lower-priority head ahead of
it: core.tiers.wait_bands) may plan behind it whatever its tier says (`outranks_head`).

Back-off and queueing hints: core.backoff. The head's reservation: core.reservation; the estimated
starts published for every waiting gang: core.estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from airflow_gpu.core.backoff import Backoff, FitMasks, NoPlanMemo, Refusal, RefusedAsks
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import BLOCKED_CAPACITY, GangDecision, QuotaAnswers, admit
from airflow_gpu.core.model import Gang, PodRequest, RunningGang
from airflow_gpu.core.preemption import (PreemptionPlan, PreemptionPolicy, head_takes_back, head_takes_back_admitted,
                                         plan_preemption)
from airflow_gpu.core.reservation import Reservation, ReservationHold, StartMemo, estimate_start, node_mask
from airflow_gpu.core.snapshot import Snapshot


def queue_order(pending: Iterable[Gang]) -> list[Gang]:
    """Priority first, then first come first served; the name breaks exact ties deterministically."""
    return sorted(pending, key=QUEUE_KEY)


QUEUE_KEY = attrgetter("queue_key")  # kept on the gang: a cycle over a long backlog sorts it every time


@dataclass
class CycleResult:
    admitted: list[GangDecision] = field(default_factory=list)
    preemptions: list[PreemptionPlan] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # gang name -> wait reason (tried this cycle)
    cut: bool = False  # stopped at its admission limit: the gangs after the last admitted were not tried
    reservation: Reservation | None = None
    deferred: list[str] = field(default_factory=list)  # gangs skipped in back-off (last reason stands)
    refusals: dict[str, Refusal] = field(default_factory=dict)  # gang name -> what it was refused under


def outranks_head(head: Gang, gang: Gang, policy: PreemptionPolicy) -> bool:
    """`gang` has a higher priority than the head of line ahead of it: only a wait bound puts one
    there (an overdue gang of a lower tier, core.tiers.wait_bands). The head never preempts `gang`,
    so it does not keep `gang` from preempting either: `gang` may search a plan behind it, off its
    reserved nodes, whatever its tier's preempt_behind_head says (a tier that preempts keeps doing
    so; without it, an overdue sweep would hold serving work behind it for as long as it waits)."""
    return head.priority < gang.priority and gang.tier not in policy.never_preempting_tiers


def _fits_somewhere(snap: Snapshot, gang: Gang, nodes: np.ndarray) -> bool:
    """Whether some member's resources fit on one of `nodes` (a mask). When none does, opening those
    nodes changes nothing for the gang, so the admission refused without them needs no second try."""
    return any(bool((snap.fit_mask(ps.request) & nodes).any()) for ps in gang.pod_sets)


def _set_fitting_nowhere(snap: Snapshot, gang: Gang) -> PodRequest | None:
    """A member whose resources fit on no node of `snap` (so the gang cannot be placed), else None."""
    for ps in gang.pod_sets:
        if not snap.fit_mask(ps.request).any():
            return ps.request
    return None


def _preempting(plan: PreemptionPlan) -> str:
    whom = "of lower priority or borrowing in the cohort" if plan.reclaim else "of lower priority"
    return f"preempting {len(plan.victims)} gang(s) {whom}: {', '.join(plan.victim_names)}"


def _when(start: float, now: float) -> str:
    return "when gangs of unknown duration end" if math.isinf(start) else f"in ~{max(0.0, start - now):.0f} s"


def schedule_cycle(state: CycleState, pending: Iterable[Gang], profile: Profile, now: float,
                   policy: PreemptionPolicy = PreemptionPolicy(),
                   backoff: Backoff | None = None, no_plan: NoPlanMemo | None = None,
                   hold: ReservationHold | None = None, explain: bool = True,
                   starts: StartMemo | None = None, limit: int | None = None) -> CycleResult:
    """Admit what can start now, plan at most one preemption, hold one reservation. Changes nothing
    passed in (`backoff` is read, its refusals brought up to date by Backoff.ready; Backoff.record
    books the result; `no_plan` is added to, see NoPlanMemo; `hold` bounds reservations of unknown
    start and is only read: ReservationHold.record books the result; Queue.cycle does both).
    `state` (core.cycle) holds every gang that takes capacity or quota: running, terminating and held
    plans. explain=False: a gang kept off the reservation is not placed a second time only to say
    that it "would delay" the head, and capacity reasons name the member that does not fit without
    counting nodes per filter (a caller that shows no wait reasons, the replay; the decisions are the
    same). `starts`: a StartMemo kept across cycles (same estimates, fewer placements). `limit`: at
    most this many admissions (the scheduler's room to bind); once reached the rest of the queue is
    not tried (no wait reason, no back-off, no reservation, no plan: result.cut), the next cycle goes
    on with it. None (the replay): no limit.

    The steps, like Kueue's schedule(): order the queue; until a head of line holds a reservation,
    admit each gang or make it the head (reserve: a preemption plan, or its estimated start); behind
    it, backfill each gang off the reserved nodes (or plan a preemption behind the head)."""
    cycle = _Cycle(state, profile, now, policy, no_plan, explain)
    for gang in queue_order(pending):
        if limit is not None and len(cycle.result.admitted) >= limit:
            cycle.result.cut = True
            break
        if cycle.result.reservation is None:
            cycle.admit_or_reserve(gang, hold, starts)
        else:
            cycle.backfill(gang, backoff)
    return cycle.result


class _Cycle:
    """One cycle's working state: a copy of the cycle state that each admission and nomination
    changes, the result so far, and what the cycle learnt on the way (asks refused, fit masks and
    quota answers of the working state as it is, asks without a preemption plan)."""

    def __init__(self, state: CycleState, profile: Profile, now: float, policy: PreemptionPolicy,
                 no_plan: NoPlanMemo | None, explain: bool):
        self.work = state.copy()
        self.running = list(state.running)
        self.profile, self.now, self.policy, self.explain = profile, now, policy, explain
        self.result = CycleResult()
        self.started: list[RunningGang] = []  # admitted this cycle: they hold capacity until their own end
        self.reserved: np.ndarray | None = None  # the reservation's nodes
        self.refused = RefusedAsks(by_team=state.book is not None)
        self.no_plan = no_plan if no_plan is not None else NoPlanMemo()
        self.fits = FitMasks()  # of work.snap as it is: cleared whenever the cycle changes it
        self.quota_answers = QuotaAnswers()  # quota checks of work.usage as it is (it knows when that changes)
        self.nominated: np.ndarray | None = None  # nodes of a plan made behind the head: closed to later gangs
        self.nominated_nodes: frozenset[str] = frozenset()
        self.searched_teams: set[str] = set()  # teams that searched a plan behind the head in this cycle

    # --- admit ------------------------------------------------------------------------------
    def admit(self, gang: Gang, exclude: np.ndarray | None) -> GangDecision:
        work = self.work
        return admit(work.snap, gang, self.profile, work.book, work.usage, exclude, self.quota_answers, self.explain)

    def take(self, decision: GangDecision) -> None:
        """An admission holds its placement: held, not running, so it is no preemption candidate in
        this cycle."""
        gang, work = decision.gang, self.work
        work.hold(gang.team, decision.placements)
        self.fits.clear()
        self.started.append(RunningGang(gang, decision.placements, self.now, borrowed=decision.borrowed,
                                        speed=work.speed(decision.placements)))
        self.result.admitted.append(decision)

    def wait(self, gang: Gang, reason: str, quota_products: frozenset[str],
             kept_off: frozenset[str] = frozenset()) -> None:
        self.result.waiting[gang.name] = reason
        self.result.refusals[gang.name] = Refusal(tuple(ps.request for ps in gang.pod_sets), kept_off,
                                                  quota_products, self.profile.filters)

    def admit_or_reserve(self, gang: Gang, hold: ReservationHold | None, starts: StartMemo | None) -> None:
        """Before any reservation: admit the gang, else it may become the head of line (reserve)."""
        if self.no_plan.failed(gang):
            covered = self.refused.covering(gang, False)
            if covered is not None:  # no room, no plan and no reservation for this ask in this cycle
                self.wait(gang, *covered)
                return
        decision = self.admit(gang, None)
        if decision.admitted:
            self.take(decision)
            return
        if decision.blocked_by == BLOCKED_CAPACITY:
            self.refused.add(gang, False, decision.reason, quota_products=decision.quota_products)
        self.wait(gang, self.reserve(gang, decision, hold, starts), decision.quota_products)

    # --- reserve ----------------------------------------------------------------------------
    def reserve(self, gang: Gang, decision: GangDecision, hold: ReservationHold | None,
                starts: StartMemo | None) -> str:
        """The first refused gang that preemption can serve, or that lacks capacity, is the head of
        line: a preemption plan (Kueue: a quota refusal may be solved by preemption too, the team's
        own lower-priority gangs or reclaim from borrowers, so every refused gang asks for one) or,
        when capacity blocks it, the nodes of its estimated start. Returns its wait reason."""
        reason, work, now = decision.reason, self.work, self.now
        plan = None
        if not self.no_plan.failed(gang):
            plan, _ = plan_preemption(work, gang, self.profile, now, self.policy, refused=decision)
            if plan is None:
                self.no_plan.add(gang)
        if plan is not None:
            self.result.preemptions.append(plan)
            self.result.reservation = Reservation(gang, frozenset(p.node for p in plan.placements), now,
                                                  plan.placements, by_preemption=True)
            self.reserved = self.result.reservation.mask(work.snap)
            # the nomination's quota counts at once (the victims' too, until they are gone); its
            # nodes are reserved
            work.nominate(gang.team, plan.placements, plan.victims)
            self.fits.clear()
            return f"{reason}; {_preempting(plan)}"
        if decision.blocked_by != BLOCKED_CAPACITY:
            return reason
        if hold is not None and not hold.may_reserve(gang.name, now):
            return f"{reason}; {hold.why(gang.name, now)}"
        if starts is not None:
            est = starts.estimate(work.snap, gang, self.running + self.started, self.profile, now)
        else:
            est = estimate_start(work.snap, gang, self.running + self.started, self.profile, now)
        if est is None:
            return reason
        self.result.reservation = est
        self.reserved = est.mask(work.snap)
        return f"{reason}; {len(est.nodes)} node(s) reserved, earliest start {_when(est.start, now)}"

    # --- backfill ---------------------------------------------------------------------------
    def backfill(self, gang: Gang, backoff: Backoff | None) -> None:
        """Behind the reservation: admit the gang off the reserved nodes (on them when it ends
        before the head starts, or when the head can take them back), else leave it waiting and let
        it plan a preemption behind the head."""
        res, now, work = self.result.reservation, self.now, self.work
        exclude = self.reserved if not res.lets_through(gang, now) else None
        lent = exclude is not None and not res.by_preemption and head_takes_back(work, res, gang, now, self.policy)
        if lent:
            exclude = None  # tried on every node; kept off the reserved ones unless the head can take it back
        kept_off = res.nodes if exclude is not None else frozenset()  # as a Refusal records it
        if self.nominated is not None:
            exclude = self.nominated if exclude is None else exclude | self.nominated
            kept_off = kept_off | self.nominated_nodes
        if backoff is not None and not self.may_plan_behind(gang, res) \
                and not backoff.ready(gang.name, now, kept_off, work.snap, self.fits):
            self.result.deferred.append(gang.name)  # (a gang that would search a plan is always tried)
            return
        covered = self.refused.covering(gang, exclude is not None)
        if covered is not None:
            # it fits no more than the ask that covers it, but may still plan where that one could
            # not (a production gang behind a refused best-effort one of its team): a refusal it
            # did not make takes no turn from it
            self.wait(gang, self.plan_behind(gang, res, covered.reason), covered.quota_products, kept_off)
            return
        short = _set_fitting_nowhere(work.snap, gang)
        if short is not None:  # no placement to try: a member fits on no node, reserved or not
            reason = f"member {short.name} does not fit: no node has the free CPU, memory and GPU it asks for"
            self.refused.add(gang, exclude is not None, reason)
            self.wait(gang, self.plan_behind(gang, res, reason), frozenset(), kept_off)
            return
        decision = self.admit(gang, exclude)
        if lent and decision.admitted and not head_takes_back_admitted(work, res, decision):
            exclude = self.reserved if self.nominated is None else self.reserved | self.nominated
            kept_off = res.nodes | self.nominated_nodes
            decision = self.admit(gang, exclude)
        if decision.admitted:
            self.take(decision)
            return
        reason = decision.reason
        delays = ""
        if self.explain and exclude is not None and _fits_somewhere(work.snap, gang, exclude) \
                and admit(work.snap, gang, self.profile, work.book, work.usage, answers=self.quota_answers).admitted:
            reason = delays = f"would delay {res.gang.name}, which holds {len(res.nodes)} node(s) " \
                              f"and starts {_when(res.start, now)}"
        if decision.blocked_by == BLOCKED_CAPACITY:
            self.refused.add(gang, exclude is not None, decision.reason, delays, decision.quota_products)
        behind = self.plan_behind(gang, res, reason, decision if exclude is self.reserved else None)
        self.wait(gang, behind, decision.quota_products, kept_off)

    # --- plan behind the head ---------------------------------------------------------------
    def may_plan_behind(self, gang: Gang, res: Reservation) -> bool:
        """Refused behind a capacity reservation, it would search a plan: the first of its team in
        this cycle whose ask is not known to have no plan (see the module docstring)."""
        return ((gang.tier in self.policy.preempt_behind_head_tiers or outranks_head(res.gang, gang, self.policy))
                and not res.by_preemption
                and not self.result.preemptions and gang.team not in self.searched_teams
                and not self.no_plan.failed(gang, ("behind", res.nodes)))

    def plan_behind(self, gang: Gang, res: Reservation, reason: str, refused: GangDecision | None = None) -> str:
        """A preemption plan off the reserved nodes (the head keeps its reservation); its nodes are
        closed to the rest of the cycle. `refused`: its admission off the reserved nodes, when that
        is what it was. Returns its wait reason."""
        if not self.may_plan_behind(gang, res):
            return reason
        where = ("behind", res.nodes)
        self.searched_teams.add(gang.team)
        plan, _ = plan_preemption(self.work, gang, self.profile, self.now, self.policy, exclude=self.reserved,
                                  refused=refused)
        if plan is None:
            self.no_plan.add(gang, where)
            return reason
        self.result.preemptions.append(plan)
        self.work.nominate(gang.team, plan.placements, plan.victims)
        self.fits.clear()
        self.nominated_nodes = frozenset(p.node for p in plan.placements)
        self.nominated = node_mask(self.work.snap, self.nominated_nodes)
        return f"{reason}; {_preempting(plan)}"


class Queue:
    """The pending gangs' queue across cycles (Kueue's queue manager + scheduler): it owns the
    back-off with its queueing hints (core.backoff.Backoff), the memo of asks with no preemption plan
    (NoPlanMemo), the bound on reservations of unknown start (ReservationHold) and the memo of head
    estimates (StartMemo), runs one cycle with them and books the cycle's result in them. The
    scheduler and the replay drive the same object; a memo left None is not kept across cycles.

    `profile` and `policy` may be replaced between cycles (the scheduler learns its profile and adds
    PriorityClasses' preemptionPolicy: Never to the policy). explain=False: see schedule_cycle."""

    def __init__(self, profile: Profile, policy: PreemptionPolicy = PreemptionPolicy(),
                 backoff: Backoff | None = None, hold: ReservationHold | None = None,
                 no_plan: NoPlanMemo | None = None, starts: StartMemo | None = None, explain: bool = True):
        self.profile, self.policy = profile, policy
        self.backoff = backoff if backoff is not None else Backoff()
        self.hold, self.no_plan, self.starts, self.explain = hold, no_plan, starts, explain

    def cycle(self, state: CycleState, pending: Sequence[Gang], now: float,
              policy: PreemptionPolicy | None = None, limit: int | None = None) -> CycleResult:
        """One scheduling cycle over `pending` on `state` (schedule_cycle), booked: gangs left
        waiting back off, admitted and preempting ones are forgotten, a reservation held without a
        known start counts towards its bound, and a changed running set clears the memo of asks
        without a plan. `policy`: this cycle's, when it differs from the queue's; `limit`: at most
        this many admissions (schedule_cycle)."""
        result = schedule_cycle(state, pending, self.profile, now, policy or self.policy, self.backoff,
                                self.no_plan, self.hold, self.explain, self.starts, limit)
        self.backoff.record(result, pending, now)
        if self.hold is not None:
            self.hold.record(result, now)
        if self.no_plan is not None and (result.admitted or result.preemptions):
            self.no_plan.reset()  # the running set changes: plans may exist now
        return result

    def room_appeared(self, snap: Snapshot, nodes: Sequence[int], quota_freed: Iterable[str] = ()) -> None:
        """Pods ended on `nodes` of `snap` (or a node came back), quota usage fell on the GPU products
        `quota_freed`: only the gangs this may help try again (Backoff.wake)."""
        self.backoff.wake(snap, nodes, quota_freed)
        if self.no_plan is not None:
            self.no_plan.reset()

    def reset(self) -> None:
        """Room may have appeared anywhere: every gang may try at once (Backoff.reset)."""
        self.backoff.reset()
        if self.no_plan is not None:
            self.no_plan.reset()
