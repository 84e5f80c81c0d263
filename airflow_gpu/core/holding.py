"""Held placements across cycles, as the replay runs them (`simulate replay --placement-hold`, an
experiment): a lone share whose placement strands GPU capacity is reserved and not bound for at most
`--placement-hold-seconds`, so that a pod that fits nowhere may take its room (core/hold.py is the
rule; this module is its bookkeeping from one cycle to the next). Pure: no I/O.

The scheduler does not run it: pods on Kubernetes reach it as whole GPUs or MIG slices
(kube/convert.py has no GPU-share request), and only shares strand capacity in this rule; measured in
the replay it gains next to nothing at openb's arrival rate (README, "The hold as a real mechanism").

As a pod waiting at kube-scheduler's Permit stage ("Wait" with a timeout): its placement is assumed
in every cycle's state (capacity and quota), not bound. It is bound where it was reserved when its
time is up, when the budget (`--placement-hold`, a fraction of the GPU capacity)
needs room for a newer one, or when it no longer strands capacity; a pod that fits nowhere this
cycle may displace it (core.hold.PlacementHold.make_room), and then it is pending again and placed
by the next cycle like any other. kube-scheduler rejects a pod whose Permit wait times out; here the
timeout allows it, its placement being still valid.

Only lone pods are held (no PodGroup, one member): a gang member is never held, so no gang waits on
a held pod. Off when the budget is 0 (the default).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import GangDecision
from airflow_gpu.core.hold import PlacementHold
from airflow_gpu.core.model import Gang, Placement, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods, final_waste_table
from airflow_gpu.core.snapshot import OverCommitError


@dataclass(frozen=True)
class Held:
    gang: Gang  # a lone pod's gang (one member)
    placement: Placement
    until: float  # bound at its reserved place by then at the latest
    since: float = 0.0  # held since (its reserved GPUs idle from then)
    borrowed: bool = False  # admitted on the cohort's idle quota

    @property
    def pod(self) -> PodRequest:
        return self.gang.members[0]


def holdable(gang: Gang, lone: bool) -> bool:
    """Only a lone pod (no PodGroup) with one member may be held: never a gang member."""
    return lone and len(gang.members) == 1


@dataclass
class CycleHolds:
    """What this cycle decided about held pods."""

    bind: list[Held] = field(default_factory=list)  # released (or admitted by displacement): bind now
    held: list[Held] = field(default_factory=list)  # still held after this cycle (wait reasons)
    kept: set[str] = field(default_factory=set)  # admitted this cycle and held instead of bound
    displaced: list[Held] = field(default_factory=list)  # displaced: pending again


class PlacementHolds:
    """The held pods across cycles, in memory (lost on restart: then they are pending again)."""

    def __init__(self, budget: float, seconds: float):
        self.budget, self.seconds = budget, seconds
        self.typical: TypicalPods | None = None  # the workload's typical pods (learnt with the profile)
        self._table: tuple[TypicalPods, object] | None = None  # typical -> its final-waste table
        self._held: dict[str, Held] = {}  # gang name -> held, oldest first
        self._hold: PlacementHold | None = None  # this cycle's rule, on this cycle's snapshot

    @property
    def enabled(self) -> bool:
        return self.budget > 0 and self.typical is not None

    def __contains__(self, gang_name: str) -> bool:
        return gang_name in self._held

    def reserve(self, state: CycleState, pending: list[Gang], now: float) -> tuple[list[Gang], CycleHolds]:
        """Before the cycle: the held pods still pending are assumed in `state` (capacity and quota)
        and taken out of `pending`; those whose time is up, or that no longer strand capacity, are
        to be bound now (still assumed, so the cycle gives their room to no one). A held pod gone,
        bound by someone else or whose room was taken is forgotten (pending again if it still is)."""
        out = CycleHolds()
        if not self._held:
            return pending, out
        by_name = {g.name: g for g in pending}
        self._hold = self._rule(state) if self.enabled else None
        for name, h in list(self._held.items()):  # oldest first: release times in order
            gang = by_name.get(name)
            if gang is None or gang.members != h.gang.members:
                del self._held[name]
                continue
            try:
                state.hold(gang.team, [h.placement])
            except (OverCommitError, KeyError):  # its room was taken (or its node is gone)
                del self._held[name]
                continue
            self._held[name] = h = replace(h, gang=gang)
            if self._hold is None or h.until <= now:
                del self._held[name]
                out.bind.append(h)
                continue
            for placement in self._hold.offer(state.snap, h.pod, h.placement, now, until=h.until):
                self._release(placement, out)  # it no longer strands capacity, or the budget is full
        for placement in (self._hold.expire(now) if self._hold is not None else []):
            self._release(placement, out)
        taken = set(self._held) | {h.gang.name for h in out.bind}
        return [g for g in pending if g.name not in taken], out

    def after(self, state: CycleState, admitted: list[GangDecision], waiting: list[Gang], lone: set[str],
              profile: Profile, now: float, out: CycleHolds) -> CycleHolds:
        """After the cycle: admitted lone pods whose share strands capacity are held instead of bound
        (`out.kept`); the budget may release older ones (`out.bind`); then each waiting lone GPU pod
        that fits nowhere may displace held pods of smaller GPU demand and no higher priority (its
        quota checked): it is admitted (`out.bind`), the displaced are pending again. `state` is not
        changed."""
        if not self.enabled:
            self._flush(out)
            return out
        if self._hold is None:
            self._hold = self._rule(state)
        work = state.copy()
        for d in admitted:
            work.hold(d.gang.team, d.placements)
        for d in admitted:
            if d.gang.name not in lone or not holdable(d.gang, True) or len(d.placements) != 1:
                continue
            released = self._hold.offer(work.snap, d.gang.members[0], d.placements[0], now)
            if d.gang.members[0].name in self._hold:
                self._held[d.gang.name] = Held(d.gang, d.placements[0], self._hold.until(d.gang.members[0].name),
                                               now, d.borrowed)
                out.kept.add(d.gang.name)
            for placement in released:
                if placement.pod != d.placements[0].pod:
                    self._release(placement, out)
        for gang in waiting:
            if self._held and gang.name in lone and holdable(gang, True) and gang.members[0].uses_gpu:
                self._displace(work, gang, profile, now, out)
        self._flush(out)
        return out

    def _displace(self, work: CycleState, gang: Gang, profile: Profile, now: float, out: CycleHolds) -> None:
        room = self._hold.make_room(work.snap, gang.members[0], profile, now)
        if room is None:
            return
        victims = {h.pod.name: (n, h) for n, h in self._held.items()
                   if h.pod.name in {p.name for p in room.displaced} | {m.pod for m in room.moved}}
        for _, h in victims.values():
            if work.usage is not None:
                work.usage.remove(h.gang.team, work.demand([h.placement]))
        verdict = work.check(gang.team, work.demand([room.placement]))
        if not verdict.fits or any(h.gang.priority > gang.priority for _, h in victims.values()):
            # its team may not take the room, or a held pod of higher priority would go: undo it all
            work.snap.forget(room.placement.pod)
            for m in room.moved:
                work.snap.forget(m.pod)
            for _, h in sorted(victims.values(), key=lambda v: v[1].until):
                work.snap.assume(h.placement)
                self._hold.offer(work.snap, h.pod, h.placement, now, until=h.until)
                if work.usage is not None:
                    work.usage.add(h.gang.team, work.demand([h.placement]))
            return
        work.hold(gang.team, [room.placement], assume=False)
        for m in room.moved:
            name, h = victims[m.pod]
            del self._held[name]
            work.hold(h.gang.team, [m], assume=False)
            out.bind.append(replace(h, placement=m))
        for gone in room.displaced:
            name, h = victims[gone.name]
            del self._held[name]
            out.displaced.append(h)
        out.bind.append(Held(gang, room.placement, now, now, verdict.borrowed))
        for placement in room.released:
            if placement.pod != room.placement.pod and placement.pod not in {m.pod for m in room.moved}:
                self._release(placement, out)

    def _rule(self, state: CycleState) -> PlacementHold:
        """This cycle's PlacementHold on `state` (the final-waste table kept while typical is the same)."""
        if self._table is None or self._table[0] is not self.typical:
            self._table = (self.typical, final_waste_table(self.typical))
        return PlacementHold(self.typical, state.snap.shape.total_gpu_milli, self.budget, self.seconds,
                             self._table[1])

    def _release(self, placement: Placement, out: CycleHolds) -> None:
        for name, h in list(self._held.items()):
            if h.pod.name == placement.pod:
                del self._held[name]
                out.bind.append(h)
                return

    def _flush(self, out: CycleHolds) -> None:
        out.held = list(self._held.values())
        self._hold = None
