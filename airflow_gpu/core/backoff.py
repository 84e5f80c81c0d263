"""Back-off, queueing hints and the memos of one queue (core.queue.Queue keeps them across cycles).

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
decisions as waking every gang, tested on the seed scenario and on multi-node gangs over two
products); the scheduler still resets on every change.

Refused asks (RefusedAsks): within one cycle capacity only shrinks (admissions hold it, a
nomination's victims keep theirs), so once the reservation is taken, a gang whose ask is no smaller
than one already refused for capacity in this cycle (same team, same constraints, no fewer
excluded nodes) is left waiting without being placed again. The team is part of the ask because
quota decides which products a gang may be placed on; usage only grows within a cycle (a
nomination's victims keep their quota until they are gone). This keeps a cycle over a long backlog of similar asks
at about one placement per distinct ask instead of one per gang. After the reservation, a gang with
a member that fits on no node by resources (CPU, memory, GPU form: one vectorised test) is refused
without a placement, and the "would it fit without the reservation" test for the wait reason runs
only when a member fits on a reserved node. A covered gang still searches a preemption plan behind
the head when it may (a production gang behind a refused best-effort one of its team): a refusal it
did not make takes no turn from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from airflow_gpu.core.framework import static_mask
from airflow_gpu.core.model import Gang, HashedTuple, PodRequest
from airflow_gpu.core.snapshot import Snapshot

if TYPE_CHECKING:
    from airflow_gpu.core.queue import CycleResult


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
    _shape: HashedTuple | None = field(default=None, repr=False)

    @property
    def shape(self) -> HashedTuple:
        """What may_fit reads of it: gangs of one shape get one answer (FitMasks.answers; hashed once,
        as every refusal of a long backlog is looked up there)."""
        if self._shape is None:
            self._shape = HashedTuple((tuple(a.shape for a in self.asks), self.filters))
        return self._shape

    def keep_shape(self, old: Refusal) -> None:
        """Take over the shape of the gang's previous refusal `old` (hashed already) when its asks
        and filters are the same: that does not change."""
        if old.asks == self.asks and old.filters is self.filters:
            self._shape = old._shape

    def may_fit(self, snap: Snapshot, nodes: Sequence[int], fits: FitMasks | None = None) -> bool:
        """A member may go to one of `nodes` (static filters) and fits there by resources. `fits`:
        fit masks of this state of `snap` (many refusals checked between two changes)."""
        if not nodes:
            return False
        # where its asks may ever go: a fact of the node list, kept beside it (one per shape)
        wheres = snap.shape.derived(("refusal-where", self.shape),
                                    lambda: [static_mask(snap, a, self.filters).tolist() for a in self.asks])
        fits = fits if fits is not None else FitMasks()
        for ask, where in zip(self.asks, wheres):
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
                    if old is not None:
                        refusal.keep_shape(old)
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
