"""Airflow's own KubernetesPodOperator (cncf provider) on the local cluster with do_xcom_push=True, run by
`dag.test()` in a child interpreter: the base container writes /airflow/xcom/return.json inside its view
(the emptyDir the operator mounts), the operator reads it by exec into the airflow-xcom-sidecar and stops
the sidecar with `kill -2 $(pgrep ...)` (which a container's PID namespace keeps away from the host).
Sync and deferrable (the trigger runs inline in dag.test())."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_gpu.devtools.dag_test import DAG_TEST_SCRIPT

pytestmark = pytest.mark.slow

DAG = '''
import pendulum
from airflow.sdk import dag
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    KubernetesPodOperator(
        task_id="kpo", name="kpo-{dag_id}", namespace="default", image="python:3.11",
        cmds={cmds!r}, do_xcom_push=True, deferrable={deferrable}, poll_interval=1,
        get_logs=True, on_finish_action="delete_pod", startup_timeout_seconds=120)

build()
'''

RUN = DAG_TEST_SCRIPT  # dag.test() in a fresh interpreter (devtools/dag_test.py)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_kubernetes_pod_operator_returns_the_xcom(sqlite_airflow_db, kube_cluster, deferrable):
    marker = uuid.uuid4().hex[:8]
    dag_id = f"kpo_{'deferrable' if deferrable else 'sync'}"
    script = ("import json, os; os.makedirs('/airflow/xcom', exist_ok=True); "
              f"json.dump({{'rows': 7, 'marker': '{marker}'}}, open('/airflow/xcom/return.json', 'w')); "
              "print('base done')")
    folder = sqlite_airflow_db.home / "dags"
    folder.mkdir(exist_ok=True)
    (folder / f"{dag_id}.py").write_text(DAG.format(dag_id=dag_id, cmds=[sys.executable, "-c", script],
                                                    deferrable=deferrable))
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}})
    env = sqlite_airflow_db.env(AIRFLOW_CONN_KUBERNETES_DEFAULT=conn, AIRFLOW__LOGGING__LOGGING_LEVEL="INFO")
    proc = subprocess.run([sys.executable, "-c", RUN, str(folder), dag_id], env=env, capture_output=True, text=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out[-6000:]
    result = json.loads(line[len("RESULT "):])
    ti = result["tis"]["kpo"]
    assert (result["state"], ti["state"]) == ("success", "success"), out[-6000:]
    xcom = ti["xcom"] if isinstance(ti["xcom"], dict) else json.loads(ti["xcom"])
    assert xcom == {"rows": 7, "marker": marker}
    assert "Failed to kill xcom sidecar" not in out, out[-6000:]
    assert not Path("/airflow/xcom/return.json").exists()  # written inside the pod's view only
