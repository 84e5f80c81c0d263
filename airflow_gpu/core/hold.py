"""Held placements: a placement that strands GPU capacity stays provisional, so that a larger pod
that fits nowhere may take its room (the displaced pod is placed again if it fits, else it fails).

Why (issue 16): in the inflation experiment a policy that places every pod that fits and never
moves one cannot close the gap. Every share of the shape that dominates the loss (810 milli, on a
GPU of its own) arriving before the cluster is full gets placed, and each strands 190 milli only
the rare pods of <= 190 milli can fill: on the default openb trace (seed 42) 957 such GPUs are 182
of the 241 unallocated GPUs, and no choice of WHERE to put them changes how many arrive first.
What can change it is WHICH pods keep the room once demand exceeds capacity: a whole-GPU pod
arriving later uses the same GPU fully.

Rule: a share whose placement raises its GPU's expected final waste (the lookahead table of
core/plugins/fgd.final_waste_table: the milli a hole of x still has free when the workload is
over) is held. A held pod is released (bound where it was reserved) after at most `hold_seconds`
(expire), and earlier when the held pods' GPU milli passes `budget_fraction` of the cluster's GPU
milli (the oldest first). A pod that fits nowhere may displace held pods of smaller total GPU
demand (fewest milli lost first, one node, at most as many as it needs GPUs); a displaced pod
placed again elsewhere is bound there at once (held once, so its wait stays bounded). Only single
pods are offered: a gang member is never held (the caller's rule; shares are single pods).

On a real cluster a held pod is one the scheduler has reserved but not yet bound, as a pod waiting
at kube-scheduler's Permit stage ("Wait" with a timeout; kube-scheduler rejects a pod whose wait
times out, here the timeout allows it: its placement is still valid). Its GPUs are reserved and
idle while it waits, and its start is delayed: both are costs the inflation experiment (no clock,
no run time) does not see. Once a pod is bound Kubernetes cannot move it (only delete it), so
displacement applies to held pods only.

Off unless asked for (`simulate inflation --hold [F]`, `simulate replay --placement-hold F`); every
output of such a run names it (experiment_label). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.framework import Profile, place_pod
from airflow_gpu.core.model import GPU_MILLI, Placement, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods, final_waste_table
from airflow_gpu.core.snapshot import Snapshot

# the experiment's budget when none is given (at most this fraction of the cluster's GPU milli held
# at once); the scheduler holds none
EXPERIMENT_HOLD_FRACTION = 0.08


def experiment_label(budget_fraction: float, hold_seconds: float = math.inf) -> str:
    """How every output of a run with held placements names them: not what the scheduler runs."""
    bound = "unbounded" if math.isinf(hold_seconds) else f"at most {hold_seconds:g} s"
    return f"held placements (hold={budget_fraction:g}, {bound}), not run by the scheduler"


@dataclass(frozen=True)
class _Held:
    placement: Placement
    pod: PodRequest
    node: int
    gpu: int  # the one GPU the share sits on
    milli: int
    slot: int  # its row in PlacementHold's arrays
    until: float  # when it is released (bound) at the latest


@dataclass(frozen=True)
class Displacement:
    """What make_room did: the pod's placement, the held pods moved elsewhere (new placements) and
    the held pods that fit nowhere else any more (they failed)."""

    placement: Placement
    moved: tuple[Placement, ...]
    displaced: tuple[PodRequest, ...]
    released: tuple[Placement, ...] = ()  # placements to bind now (the budget, or not held at all)


class PlacementHold:
    """The held (provisional) placements of one snapshot, oldest first."""

    def __init__(self, typical: TypicalPods, capacity_milli: int, budget_fraction: float = EXPERIMENT_HOLD_FRACTION,
                 hold_seconds: float = math.inf, final_waste: np.ndarray | None = None):
        if not 0 <= budget_fraction <= 1:
            raise ValueError(f"hold: budget_fraction must be in [0, 1] (a fraction of the GPU capacity), "
                             f"got {budget_fraction}")
        if not hold_seconds > 0:
            raise ValueError(f"hold: hold_seconds must be > 0 (how long a pod may stay held), got {hold_seconds}")
        # final_waste: the table of `typical`, when the caller keeps it (it costs ms to compute)
        self.final_waste = final_waste_table(typical) if final_waste is None else final_waste
        self.budget_milli = int(budget_fraction * capacity_milli)
        self.hold_seconds = hold_seconds
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._held_milli = 0
        # the held pods as columns (node, GPU, milli, CPU, memory), one row a slot, so that the
        # search for room is vectorised: at 10x the cluster thousands are held at once
        self._columns = np.zeros((5, 64), dtype=np.int64)
        self._alive = np.zeros(64, dtype=bool)
        self._by_slot: list[_Held | None] = [None] * 64
        self._free_slots = list(range(63, -1, -1))

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, name: str) -> bool:
        return name in self._held

    @property
    def held_milli(self) -> int:
        return self._held_milli

    def strands(self, snap: Snapshot, placement: Placement) -> bool:
        """True if `placement` (already assumed in `snap`) is a share that raised its GPU's
        expected final waste."""
        if len(placement.gpu_shares) != 1 or placement.gpu_shares[0][1] >= GPU_MILLI:
            return False
        g, milli = placement.gpu_shares[0]
        after = int(snap.gpu_free[snap.node_index(placement.node), g])
        return self.final_waste[after] > self.final_waste[after + milli]

    def until(self, name: str) -> float:
        """When the held pod `name` is released at the latest."""
        return self._held[name].until

    def held(self) -> list[tuple[PodRequest, Placement, float]]:
        """The held pods, oldest first: (pod, its reserved placement, release time)."""
        return [(e.pod, e.placement, e.until) for e in self._held.values()]

    def offer(self, snap: Snapshot, pod: PodRequest, placement: Placement, now: float = 0.0,
              until: float | None = None) -> list[Placement]:
        """Consider a placement just assumed in `snap`: hold it if it strands capacity. Returns the
        placements released to keep within the budget (oldest first), which are bound now; `pod`
        itself is among them when it is not held. `until`: a pod held before keeps its release time
        (offer those oldest first)."""
        if not self.budget_milli or not self.strands(snap, placement):
            return [placement]
        g, milli = placement.gpu_shares[0]
        if not self._free_slots:
            size = len(self._alive)
            self._columns = np.concatenate([self._columns, np.zeros_like(self._columns)], axis=1)
            self._alive = np.concatenate([self._alive, np.zeros(size, dtype=bool)])
            self._by_slot.extend([None] * size)
            self._free_slots = list(range(2 * size - 1, size - 1, -1))
        slot = self._free_slots.pop()
        entry = _Held(placement, pod, snap.node_index(placement.node), g, milli, slot,
                      now + self.hold_seconds if until is None else until)
        self._held[pod.name] = entry
        self._columns[:, slot] = (entry.node, g, milli, pod.cpu_milli, pod.memory_mib)
        self._alive[slot] = True
        self._by_slot[slot] = entry
        self._held_milli += milli
        released = []
        while self._held_milli > self.budget_milli:
            released.append(self._release(next(iter(self._held))).placement)
        return released

    def expire(self, now: float) -> list[Placement]:
        """Release (to be bound at their reserved places) the held pods whose time is up, oldest
        first. Entries are kept in hold order and every one gets the same hold, so the expired ones
        are a prefix."""
        released = []
        while self._held and next(iter(self._held.values())).until <= now:
            released.append(self._release(next(iter(self._held))).placement)
        return released

    def release(self, name: str) -> Placement:
        """Release one held pod now (bound at its reserved place)."""
        return self._release(name).placement

    def drop(self, name: str) -> None:
        """Forget a held pod that is gone (deleted while held): its room is the caller's to free."""
        if name in self._held:
            self._release(name)

    def _release(self, name: str) -> _Held:
        entry = self._held.pop(name)
        self._held_milli -= entry.milli
        self._alive[entry.slot] = False
        self._by_slot[entry.slot] = None
        self._free_slots.append(entry.slot)
        return entry

    def make_room(self, snap: Snapshot, pod: PodRequest, profile: Profile, now: float = 0.0) -> Displacement | None:
        """For `pod`, which fits nowhere: take the room of held pods of smaller GPU demand on one
        node, place it there (assumed in `snap`), place the displaced pods again where they fit.
        None (and `snap` unchanged) if no set of held pods makes room."""
        if not self._held or not pod.uses_gpu:
            return None
        for victims in self._candidates(snap, pod):
            for v in victims:
                snap.forget(v.placement)
            placement, _ = place_pod(snap, pod, profile)
            if placement is None:  # another filter (taint, selector, product) still refuses it
                for v in victims:
                    snap.assume(v.placement)
                continue
            snap.assume(placement)
            moved, displaced, released = [], [], []
            for v in victims:
                self._release(v.pod.name)
                again, _ = place_pod(snap, v.pod, profile)
                if again is None:
                    displaced.append(v.pod)
                else:
                    snap.assume(again)
                    moved.append(again)  # bound where it moved: held once, its wait stays bounded
                    released.append(again)
            released += self.offer(snap, pod, placement, now)
            return Displacement(placement, tuple(moved), tuple(displaced), tuple(released))
        return None

    def _candidates(self, snap: Snapshot, pod: PodRequest, tries: int = 3) -> list[list[_Held]]:
        """Up to `tries` victim sets, fewest GPU milli lost first: held pods on one node whose
        removal gives `pod` its GPUs, CPU and memory (other filters are checked by the caller).
        One victim is vectorised over every held pod; sets of several (multi-GPU pods, or CPU
        short) are searched only on nodes whose held pods together could make room."""
        slots = np.flatnonzero(self._alive)
        slots = slots[self._columns[2, slots] < pod.gpu_milli_total]
        if not len(slots):
            return []
        node, gpu, milli, cpu, mem = self._columns[:, slots]
        gpu_after = snap.gpu_free[node, gpu] + milli
        if pod.gpus:
            gains = (gpu_after == GPU_MILLI).astype(np.int64)  # the victim leaves its GPU whole
            gpu_ok = snap.whole_free_gpus()[node] + gains >= pod.gpus
        else:
            gains = (gpu_after >= pod.gpu_milli).astype(np.int64)
            gpu_ok = (snap.max_gpu_free()[node] >= pod.gpu_milli) | (gains > 0)
        res_ok = (snap.cpu_free[node] + cpu >= pod.cpu_milli) & (snap.mem_free[node] + mem >= pod.memory_mib)
        single = np.flatnonzero(gpu_ok & res_ok)
        best = single[np.lexsort((node[single], milli[single]))[:tries]]  # fewest milli, then node
        options = [(int(milli[i]), 1, int(node[i]), [self._by_slot[slots[i]]]) for i in best]
        if pod.gpus < 2 and len(options) >= tries:
            return [o[3] for o in options]
        # several victims on one node (a multi-GPU pod, or CPU short): only where all its held pods
        # together would do, summed per node that holds some (not over every node of the cluster)
        held_at, at = np.unique(node, return_inverse=True)
        k = len(held_at)
        gains_at = np.bincount(at, weights=gains, minlength=k)
        if pod.gpus:
            gpu_enough = snap.whole_free_gpus()[held_at] + gains_at >= pod.gpus
        else:
            gpu_enough = gains_at + (snap.max_gpu_free()[held_at] >= pod.gpu_milli) > 0
        enough = (gpu_enough
                  & (np.bincount(at, minlength=k) > 1)  # one held pod alone was tried above
                  & (snap.cpu_free[held_at] + np.bincount(at, weights=cpu, minlength=k) >= pod.cpu_milli)
                  & (snap.mem_free[held_at] + np.bincount(at, weights=mem, minlength=k) >= pod.memory_mib))
        if pod.gpu_products:
            enough &= snap.shape.product_mask(pod.gpu_products)[held_at]
        enough[np.isin(held_at, node[single])] = False  # one victim does it on these nodes
        wanted = held_at[enough]
        if len(wanted):
            on_wanted = np.isin(node, wanted)
            order = np.argsort(node[on_wanted], kind="stable")
            held_nodes, starts = np.unique(node[on_wanted][order], return_index=True)
            for i, group in zip(held_nodes.tolist(), np.split(slots[on_wanted][order], starts[1:])):
                victims = _victims_on(snap, i, pod, [self._by_slot[k] for k in group])
                if victims is not None:
                    options.append((sum(v.milli for v in victims), len(victims), i, victims))
        options.sort(key=lambda o: o[:3])
        return [o[3] for o in options[:tries]]


def _victims_on(snap: Snapshot, node: int, pod: PodRequest, entries: list[_Held]) -> list[_Held] | None:
    """The fewest-milli held pods on `node` whose removal lets `pod` fit there (GPU form, CPU,
    memory), or None. Whole GPUs: each victim must leave its GPU entirely free."""
    cpu, mem = int(snap.cpu_free[node]), int(snap.mem_free[node])
    row = snap.gpu_free[node]
    if pod.gpus:
        need = pod.gpus - int(snap.whole_free_gpus()[node])
        freeing = sorted((e for e in entries if row[e.gpu] + e.milli == GPU_MILLI), key=lambda e: e.milli)
        chosen = freeing[: max(need, 0)]
        if len(chosen) < need:
            return None
    else:
        if int(snap.max_gpu_free()[node]) >= pod.gpu_milli:
            chosen = []
        else:
            fitting = [e for e in entries if row[e.gpu] + e.milli >= pod.gpu_milli]
            if not fitting:
                return None
            chosen = [min(fitting, key=lambda e: e.milli)]
    # CPU or memory may still be short: add the node's other held pods, smallest first
    rest = sorted((e for e in entries if e not in chosen), key=lambda e: e.milli)
    while cpu + sum(e.pod.cpu_milli for e in chosen) < pod.cpu_milli or \
            mem + sum(e.pod.memory_mib for e in chosen) < pod.memory_mib:
        if not rest:
            return None
        chosen.append(rest.pop(0))
    if not chosen or sum(e.milli for e in chosen) >= pod.gpu_milli_total:
        return None
    return chosen
