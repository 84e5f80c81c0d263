"""GpuTrainingOperator end to end with `dag.test()`: the local cluster (tests/fixtures/kube.py), the GPU
scheduler, SeaweedFS for checkpoints, a migrated Airflow DB; the task talks to the cluster through a
`kubernetes_default` connection whose kube_config_path is the cluster's kubeconfig, as for
KubernetesPodOperator. Each DAG runs in a child interpreter (dag.test() in its own AIRFLOW_HOME).

- success: XCom with the counters, no object of the task instance left;
- application failure (exit 1): the retry is spent, the retry's gang has a new attempt number;
- spot interruption mid-training: the gang is resubmitted within try 1 and resumes from its newest
  checkpoint (step > 0, in the task log), XCom reports one interruption.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_gpu import constants as C
from airflow_gpu.devtools.dag_test import DAG_TEST_SCRIPT
from airflow_gpu.devtools.processes import wait_until

pytestmark = pytest.mark.slow

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"
S3_SECRET = "s3-credentials"
TRAINER = [sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"]

DAG = '''
import datetime as dt
import pendulum
from airflow.sdk import dag
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False,
     default_args={{"retry_delay": dt.timedelta(seconds=1)}})
def build():
    GpuTrainingOperator(task_id="train", poll_interval=1, {args})

build()
'''

RUN = DAG_TEST_SCRIPT  # dag.test() in a fresh interpreter (devtools/dag_test.py)


@pytest.fixture(scope="module")
def platform(kube_cluster, seaweedfs, tmp_path_factory):
    """Quotas, PriorityClasses and the S3 Secret applied; the GPU scheduler running."""
    from kubernetes import client

    from airflow_gpu.devtools.gangs import scheduler_process
    from airflow_gpu.devtools.seaweedfs import create_team_secrets

    rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    kube_cluster.kubectl("apply", "-f", "-", input=rendered)
    core = client.CoreV1Api(kube_cluster.api_client())
    # each team its bucket, and in its namespace a Secret with an identity limited to that bucket
    identities = {"nlp": "operator-nlp", "research": "operator-research"}
    # (the S3 server is the session's: another module using this fixture already added the teams)
    buckets = {team: (seaweedfs.teams.get(ident) or seaweedfs.add_team(ident, f"{ident}-ckpt")).bucket
               for team, ident in identities.items()}
    create_team_secrets(core, seaweedfs, {identities[t]: f"team-{t}" for t in identities}, S3_SECRET)
    log = tmp_path_factory.mktemp("scheduler") / "scheduler.log"
    scheduler = scheduler_process(kube_cluster.kubeconfig, log, config_path=SEED, identity="op-test").start()
    try:
        yield {"buckets": buckets, "core": core}
    finally:
        scheduler.stop()


def run_dag(db, kube_cluster, seaweedfs, dag_id: str, args: str, timeout: float = 400, during=None,
            extra_env: dict[str, str] | None = None, source: str | None = None) -> tuple[dict, str]:
    """source: a whole DAG file instead of DAG with `args` (for DAGs of another shape, e.g. mapped)."""
    folder = db.home / "dags"
    folder.mkdir(exist_ok=True)
    (folder / f"{dag_id}.py").write_text(source if source is not None else DAG.format(dag_id=dag_id, args=args))
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}})
    # dag.test() runs the trigger inline, with no scheduler and no executor: no race to settle for
    env = db.env(AIRFLOW_CONN_KUBERNETES_DEFAULT=conn, AIRFLOW__AIRFLOW_GPU__CONFIG_FILE=str(SEED),
                 AIRFLOW__AIRFLOW_GPU__DEFERRAL_SETTLE_SECONDS="0", AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
                 **seaweedfs.env(), **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(folder), dag_id], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        if during is not None:
            try:
                during()
            except Exception as exc:  # what dag.test() printed says why (e.g. it failed before any pod)
                if proc.poll() is None:
                    proc.kill()
                out, _ = proc.communicate()
                raise AssertionError(f"{dag_id}: {type(exc).__name__}: {exc}; dag.test() "
                                     f"(exit {proc.returncode}) printed:\n{(out or '')[-8000:]}") from exc
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"dag.test() of {dag_id} still running after {timeout:.0f} s; its output ends:\n"
                             f"{(out or '')[-8000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    assert line, out[-6000:]
    return json.loads(line[len("RESULT "):]), out


def leftovers(core, dag_id: str) -> list[str]:
    selector = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY_VALUE},{C.LABEL_DAG_ID}={dag_id}"
    names = []
    for ns in ("team-nlp", "team-research"):
        names += [p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=selector).items]
        names += [s.metadata.name for s in core.list_namespaced_service(ns, label_selector=selector).items]
    return names


def test_success_returns_the_counters_and_leaves_nothing(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    bucket = platform["buckets"]["nlp"]
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "op_success", (
        f'team="nlp", tier="production-training", workers=2, gpus_per_worker=2, checkpoint="s3://{bucket}/ok", '
        f'spot="never", retries=1, image="python:3.11", cmds={TRAINER!r}, secrets=[{{"secret": "{S3_SECRET}"}}], '
        f'env_vars={{"{C.ENV_EXAMPLE_EPOCHS}": "3"}}'))
    ti = result["tis"]["train"]
    assert (result["state"], ti["state"], ti["try_number"]) == ("success", "success", 1), log[-6000:]
    xcom = ti["xcom"] if isinstance(ti["xcom"], dict) else json.loads(ti["xcom"])
    assert set(xcom) >= {"checkpoint_uri", "attempts", "interruptions", "preemptions", "gpu_seconds",
                         "lost_gpu_seconds", "resumed_from_step"}
    assert (xcom["attempts"], xcom["interruptions"], xcom["preemptions"]) == (1, 0, 0)
    assert xcom["gpu_seconds"] > 0 and xcom["lost_gpu_seconds"] == 0 and xcom["resumed_from_step"] is None
    assert xcom["checkpoint_uri"].startswith(f"s3://{bucket}/ok/op_success/train/")
    # rank 0's log reached the task log once: live logs wrote it, the end block does not repeat it
    assert log.count('"event": "done"') == 1 and "rank 0's output is above: live logs streamed all of it" in log, \
        log[-6000:]
    assert wait_until(lambda: not leftovers(platform["core"], "op_success"), timeout=60, what="objects deleted")


def test_application_failure_spends_a_retry_with_a_new_attempt(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "op_fail", (
        'team="nlp", tier="production-training", workers=1, gpus_per_worker=1, retries=1, image="python:3.11", '
        f'cmds=["{sys.executable}", "-c", "import sys; print(\'boom\'); sys.exit(1)"]'))
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("failed", 2), log[-6000:]
    assert "attempt 1000" in log and "attempt 2000" in log  # ENV.md: try_number * 1000 + relaunches
    assert "failed (application failure) - rank 0: pod " in log and "exit code 1 (Error): its log ends with:" in log
    assert wait_until(lambda: not leftovers(platform["core"], "op_fail"), timeout=60, what="objects deleted")


def test_spot_interruption_resumes_from_checkpoint_within_the_try(platform, sqlite_airflow_db, kube_cluster,
                                                                 seaweedfs):
    bucket = platform["buckets"]["research"]
    core = platform["core"]
    interrupted: dict = {}

    def interrupt_when_training():
        def running_pod():
            pods = core.list_namespaced_pod("team-research", label_selector=f"{C.LABEL_DAG_ID}=op_spot").items
            return next((p for p in pods if p.status.phase == "Running" and p.spec.node_name), None)
        pod = wait_until(running_pod, timeout=180, what="the training pod running")
        time.sleep(4)  # a few epochs: checkpoints at steps > 0
        interrupted["node"] = pod.spec.node_name
        kube_cluster.interrupt(pod.spec.node_name, notice=1.0, replace_after=2.0)

    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the operator's Stats, as [metrics] sets them up
    statsd.bind(("127.0.0.1", 0))
    metrics_env = {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                   "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]), "AIRFLOW__METRICS__STATSD_PREFIX": "",
                   "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "op_spot", (
        f'team="research", tier="best-effort-training", workers=1, gpus_per_worker=4, checkpoint="s3://{bucket}/spot", '
        f'spot="always", retries=1, image="python:3.11", cmds={TRAINER!r}, secrets=[{{"secret": "{S3_SECRET}"}}], '
        f'termination_grace_period=15, env_vars={{"{C.ENV_EXAMPLE_EPOCHS}": "30", "{C.ENV_EXAMPLE_STEP_SECONDS}": "0.02"}}'),
        timeout=500, during=interrupt_when_training, extra_env=metrics_env)
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("success", 1), log[-8000:]
    xcom = ti["xcom"] if isinstance(ti["xcom"], dict) else json.loads(ti["xcom"])
    assert (xcom["interruptions"], xcom["attempts"]) == (1, 2), xcom
    # the loss is the interruption's and the relaunch's restart overhead (the tier's 120 s: all of this
    # short relaunch); the chargeback reads the causes apart
    assert xcom["lost_interruption_gpu_seconds"] > 0 and xcom["lost_restart_gpu_seconds"] > 0, xcom
    assert xcom["lost_interruption_gpu_seconds"] + xcom["lost_restart_gpu_seconds"] == \
        pytest.approx(xcom["lost_gpu_seconds"], abs=0.01), xcom
    assert xcom["lost_preemption_gpu_seconds"] == 0, xcom
    # both attempts ran on spot (a relaunch stays on spot below max_interruptions, before the last try)
    (spot,) = xcom["usage_by_capacity"].values()
    assert list(xcom["usage_by_capacity"]) == ["spot"] and spot["gpu_seconds"] == xcom["gpu_seconds"], xcom
    assert spot["lost_interruption_gpu_seconds"] == xcom["lost_interruption_gpu_seconds"], xcom
    assert xcom["resumed_from_step"] and xcom["resumed_from_step"] > 0, xcom
    resumed = [json.loads(x[x.index("{"):]) for x in log.splitlines() if '"event": "resume"' in x]
    assert resumed and resumed[-1]["step"] > 0 and resumed[-1]["attempt"] == 1001, log[-8000:]
    assert wait_until(lambda: not leftovers(core, "op_spot"), timeout=60, what="objects deleted")
    sent = _statsd_lines(statsd)
    ours = [line for line in sent if line.lstrip(".").startswith("airflow_gpu_")]
    assert any(line.lstrip(".").startswith("airflow_gpu_interruptions,") and "capacity_type=spot" in line
               and "team=research" in line for line in ours), sent
    assert any("airflow_gpu_lost_gpu_seconds," in line and "cause=interruption" in line for line in ours), sent
    assert any("airflow_gpu_lost_gpu_seconds," in line and "cause=restart" in line for line in ours), sent
    assert sum("airflow_gpu_queue_wait_seconds," in line for line in ours) == 2, sent  # one per attempt


def _statsd_lines(sock: socket.socket) -> list[str]:
    sock.setblocking(False)
    lines = []
    try:
        while True:
            lines += sock.recv(65536).decode().splitlines()
    except BlockingIOError:
        return lines
    finally:
        sock.close()


def _first_event(trigger, timeout: float) -> dict:
    import asyncio

    async def main():
        gen = trigger.run()
        try:
            return (await asyncio.wait_for(gen.__anext__(), timeout)).payload
        finally:
            await gen.aclose()
    return asyncio.run(main())


def test_production_preempts_the_teams_best_effort_gang(platform, kube_cluster, monkeypatch):
    """Team nlp (quota 8): a best-effort 2 x 4 GPU gang runs; a production 2 x 4 GPU gang of the same team
    is submitted (its pool and ResourceQuota are the guaranteed ones, so nothing holds it back) and the
    scheduler preempts the best-effort gang; the best-effort task sees a preemption, resubmits its gang
    as the next attempt within the try (no retry spent) and defers again. Measures the production gang's
    start latency (submission -> every pod bound)."""
    from airflow_gpu.devtools.operator_run import DictStateStore, FakeTaskInstance, context_for, execute_until_deferred
    from airflow_gpu.operators import GpuTrainingOperator

    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}}))
    monkeypatch.setenv("AIRFLOW__AIRFLOW_GPU__DEFERRAL_SETTLE_SECONDS", "0")  # the trigger runs here, no scheduler
    core, bucket = platform["core"], platform["buckets"]["nlp"]

    def make(task_id, tier, **kw):
        return GpuTrainingOperator(task_id=task_id, team="nlp", tier=tier, workers=2, gpus_per_worker=4,
                                   image="python:3.11", retries=2, poll_interval=1, config_file=str(SEED),
                                   termination_grace_period=5, **kw)

    def bound(dag_id):
        pods = core.list_namespaced_pod("team-nlp", label_selector=f"{C.LABEL_DAG_ID}={dag_id}").items
        return len(pods) == 2 and all(p.spec.node_name and not p.metadata.deletion_timestamp for p in pods)

    best = make("sweep", "best-effort-training", checkpoint=f"s3://{bucket}/be", spot="never",
                annotations={C.ANNOTATION_SIM_DURATION: "600"})
    best_ti, best_store = FakeTaskInstance("op_be", "sweep", "manual__1"), DictStateStore()
    deferred = execute_until_deferred(best, context_for(best_ti, best_store))
    wait_until(lambda: bound("op_be"), timeout=120, what="the best-effort gang bound")

    import threading

    watched: dict = {}  # the best-effort task's trigger watches from before the production task arrives
    watcher = threading.Thread(target=lambda: watched.update(payload=_first_event(deferred.trigger, 240)), daemon=True)
    watcher.start()
    time.sleep(3)
    prod = make("finetune", "production-training", annotations={C.ANNOTATION_SIM_DURATION: "600"})
    t0 = time.monotonic()
    execute_until_deferred(prod, context_for(FakeTaskInstance("op_prod", "finetune", "manual__1"), DictStateStore()))
    watcher.join(240)
    payload = watched["payload"]
    assert payload["status"] == "disrupted" and payload["cause"] == "preemption", json.dumps(payload)
    wait_until(lambda: bound("op_prod"), timeout=120, what="the production gang bound")
    latency = time.monotonic() - t0
    print(f"production gang start latency (submission -> 8 GPUs bound, incl. the preemption): {latency:.1f} s")

    again = None
    from airflow.sdk.exceptions import TaskDeferred
    try:
        make("sweep", "best-effort-training", checkpoint=f"s3://{bucket}/be", spot="never",
             annotations={C.ANNOTATION_SIM_DURATION: "600"}).execute_complete(
            context_for(best_ti, best_store), event=payload, run=deferred.kwargs["run"])
    except TaskDeferred as exc:
        again = exc
    assert again is not None, "the preempted task must resubmit and defer, not finish or fail"
    run = again.kwargs["run"]
    assert (run["try"], run["attempt"], run["preemptions"], run["interruptions"]) == (1, 1001, 1, 0)
    assert run["lost_preemption_gpu_seconds"] == run["lost_gpu_seconds"] and run["lost_interruption_gpu_seconds"] == 0
    assert run["usage_by_capacity"]["on-demand"]["lost_preemption_gpu_seconds"] == run["lost_preemption_gpu_seconds"]
    assert best_ti.try_number == 1  # no retry spent
    pending = core.list_namespaced_pod("team-nlp", label_selector=f"{C.LABEL_DAG_ID}=op_be").items
    assert {p.metadata.labels[C.LABEL_ATTEMPT] for p in pending} == {"1001"}  # requeued, waits for quota
    assert latency < 60
    for dag_id, ti_task in (("op_be", "sweep"), ("op_prod", "finetune")):
        make(ti_task, "production-training")._cleanup_quietly(
            context_for(FakeTaskInstance(dag_id, ti_task, "manual__1"), None))
