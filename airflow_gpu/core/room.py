"""Room estimate: how many members of a gang fit on each node's free capacity, summed per topology
domain (core.topology's estimate, the one admission uses to pick domains).

If no domain has room by this estimate, admission fails too; so preemption planning and the
earliest-start estimate use it to skip full placements that cannot succeed. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import keeps_one_product
from airflow_gpu.core.model import GPU_MILLI, Gang, RunningGang, TopologyLevel
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import LADDER, eligible_nodes, fit_count, fit_count_one, members_per_node


class RoomEstimate:
    """Members of `gang` that fit per node and per domain, at the topology levels it may use."""

    def __init__(self, snap: Snapshot, gang: Gang, eligible: np.ndarray):
        """eligible: [S, N] per pod set (core.topology.eligible_nodes)."""
        self.snap, self.gang, self.by_set = snap, gang, eligible
        self.eligible = eligible.any(axis=0)  # [N] the node suits some member
        self.want = len(gang.members)
        req = gang.topology
        last = LADDER.index(req.level) if req.hard else len(LADDER) - 1
        self.levels = [TopologyLevel.NODE] if self.want == 1 else list(LADDER[: last + 1])
        # a gang whose GPU pods stay on one product (core.gang.keeps_one_product) fits in a domain only
        # on one product's nodes: each domain counts per product, or the estimate says "room" where
        # only the products together have it, and every placement tried there fails (a CPU-only
        # member may go anywhere: then the domains are not split, which stays an upper bound)
        self.per_product = keeps_one_product(gang) and all(m.uses_gpu for m in gang.members)
        self._ids: dict[TopologyLevel, np.ndarray] = {}

    @classmethod
    def for_gang(cls, snap: Snapshot, gang: Gang, profile: Profile) -> RoomEstimate:
        """Eligible nodes: those passing the gang's filters on an EMPTY cluster, a superset of what
        any release of running gangs can open up, so the estimate stays an upper bound."""
        shape = snap.shape

        def build() -> np.ndarray:
            empty = Snapshot(shape, np.where(shape.gpu_exists, GPU_MILLI, 0), shape.cpu_cap.copy(),
                             shape.mem_cap.copy(), shape.mig_cap.copy(), {})
            eligible = eligible_nodes(empty, gang, profile)
            eligible.setflags(write=False)
            return eligible

        # a fact of the node list and the asks (names aside): one per distinct gang shape, not per
        # estimate (the head of line is estimated again in most cycles)
        key = ("room-eligible", profile.filters, tuple(ps.request.shape for ps in gang.pod_sets))
        return cls(snap, gang, shape.derived(key, build))

    def ids(self, level: TopologyLevel) -> np.ndarray:
        """[N] the domain of each node at `level` (-1: none); per (domain, product) when the gang
        keeps to one product."""
        hit = self._ids.get(level)
        if hit is None:
            # a fact of the node list: once per level and split (the head of line is estimated in most cycles)
            hit = self._ids[level] = self.snap.shape.cached_mask(("room-ids", level, self.per_product),
                                                                  lambda: self._domain_ids(level))
        return hit

    def _domain_ids(self, level: TopologyLevel) -> np.ndarray:
        shape = self.snap.shape
        if level is TopologyLevel.NODE:
            return np.arange(len(self.snap))
        ids = np.zeros(len(self.snap), dtype=np.int64) if level is TopologyLevel.ANY else shape.domain_ids(level.value)
        if self.per_product:
            product = shape.product_id  # -1: no GPU product, never a GPU member's node
            ids = np.where((ids >= 0) & (product >= 0), ids * (len(shape.products) + 1) + product, -1)
        return ids

    def may_fit(self, snap: Snapshot) -> bool:
        return self.holds(members_per_node(snap, self.gang, self.by_set))

    def holds(self, fit: np.ndarray) -> bool:
        """Some domain of a level the gang may use holds all its members, by `fit` ([N] members
        per node)."""
        for level in self.levels:
            ids = self.ids(level)
            known = ids >= 0
            if known.any() and np.bincount(ids[known], weights=fit[known]).max() >= self.want:
                return True
        return False

    def tracker(self, snap: Snapshot) -> RoomTracker:
        return RoomTracker(self, snap)

    def fit_one(self, row, cpu: int, mem: int, node: int) -> int:
        """members_per_node for one node from its free GPU row (list or array), CPU and memory
        (MIG not counted: still an upper bound)."""
        if not isinstance(row, list):
            row = row.tolist()
        by_set = self.by_set
        return sum(fit_count_one(ps.request, ps.count, cpu, mem, row)
                   for s, ps in enumerate(self.gang.pod_sets) if by_set[s, node])

    def fit_all(self, cpu: np.ndarray, mem: np.ndarray, gpu_rows: np.ndarray) -> np.ndarray:
        """[N] members_per_node on the given free capacity of every node (MIG not counted)."""
        out = np.zeros(len(cpu), dtype=np.int64)
        for s, ps in enumerate(self.gang.pod_sets):
            out += np.where(self.by_set[s], fit_count(ps.request, ps.count, cpu, mem, gpu_rows), 0)
        return out


class RoomTracker:
    """The room estimate kept up to date while running gangs are released one by one on `snap`
    (mutated), touching only the nodes they held: O(pods) over a whole release order."""

    def __init__(self, room: RoomEstimate, snap: Snapshot):
        self.room, self.snap = room, snap
        self.fit = members_per_node(snap, room.gang, room.by_set).astype(np.int64)
        self.sums = []
        for level in room.levels:
            ids = room.ids(level)
            if level is TopologyLevel.NODE:
                self.sums.append((ids, None))
            else:
                known = ids >= 0
                size = int(ids.max()) + 1 if known.any() else 0
                self.sums.append((ids, np.bincount(ids[known], weights=self.fit[known], minlength=size)))

    def holds(self) -> bool:
        """RoomEstimate.holds(self.fit), read from the per-domain sums kept up to date (no bincount
        per question: the estimates ask it at every release time)."""
        want = self.room.want
        for _, sums in self.sums:
            if sums is None:
                if len(self.fit) and self.fit.max() >= want:
                    return True
            elif len(sums) and sums.max() >= want:
                return True
        return False

    def release(self, running: RunningGang) -> bool:
        """Forget the gang's pods; True if some domain may now hold the gang."""
        snap = self.snap
        touched = snap.forget_placed(running.placements)
        return self.update([(n, snap.gpu_free[n], int(snap.cpu_free[n]), int(snap.mem_free[n])) for n in touched])

    def update(self, nodes: Iterable[tuple[int, object, int, int]]) -> bool:
        """Nodes' free capacity rose to (node, free GPU row, CPU, memory), the snapshot being
        released elsewhere (core.estimate shares one release sequence between the gangs it
        estimates); True if some domain may now hold the gang."""
        room = self.room
        hit = False
        for n, row, cpu, mem in nodes:
            if not room.eligible[n]:
                continue
            new = room.fit_one(row, cpu, mem, n)
            delta = new - int(self.fit[n])
            self.fit[n] = new
            for ids, sums in self.sums:
                if sums is None:
                    hit = hit or new >= room.want
                elif ids[n] >= 0:
                    sums[ids[n]] += delta
                    hit = hit or sums[ids[n]] >= room.want
        return hit
