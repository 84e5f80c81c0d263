"""The running cluster kept from cycle to cycle: capacity and quota usage changed by deltas, not rebuilt.

kube-scheduler and Kueue keep one cache that the informer's events change (a pod bound, a pod gone)
and take a snapshot of it per cycle. `LiveState` is that cache on the core side: the caller (the
scheduler's informer cache, the simulator) tells it which gangs started and ended; each cycle
`cycle_state()` hands out a CycleState copy, at the cost of copying arrays and dicts, not of
re-assuming every running pod and re-summing every gang's quota (at 50,000 pods that rebuild is
most of a cycle). Pure: no I/O, no Kubernetes.

    live = LiveState.from_nodes(nodes, book)
    live.start(running_gang)  # its pods assumed, its quota counted (OverCommitError: nothing held)
    live.end(name)            # released
    state = live.cycle_state(held=[(team, placements)], terminating=[...])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import Placement, RunningGang
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, demand_of_placements
from airflow_gpu.core.snapshot import OverCommitError, Snapshot


class LiveState:
    """Running gangs by name, with the snapshot and quota usage that hold exactly them."""

    def __init__(self, snap: Snapshot, book: QuotaBook | None = None):
        if len(snap.placements):
            raise ValueError("LiveState starts from an empty snapshot; add running gangs with start()")
        self.snap, self.book = snap, book
        self.usage = QuotaUsage() if book is not None else None
        self.running: dict[str, RunningGang] = {}
        self._demand: dict[str, dict] = {}
        # CycleState's demand cache (id of a placements tuple -> (tuple, demand)) for the running gangs
        self._by_id: dict[int, tuple] = {}

    @classmethod
    def from_nodes(cls, nodes, book: QuotaBook | None = None) -> LiveState:
        return cls(Snapshot.from_nodes(nodes), book)

    def start(self, rg: RunningGang) -> None:
        """A gang runs: its pods hold capacity and it counts against its team's quota. All or
        nothing: if one pod does not fit, nothing of the gang is held (OverCommitError)."""
        name = rg.gang.name
        if name in self.running:
            raise ValueError(f"gang {name} is running already; end() it before starting it again")
        done: list[Placement] = []
        try:
            for p in rg.placements:
                self.snap.assume(p)
                done.append(p)
        except OverCommitError:
            for p in done:
                self.snap.forget(p.pod)
            raise
        self.running[name] = rg
        if self.usage is not None:
            demand = self._demand[name] = demand_of_placements(rg.placements, self.snap.shape.node_product, self.book)
            self._by_id[id(rg.placements)] = (rg.placements, demand)
            self.usage.add(rg.gang.team, demand)

    def end(self, name: str) -> RunningGang:
        """The gang is gone (its pods ended or were deleted): capacity and quota released."""
        rg = self.running.pop(name, None)
        if rg is None:
            raise KeyError(f"gang {name} is not running in this state")
        for p in rg.placements:
            self.snap.forget(p.pod)
        if self.usage is not None:
            self.usage.remove(rg.gang.team, self._demand.pop(name))
            self._by_id.pop(id(rg.placements), None)
        return rg

    def cycle_state(self, held: Iterable[tuple[str, Sequence[Placement]]] = (),
                    terminating: Iterable[str] = ()) -> CycleState:
        """This cycle's CycleState: a copy (the live state is not changed by what the cycle tries).
        held: plans (team, placements) assumed on the copy and counted; terminating: names of
        running gangs that still hold capacity and quota but are no preemption candidates."""
        gone = set(terminating)
        # the running gangs' quota demand is known: the copy of the cache saves recomputing it
        state = CycleState(self.snap.copy(), self.book, self.usage.copy() if self.usage is not None else None,
                           [rg for name, rg in self.running.items() if name not in gone],
                           self.snap.shape.node_product, dict(self._by_id))
        for team, placements in held:
            state.hold(team, placements)
        return state
