"""What the scheduler shows of its queue (Kueue's visibility API: the queue manager serves what it
knows): for every waiting gang, its position in the cluster's queue and in its team's, the wait
reason of the cycle, and the estimated start and nodes computed with the cycle's own profile, quota
book and reservation (core.estimate.estimate_starts). And the cluster picture: GPUs free per node,
held by a plan, MIG slices, allocation and FGD fragmentation. Pure: the scheduler publishes it
(scheduler/publish.py), the UI and `airflow-gpu queue` only read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.model import GPU_MILLI, Gang, PodRequest
from airflow_gpu.core.plugins.fgd import FGDScore, TypicalPods
from airflow_gpu.core.estimate import ESTIMATE_LIMIT, RunLengths, StartCalibration, estimate_starts
from airflow_gpu.core.queue import CycleResult, queue_order
from airflow_gpu.core.snapshot import Snapshot

REASON_NOT_TRIED = "not tried by the scheduler yet"


@dataclass(frozen=True)
class WaitingEntry:
    """One waiting gang as the scheduler shows it. `position`: in its team's queue; both positions
    count from 1 in queue order (core.queue.queue_order) over the waiting gangs."""

    gang: str
    team: str
    tier: str
    priority: int
    gpus: float
    products: tuple[str, ...]
    created_at: float
    cluster_position: int
    position: int
    reason: str
    estimated_start: float | None
    estimate_note: str
    nodes: tuple[str, ...]
    # GPU products of `nodes`: where a gang that accepts several products is expected to start (one:
    # its GPU pod sets keep to one product); the queue page and `airflow-gpu queue` show it
    expected_products: tuple[str, ...]
    # when its tier's wait bound (max_wait_seconds > 0) is up: before, newer work of the bounded tiers
    # goes ahead of it; after, it keeps its place (Gang.due_at). None: no such bound
    due_at: float | None = None

    def as_dict(self) -> dict:
        return {"gang": self.gang, "team": self.team, "tier": self.tier, "priority": self.priority,
                "gpus": self.gpus, "products": list(self.products), "created_at": self.created_at,
                "cluster_position": self.cluster_position, "position": self.position, "reason": self.reason,
                "estimated_start": self.estimated_start, "estimate_note": self.estimate_note,
                "nodes": list(self.nodes), "expected_products": list(self.expected_products),
                "due_at": self.due_at}


def gpus_of(members: Iterable[PodRequest], mig_gpus: Callable[[str], float] | None = None) -> float:
    """Whole GPUs asked; a MIG slice counts `mig_gpus(profile)`: the config's rule (its `slices`,
    config.core.mig_gpus), which the caller passes in, as core reads no config."""
    def one(m: PodRequest) -> float:
        if not m.mig_profile:
            return m.gpus + m.gpu_milli / GPU_MILLI
        if mig_gpus is None:
            raise ValueError(f"pod {m.name} asks for MIG {m.mig_profile}: pass mig_gpus, the config's rule for "
                             f"what one slice counts (airflow_gpu.config.core.mig_gpus)")
        return m.gpus + m.gpu_milli / GPU_MILLI + mig_gpus(m.mig_profile)

    return round(sum(one(m) for m in members), 3)


def waiting_entries(state: CycleState, pending: Sequence[Gang], result: CycleResult, profile: Profile,
                    now: float, nominated: Sequence[tuple[Gang, Sequence[str]]] = (),
                    reasons: Mapping[str, str] | None = None,
                    limit: int = ESTIMATE_LIMIT, mig_gpus: Callable[[str], float] | None = None,
                    run_lengths: RunLengths | None = None,
                    calibration: StartCalibration | None = None) -> list[WaitingEntry]:
    """Every gang of `pending` the cycle of `result` did not admit, and every gang of `nominated`
    ((gang, its nodes): a held preemption plan waiting for its victims, not pending any more), in
    queue order.
    Reason: `reasons` where given (the scheduler passes the reason it last wrote for a gang the
    cycle skipped in back-off, or one that preempts), else the cycle's. `state`: the cycle's state
    before the cycle. `mig_gpus`: what a MIG slice counts in GPUs (gpus_of); `run_lengths`,
    `calibration`: what was learned so far (core.estimate.RunLengths, StartCalibration)."""
    reasons = reasons or {}
    admitted = {d.gang.name for d in result.admitted}
    waiting = queue_order([g for g in pending if g.name not in admitted] + [g for g, _ in nominated])
    starts = estimate_starts(state, waiting, result, profile, now, limit,
                             nominated={g.name: tuple(nodes) for g, nodes in nominated}, run_lengths=run_lengths,
                             calibration=calibration)
    product = state.node_product
    per_team: dict[str, int] = {}
    out = []
    for i, gang in enumerate(waiting, start=1):
        per_team[gang.team] = per_team.get(gang.team, 0) + 1
        est = starts[gang.name]
        reason = reasons.get(gang.name) or result.waiting.get(gang.name) or REASON_NOT_TRIED
        out.append(WaitingEntry(
            gang.name, gang.team, gang.tier, gang.priority, gpus_of(gang.members, mig_gpus),
            tuple(sorted({p for m in gang.members for p in m.gpu_products})), gang.created_at, i,
            per_team[gang.team], reason, est.start, est.note, est.nodes,
            tuple(sorted({product.get(n) or "" for n in est.nodes} - {""})), gang.due_at if gang.max_wait else None))
    return out


def cluster_picture(snap: Snapshot, held_nodes: Iterable[str], pods: Sequence[PodRequest]) -> dict:
    """Nodes x GPUs: per GPU free milli, held by a plan, MIG devices; allocation and FGD
    fragmentation against `pods` (the typical pods: the waiting and running ones)."""
    held = set(held_nodes)
    nodes = []
    for i, node in enumerate(snap.nodes):
        free = snap.gpu_free[i]
        nodes.append({
            "name": node.name, "product": node.gpu_product, "capacity_type": node.capacity_type,
            # which device a pod got is the device plugin's choice, unknown here: used ones first
            "gpus": sorted(int(f) for f in free[: node.gpu_count]), "held": node.name in held,
            "mig": {p: [int(snap.mig_free[i, snap.shape.mig_profiles.index(p)]), int(c)] for p, c in node.mig_slices},
        })
    total = snap.shape.total_gpu_milli
    frag = 0.0
    typical = TypicalPods.from_pods(pods) if pods else None
    if typical is not None and len(typical) and total:
        frag = float(np.sum(FGDScore(typical=typical).node_frag(snap))) / total
    return {"nodes": nodes, "allocation_ratio": float(snap.gpu_allocation_ratio()), "fragmentation": frag,
            "gpus_total": int(total // GPU_MILLI)}
