"""The GPU queue as the UI, the API and `airflow-gpu queue` show it: team pools, waiting GPU tasks with
their place in the queue, wait reason and estimated start, running gangs, and the cluster picture.

Built from what others decided: the Airflow pools and task instances, the cluster's objects read into
the scheduler's World (the same queue order), the wait reason the scheduler wrote on the PodGroup,
and core's estimate_start / FGD fragmentation. Nothing here decides.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import quote

import numpy as np

from airflow_gpu import constants as C
from airflow_gpu.core.model import GPU_MILLI
from airflow_gpu.core.plugins.fgd import FGDScore, TypicalPods
from airflow_gpu.core.policies import make_profile
from airflow_gpu.core.queue import estimate_start
from airflow_gpu.config import SLOTS_PER_GPU
from airflow_gpu.pools.plan import POOL_PREFIX, parse_pool_name
from airflow_gpu.scheduler.cache import View
from airflow_gpu.scheduler.convert import ConversionContext, gang_identity, hint_time, key_of, parse_time
from airflow_gpu.scheduler.state import Memo, build_world
from airflow_gpu.ui.ledger import try_key

ESTIMATE_LIMIT = 25  # estimated starts for the first N waiting gangs of the cluster's queue (cost bound)
# why a waiting row has no estimated start (its estimate_note)
NOTE_NOT_ESTIMATED = "not estimated: only the first {limit} gangs in the cluster's queue are"
NOTE_NO_END = "after running work that has no expected duration"
NOTE_NEVER = "would not fit even if every running gang ended"
NOTE_INCOMPLETE = "its gang is incomplete"
NOTE_IN_AIRFLOW = "no pods yet: Airflow holds the task"


@dataclass
class PoolRow:
    pool: str
    slots: int
    occupied: int
    deferred: int
    queued: int
    team_name: str | None = None


@dataclass
class TaskRow:
    """A GPU task instance waiting in Airflow (scheduled/queued, no pod yet) or with pods."""

    dag_id: str
    task_id: str
    run_id: str
    try_number: int
    pool: str
    state: str
    queued_at: float | None
    priority_weight: int = 0
    pool_slots: int = 1


@dataclass
class Inputs:
    pools: list[PoolRow]
    tasks: list[TaskRow]
    view: View
    ctx: ConversionContext = field(default_factory=ConversionContext)
    scheduler_name: str = C.DEFAULT_SCHEDULER_NAME
    base_url: str = ""  # Airflow UI base for task instance links


def pool_parts(pool: str) -> tuple[str, str] | None:
    """gpu.<team>.<tier class> -> (team, tier class); the naming is pools.plan's."""
    return parse_pool_name(pool)


def ti_link(base_url: str, dag_id: str, run_id: str, task_id: str) -> str:
    """The task instance's page in the Airflow UI (run ids hold ':' and '+': each part quoted)."""
    part = lambda s: quote(str(s), safe="")  # noqa: E731
    return f"{base_url.rstrip('/')}/dags/{part(dag_id)}/runs/{part(run_id)}/tasks/{part(task_id)}"


def _gpus(members) -> float:
    """Whole GPUs asked; a MIG slice counts by its compute slices (1g = 1/7), as the pools do."""
    return sum(m.gpus + m.gpu_milli / GPU_MILLI + (int(m.mig_profile.split("g")[0]) / SLOTS_PER_GPU
                                                  if m.mig_profile else 0) for m in members)


def cluster_picture(world, pending_gangs) -> dict:
    """Nodes x GPUs: per GPU free milli, held by a plan, MIG devices; allocation and FGD fragmentation."""
    snap = world.snapshot
    held_nodes = {p.node for plan in world.plans.values() for p in plan.placements.values()}
    nodes = []
    for i, node in enumerate(snap.nodes):
        free = snap.gpu_free[i]
        nodes.append({
            "name": node.name, "product": node.gpu_product, "capacity_type": node.capacity_type,
            # which device a pod got is the device plugin's choice, unknown here: used ones first
            "gpus": sorted(int(f) for f in free[: node.gpu_count]), "held": node.name in held_nodes,
            "mig": {p: [int(snap.mig_free[i, snap.shape.mig_profiles.index(p)]), int(c)] for p, c in node.mig_slices},
        })
    total = snap.shape.total_gpu_milli
    typical = TypicalPods.from_pods([m for g in pending_gangs for m in g.members] +
                                    [m for r in world.running for m in r.gang.members]) if (pending_gangs or world.running) else None
    frag = 0.0
    if typical is not None and len(typical) and total:
        frag = float(np.sum(FGDScore(typical=typical).node_frag(snap))) / total
    return {"nodes": nodes, "allocation_ratio": snap.gpu_allocation_ratio(), "fragmentation": frag,
            "gpus_total": total // GPU_MILLI}


def build(inputs: Inputs, now: float | None = None, estimate_limit: int = ESTIMATE_LIMIT, memo: Memo | None = None) -> dict:
    """memo: the conversions of an earlier build to reuse (the same answer, faster)."""
    now = time.time() if now is None else now
    world = build_world(inputs.view, inputs.scheduler_name, inputs.ctx, now, memo=memo)
    teams = []
    for p in sorted(inputs.pools, key=lambda p: p.pool):
        parts = pool_parts(p.pool)
        if parts is None:
            continue
        teams.append({"team": parts[0], "tier_class": parts[1], "pool": p.pool, "slots": p.slots, "occupied": p.occupied,
                      "deferred": p.deferred, "queued": p.queued, "gpus": p.slots / SLOTS_PER_GPU,
                      "occupied_gpus": p.occupied / SLOTS_PER_GPU, "deferred_gpus": p.deferred / SLOTS_PER_GPU,
                      "queued_gpus": p.queued / SLOTS_PER_GPU, "team_name": p.team_name})
    tis = {(t.dag_id, t.task_id, t.run_id, str(t.try_number)): t for t in inputs.tasks}
    seen: set[tuple] = set()
    waiting = []
    profile = make_profile("bestfit")
    pending_gangs = [g for _, g in world.pending]
    for pos, (unit, gang) in enumerate(world.pending):
        pod = (unit.pods or [{}])[0]
        labels = (pod.get("metadata") or {}).get("labels") or {}
        key = try_key(labels)
        seen.add(key)
        est, note = None, NOTE_NOT_ESTIMATED.format(limit=estimate_limit)
        if pos < estimate_limit:
            res = estimate_start(world.snapshot, gang, world.running, profile, now)
            est = None if res is None or math.isinf(res.start) else res.start
            note = NOTE_NEVER if res is None else NOTE_NO_END if est is None else ""
        waiting.append(_waiting_row(key, gang.team, gang.tier, _gpus(gang.members),
                                    sorted({p for m in gang.members for p in m.gpu_products}),
                                    now - (gang.created_at or now), unit.annotation(C.ANNOTATION_WAIT_REASON) or
                                    "not tried by the scheduler yet", est, pos + 1, inputs.base_url, unit.key, note))
    for unit, reason in world.incomplete:
        labels = ((unit.pods or [{}])[0].get("metadata") or {}).get("labels") or {}
        key = try_key(labels)
        seen.add(key)
        who = gang_identity(unit.key, unit.podgroup, unit.pods, inputs.ctx)  # the namespace's team, not a label's
        waiting.append(_waiting_row(key, who.team, who.tier, 0, [], 0,
                                    reason, None, None, inputs.base_url, unit.key, NOTE_INCOMPLETE))
    full = {t["pool"]: t for t in teams}
    order = sorted((t for k, t in tis.items() if k not in seen and t.state in ("scheduled", "queued")),
                   key=lambda t: (-t.priority_weight, t.queued_at or now))
    for t in order:
        parts = pool_parts(t.pool) or ("", "")
        pool = full.get(t.pool)
        reason = (f"pool full: {t.pool} has {pool['occupied']} of {pool['slots']} slots occupied"
                  if pool and pool["occupied"] + t.pool_slots > pool["slots"] else "waiting for an Airflow executor slot")
        waiting.append(_waiting_row((t.dag_id, t.task_id, t.run_id, str(t.try_number)), parts[0], "",
                                    t.pool_slots / SLOTS_PER_GPU, [], now - (t.queued_at or now), reason,
                                    None, None, inputs.base_url, "", NOTE_IN_AIRFLOW))
    _positions(waiting)
    running = [_running_row(world.running_units[r.gang.name], r, world, now, inputs.base_url) for r in world.running]
    return {"generated_at": now, "teams": teams, "waiting": waiting, "running": running,
            "cluster": cluster_picture(world, pending_gangs)}


def _waiting_row(key, team, tier, gpus, products, waited, reason, est, cluster_pos, base_url, gang, note) -> dict:
    """note: why there is no estimated start (empty when there is one)."""
    dag_id, task_id, run_id, _ = key or (None, None, None, None)
    return {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "team": team, "tier": tier, "gang": gang,
            "gpus": round(gpus, 3), "products": products, "waiting_seconds": round(max(0.0, waited), 1),
            "cluster_position": cluster_pos, "position": None, "reason": reason, "estimated_start": est,
            "estimate_note": note, "link": ti_link(base_url, dag_id, run_id, task_id) if dag_id else None}


def _positions(waiting: list[dict]) -> None:
    """Position in the team's queue and in the cluster's: list order (the scheduler's order first,
    then tasks Airflow still holds back by pool)."""
    per_team: dict[str, int] = {}
    for i, row in enumerate(waiting, start=1):
        per_team[row["team"]] = per_team.get(row["team"], 0) + 1
        row["position"] = per_team[row["team"]]
        row["cluster_position"] = i


def _running_row(unit, rg, world, now, base_url) -> dict:
    pods = []
    interruptions = preemptions = 0
    for pod in unit.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        known = world.nodes.get(node)
        pods.append({"name": key_of(pod), "node": node, "capacity_type": known.capacity_type if known else "unknown"})
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        interruptions = max(interruptions, _count(ann, C.ANNOTATION_INTERRUPTIONS))
        preemptions = max(preemptions, _count(ann, C.ANNOTATION_PREEMPTIONS))
    labels = ((unit.pods or [{}])[0].get("metadata") or {}).get("labels") or {}
    key = try_key(labels)
    dag_id, task_id, run_id, _ = key or (None, None, None, None)
    ckpt = hint_time(unit.annotation(C.ANNOTATION_LAST_CHECKPOINT_TIME), "last checkpoint", [])  # a hint: bad is none
    age = None if not ckpt else round(now - ckpt, 1)
    return {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "team": rg.gang.team, "tier": rg.gang.tier,
            "gang": unit.key, "gpus": round(_gpus(rg.gang.members), 3), "pods": pods,
            "running_seconds": round(now - rg.started_at, 1) if rg.started_at else None,
            "last_checkpoint_age_seconds": age, "interruptions": interruptions, "preemptions": preemptions,
            "link": ti_link(base_url, dag_id, run_id, task_id) if dag_id else None}


def _count(annotations: Mapping[str, str], name: str) -> int:
    """A relaunch counter the operator writes on its pods; a value a user mangled counts as 0."""
    try:
        return max(0, int(annotations.get(name) or 0))
    except ValueError:
        return 0
