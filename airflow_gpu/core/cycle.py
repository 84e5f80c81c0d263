"""One cycle state: capacity AND quota usage, changed together (Kueue's pkg/cache snapshot).

Every decision of a scheduling cycle (admission, preemption planning, the earliest-start estimate)
reads one `CycleState` and what-ifs run on `copy()`:
- `snap`: free capacity; it holds every gang that takes GPUs (running, terminating, held plans);
- `book`, `usage`: the quota book and what each team uses. Usage counts the same gangs the snapshot
  holds: running ones, terminating ones (until their GPUs are free) and held plans (a binding in
  progress or a preemption's nomination), so a plan can never be admitted twice against one quota;
- `running`: the gangs that may be preempted (not terminating, not held, not a nomination's victim);
- `node_product`: node name -> GPU product label, built once per node list.

API (stable; the scheduler, the simulator and the replay build on it):
    state = CycleState.build(snap, running, book, held=[(team, placements), ...], terminating=[...])
    state.add(running_gang)     # a gang starts: capacity assumed, usage added, becomes a candidate
    state.remove(running_gang)  # a gang leaves: capacity and usage released
    state.hold(team, placements)  # a plan reserved: capacity assumed (pods the snapshot does not
                                  # hold yet) and usage added; never a candidate
    state.nominate(team, placements, victims)  # a preemption plan: its quota counts, the victims' too
                                               # until they are gone
    state.without(victims)      # a copy with those gangs gone (what preemption asks)
    state.demand(placements)    # quota demand of placed pods
    state.demand_of(running_gang)  # the same, computed once per gang (by name, while its placements stay)
`build` expects `snap` to hold every placement passed in already (the scheduler's World does);
`CycleState.from_running(nodes_snap, running, ...)` is the shortcut when only running gangs exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from airflow_gpu.core.model import Placement, RunningGang
from airflow_gpu.core.quota import (
    Demand,
    QuotaBook,
    QuotaUsage,
    QuotaVerdict,
    borrowing,
    check,
    demand_of_placements,
    placement_speed,
)
from airflow_gpu.core.snapshot import Snapshot


def node_products(snap: Snapshot) -> dict[str, str | None]:
    """Node name -> its GPU product label (kept once per node list, on the snapshot's shape)."""
    return snap.shape.node_product


@dataclass
class CycleState:
    snap: Snapshot
    book: QuotaBook | None = None
    usage: QuotaUsage | None = None
    running: list[RunningGang] = field(default_factory=list)
    node_product: dict[str, str | None] = field(default_factory=dict)
    # quota demand per running gang, shared by copies: preemption planning releases the same gangs
    # from many what-if copies. Gang name -> (its placements tuple, demand): valid while the gang's
    # placements are that tuple (a gang that moved is a new RunningGang with a new tuple)
    demands: dict[str, tuple] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, snap: Snapshot, running: Iterable[RunningGang] = (), book: QuotaBook | None = None,
              held: Iterable[tuple[str, Sequence[Placement]]] = (),
              terminating: Iterable[RunningGang] = (),
              nominated: Iterable[tuple[str, Sequence[Placement], Sequence[RunningGang]]] = ()) -> CycleState:
        """From a snapshot that already holds `running`, `terminating` and `held` (team, placements).
        `nominated`: preemption plans (team, placements, victims) whose victims are still in `snap`;
        they count as nominate() counts them (and the victims belong in no other argument)."""
        running = list(running)
        node_product = node_products(snap)
        state = cls(snap, book, QuotaUsage() if book is not None else None, running, node_product)
        if book is not None:
            for rg in running + list(terminating):
                state.usage.add(rg.gang.team, state.demand_of(rg))
            for team, placements, victims in nominated:
                for v in victims:
                    state.usage.add(v.gang.team, state.demand_of(v))
            state.count_plans(held, nominated)
        return state

    def count_plans(self, held: Iterable[tuple[str, Sequence[Placement]]] = (),
                    nominated: Iterable[tuple[str, Sequence[Placement], Sequence[RunningGang]]] = ()) -> None:
        """Add held plans and nominations to a usage that counts every running gang (a nomination's
        victims too): what build() does after summing the gangs, and what core.live does on the
        usage it keeps by deltas."""
        if self.usage is None:
            return
        for team, placements in held:
            self.usage.add(team, self.demand(placements))
        for team, placements, victims in nominated:
            self.usage.add(team, self.nomination_charge(team, placements, victims))

    def copy(self) -> CycleState:
        return CycleState(self.snap.copy(), self.book, self.usage.copy() if self.usage is not None else None,
                          list(self.running), self.node_product, self.demands)

    def speed(self, placements: Iterable[Placement]) -> float:
        """Relative speed of the GPU product `placements` run on (core.quota.placement_speed)."""
        return placement_speed(placements, self.node_product, self.book)

    # --- quota views ------------------------------------------------------------------------
    def demand(self, placements: Iterable[Placement]) -> Demand:
        return demand_of_placements(placements, self.node_product, self.book)

    def demand_of(self, rg: RunningGang) -> Demand:
        """A running gang's quota demand: computed once per gang and placements (demands)."""
        hit = self.demands.get(rg.gang.name)
        if hit is not None and hit[0] is rg.placements:
            return hit[1]
        demand = demand_of_placements(rg.placements, self.node_product, self.book)
        self.demands[rg.gang.name] = (rg.placements, demand)
        return demand

    def check(self, team: str, demand: Demand) -> QuotaVerdict:
        """May `team` take `demand` now? Always fits without a quota book."""
        if self.book is None or self.usage is None:
            return QuotaVerdict(True)
        return check(self.book, self.usage, team, demand)

    def borrowing(self, team: str, keys: Iterable) -> bool:
        """Is `team` above its guarantee now on one of `keys`? (Kueue: the ClusterQueue borrows.)"""
        return self.book is not None and self.usage is not None and borrowing(self.book, self.usage, team, keys)

    # --- changes ----------------------------------------------------------------------------
    def add(self, rg: RunningGang) -> None:
        self.restore(rg)
        self.running.append(rg)

    def remove(self, rg: RunningGang) -> None:
        self._release(rg)
        self.running = [r for r in self.running if r is not rg]

    def _release(self, rg: RunningGang) -> None:
        self.snap.forget_placed(rg.placements)  # a pod the snapshot does not hold frees nothing
        if self.usage is not None:
            self.usage.remove(rg.gang.team, self.demand_of(rg))

    def hold(self, team: str, placements: Sequence[Placement], assume: bool = True) -> None:
        """A plan's placements count from now on. assume=False: their capacity is held by other
        means (a nomination's nodes are reserved while its victims still run on them)."""
        if assume:
            for p in placements:
                if p.pod not in self.snap.placements:
                    self.snap.assume(p)
        if self.usage is not None:
            self.usage.add(team, self.demand(placements))

    def nominate(self, team: str, placements: Sequence[Placement], victims: Iterable[RunningGang]) -> None:
        """A preemption plan is held: its quota counts from now on. Its victims keep their GPUs and
        their quota until they are gone (a team never holds more than its ceiling, not even while its
        preempted gangs stop) and are no candidates again. Its nodes are reserved by the caller (the
        victims still run on them)."""
        victims = list(victims)
        gone = {v.gang.name for v in victims}
        self.running = [r for r in self.running if r.gang.name not in gone]
        if self.usage is not None:
            self.usage.add(team, self.nomination_charge(team, placements, victims))

    def nomination_charge(self, team: str, placements: Sequence[Placement],
                          victims: Iterable[RunningGang]) -> Demand:
        """What a nomination adds to its team's usage while its victims (counted) still run: where
        they are the team's own gangs, the team holds either them or the nomination at any moment,
        so it is charged the larger of the two per quota key, not both."""
        own: dict = {}
        for v in victims:
            if v.gang.team == team:
                for key, amount in self.demand_of(v).items():
                    own[key] = own.get(key, 0) + amount
        return {key: amount - own.get(key, 0) for key, amount in self.demand(placements).items()
                if amount > own.get(key, 0)}

    def capacity_view(self) -> CycleState:
        """A copy of capacity and quota only (no preemption candidates): what admission what-ifs
        read, without copying the list of every running gang."""
        return CycleState(self.snap.copy(), self.book, self.usage.copy() if self.usage is not None else None,
                          [], self.node_product, self.demands)

    def release(self, rg: RunningGang) -> None:
        """Free a gang's capacity and quota (a what-if: `running` is left alone)."""
        self._release(rg)

    def restore(self, rg: RunningGang) -> None:
        """Hold a gang's pods and quota (undoes release(rg) on a what-if; `running` is left alone)."""
        for p in rg.placements:
            if p.pod not in self.snap.placements:
                self.snap.assume(p)
        if self.usage is not None:
            self.usage.add(rg.gang.team, self.demand_of(rg))

    def without(self, victims: Iterable[RunningGang]) -> CycleState:
        work = self.copy()
        gone = set()
        for v in victims:
            work._release(v)
            gone.add(v.gang.name)
        work.running = [r for r in work.running if r.gang.name not in gone]
        return work
