"""Airflow's own KubernetesPodOperator and KubernetesJobOperator (cncf provider) on the local cluster, run
by `dag.test()` in a child interpreter (triggers run inline).
- KPO with do_xcom_push=True, sync and deferrable: the base container writes /airflow/xcom/return.json
  inside its view (the emptyDir the operator mounts), the operator reads it by exec into the
  airflow-xcom-sidecar and stops the sidecar with `kill -2 $(pgrep ...)` (which a container's PID
  namespace keeps away from the host).
- Deferrable KPO with logging_interval: the task comes back from the trigger every interval and reads
  the log since the last line it saw (sinceSeconds / sinceTime); every numbered line is in the task log.
- KubernetesJobOperator, sync and deferrable: a Job of 2 completions x 2 in parallel completes, and the
  XCom of each pod comes back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

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


def run_dag(airflow_db, kube_cluster, dag_id: str, source: str) -> tuple[dict, str]:
    """Write the DAG file, run dag.test() in a child interpreter: (RESULT, its stdout + stderr)."""
    folder = airflow_db.home / "dags"
    folder.mkdir(exist_ok=True)
    (folder / f"{dag_id}.py").write_text(source)
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}})
    env = airflow_db.env(AIRFLOW_CONN_KUBERNETES_DEFAULT=conn, AIRFLOW__LOGGING__LOGGING_LEVEL="INFO")
    proc = subprocess.run([sys.executable, "-c", RUN, str(folder), dag_id], env=env, capture_output=True, text=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out[-6000:]
    return json.loads(line[len("RESULT "):]), out


def xcom_value(ti: dict):
    return ti["xcom"] if not isinstance(ti["xcom"], str) else json.loads(ti["xcom"])


def writes_xcom(value: str, then: str) -> list[str]:
    """A container command: write `value` (a Python expression) as the XCom, then print `then`."""
    return [sys.executable, "-c", "import json, os, uuid; os.makedirs('/airflow/xcom', exist_ok=True); "
            f"json.dump({value}, open('/airflow/xcom/return.json', 'w')); print({then!r})"]


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_kubernetes_pod_operator_returns_the_xcom(sqlite_airflow_db, kube_cluster, deferrable):
    marker = uuid.uuid4().hex[:8]
    dag_id = f"kpo_{'deferrable' if deferrable else 'sync'}"
    cmds = writes_xcom(f"{{'rows': 7, 'marker': '{marker}'}}", "base done")
    result, out = run_dag(sqlite_airflow_db, kube_cluster, dag_id, DAG.format(dag_id=dag_id, cmds=cmds,
                                                                              deferrable=deferrable))
    ti = result["tis"]["kpo"]
    assert (result["state"], ti["state"]) == ("success", "success"), out[-6000:]
    assert xcom_value(ti) == {"rows": 7, "marker": marker}
    assert "Failed to kill xcom sidecar" not in out, out[-6000:]
    assert not Path("/airflow/xcom/return.json").exists()  # written inside the pod's view only


LOGGING_DAG = '''
import pendulum
from airflow.sdk import dag
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    KubernetesPodOperator(
        task_id="kpo", name="kpo-{dag_id}", namespace="default", image="python:3.11", cmds={cmds!r},
        deferrable=True, logging_interval=1, poll_interval=1, get_logs=True, on_finish_action="keep_pod",
        startup_timeout_seconds=120)

build()
'''

LINES = 60


def test_deferrable_pod_operator_with_logging_interval_reads_every_line_it_asks_for(sqlite_airflow_db, kube_cluster):
    """60 numbered lines over 6 s, read by the trigger every second (logging_interval=1). The provider
    (10.25, AsyncPodManager.fetch_container_logs_before_current_sec) skips the lines of the current second
    and asks next time for sinceSeconds=ceil(elapsed), counted back from the server's clock as a kubelet
    does (exactly, not in whole seconds): the first lines of that skipped second can fall before the next
    window and are then never read. That is the provider's loss, on a real cluster too. The server's part
    is checked here: every line after the first fetch is in the task log, except only lines that open a
    new second right at a fetch boundary (the provider's signature; a server rounding since to whole
    seconds, or dropping lines, would show other gaps)."""
    marker = uuid.uuid4().hex[:6]
    script = (f"import time\nfor i in range({LINES}):\n    print('line-{marker}-%03d' % i, flush=True)\n"
              "    time.sleep(0.1)")
    result, out = run_dag(sqlite_airflow_db, kube_cluster, "kpo_logging_interval",
                          LOGGING_DAG.format(dag_id="kpo_logging_interval", cmds=[sys.executable, "-c", script]))
    assert (result["state"], result["tis"]["kpo"]["state"]) == ("success", "success"), out[-6000:]
    assert "Reading of logs interrupted" not in out, out[-6000:]
    core = kube_cluster.core()
    pod = next(p for p in core.list_namespaced_pod("default").items if p.metadata.name.startswith("kpo-kpo-logging"))
    stamped = core.read_namespaced_pod_log(pod.metadata.name, "default", timestamps=True, _preload_content=False)
    second_of = {int(m.group(2)): m.group(1) for m in re.finditer(  # line -> its whole second on the node
        rf"^(\S+?)(?:\.\d+)?Z line-{marker}-(\d{{3}})$", stamped.data.decode(), re.M)}
    assert sorted(second_of) == list(range(LINES))  # the container's log itself is complete
    trigger_reads = [int(n) for n in re.findall(rf"\[base\] line-{marker}-(\d{{3}}) .*AsyncPodManager", out)]
    # read by the trigger (its AsyncPodManager polls a running pod); it may read the last line too when a
    # fetch falls in the 0.1 s between the last line and the exit (seen once under CI's load)
    assert len(set(trigger_reads)) > 10
    core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    seen = {int(n) for n in re.findall(rf"line-{marker}-(\d{{3}})", out)}
    missing = sorted(set(range(LINES)) - seen)
    for i in missing:  # each lost line opens its second or follows a lost line of the same second
        assert i > 0 and (second_of[i - 1] < second_of[i] or (i - 1 in missing and second_of[i - 1] == second_of[i])), \
            (missing, out[-6000:])


JOB_DAG = '''
import pendulum
from airflow.sdk import dag
from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    KubernetesJobOperator(
        task_id="job", name="job-{dag_id}", namespace="default", image="python:3.11", cmds={cmds!r},
        completions=2, parallelism=2, backoff_limit=0, wait_until_job_complete=True, job_poll_interval=1,
        deferrable={deferrable}, get_logs=True, do_xcom_push=True, startup_timeout_seconds=120)

build()
'''


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_kubernetes_job_operator_completes_a_job(sqlite_airflow_db, kube_cluster, deferrable):
    marker = uuid.uuid4().hex[:8]
    dag_id = f"job_{'deferrable' if deferrable else 'sync'}"
    cmds = writes_xcom(f"{{'pod': uuid.uuid4().hex, 'marker': '{marker}'}}", f"worker done {marker}")
    result, out = run_dag(sqlite_airflow_db, kube_cluster, dag_id, JOB_DAG.format(dag_id=dag_id, cmds=cmds,
                                                                                  deferrable=deferrable))
    ti = result["tis"]["job"]
    assert (result["state"], ti["state"]) == ("success", "success"), out[-6000:]
    xcoms = xcom_value(ti)
    assert [x["marker"] for x in xcoms] == [marker, marker] and len({x["pod"] for x in xcoms}) == 2
    batch = client.BatchV1Api(kube_cluster.api_client())
    job = next(j for j in batch.list_namespaced_job("default").items  # "job-" + name= + a suffix
               if j.metadata.name.startswith(f"job-job-{dag_id}".replace("_", "-")))
    assert job.status.succeeded == 2 and not job.status.failed
    assert {c.type for c in job.status.conditions if c.status == "True"} >= {"Complete"}
    assert f"worker done {marker}" in out, out[-6000:]  # get_logs: the pods' logs are in the task log
    batch.delete_namespaced_job(job.metadata.name, "default", propagation_policy="Background")
