"""`airflow-gpu dev up --dags DIR` (issue 27 item 6): a DAG of your own folder runs through the real
Airflow processes (api-server, scheduler, dag-processor, triggerer) on the local cluster with the GPU
scheduler to success; the caller's AIRFLOW__* settings reach the tasks; `dev down` leaves no process
behind (every PID the platform recorded is gone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from airflow_gpu.devtools.processes import wait_until

pytestmark = pytest.mark.slow

DAG = '''
import pendulum
from airflow.sdk import dag
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="my_dag", schedule=None, start_date=pendulum.datetime(2026, 1, 1))
def build():
    GpuTrainingOperator(task_id="train", team="nlp", tier="production-training", gpus_per_worker=1,
                        image="python:3.11", poll_interval=1, cmds=[{python!r}, "-c", "print('hello from rank 0')"])

build()
'''


def _finished(api, path: str) -> str | None:
    """The run's final state, None while it runs or while the api-server does not answer in time (a
    machine under load: ask again, the wait's own timeout bounds it)."""
    from airflow_gpu.airflow_api import AirflowApiError

    try:
        state = api.request("GET", path)["state"]
    except AirflowApiError as exc:
        if exc.status is not None:
            raise
        return None
    return state if state in ("success", "failed") else None


def _alive(pid: int) -> bool:
    from airflow_gpu.devtools.devplatform import _alive as alive

    return alive(pid)


def test_dev_up_runs_your_dag_and_dev_down_leaves_nothing(tmp_path):
    from airflow_gpu.airflow_api import AirflowApi, fetch_token

    dags, workdir = tmp_path / "mydags", tmp_path / "dev"
    dags.mkdir()
    (dags / "my_dag.py").write_text(DAG.format(python=sys.executable))
    env = {**os.environ, "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "3"}  # the caller's setting: kept
    up = subprocess.Popen([sys.executable, "-m", "airflow_gpu", "dev", "up", "--dags", str(dags), "--workdir",
                           str(workdir)], env=env, stdout=open(tmp_path / "up.log", "wb"), stderr=subprocess.STDOUT,
                          start_new_session=True)
    state = workdir / "dev.json"
    try:
        wait_until(lambda: state.exists() or up.poll() is not None, timeout=400, what="dev up ready")
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-4000:]
        info = json.loads(state.read_text())
        assert "Airflow UI: http://127.0.0.1:" in (tmp_path / "up.log").read_text()
        api = AirflowApi(info["ui"], token=fetch_token(info["ui"], info["username"], info["password"]))
        wait_until(lambda: api.request("GET", "/api/v2/dags/my_dag", ok=(200, 404)).get("dag_id") == "my_dag",
                   timeout=180, what="my_dag parsed")
        run = api.request("POST", "/api/v2/dags/my_dag/dagRuns", json={"logical_date": None, "conf": {}})
        path = f"/api/v2/dags/my_dag/dagRuns/{run['dag_run_id']}"
        final = wait_until(lambda: _finished(api, path), timeout=400, what="my_dag run finished")
        ti = api.request("GET", f"{path}/taskInstances/train")
        assert (final, ti["max_tries"]) == ("success", 3), ti
        api.close()
    finally:
        down = subprocess.run([sys.executable, "-m", "airflow_gpu", "dev", "down", "--workdir", str(workdir)],
                              capture_output=True, text=True, timeout=300)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)  # the test's own child, by PID
            up.wait()
    assert down.returncode == 0 and "dev platform stopped" in down.stdout, down.stdout + down.stderr
    assert up.returncode == 0 and not state.exists()
    time.sleep(1)
    left = {name: pid for name, pid in info["pids"].items() if _alive(pid)}
    assert not left, left
