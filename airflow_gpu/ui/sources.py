"""Reads for the queue and the ledger: Airflow's pools, task instances and XCom results (ORM session,
inside the api-server or a CLI with DB access), the scheduler's published queue (kube.queue_status)
and, for the chargeback, the cluster's pods and nodes (kubeconfig, one list each)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from airflow_gpu.kube import queue_status
from airflow_gpu.ui.queue import POOL_PREFIX, PoolRow, TaskRow

WAITING_STATES = ("scheduled", "queued", "running", "deferred", "up_for_retry")


class Unreadable(RuntimeError):
    """The published queue could not be read; the message says where and why."""


@dataclass
class ClusterObjects:
    pods: dict[str, dict]  # namespace/name -> pod
    nodes: dict[str, dict]  # name -> node


def _key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def read_cluster(kubeconfig: str | Path) -> ClusterObjects:
    """Pods and nodes as plain dicts (no model deserialisation: 1,000s of pods stay fast)."""
    from kubernetes import client

    from airflow_gpu.kube.client import api_client

    with api_client(kubeconfig, pool=2) as api:
        core = client.CoreV1Api(api)

        def items(resp) -> list[dict]:
            return json.loads(resp.data)["items"]

        with ThreadPoolExecutor(max_workers=2) as pool:  # the two lists at once: the API server's time dominates
            pods_f = pool.submit(lambda: items(core.list_pod_for_all_namespaces(_preload_content=False)))
            nodes_f = pool.submit(lambda: items(core.list_node(_preload_content=False)))
            pods, nodes = pods_f.result(), nodes_f.result()
    return ClusterObjects({_key(p): p for p in pods}, {n["metadata"]["name"]: n for n in nodes})


def read_published(kubeconfig: str | Path, namespace: str, scheduler_name: str) -> dict | None:
    """The scheduler's published queue, None when there is none."""
    from kubernetes import client

    from airflow_gpu.kube.client import api_client

    where = f"ConfigMap {namespace}/{queue_status.configmap_name(scheduler_name)}"
    try:
        with api_client(kubeconfig, pool=1) as api:
            return queue_status.read(api, namespace, scheduler_name)
    except queue_status.StatusUnreadable as exc:
        raise Unreadable(f"the scheduler's published queue ({where}) cannot be read: {exc}") from exc
    except client.ApiException as exc:
        fix = " (the api-server's identity needs get on it: deploy/README.md)" if exc.status in (401, 403) else ""
        raise Unreadable(f"the scheduler's published queue ({where}): {exc.status} {exc.reason}{fix}") from exc
    except Exception as exc:  # noqa: BLE001 - connection errors of every kind: say which cluster
        raise Unreadable(f"the cluster of [airflow_gpu] kubeconfig {kubeconfig} is not reachable: "
                         f"{type(exc).__name__}: {exc}") from exc


def read_pools_and_tasks(session) -> tuple[list[PoolRow], list[TaskRow]]:
    """The GPU pools and their task instances in the states that hold or wait for slots: the pool
    table, then one query on the task instances by pool and state (Airflow's index ti_pool). The pool
    counts are Airflow's own (Pool.slots_stats: running + queued, and deferred where the pool counts
    it, occupy; queued here = queued + scheduled), summed from the same rows."""
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance as TI

    pools = {p.pool: p for p in session.query(Pool.pool, Pool.slots, Pool.include_deferred, Pool.team_name).filter(
        Pool.pool.like(POOL_PREFIX + "%"))}
    if not pools:
        return [], []
    rows = session.query(TI.dag_id, TI.task_id, TI.run_id, TI.try_number, TI.pool, TI.state, TI.queued_dttm,
                         TI.scheduled_dttm, TI.priority_weight, TI.pool_slots).filter(
        TI.pool.in_(sorted(pools)), TI.state.in_(WAITING_STATES))
    slots: dict[tuple[str, str], int] = {}
    tasks = []
    for r in rows:
        state = str(getattr(r.state, "value", r.state))
        slots[(r.pool, state)] = slots.get((r.pool, state), 0) + (r.pool_slots or 1)
        when = r.queued_dttm or r.scheduled_dttm
        tasks.append(TaskRow(r.dag_id, r.task_id, r.run_id, r.try_number, r.pool, state,
                             when.timestamp() if when else None, r.priority_weight or 0, r.pool_slots or 1))
    out = []
    for name, p in pools.items():
        count = lambda state: slots.get((name, state), 0)  # noqa: E731
        occupied = count("running") + count("queued") + (count("deferred") if p.include_deferred else 0)
        out.append(PoolRow(name, int(p.slots), occupied, count("deferred"), count("queued") + count("scheduled"),
                           getattr(p, "team_name", None)))
    return out, tasks


def read_xcom_results(session, since: float, until: float) -> list[dict]:
    """The operator's return values (XCom key return_value) of GPU tasks that ended in the period."""
    from datetime import datetime, timezone

    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel

    lo = datetime.fromtimestamp(since, timezone.utc)
    hi = datetime.fromtimestamp(until, timezone.utc)
    q = session.query(TI.dag_id, TI.task_id, TI.run_id, TI.try_number, TI.pool, TI.start_date, TI.end_date,
                      XComModel.value).join(
        XComModel, (XComModel.dag_id == TI.dag_id) & (XComModel.task_id == TI.task_id) &
        (XComModel.run_id == TI.run_id) & (XComModel.map_index == TI.map_index)).filter(
        XComModel.key == "return_value", TI.pool.like(POOL_PREFIX + "%"), TI.end_date >= lo, TI.end_date < hi)
    out = []
    for r in q:
        from airflow_gpu.ui.queue import pool_parts

        team = (pool_parts(r.pool) or ("", ""))[0]
        value = r.value if isinstance(r.value, dict) else json.loads(r.value) if r.value else {}
        product = str(value.get("gpu_product") or "")  # pools span products; the operator reports its own
        out.append({"team": team, "product": product, "try": (r.dag_id, r.task_id, r.run_id, str(r.try_number)),
                    "start": (r.start_date or r.end_date).timestamp(), "end": r.end_date.timestamp(), "value": value})
    return out
