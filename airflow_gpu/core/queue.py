"""The queue of pending gangs and one scheduling cycle over it (Kueue's queue / scheduler split).

API: `schedule_cycle(state, pending, profile, now, policy=PreemptionPolicy(), backoff=None)` where
`state` is a core.cycle.CycleState (capacity and quota usage of every running, terminating and held
gang; build it with `CycleState.build(snap, running, book, held=..., terminating=...)`). It returns a
CycleResult and changes nothing passed in.

Order: priority (high first), then creation time, then name. A cycle admits gangs in that order on a
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

Back-off (DESIGN.md: "timeout + exponential back-off, then report, never spin"): a gang that failed
to fit is not tried again until its back-off (Backoff: exponential, capped) has passed, unless the
cluster changed in a way that can make room (the caller calls Backoff.reset: a pod ended, a node
joined). A gang in back-off is skipped only once this cycle's reservation is taken: until then
every gang is tried, so the head of line is never skipped and never loses its reservation to a
gang behind it.

Queueing hints (kube-scheduler's QueueingHint): each refusal is kept with what it was refused
under (Refusal: its asks, the reserved nodes it was kept off, the GPU products quota limited it
on). A caller that knows where room appeared calls Backoff.wake instead of reset; the wake is
logged, and in the cycle `ready` reads the wakes since the gang's refusal: it is tried when usage
fell on one of its quota-limited products, or when a node that gained room, or a reserved node it
was kept off and is not now, has room for one of its members (static filters and resources)
outside this cycle's reservation. A gang that none of this reaches would be refused again: on the
nodes that did not gain, capacity only shrank. Gangs of one shape refused under the same wakes and
reservation share one answer per state of the cycle (FitMasks). The replay uses wake (same
decisions as waking every gang, tested); the scheduler still resets on every change.

Refused asks (RefusedAsks): within one cycle capacity only shrinks (admissions hold it, a
nomination's victims keep theirs), so once the reservation is taken, a gang whose ask is no smaller
than one already refused for capacity in this cycle (same team, same constraints, no fewer
excluded nodes) is left waiting without being placed again. The team is part of the ask because
quota decides which products a gang may be placed on; usage only grows within a cycle (a
nomination's victims keep their quota until they are gone). This keeps a cycle over a long backlog of similar asks
at about one placement per distinct ask instead of one per gang. After the reservation, a gang with
a member that fits on no node by resources (CPU, memory, GPU form: one vectorised test) is refused
without a placement, and the "would it fit without the reservation" test for the wait reason runs
only when a member fits on a reserved node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from airflow_gpu.constants import DEFAULT_RESERVATION_HOLD_SECONDS
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile, static_mask
from airflow_gpu.core.gang import BLOCKED_CAPACITY, GangDecision, QuotaAnswers, admit, place_gang
from airflow_gpu.core.model import Gang, HashedTuple, Placement, PodRequest, RunningGang
from airflow_gpu.core.preemption import PreemptionPlan, PreemptionPolicy, plan_preemption, under_guarantee
from airflow_gpu.core.room import RoomEstimate
from airflow_gpu.core.snapshot import OverCommitError, Snapshot


def queue_order(pending: Iterable[Gang]) -> list[Gang]:
    """Priority first, then first come first served; the name breaks exact ties deterministically."""
    return sorted(pending, key=QUEUE_KEY)


QUEUE_KEY = attrgetter("queue_key")  # kept on the gang: a cycle over a long backlog sorts it every time


@dataclass(frozen=True)
class Reservation:
    """Nodes held for the head-of-line gang until `start` (its estimated earliest start; math.inf when
    it waits on gangs of unknown duration; now when victims are being preempted for it)."""

    gang: Gang
    nodes: frozenset[str]
    start: float
    placements: tuple[Placement, ...]
    by_preemption: bool = False

    def mask(self, snap: Snapshot) -> np.ndarray:
        return node_mask(snap, self.nodes)

    def lets_through(self, gang: Gang, now: float) -> bool:
        """A gang known to finish before the head can start may use the reserved nodes."""
        return gang.expected_duration is not None and now + gang.expected_duration <= self.start


def node_mask(snap: Snapshot, names: Iterable[str]) -> np.ndarray:
    """[N] bool: the nodes named."""
    m = np.zeros(len(snap), dtype=bool)
    m[[snap.node_index(n) for n in names]] = True
    return m


@dataclass(eq=False)
class Refusal:
    """What a gang was refused under, so that it is tried again only once that may have changed
    (kube-scheduler's QueueingHint): a node gained room where one of `asks` may go and fits, usage
    fell on a GPU product quota limited it on, or it is kept off fewer reserved nodes than `kept_off`.
    Backoff keeps it up to date: `epoch` counts the wakes it has taken into account, and a check
    that finds nothing usable folds the later ones in (Backoff.ready)."""

    asks: tuple[PodRequest, ...]  # its members' distinct requests
    kept_off: frozenset[str] = frozenset()  # the reservation's nodes it was not allowed on
    quota_products: frozenset[str] = frozenset()  # GangDecision.quota_products
    filters: tuple = ()  # the profile's filters (the static ones say where an ask may ever go)
    epoch: int = 0  # Backoff wakes heard before it (set by Backoff.record)
    _where: list[np.ndarray] | None = field(default=None, repr=False)
    _shape: HashedTuple | None = field(default=None, repr=False)

    @property
    def shape(self) -> HashedTuple:
        """What may_fit reads of it: gangs of one shape get one answer (FitMasks.answers; hashed once,
        as every refusal of a long backlog is looked up there)."""
        if self._shape is None:
            self._shape = HashedTuple((tuple(a.shape for a in self.asks), self.filters))
        return self._shape

    def may_fit(self, snap: Snapshot, nodes: Sequence[int], fits: FitMasks | None = None) -> bool:
        """A member may go to one of `nodes` (static filters) and fits there by resources. `fits`:
        fit masks of this state of `snap` (many refusals checked between two changes)."""
        if not nodes:
            return False
        if self._where is None:
            self._where = [static_mask(snap, a, self.filters).tolist() for a in self.asks]
        fits = fits if fits is not None else FitMasks()
        for ask, where in zip(self.asks, self._where):
            fit = fits.of(snap, ask)
            if any(where[i] and fit[i] for i in nodes):
                return True
        return False


class FitMasks:
    """Snapshot.fit_mask of each ask resources checked against one state of a snapshot, as lists,
    and Backoff.ready's answers in that state: a cycle checks hundreds of refusals between two
    admissions, most with a handful of shapes. Whoever changes the snapshot clears it."""

    def __init__(self) -> None:
        self._masks: dict[tuple, list[bool]] = {}
        self.answers: dict[tuple, tuple[bool, frozenset[str]]] = {}

    def of(self, snap: Snapshot, ask: PodRequest) -> list[bool]:
        key = (ask.cpu_milli, ask.memory_mib, ask.gpus, ask.gpu_milli, ask.mig_profile)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = snap.fit_mask(ask).tolist()
        return mask

    def clear(self) -> None:
        self._masks.clear()
        self.answers.clear()


@dataclass
class CycleResult:
    admitted: list[GangDecision] = field(default_factory=list)
    preemptions: list[PreemptionPlan] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # gang name -> wait reason (tried this cycle)
    reservation: Reservation | None = None
    deferred: list[str] = field(default_factory=list)  # gangs skipped in back-off (last reason stands)
    refusals: dict[str, Refusal] = field(default_factory=dict)  # gang name -> what it was refused under


@dataclass
class Backoff:
    """Per-gang retry back-off: after the n-th failed try in a row a gang waits
    min(cap, base * 2**(n-1)) seconds. Pure bookkeeping; the caller passes the clock."""

    base: float = 1.0
    cap: float = 60.0
    failures: dict[str, int] = field(default_factory=dict)
    not_before: dict[str, float] = field(default_factory=dict)
    refusals: dict[str, Refusal] = field(default_factory=dict)
    # the wakes heard (node indices that gained room, GPU products whose usage fell), oldest first:
    # each refusal reads those after its epoch when it is asked (a wake costs nothing per gang)
    _wakes: list[tuple[tuple[int, ...], frozenset[str]]] = field(default_factory=list, repr=False)
    _failed_at: dict[str, int] = field(default_factory=dict, repr=False)  # wakes heard before its last failure
    _since: dict[int, tuple[frozenset[int], frozenset[str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base:
            raise ValueError(f"back-off: base ({self.base}) must be > 0 and cap ({self.cap}) >= base")

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 62)) if failures > 0 else 0.0

    def _woken_since(self, epoch: int) -> tuple[frozenset[int], frozenset[str]]:
        """The nodes and products of every wake after the first `epoch`."""
        got = self._since.get(epoch)
        if got is None:
            nodes: set[int] = set()
            freed: set[str] = set()
            for n, f in self._wakes[epoch:]:
                nodes.update(n)
                freed.update(f)
            got = self._since[epoch] = (frozenset(nodes), frozenset(freed))
        return got

    def _settle(self, name: str) -> bool:
        """Forget the gang (True) if a wake since its failure concerns it whatever the nodes: usage
        fell on a product quota limited it on, or nothing is known of its refusal."""
        epoch = len(self._wakes)
        r = self.refusals.get(name)
        if r is None:
            if self._failed_at.get(name, epoch) < epoch:
                self.forget(name)
                return True
            return False
        if self._quota_woken(r, epoch):
            self.forget(name)
            return True
        return False

    def _quota_woken(self, r: Refusal, epoch: int) -> bool:
        """Usage fell, since the refusal, on a GPU product quota limited it on."""
        return r.epoch < epoch and bool(r.quota_products) \
            and not self._woken_since(r.epoch)[1].isdisjoint(r.quota_products)

    def ready(self, name: str, now: float, kept_off: frozenset[str] = frozenset(),
              snap: Snapshot | None = None, fits: FitMasks | None = None) -> bool:
        """Its back-off has passed, or since its refusal usage fell on a product quota limited it
        on, or a node it may use now (`kept_off`: the nodes reserved against it in this cycle)
        gained room or is no longer reserved against it, and, when `snap` is given, one of its
        members fits on one of those by resources there. When none does, the refusal now stands as
        if made in this cycle (what `ready` checked is folded into it), so the same nodes are not
        checked again until they change. `fits`: fit masks of this state of `snap` (gangs of one
        shape refused under the same wakes and reservation share the answer)."""
        not_before = self.not_before.get(name)
        if not_before is None or now >= not_before:
            return True
        r = self.refusals.get(name)
        epoch = len(self._wakes)
        if r is None:
            return self._settle(name)
        if r.epoch < epoch:
            if self._quota_woken(r, epoch):
                self.forget(name)
                return True
        elif r.kept_off <= kept_off:
            return False  # nothing gained, nothing opened: the common case, without a new set
        if snap is None:
            return True
        key = (r.shape, r.epoch, r.kept_off, kept_off)
        got = fits.answers.get(key) if fits is not None else None
        if got is None:
            gained = self._woken_since(r.epoch)[0] if r.epoch < epoch else frozenset()
            names = snap.shape.nodes
            usable = {snap.node_index(n) for n in r.kept_off - kept_off}
            usable.update(i for i in gained if names[i].name not in kept_off)
            if r.may_fit(snap, sorted(usable), fits=fits):
                got = (True, r.kept_off)
            else:
                got = (False, frozenset(n for n in r.kept_off.union(names[i].name for i in gained) if n in kept_off))
            if fits is not None:
                fits.answers[key] = got
        if got[0]:
            return True
        r.kept_off, r.epoch = got[1], epoch
        return False

    def failed(self, name: str, now: float) -> float:
        """Record a failed try; returns the delay until the next one."""
        self._settle(name)  # a wake that concerned it since its last failure starts its back-off again
        n = self.failures[name] = self.failures.get(name, 0) + 1
        d = self.delay(n)
        self.not_before[name] = now + d
        self._failed_at[name] = len(self._wakes)
        return d

    def forget(self, name: str) -> None:
        self.failures.pop(name, None)
        self.not_before.pop(name, None)
        self.refusals.pop(name, None)
        self._failed_at.pop(name, None)

    def reset(self) -> None:
        """Room may have appeared (a pod ended, a node joined): every gang may try at once, and its
        back-off starts again from `base`."""
        self.failures.clear()
        self.not_before.clear()
        self.refusals.clear()
        self._failed_at.clear()
        self._wakes.clear()
        self._since.clear()

    def wake(self, snap: Snapshot, nodes: Sequence[int], quota_freed: Iterable[str] = ()) -> None:
        """Room appeared on `nodes` of `snap` (pods ended there, a node joined); `quota_freed`: the
        node GPU products on which quota usage fell. Only the gangs this may help try again at once
        (kube-scheduler's QueueingHint): quota limited it on one of those products, or nothing is
        known of its refusal, or (checked by `ready` against the cycle's own state and reservation)
        a member may go to one of those nodes and fits there by resources. For the others nothing
        they could use changed: on the nodes that did not gain, capacity only shrank since their
        refusal, and a reserved node it was kept off counts once it is kept off it no more. The
        wake is only logged; each refusal reads the wakes after its own when it is asked (a node
        that gained room where a gang did not fit then has no more room for it later, unless
        another wake says so)."""
        self._wakes.append((tuple(int(i) for i in nodes), frozenset(quota_freed)))
        self._since.clear()

    def record(self, result: CycleResult, pending: Sequence[Gang], now: float) -> None:
        """Book one cycle: gangs tried and left waiting back off further; admitted or preempting
        gangs, and gangs not in `pending` (the gangs still pending: as a rule those the cycle was
        given), are forgotten. Deferred gangs keep their back-off."""
        planned = {p.gang.name for p in result.preemptions}
        for name in result.waiting:
            if name in planned:
                self.forget(name)
            else:
                self.failed(name, now)
                refusal = result.refusals.get(name)
                old = self.refusals.pop(name, None)
                if refusal is not None:
                    if old is not None and old.asks == refusal.asks and old.filters is refusal.filters:
                        refusal._where = old._where  # where its asks may go does not change
                        refusal._shape = old._shape
                    refusal.epoch = len(self._wakes)
                    self.refusals[name] = refusal
        for d in result.admitted:
            self.forget(d.gang.name)
        # every gang of the cycle was admitted, left waiting or deferred, and each one left waiting
        # (but for the planned) or deferred has failures: more failures, or a `pending` that is not
        # the cycle's, means some gang is no longer pending (the sweep is skipped in the common case)
        tried = len(result.admitted) + len(result.waiting) + len(result.deferred)
        if len(pending) != tried or len(self.failures) > len(result.waiting) - len(planned) + len(result.deferred):
            alive = {g.name for g in pending}
            for name in [n for n in self.failures if n not in alive]:
                self.forget(name)


class Covered(NamedTuple):
    """An ask refused earlier in the cycle covers this one: the wait reason, and the GPU products
    quota limited that refusal on."""

    reason: str
    quota_products: frozenset[str]


class RefusedAsks:
    """Asks refused for capacity in this cycle. A one-pod gang is covered by a refused one-pod ask
    of the same team with the same constraints and no more CPU, memory or GPU; a bigger gang only by
    the same team, pod sets, topology and pins. An ask refused with every node open covers asks that
    are shown fewer."""

    def __init__(self, by_team: bool = True) -> None:
        self.by_team = by_team  # False: no quota book, a team's ask is any team's
        self._single: dict[tuple, list[tuple[int, int, int, bool, str, str]]] = {}
        self._gangs: dict[tuple, tuple[bool, str, str]] = {}

    def _single_key(self, gang: Gang) -> tuple[tuple, int]:
        pod = gang.members[0]
        form = "mig" if pod.mig_profile else ("share" if pod.gpu_milli else "gpus")
        return (gang.team if self.by_team else None, form, pod.mig_profile, pod.gpu_products, pod.node_selector, pod.tolerations,
                pod.capacity_types), (pod.gpus if form == "gpus" else pod.gpu_milli)

    def _gang_key(self, gang: Gang) -> tuple:
        return (gang.team if self.by_team else None, gang.topology, gang.min_member, gang.pinned,
                gang.pod_set_shapes, gang.products_mixed)

    def add(self, gang: Gang, excluded: bool, reason: str, delays: str = "",
            quota_products: frozenset[str] = frozenset()) -> None:
        """`delays`: the reason when the ask would fit but for the reservation (it names the head,
        not the gang, so an equal ask of the same team waits for exactly that reason too).
        `quota_products`: GangDecision.quota_products of the refusal (an ask it covers shares them)."""
        entry = (excluded, gang.name, reason, delays, quota_products)
        if len(gang.members) == 1:
            pod = gang.members[0]
            key, amount = self._single_key(gang)
            ask = (pod.cpu_milli, pod.memory_mib, amount)
            known = self._single.setdefault(key, [])
            if not delays and any(all(r <= a for r, a in zip(r_ask, ask)) and (excluded or not e[0])
                                  for r_ask, e in known):
                return  # a smaller refusal covers it already: the list stays short over a long backlog
            known.append((ask, entry))
        else:
            self._gangs.setdefault(self._gang_key(gang), entry)

    def covering(self, gang: Gang, excluded: bool) -> Covered | None:
        """The wait reason (and the products quota limited the refusal on) when `gang` cannot fit
        either, else None."""
        if len(gang.members) == 1:
            pod = gang.members[0]
            key, amount = self._single_key(gang)
            ask = (pod.cpu_milli, pod.memory_mib, amount)
            for refused_ask, entry in self._single.get(key, ()):
                if all(r <= a for r, a in zip(refused_ask, ask)) and (excluded or not entry[0]):
                    return self._reason(entry, excluded, refused_ask == ask)
            return None
        entry = self._gangs.get(self._gang_key(gang))
        return None if entry is None or not (excluded or not entry[0]) else self._reason(entry, excluded, True)

    @staticmethod
    def _reason(entry, excluded: bool, equal: bool) -> Covered:
        was_excluded, name, reason, delays, quota_products = entry
        if delays and equal and was_excluded == excluded:
            return Covered(delays, quota_products)
        return Covered(f"does not fit, as {name} (no larger ask) this cycle: {reason}", quota_products)


def may_backfill_reserved(head: Gang, gang: Gang, policy: PreemptionPolicy) -> bool:
    """Whether `gang` may use the head's reserved nodes without a duration estimate: only work the
    head can take back by preemption when it can start (preemptible, checkpointable, lower priority,
    and the head's tier preempts), so the reservation's idle GPUs compute meanwhile and the head is
    not delayed beyond a SIGTERM checkpoint. Another team's backfill must also borrow (checked at
    admission): only a borrower is a victim across teams."""
    return (gang.preemptible and gang.checkpointable and gang.priority < head.priority
            and gang.tier not in policy.non_preemptible_tiers and head.tier not in policy.never_preempting_tiers)


class NoPlanMemo:
    """Asks (team, tier, priority, shape) for which no preemption plan was found. Within a cycle
    candidates only go (admissions are held, nominations take their victims) and capacity only
    shrinks, so a failed plan is not searched again for the same ask. The caller may keep one memo
    across cycles and must `reset` it whenever the running set, the capacity or the quota usage
    changed (a gang started or ended, a node came or went)."""

    def __init__(self) -> None:
        self._failed: set[tuple] = set()

    @staticmethod
    def key(gang: Gang, where: tuple = ()) -> tuple:
        """`where`: what else the search was restricted by (nodes it could not use)."""
        return gang.plan_ask, where

    def failed(self, gang: Gang, where: tuple = ()) -> bool:
        return self.key(gang, where) in self._failed

    def add(self, gang: Gang, where: tuple = ()) -> None:
        self._failed.add(self.key(gang, where))

    def reset(self) -> None:
        self._failed.clear()


class StartMemo:
    """The last earliest-start estimate of each head of line, kept while the nodes it may use
    (its pod sets' static filters) are unchanged. Snapshot versions equal means equal node state
    with the same pods, and estimate_start reads only those nodes and the gangs on them, released
    in the same order: a cycle in which only other nodes changed (work on another GPU product or
    capacity type) gets the same answer without a placement. An estimate that starts at a finite
    time depends on the clock and is not kept."""

    KEEP = 64  # heads remembered (the head of line rarely changes)

    def __init__(self) -> None:
        self._last: dict[str, tuple[Profile, bytes, Reservation | None]] = {}

    @staticmethod
    def _key(snap: Snapshot, gang: Gang, profile: Profile) -> bytes:
        usable = np.zeros(len(snap), dtype=bool)
        for ps in gang.pod_sets:
            usable |= static_mask(snap, ps.request, profile.filters)
        return snap.version[usable].tobytes()

    def estimate(self, snap: Snapshot, gang: Gang, running: Sequence[RunningGang], profile: Profile,
                 now: float) -> Reservation | None:
        """estimate_start, or the same answer kept from an earlier cycle."""
        key = self._key(snap, gang, profile)
        hit = self._last.get(gang.name)
        if hit is not None and hit[0] is profile and hit[1] == key and (hit[2] is None or hit[2].gang == gang):
            return hit[2]
        est = estimate_start(snap, gang, running, profile, now)
        self._last.pop(gang.name, None)
        if est is None or math.isinf(est.start):
            if len(self._last) >= self.KEEP:
                self._last.pop(next(iter(self._last)))
            self._last[gang.name] = (profile, key, est)
        return est


@dataclass
class ReservationHold:
    """Bounded hold: a reservation whose start cannot be estimated (it waits on work of unknown
    duration) keeps its nodes' free GPUs idle against every gang the head cannot take back. It may
    do so for `max_hold` seconds in a row; then the gang holds no reservation for `pause` seconds
    (it is still admitted whenever it fits, and the next gang may hold one), then it may again.
    Without it a head of line that waits on long work idles its nodes for as long as that work
    runs while smaller work of its own priority queues behind it. Pure bookkeeping; the caller
    passes the clock and calls `record` after each cycle."""

    max_hold: float = DEFAULT_RESERVATION_HOLD_SECONDS
    pause: float = DEFAULT_RESERVATION_HOLD_SECONDS
    since: dict[str, float] = field(default_factory=dict)  # gang -> start of its current hold
    paused_until: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_hold <= 0 or self.pause < 0:
            raise ValueError(f"reservation hold: max_hold ({self.max_hold}) must be > 0 and pause ({self.pause}) >= 0")

    def may_reserve(self, name: str, now: float) -> bool:
        return now >= self.paused_until.get(name, -math.inf)

    def why(self, name: str, now: float) -> str:
        return (f"no reservation: it held one {self.max_hold:.0f} s without a known start; "
                f"it may again in ~{max(0.0, self.paused_until[name] - now):.0f} s")

    def record(self, result: CycleResult, now: float) -> None:
        res = result.reservation
        holder = res.gang.name if res is not None and not res.by_preemption and math.isinf(res.start) else None
        for name in [n for n in self.since if n != holder]:
            del self.since[name]  # a hold counts only while it lasts without a break
        if holder is not None:
            since = self.since.setdefault(holder, now)
            if now - since >= self.max_hold:
                del self.since[holder]
                self.paused_until[holder] = now + self.pause
        for name in [n for n, t in self.paused_until.items() if t <= now]:
            del self.paused_until[name]


def estimate_start(snap: Snapshot, gang: Gang, running: Sequence[RunningGang], profile: Profile,
                   now: float) -> Reservation | None:
    """When and where `gang`, which does not fit now, could start if nothing else were admitted:
    running gangs are released by expected end on a copy until it fits. None: it would not fit even
    with all of them gone. (A gang that fits now needs no estimate; releases that add no room for
    it are skipped, so for such a gang the answer is not "now".)

    A room estimate kept up to date per release (core.room.RoomTracker) says when a full
    placement is worth trying, so the whole release order costs about one pass over the pods."""
    ends = sorted(running, key=lambda r: (math.inf if r.expected_end is None else r.expected_end,
                                          r.started_at, r.gang.name))
    work = snap.copy()
    tracker = RoomEstimate.for_gang(snap, gang, profile).tracker(work)
    for r in ends:
        if not tracker.release(r):
            continue
        placed, _, _ = place_gang(work, gang, profile)
        if placed is not None:
            last = r.expected_end
            start = math.inf if last is None else max(now, last)
            return Reservation(gang, frozenset(p.node for p in placed), start, placed)
    return None


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


def _reclaimable_backfill(state: CycleState, res: Reservation, decision: GangDecision) -> bool:
    """A backfill admitted onto the head's reserved nodes stays a preemption candidate of the head:
    same team, no quota book, or (another team) admitted on borrowed quota while the head's team is
    under its guarantee (Kueue's reclaim). Off the reserved nodes any admission is fine."""
    if not {p.node for p in decision.placements} & res.nodes:
        return True
    if state.book is None or decision.gang.team == res.gang.team:
        return True
    return decision.borrowed and under_guarantee(state, res.gang)


def _preempting(plan: PreemptionPlan) -> str:
    whom = "of lower priority or borrowing in the cohort" if plan.reclaim else "of lower priority"
    return f"preempting {len(plan.victims)} gang(s) {whom}: {', '.join(plan.victim_names)}"


def _when(start: float, now: float) -> str:
    return "when gangs of unknown duration end" if math.isinf(start) else f"in ~{max(0.0, start - now):.0f} s"


def schedule_cycle(state: CycleState, pending: Iterable[Gang], profile: Profile, now: float,
                   policy: PreemptionPolicy = PreemptionPolicy(),
                   backoff: Backoff | None = None, no_plan: NoPlanMemo | None = None,
                   hold: ReservationHold | None = None, explain: bool = True,
                   starts: StartMemo | None = None) -> CycleResult:
    """Admit what can start now, plan at most one preemption, hold one reservation. Changes nothing
    passed in (`backoff` is read, its refusals brought up to date by Backoff.ready; Backoff.record
    books the result; `no_plan` is added to, see NoPlanMemo; `hold` bounds reservations of unknown start and is only read: ReservationHold.record
    books the result). `state` (core.cycle) holds every gang that takes capacity or quota: running,
    terminating and held plans. explain=False: a gang kept off the reservation is not placed a
    second time only to say that it "would delay" the head, and capacity reasons name the member
    that does not fit without counting nodes per filter (a caller that shows no wait reasons, the
    replay; the decisions are the same). `starts`: a StartMemo kept across cycles (same
    estimates, fewer placements)."""
    work = state.copy()
    running = list(state.running)
    result = CycleResult()
    started: list[RunningGang] = []  # admitted this cycle: they hold capacity until their own end
    reserved: np.ndarray | None = None
    refused = RefusedAsks(by_team=state.book is not None)
    no_plan = no_plan if no_plan is not None else NoPlanMemo()
    fits = FitMasks()  # of work.snap as it is: cleared whenever the cycle changes it
    quota_answers = QuotaAnswers()  # quota checks of work.usage as it is (it knows when that changes)

    nominated: np.ndarray | None = None  # nodes of a plan made behind the head: closed to later gangs
    nominated_nodes: frozenset[str] = frozenset()
    searched_teams: set[str] = set()  # teams that searched a plan behind the head in this cycle

    def may_plan_behind(gang: Gang, res: Reservation) -> bool:
        """Refused behind a capacity reservation, it would search a plan: the first of its team in
        this cycle whose ask is not known to have no plan (see the module docstring)."""
        return (gang.tier in policy.preempt_behind_head_tiers and not res.by_preemption and not result.preemptions
                and gang.team not in searched_teams and not no_plan.failed(gang, ("behind", res.nodes)))

    def plan_behind(gang: Gang, res: Reservation, reason: str, refused: GangDecision | None = None) -> str:
        """`refused`: its admission off the reserved nodes, when that is what it was."""
        nonlocal nominated, nominated_nodes
        if not may_plan_behind(gang, res):
            return reason
        where = ("behind", res.nodes)
        searched_teams.add(gang.team)
        plan, _ = plan_preemption(work, gang, profile, now, policy, exclude=reserved, refused=refused)
        if plan is None:
            no_plan.add(gang, where)
            return reason
        result.preemptions.append(plan)
        work.nominate(gang.team, plan.placements, plan.victims)
        fits.clear()
        nominated_nodes = frozenset(p.node for p in plan.placements)
        nominated = node_mask(work.snap, nominated_nodes)
        return f"{reason}; {_preempting(plan)}"

    for gang in queue_order(pending):
        res = result.reservation
        exclude = reserved if res is not None and not res.lets_through(gang, now) else None
        lent = exclude is not None and not res.by_preemption and may_backfill_reserved(res.gang, gang, policy)
        if lent:
            exclude = None  # tried on every node; kept off the reserved ones unless the head can take it back
        kept_off = res.nodes if exclude is not None else frozenset()  # as a Refusal records it
        if nominated is not None:
            exclude = nominated if exclude is None else exclude | nominated
            kept_off = kept_off | nominated_nodes
        if res is not None and backoff is not None and not may_plan_behind(gang, res) \
                and not backoff.ready(gang.name, now, kept_off, work.snap, fits):
            result.deferred.append(gang.name)  # (a gang that would search a plan is always tried)
            continue

        def wait(reason: str, quota_products: frozenset[str]) -> None:
            result.waiting[gang.name] = reason
            result.refusals[gang.name] = Refusal(tuple(ps.request for ps in gang.pod_sets), kept_off,
                                                 quota_products, profile.filters)

        if res is None and no_plan.failed(gang):
            covered = refused.covering(gang, False)
            if covered is not None:  # no room, no plan and no reservation for this ask in this cycle
                wait(*covered)
                continue
        if res is not None:
            covered = refused.covering(gang, exclude is not None)
            if covered is not None:
                wait(*covered)
                continue
            short = _set_fitting_nowhere(work.snap, gang)
            if short is not None:  # no placement to try: a member fits on no node, reserved or not
                reason = f"member {short.name} does not fit: no node has the free CPU, memory and GPU it asks for"
                refused.add(gang, exclude is not None, reason)
                wait(plan_behind(gang, res, reason), frozenset())
                continue
        decision = admit(work.snap, gang, profile, work.book, work.usage, exclude, quota_answers, explain)
        if lent and decision.admitted and not _reclaimable_backfill(work, res, decision):
            exclude = reserved if nominated is None else reserved | nominated
            kept_off = res.nodes | nominated_nodes
            decision = admit(work.snap, gang, profile, work.book, work.usage, exclude, quota_answers, explain)
        if decision.admitted:
            # held, not running: a gang admitted this cycle is no preemption candidate in it
            work.hold(gang.team, decision.placements)
            fits.clear()
            started.append(RunningGang(gang, decision.placements, now, borrowed=decision.borrowed,
                                       speed=work.speed(decision.placements)))
            result.admitted.append(decision)
            continue

        reason = decision.reason
        if res is not None:
            delays = ""
            if explain and exclude is not None and _fits_somewhere(work.snap, gang, exclude) \
                    and admit(work.snap, gang, profile, work.book, work.usage, answers=quota_answers).admitted:
                reason = delays = f"would delay {res.gang.name}, which holds {len(res.nodes)} node(s) " \
                                  f"and starts {_when(res.start, now)}"
            if decision.blocked_by == BLOCKED_CAPACITY:
                refused.add(gang, exclude is not None, decision.reason, delays, decision.quota_products)
            wait(plan_behind(gang, res, reason, decision if exclude is reserved else None), decision.quota_products)
            continue
        if decision.blocked_by == BLOCKED_CAPACITY:
            refused.add(gang, False, reason, quota_products=decision.quota_products)

        # Kueue: a quota refusal may be solved by preemption too (the team's own lower-priority
        # gangs, or reclaim from borrowers), so every refused gang asks for a plan.
        plan = None
        if not no_plan.failed(gang):
            plan, _ = plan_preemption(work, gang, profile, now, policy, refused=decision)
            if plan is None:
                no_plan.add(gang)
        if plan is not None:
            result.preemptions.append(plan)
            result.reservation = Reservation(gang, frozenset(p.node for p in plan.placements), now,
                                             plan.placements, by_preemption=True)
            reserved = result.reservation.mask(work.snap)
            # the nomination's quota counts at once (the victims' too, until they are gone); its
            # nodes are reserved
            work.nominate(gang.team, plan.placements, plan.victims)
            fits.clear()
            reason = f"{reason}; {_preempting(plan)}"
        elif decision.blocked_by == BLOCKED_CAPACITY and hold is not None and not hold.may_reserve(gang.name, now):
            reason = f"{reason}; {hold.why(gang.name, now)}"
        elif decision.blocked_by == BLOCKED_CAPACITY:
            if starts is not None:
                est = starts.estimate(work.snap, gang, running + started, profile, now)
            else:
                est = estimate_start(work.snap, gang, running + started, profile, now)
            if est is not None:
                result.reservation = est
                reserved = est.mask(work.snap)
                reason = f"{reason}; {len(est.nodes)} node(s) reserved, earliest start {_when(est.start, now)}"
        wait(reason, decision.quota_products)
    return result


ESTIMATE_LIMIT = 25  # estimated starts for the first N waiting gangs of the cluster's queue (cost bound)
ESTIMATE_TRIES = 64  # full admissions tried per gang at most (cost bound; the room estimate skips most)
# why a waiting gang has no estimated start, or what its estimate waits for
NOTE_NOT_ESTIMATED = "not estimated: only the first {limit} gangs in the cluster's queue are"
NOTE_NO_END = "after running work that has no expected duration"
NOTE_NEVER = "would not fit even if every running gang ended"
NOTE_PREEMPTING = "preempting: starts once its victims are gone"
NOTE_TOO_MANY_TRIES = "not estimated: no start found within {tries} tries"


@dataclass(frozen=True)
class StartEstimate:
    """A waiting gang's estimated start (None: not known, `note` says why) and the nodes it is
    expected to start on."""

    start: float | None
    nodes: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class _Ahead:
    """An estimated gang's future placement, held from `start` to `end` (math.inf: unknown end)."""

    team: str
    placements: tuple[Placement, ...]
    start: float
    end: float

    def overlaps(self, t: float, until: float) -> bool:
        return self.start < until and t < self.end


def estimate_starts(state: CycleState, waiting: Sequence[Gang], result: CycleResult, profile: Profile,
                    now: float, limit: int = ESTIMATE_LIMIT,
                    nominated: Mapping[str, Sequence[str]] | None = None) -> dict[str, StartEstimate]:
    """When and where each of the first `limit` gangs of `waiting` (queue order, what the cycle of
    `result` left waiting) is expected to start, under the cycle's own profile, quota book and
    reservation (conservative backfilling: each estimate holds its placement on the what-if from its
    start, so the gangs behind it never delay it):
    - the head of line's capacity reservation starts when the cycle said (Reservation.start);
    - a gang with a preemption plan (of this cycle, or `nominated`: gang name -> nodes of a held
      nomination) starts now, once its victims are gone;
    - any other: running gangs (and the gangs admitted in this cycle) are released on a copy by
      expected end until core.gang.admit admits it, capacity AND quota (a quota-blocked gang gets
      the end of the gang of its team or cohort that frees its quota, not the time capacity frees).
      Releases that add no room for it and free no quota of its cohort are skipped (RoomEstimate).
    `state` is the cycle's state before the cycle (changed nothing)."""
    order = list(waiting)
    out: dict[str, StartEstimate] = {}
    base = state.capacity_view()
    ends: list[RunningGang] = list(state.running)
    planned = {p.gang.name: p for p in result.preemptions}
    for d in result.admitted:  # admitted this cycle: held from now, until their own expected end
        base.hold(d.gang.team, d.placements)
        ends.append(RunningGang(d.gang, d.placements, now, borrowed=d.borrowed))
    for plan in result.preemptions:  # its victims leave now and it takes their place
        gone = {id(v) for v in plan.victims}
        for v in plan.victims:
            base.release(v)
        ends = [r for r in ends if id(r) not in gone]
        _hold_where_free(base, plan.gang.team, plan.placements)
        ends.append(RunningGang(plan.gang, tuple(plan.placements), now))
    ends.sort(key=lambda r: (math.inf if r.expected_end is None else r.expected_end, r.started_at, r.gang.name))
    ahead: list[_Ahead] = []
    nominated = dict(nominated or {})
    res = result.reservation
    head = res.gang.name if res is not None and not res.by_preemption else None
    if head is not None and head in {g.name for g in order[:limit]}:
        # the scheduler keeps every other gang off the head's nodes, those ahead of it in the queue too
        # (a quota-blocked gang is never head): its reservation is held first
        out[head] = StartEstimate(None if math.isinf(res.start) else res.start, tuple(sorted(res.nodes)),
                                  NOTE_NO_END if math.isinf(res.start) else "")
        if not math.isinf(res.start):
            d = res.gang.expected_duration
            ahead.append(_Ahead(res.gang.team, tuple(res.placements), res.start,
                                math.inf if d is None else res.start + d))
    for i, gang in enumerate(order):
        if i >= limit:
            out[gang.name] = StartEstimate(None, (), NOTE_NOT_ESTIMATED.format(limit=limit))
            continue
        if gang.name == head:
            continue
        if gang.name in planned or gang.name in nominated:
            plan = planned.get(gang.name)
            nodes = tuple(sorted({p.node for p in plan.placements})) if plan is not None else nominated[gang.name]
            out[gang.name] = StartEstimate(now, tuple(nodes), NOTE_PREEMPTING)
            continue
        est, placements = _estimate_one(base, ends, ahead, gang, profile, now)
        out[gang.name] = est
        if est.start is not None:
            d = gang.expected_duration
            ahead.append(_Ahead(gang.team, tuple(placements), est.start, math.inf if d is None else est.start + d))
    return out


def _hold_where_free(state: CycleState, team: str, placements: Iterable[Placement]) -> set[str]:
    """Hold what fits of `placements` on `state` (quota counted whole); the nodes where a placement
    does not fit (still taken at that time) are returned, to be kept off instead."""
    blocked = set()
    placements = tuple(placements)
    for p in placements:
        if p.pod in state.snap.placements:
            continue
        try:
            state.snap.assume(p)
        except OverCommitError:
            blocked.add(p.node)
    if state.usage is not None:
        state.usage.add(team, state.demand(placements))
    return blocked


def _estimate_one(base: CycleState, ends: Sequence[RunningGang], ahead: Sequence[_Ahead], gang: Gang,
                  profile: Profile, now: float) -> tuple[StartEstimate, tuple[Placement, ...]]:
    """estimate_starts for one gang that is neither head nor preempting."""
    work = base.capacity_view()
    tracker = RoomEstimate.for_gang(work.snap, gang, profile).tracker(work.snap)
    room = tracker.room
    cohort = _cohort_of(base, gang.team)
    duration = math.inf if gang.expected_duration is None else gang.expected_duration
    times = sorted({now} | {r.expected_end for r in ends if r.expected_end is not None and r.expected_end > now}
                   | {a.end for a in ahead if now < a.end < math.inf})
    times.append(math.inf)  # every gang gone, the unknown ones too
    k, tries = 0, 0
    for t in times:
        worth = t == now
        while k < len(ends) and (math.inf if ends[k].expected_end is None else ends[k].expected_end) <= t:
            r = ends[k]
            k += 1
            worth = tracker.release(r) or worth
            if work.usage is not None:
                work.usage.remove(r.gang.team, work.demand(r.placements))
                worth = worth or _cohort_of(base, r.gang.team) == cohort
        worth = worth or any(a.end == t for a in ahead)
        if not worth or not room.holds(tracker.fit):
            continue
        tries += 1
        if tries > ESTIMATE_TRIES:
            return StartEstimate(None, (), NOTE_TOO_MANY_TRIES.format(tries=ESTIMATE_TRIES)), ()
        trial = work.capacity_view()
        kept_off: set[str] = set()
        for a in ahead:
            if a.overlaps(t, t + duration):
                kept_off |= _hold_where_free(trial, a.team, a.placements)
        exclude = node_mask(trial.snap, kept_off) if kept_off else None
        decision = admit(trial.snap, gang, profile, trial.book, trial.usage, exclude, explain=False)
        if decision.admitted:
            nodes = tuple(sorted({p.node for p in decision.placements}))
            if math.isinf(t):
                return StartEstimate(None, nodes, NOTE_NO_END), ()
            return StartEstimate(t, nodes), decision.placements
    return StartEstimate(None, (), NOTE_NEVER), ()


def _cohort_of(state: CycleState, team: str) -> str | None:
    """The quota cohort of `team` (None without a quota book: quota frees nothing)."""
    if state.book is None:
        return None
    quota = state.book.teams.get(team)
    return quota.cohort if quota is not None else team
