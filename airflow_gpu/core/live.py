"""The running cluster kept from cycle to cycle: capacity and quota usage changed by deltas, not rebuilt.

kube-scheduler and Kueue keep one cache that the informer's events change (a pod bound, a pod gone)
and take a snapshot of it per cycle. `LiveState` is that cache on the core side: the caller (the
simulator, the benchmark) tells it which gangs started and ended; each cycle `cycle_state()` hands
out a CycleState copy, at the cost of copying arrays and dicts, not of re-assuming every running pod
and re-summing every gang's quota (at 50,000 pods that rebuild is most of a cycle). Pure: no I/O,
no Kubernetes.

    live = LiveState.from_nodes(nodes, book)
    live.start(running_gang)  # its pods assumed, its quota counted (OverCommitError: nothing held)
    live.end(name)            # released
    state = live.cycle_state(held=[(team, placements)], terminating=[...], nominated=[...])

`QuotaLedger` is the quota half alone, for a caller that keeps capacity by other means (the
scheduler's Memo holds running pods by pod, whatever gang they belong to): `sync(gangs)` each
cycle re-counts only the gangs whose team or placements changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import Placement, RunningGang
from airflow_gpu.core.quota import Demand, QuotaBook, QuotaUsage, demand_of_placements
from airflow_gpu.core.snapshot import OverCommitError, Snapshot

Held = Iterable[tuple[str, Sequence[Placement]]]
Nominated = Iterable[tuple[str, Sequence[Placement], Sequence[RunningGang]]]


class QuotaLedger:
    """Quota usage of the running gangs, by gang name, kept by deltas (Kueue's cache of admitted
    workloads): a gang's demand is computed when it starts or changes, never again per cycle."""

    def __init__(self, book: QuotaBook, node_product: Mapping[str, str | None]):
        self.book, self.node_product = book, node_product
        self.usage = QuotaUsage()
        self._gangs: dict[str, tuple[str, tuple[Placement, ...], Demand]] = {}  # name -> (team, placements, demand)
        self._demands: dict[str, tuple] = {}  # CycleState.demands: gang name -> (placements, demand)

    def __contains__(self, name: str) -> bool:
        return name in self._gangs

    def add(self, name: str, team: str, placements: Sequence[Placement]) -> Demand:
        if name in self._gangs:
            raise ValueError(f"gang {name} is counted already; remove() it before adding it again")
        placements = placements if isinstance(placements, tuple) else tuple(placements)
        demand = demand_of_placements(placements, self.node_product, self.book)
        self._gangs[name] = (team, placements, demand)
        self._demands[name] = (placements, demand)
        self.usage.add(team, demand)
        return demand

    def remove(self, name: str) -> None:
        team, _, demand = self._gangs.pop(name)
        self._demands.pop(name, None)
        self.usage.remove(team, demand)

    def sync(self, gangs: Iterable[RunningGang]) -> None:
        """Count exactly `gangs` (by name): gone ones removed, new or changed ones (team or
        placements) counted again, the rest untouched. A gang's RunningGang may be a new object
        every cycle: its placements tuple is kept, so CycleState.demand_of finds its demand."""
        seen = set()
        for rg in gangs:
            seen.add(rg.gang.name)
            self.put(rg.gang.name, rg)
        for name in [n for n in self._gangs if n not in seen]:
            self.remove(name)

    def put(self, name: str, rg: RunningGang | None) -> None:
        """sync() for one gang: `rg` counted under `name` (None: not running)."""
        held = self._gangs.get(name)
        if rg is None:
            if held is not None:
                self.remove(name)
            return
        if held is not None and held[0] == rg.gang.team and held[1] == rg.placements:
            if held[1] is not rg.placements:
                self._gangs[name] = (held[0], rg.placements, held[2])
                self._demands[name] = (rg.placements, held[2])
            return
        if held is not None:
            self.remove(name)
        self.add(name, rg.gang.team, rg.placements)

    def demand_cache(self) -> dict[str, tuple]:
        """CycleState.demands (gang name -> (placements tuple, demand)) of the counted gangs."""
        return dict(self._demands)

    def cycle_state(self, snap: Snapshot, running: Iterable[RunningGang], held: Held = (),
                    nominated: Nominated = ()) -> CycleState:
        """A CycleState on `snap` (which holds every counted gang, `held` and the nominations'
        victims) whose usage is this ledger's, plus `held` and `nominated`, as CycleState.build
        would count them when every counted gang is running, terminating or a nomination's victim.
        `running`: the preemption candidates."""
        state = CycleState(snap, self.book, self.usage.copy(), list(running), self.node_product, self.demand_cache())
        state.count_plans(held, nominated)
        return state


class LiveState:
    """Running gangs by name, with the snapshot and quota usage that hold exactly them."""

    def __init__(self, snap: Snapshot, book: QuotaBook | None = None):
        if len(snap.placements):
            raise ValueError("LiveState starts from an empty snapshot; add running gangs with start()")
        self.snap, self.book = snap, book
        self.ledger = QuotaLedger(book, snap.shape.node_product) if book is not None else None
        self.running: dict[str, RunningGang] = {}

    @property
    def usage(self) -> QuotaUsage | None:
        return self.ledger.usage if self.ledger is not None else None

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
        if self.ledger is not None:
            self.ledger.add(name, rg.gang.team, rg.placements)

    def end(self, name: str) -> RunningGang:
        """The gang is gone (its pods ended or were deleted): capacity and quota released."""
        rg = self.running.pop(name, None)
        if rg is None:
            raise KeyError(f"gang {name} is not running in this state")
        for p in rg.placements:
            self.snap.forget(p.pod)
        if self.ledger is not None:
            self.ledger.remove(name)
        return rg

    def cycle_state(self, held: Held = (), terminating: Iterable[str] = (),
                    nominated: Iterable[tuple[str, Sequence[Placement], Iterable[str]]] = ()) -> CycleState:
        """This cycle's CycleState: a copy (the live state is not changed by what the cycle tries).
        held: plans (team, placements) assumed on the copy and counted; terminating: names of
        running gangs that still hold capacity and quota but are no preemption candidates;
        nominated: preemption plans (team, placements, victim names) whose victims still run (their
        nodes are held by the victims; the plan is charged as CycleState.nominate charges it)."""
        nominated = [(team, placements, [self.running[v] for v in victims]) for team, placements, victims in nominated]
        gone = set(terminating) | {v.gang.name for _, _, victims in nominated for v in victims}
        running = [rg for name, rg in self.running.items() if name not in gone]
        snap = self.snap.copy()
        if self.ledger is not None:
            state = self.ledger.cycle_state(snap, running, nominated=nominated)
        else:
            state = CycleState(snap, None, None, running, self.snap.shape.node_product)
        for team, placements in held:
            state.hold(team, placements)
        return state
