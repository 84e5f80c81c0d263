"""The GPU queue as the UI, the API and `airflow-gpu queue` show it: team pools, waiting GPU tasks with
their place in the queue, wait reason and estimated start, running gangs, and the cluster picture.

Everything about the cluster's queue is what the scheduler published in its last cycle (its own
profile, quota book, reservation: scheduler/publish.py, read through kube/queue_status.py), joined
with Airflow's pools and task instances (links, tasks Airflow still holds back by pool). Nothing here
decides, places or estimates: with no publication, or one too old, the answer says so (`stale`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import quote

from airflow_gpu import constants as C
from airflow_gpu.config import SLOTS_PER_GPU
from airflow_gpu.pools.plan import POOL_PREFIX, parse_pool_name

NOTE_INCOMPLETE = "its gang is incomplete"
NOTE_IN_AIRFLOW = "no pods yet: Airflow holds the task"
STALE_GRACE = 30.0  # a publication older than 3 x its interval + this is stale (the scheduler is not publishing)
EMPTY_CLUSTER = {"nodes": [], "allocation_ratio": 0.0, "fragmentation": 0.0, "gpus_total": 0}


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
    published: dict | None  # the scheduler's published queue (kube.queue_status.read), None: none
    base_url: str = ""  # Airflow UI base for task instance links
    source: str = ""  # where the publication is read (for the message when there is none)


def pool_parts(pool: str) -> tuple[str, str] | None:
    """gpu.<team>.<tier class> -> (team, tier class); the naming is pools.plan's."""
    return parse_pool_name(pool)


def ti_link(base_url: str, dag_id: str, run_id: str, task_id: str) -> str:
    """The task instance's page in the Airflow UI (run ids hold ':' and '+': each part quoted)."""
    part = lambda s: quote(str(s), safe="")  # noqa: E731
    return f"{base_url.rstrip('/')}/dags/{part(dag_id)}/runs/{part(run_id)}/tasks/{part(task_id)}"


def stale_after(published: dict) -> float:
    """Seconds after which a publication is stale: 3 publish intervals and a grace."""
    return 3 * float(published.get("publish_interval") or C.DEFAULT_PUBLISH_INTERVAL) + STALE_GRACE


def freshness(published: dict | None, now: float, source: str = "") -> tuple[float | None, bool, str]:
    """(published_at, stale, message): the message says why the queue is not the scheduler's now."""
    where = f" ({source})" if source else ""
    if published is None:
        return None, True, (f"the scheduler has published no queue{where}: is `airflow-gpu scheduler` running, "
                            f"and [airflow_gpu] scheduler_name / scheduler_namespace its own?")
    at = float(published.get("generated_at") or 0)
    if now - at > stale_after(published):
        return at, True, (f"the scheduler's queue{where} was published {now - at:.0f} s ago (it publishes every "
                          f"{published.get('publish_interval')} s): the scheduler is not running or not leading; "
                          f"what follows is as of then")
    return at, False, ""


def _key(ti) -> tuple | None:
    return tuple(ti) if ti else None


def build(inputs: Inputs, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    pub = inputs.published
    published_at, stale, message = freshness(pub, now, inputs.source)
    pub = pub or {}
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
    per_team: dict[str, int] = {}
    for e in pub.get("waiting") or []:  # the scheduler's queue, its positions as published
        key = _key(e.get("ti"))
        seen.add(key)
        per_team[e["team"]] = max(per_team.get(e["team"], 0), e["position"])
        waiting.append(_waiting_row(key, e["team"], e["tier"], e["gpus"], e["products"],
                                    now - (e.get("created_at") or now), e["reason"], e["estimated_start"],
                                    e["cluster_position"], e["position"], inputs.base_url, e["gang"],
                                    e["estimate_note"], e.get("nodes") or [], e.get("expected_products") or [],
                                    e.get("estimate_error"), e.get("due_at")))
    later = []  # after the scheduler's queue: gangs not complete yet, then what Airflow holds back
    for e in pub.get("incomplete") or []:
        key = _key(e.get("ti"))
        seen.add(key)
        later.append(_waiting_row(key, e["team"], e["tier"], 0, [], 0, e["reason"], None, None, None,
                                  inputs.base_url, e["gang"], NOTE_INCOMPLETE))
    full = {t["pool"]: t for t in teams}
    order = sorted((t for k, t in tis.items() if k not in seen and t.state in ("scheduled", "queued")),
                   key=lambda t: (-t.priority_weight, t.queued_at or now))
    for t in order:
        parts = pool_parts(t.pool) or ("", "")
        pool = full.get(t.pool)
        reason = (f"pool full: {t.pool} has {pool['occupied']} of {pool['slots']} slots occupied"
                  if pool and pool["occupied"] + t.pool_slots > pool["slots"] else "waiting for an Airflow executor slot")
        later.append(_waiting_row((t.dag_id, t.task_id, t.run_id, str(t.try_number)), parts[0], "",
                                  t.pool_slots / SLOTS_PER_GPU, [], now - (t.queued_at or now), reason,
                                  None, None, None, inputs.base_url, "", NOTE_IN_AIRFLOW))
    for i, row in enumerate(later, start=len(waiting) + 1):
        per_team[row["team"]] = per_team.get(row["team"], 0) + 1
        row["cluster_position"], row["position"] = i, per_team[row["team"]]
    running = [_running_row(r, now, inputs.base_url) for r in pub.get("running") or []]
    warnings = [message] if message else []
    cut = {k: v for k, v in (pub.get("truncated") or {}).items() if v}
    if cut:  # the publication was capped under the API's object size limit (kube.queue_status.encode)
        warnings.append("the scheduler's publication leaves out " +
                        ", ".join(f"{n} {'nodes' if k == 'nodes' else k + ' gangs'}" for k, n in sorted(cut.items())) +
                        " (object size limit); the rows shown are the first in its order")
    return {"generated_at": now, "published_at": published_at, "stale": stale,
            "scheduler": pub.get("scheduler"), "profile": pub.get("profile"), "cycle": pub.get("cycle"),
            "truncated": pub.get("truncated") or {}, "teams": teams, "waiting": waiting + later, "running": running,
            "cluster": pub.get("cluster") or EMPTY_CLUSTER, "warnings": warnings}


def _waiting_row(key, team, tier, gpus, products, waited, reason, est, cluster_pos, team_pos, base_url, gang, note,
                 nodes=(), expected_products=(), error=None, due_at=None) -> dict:
    """note: why there is no estimated start (empty when there is one); error: how far off it may be
    (seconds, the p90 the replay measured for its tier; None: not measured); due_at: when its tier's
    wait bound is up (None: no bound), as published."""
    dag_id, task_id, run_id, _ = key or (None, None, None, None)
    return {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "team": team, "tier": tier, "gang": gang,
            "gpus": round(gpus, 3), "products": list(products), "waiting_seconds": round(max(0.0, waited), 1),
            "cluster_position": cluster_pos, "position": team_pos, "reason": reason, "estimated_start": est,
            "estimate_note": note, "estimate_error": error, "due_at": due_at, "nodes": list(nodes), "expected_products": list(expected_products),
            "link": ti_link(base_url, dag_id, run_id, task_id) if dag_id else None}


def _running_row(r: dict, now: float, base_url: str) -> dict:
    dag_id, task_id, run_id, _ = _key(r.get("ti")) or (None, None, None, None)
    ckpt, started = r.get("last_checkpoint_at"), r.get("started_at")
    return {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "team": r["team"], "tier": r["tier"],
            "gang": r["gang"], "gpus": r["gpus"], "pods": r["pods"],
            "running_seconds": round(now - started, 1) if started else None,
            "last_checkpoint_age_seconds": None if not ckpt else round(now - ckpt, 1),
            "interruptions": r["interruptions"], "preemptions": r["preemptions"],
            "link": ti_link(base_url, dag_id, run_id, task_id) if dag_id else None}
