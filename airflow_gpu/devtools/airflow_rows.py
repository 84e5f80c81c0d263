"""Task instances written straight into an AirflowStack's metadata DB, for views that read them (the
GPU queue reads task instances by pool and state, nothing else of their DAG): one DagModel per dag_id,
one DAG run per dag_id, one task instance per row. Runs in a child interpreter with the stack's
environment, so the caller's own Airflow configuration is untouched.

    insert_task_instances(stack, "manual__1", [{"dag_id": "d", "task_id": "t", "state": "scheduled",
                                                "pool": "gpu.nlp.preemptible", "pool_slots": 56,
                                                "priority_weight": 1000, "waited": 30}])
"""

from __future__ import annotations

import json
import subprocess
import sys

_INSERT = r'''
import json, sys, uuid
from datetime import datetime, timedelta, timezone
from sqlalchemy import insert
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.session import create_session

run_id, rows = sys.argv[1], json.loads(sys.stdin.read())
now = datetime.now(timezone.utc)
dag_ids = sorted({r["dag_id"] for r in rows})
with create_session() as session:
    if session.get(DagBundleModel, "dags-folder") is None:
        session.add(DagBundleModel(name="dags-folder"))
        session.flush()
    for dag_id in dag_ids:
        if session.get(DagModel, dag_id) is None:
            session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", max_active_tasks=16,
                                 max_consecutive_failed_dag_runs=0, has_task_concurrency_limits=False))
    session.flush()
    session.execute(insert(DagRun.__table__), [
        {"dag_id": d, "run_id": run_id, "run_type": "manual", "state": "running", "run_after": now, "start_date": now}
        for d in dag_ids])
    session.execute(insert(TI.__table__), [
        {"id": uuid.uuid4(), "dag_id": r["dag_id"], "task_id": r["task_id"], "run_id": run_id, "map_index": -1,
         "try_number": r.get("try_number", 1), "state": r["state"], "pool": r["pool"], "pool_slots": r["pool_slots"],
         "priority_weight": r.get("priority_weight", 1), "queue": "default", "max_tries": 1,
         "scheduled_dttm": now - timedelta(seconds=r.get("waited", 0)),
         "queued_dttm": now - timedelta(seconds=r.get("waited", 0)), "hostname": "", "unixname": "airflow-gpu",
         "executor_config": {}} for r in rows])
print(len(rows))
'''


def insert_task_instances(stack, run_id: str, rows: list[dict]) -> int:
    """Rows: dag_id, task_id, state, pool, pool_slots [, priority_weight, try_number, waited (seconds)]."""
    done = subprocess.run([sys.executable, "-c", _INSERT, run_id], input=json.dumps(rows), env=stack.env(),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"inserting {len(rows)} task instances failed:\n{done.stderr[-3000:]}")
    return int(done.stdout.strip().splitlines()[-1])
