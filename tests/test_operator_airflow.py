"""Issue 11's acceptance with real Airflow processes: api-server, scheduler (LocalExecutor), dag-processor
and triggerer (devtools/airflow_stack.py), the local cluster, the GPU scheduler and SeaweedFS, one stack
for the whole module. DAG runs are triggered through the REST API; outcomes are read back through it and
from the task log files the workers write.

- the seed's fine-tuning DAG (dags/finetune_pipeline.py), its spot node interrupted mid-training: resumes
  from a checkpoint step > 0 (in the task log) within try 1, XCom interruptions == 1, the DAG succeeds;
- team nlp: a best-effort 8-GPU task runs, a production 8-GPU task is triggered and starts, the best-effort
  gang is preempted, requeued and resumes from its checkpoint within its try (start latency printed);
- exit 1 spends a retry, and the retry's gang has a new attempt number;
- the triggerer is killed (-9) while the task is deferred: a restarted triggerer re-creates the trigger
  and the task finishes on the same pods (Airflow 3 runs no worker process for a deferred task);
- the task is marked failed through the REST API while deferred, and execution_timeout fires while
  deferred: every pod, Service and PodGroup of the task instance is deleted within the grace period;
- a gang evicted within a second or two of its deferral, twice (after the first deferral and after the
  re-deferral): GangTrigger holds the event until the deferral settled, so Airflow 3.3's executor-event
  race spends no retry; try 1, both interruptions counted.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airflow_gpu import constants as C
from airflow_gpu.devtools.airflow_stack import AirflowStack
from airflow_gpu.devtools.processes import wait_for_http, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "examples" / "seed-quotas.yaml"
S3_SECRET = "s3-credentials"
GRACE = 5  # termination_grace_period of the tasks that are stopped from outside

DAGS = '''
import datetime as dt
import sys

import pendulum
from airflow.sdk import dag

from airflow_gpu import constants as C
from airflow_gpu.operators import GpuTrainingOperator

TRAINER = [sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"]
BUCKET = "{bucket}"
GRACE = {grace}


def sleeper(seconds):
    return [sys.executable, "-c", f"import time; time.sleep({{seconds}})"]


def saves_on_sigterm(seconds, save_seconds):  # like a trainer: SIGTERM -> a checkpoint that takes a while
    return [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
            f"(time.sleep({{save_seconds}}), sys.exit(0))); time.sleep({{seconds}})"]


def gpu_dag(dag_id, **operator_args):
    @dag(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         default_args={{"retry_delay": dt.timedelta(seconds=1)}})
    def build():
        GpuTrainingOperator(task_id="train", image="python:3.11", poll_interval=1, **operator_args)
    return build()


gpu_dag("acc_best_effort", team="nlp", tier="best-effort-training", workers=2, gpus_per_worker=4, spot="never",
        retries=2, checkpoint=f"s3://{{BUCKET}}/best-effort", cmds=TRAINER, secrets=[{{"secret": "{secret}"}}],
        termination_grace_period=10,
        env_vars={{C.ENV_EXAMPLE_EPOCHS: "40", C.ENV_EXAMPLE_STEPS_PER_EPOCH: "10", C.ENV_EXAMPLE_STEP_SECONDS: "0.05"}})
gpu_dag("acc_production", team="nlp", tier="production-training", workers=2, gpus_per_worker=4, spot="never",
        retries=1, cmds=sleeper(3))
gpu_dag("acc_exit1", team="vision", tier="production-training", workers=1, gpus_per_worker=1, retries=1,
        cmds=[sys.executable, "-c", "import sys; print('boom'); sys.exit(1)"])
gpu_dag("acc_triggerer_crash", team="vision", tier="production-training", workers=1, gpus_per_worker=1,
        retries=1, cmds=sleeper(75))
gpu_dag("acc_mark_failed", team="vision", tier="production-training", workers=2, gpus_per_worker=1, retries=1,
        cmds=sleeper(600), termination_grace_period=GRACE)
gpu_dag("acc_quick_disruption", team="vision", tier="production-training", workers=1, gpus_per_worker=1,
        retries=1, cmds=saves_on_sigterm(4, 6), termination_grace_period=10)
gpu_dag("acc_live_logs", team="vision", tier="production-training", workers=1, gpus_per_worker=1, retries=0,
        logging_interval=5, cmds=[sys.executable, "-c", "import time\\nfor i in range(1, 61):\\n"
                                  "    print(f'LIVE-{{i:03d}}', flush=True); time.sleep(1)"])
gpu_dag("acc_timeout", team="vision", tier="production-training", workers=2, gpus_per_worker=1, retries=0,
        cmds=sleeper(600), termination_grace_period=GRACE, execution_timeout=dt.timedelta(seconds=25))
'''


@pytest.fixture(scope="module")
def platform(kube_cluster, seaweedfs, tmp_path_factory):
    """Quotas, PriorityClasses, S3 Secrets and the GPU scheduler on the cluster; Airflow's four
    components with the team pools synced, the acceptance DAGs and the seed's fine-tuning DAG."""
    from kubernetes import client

    from airflow_gpu.devtools.gangs import scheduler_process
    from airflow_gpu.devtools.seaweedfs import create_team_secrets

    # each team its bucket, and in its namespace a Secret with an identity limited to that bucket
    template = "acceptance-{team}-ckpt"
    for team in ("nlp", "vision", "serving"):
        seaweedfs.add_team(f"acceptance-{team}", template.format(team=team))
    bucket = template.format(team="nlp")
    root = tmp_path_factory.mktemp("acceptance")
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "finetune_pipeline.py", dags / "finetune_pipeline.py")
    (dags / "acceptance.py").write_text(DAGS.format(bucket=bucket, grace=GRACE, secret=S3_SECRET))
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}})
    stack = AirflowStack(home=root / "home", dags_folder=dags, extra_env={
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": conn,
        "AIRFLOW__AIRFLOW_GPU__CONFIG_FILE": str(SEED),
        C.ENV_EXAMPLE_CHECKPOINTS: f"s3://{template}/examples",  # the DAGs fill in {team}
        C.ENV_EXAMPLE_S3_SECRET: S3_SECRET,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # each test unpauses its DAG: no overlap
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",  # the operator's INFO lines are the task log we read
        # a crashed triggerer's triggers go to the next one after this many seconds without a heartbeat
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
        # on this loaded machine the execution API's first answers take seconds (default timeout 5 s)
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        **seaweedfs.env(),  # the platform's identity: the worker and the triggerer read rank 0's status.json
    })

    def prepare_airflow() -> None:  # the DB migration is the slow part: it runs while the cluster is set up
        stack.migrate()
        sync = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "sync", "--config", str(SEED)],
                              env=stack.env(), capture_output=True, text=True, timeout=300)
        assert sync.returncode == 0, sync.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=1) as pool:
        airflow_ready = pool.submit(prepare_airflow)
        rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                                  capture_output=True, text=True, timeout=60, check=True).stdout
        kube_cluster.kubectl("apply", "-f", "-", input=rendered)
        core = client.CoreV1Api(kube_cluster.api_client())
        create_team_secrets(core, seaweedfs, {f"acceptance-{t}": f"team-{t}" for t in ("nlp", "vision", "serving")},
                            S3_SECRET)
        gpu_scheduler = scheduler_process(kube_cluster.kubeconfig, root / "gpu-scheduler.log", config_path=SEED,
                                          identity="acceptance").start()
        try:
            airflow_ready.result()
        except BaseException:
            gpu_scheduler.stop()
            raise
    stack.start(migrate=False)
    api = stack.api()
    wait_for_http(f"{stack.base_url}/execution/health", timeout=120)  # warm: its first answer is slow
    try:
        wait_until(lambda: _parsed(api) >= {"finetune_pipeline", "acc_best_effort", "acc_production", "acc_exit1",
                                            "acc_triggerer_crash", "acc_mark_failed", "acc_timeout", "acc_quick_disruption",
                                            "acc_live_logs"},
                   timeout=180, interval=1, what="every DAG parsed")
        yield {"stack": stack, "api": api, "core": core, "bucket": bucket, "gpu_scheduler": gpu_scheduler}
    finally:
        api.close()
        stack.stop()
        gpu_scheduler.stop()


def _parsed(api) -> set[str]:
    return {d["dag_id"] for d in api.paginate("/api/v2/dags", "dags")}


def unpause(api, dag_id: str) -> None:
    api.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})


def trigger(api, dag_id: str) -> str:
    unpause(api, dag_id)
    return api.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]


def task_instance(api, dag_id: str, run_id: str, task_id: str = "train") -> dict:
    return api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{api.quote(run_id)}/taskInstances/{task_id}")


def wait_state(api, dag_id: str, run_id: str, states: set[str], task_id: str = "train", timeout: float = 240) -> dict:
    seen: dict = {}

    def reached():
        seen.update(task_instance(api, dag_id, run_id, task_id))
        return seen if seen.get("state") in states else None

    try:
        return wait_until(reached, timeout=timeout, interval=1, what=f"{dag_id}.{task_id} in {states}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last: {seen}") from None


def wait_run(api, dag_id: str, run_id: str, timeout: float = 300) -> str:
    def done():
        state = api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{api.quote(run_id)}")["state"]
        return state if state in ("success", "failed") else None
    return wait_until(done, timeout=timeout, interval=1, what=f"{dag_id} run {run_id} finished")


def xcom(api, dag_id: str, run_id: str, task_id: str = "train") -> dict:
    entry = api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{api.quote(run_id)}/taskInstances/{task_id}/"
                               "xcomEntries/return_value")
    value = entry["value"]
    return json.loads(value) if isinstance(value, str) else value


def trigger_started(stack: AirflowStack, dag_id: str, run_id: str, try_number: int = 1) -> bool:
    """The triggerer runs the task's trigger (its log: <task log>.trigger.<triggerer job>.log)."""
    folder = stack.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=train"
    return any("Waiting for gang" in p.read_text(errors="replace")
               for p in folder.glob(f"attempt={try_number}.log.trigger.*.log"))


def task_log(stack: AirflowStack, dag_id: str, run_id: str, try_number: int, task_id: str = "train") -> str:
    """The try's log as the UI shows it: the worker's file, then what its triggers wrote (Airflow 3 keeps
    each trigger's lines in attempt=N.log.trigger.<id>.log next to it)."""
    folder = stack.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    paths = [folder / f"attempt={try_number}.log"] + sorted(folder.glob(f"attempt={try_number}.log.trigger.*"))
    return "".join(p.read_text(errors="replace") for p in paths if p.exists())


def objects_of(core, dag_id: str, custom=None) -> list[str]:
    """Every pod, Service and PodGroup labelled with the DAG, in any team namespace."""
    from kubernetes import client

    selector = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY_VALUE},{C.LABEL_DAG_ID}={dag_id}"
    names = [f"Pod/{p.metadata.name}" for p in core.list_pod_for_all_namespaces(label_selector=selector).items]
    names += [f"Service/{s.metadata.name}" for s in core.list_service_for_all_namespaces(label_selector=selector).items]
    custom = custom or client.CustomObjectsApi(core.api_client)
    groups = custom.list_cluster_custom_object(C.PODGROUP_GROUP, C.PODGROUP_VERSION, C.PODGROUP_PLURAL,
                                               label_selector=selector)["items"]
    return names + [f"PodGroup/{g['metadata']['name']}" for g in groups]


def running_pods(core, dag_id: str, count: int):
    pods = [p for p in core.list_pod_for_all_namespaces(label_selector=f"{C.LABEL_DAG_ID}={dag_id}").items
            if not p.metadata.deletion_timestamp]
    ok = len(pods) == count and all(p.status.phase == "Running" and p.spec.node_name for p in pods)
    return pods if ok else None


def _cluster_view(core, platform) -> str:
    pods = [(p.metadata.namespace, p.metadata.name, p.status.phase, p.spec.node_name)
            for p in core.list_pod_for_all_namespaces().items]
    nodes = [(n.metadata.name, [c.status for c in n.status.conditions or [] if c.type == "Ready"])
             for n in core.list_node().items]
    return f"pods {pods}; nodes {nodes}; GPU scheduler log:\n{platform['gpu_scheduler'].log_tail(30)}"


def test_production_preempts_the_teams_best_effort_task(platform):
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    best = trigger(api, "acc_best_effort")
    wait_until(lambda: running_pods(core, "acc_best_effort", 2), timeout=180, interval=0.5,
               what="the best-effort gang running")
    time.sleep(4)  # a few epochs checkpointed
    t0 = time.monotonic()
    prod = trigger(api, "acc_production")
    wait_until(lambda: running_pods(core, "acc_production", 2), timeout=180, interval=0.2,
               what="the production gang running")
    latency = time.monotonic() - t0
    print(f"\nproduction task start latency (DAG run triggered -> 8 GPUs running, incl. the preemption): "
          f"{latency:.1f} s")
    assert wait_state(api, "acc_production", prod, {"success", "failed"})["state"] == "success"
    ti = wait_state(api, "acc_best_effort", best, {"success", "failed"}, timeout=300)
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti  # its retries untouched
    result = xcom(api, "acc_best_effort", best)
    # preempted at least once (another production gang of the team may take its GPUs again), every
    # relaunch a new attempt in the same try
    assert result["preemptions"] >= 1 and result["interruptions"] == 0, result
    assert result["attempts"] == result["preemptions"] + 1, result
    assert result["resumed_from_step"] and result["resumed_from_step"] > 0, result
    log = task_log(stack, "acc_best_effort", best, 1)
    assert "preempted" in log and f"resuming from checkpoint step {result['resumed_from_step']}" in log, log[-6000:]
    assert latency < 90


def test_exit_1_spends_a_retry_with_a_new_attempt(platform):
    api, stack = platform["api"], platform["stack"]
    run_id = trigger(api, "acc_exit1")
    ti = wait_state(api, "acc_exit1", run_id, {"failed"})
    assert ti["try_number"] == 2, ti
    first, second = task_log(stack, "acc_exit1", run_id, 1), task_log(stack, "acc_exit1", run_id, 2)
    assert "attempt 1000" in first and "application failure" in first, first[-4000:]
    assert "attempt 2000" in second and "application failure" in second, second[-4000:]
    assert wait_until(lambda: not objects_of(platform["core"], "acc_exit1"), timeout=60, what="objects deleted")


def test_a_crashed_triggerer_is_replaced_and_the_task_continues_on_the_same_pods(platform):
    """Airflow 3 runs no worker process while a task is deferred (the trigger runs in the triggerer), so
    the process to kill -9 there is the triggerer: a fresh one takes the trigger over (another
    triggerer_id on the trigger row) and the task ends on the pods it had, nothing resubmitted."""
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    run_id = trigger(api, "acc_triggerer_crash")
    (pod,) = wait_until(lambda: running_pods(core, "acc_triggerer_crash", 1), timeout=180, interval=0.5,
                        what="the gang running")
    wait_state(api, "acc_triggerer_crash", run_id, {"deferred"})

    def triggerer_id():
        return (task_instance(api, "acc_triggerer_crash", run_id).get("trigger") or {}).get("triggerer_id")

    first_triggerer = wait_until(triggerer_id, timeout=60, interval=0.5, what="a triggerer running the trigger")
    stack.crash_and_restart("triggerer")
    taken_over = wait_until(lambda: (lambda t: t if t not in (None, first_triggerer) else None)(triggerer_id()),
                            timeout=120, interval=0.5, what="another triggerer running the trigger")
    ti = wait_state(api, "acc_triggerer_crash", run_id, {"success", "failed"}, timeout=180)
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti
    result = xcom(api, "acc_triggerer_crash", run_id)
    assert result["attempts"] == 1, result  # the same gang: nothing resubmitted
    log = task_log(stack, "acc_triggerer_crash", run_id, 1)
    assert log.count("submitting gang") == 1, log[-4000:]
    assert f"gang {pod.metadata.name.rsplit('-', 1)[0]} succeeded" in log, log[-4000:]
    print(f"\ntrigger taken over by triggerer {taken_over} (was {first_triggerer}); same pod {pod.metadata.uid}")


def test_live_logs_reach_the_task_log_while_deferred_and_survive_a_triggerer_crash(platform):
    """Issue 26: rank 0 prints LIVE-001..LIVE-060, one a second, logging_interval=5. LIVE-010 is in the
    task log read through the REST API before the gang ends; the triggerer is killed -9 and restarted
    mid-way; the live copies (the trigger logs) hold every line exactly once."""
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    run_id = trigger(api, "acc_live_logs")
    wait_until(lambda: running_pods(core, "acc_live_logs", 1), timeout=180, interval=0.5, what="the gang running")
    path = f"/api/v2/dags/acc_live_logs/dagRuns/{api.quote(run_id)}/taskInstances/train/logs/1"

    def rest_log() -> str:
        return json.dumps(api.request("GET", path, params={"full_content": True}))

    folder = stack.home / "logs" / "dag_id=acc_live_logs" / f"run_id={run_id}" / "task_id=train"

    def trigger_files() -> list[Path]:  # each file once (the glob may also match a link to one)
        return sorted({p.resolve() for p in folder.glob("attempt=1.log.trigger.*")})

    def trigger_logs() -> str:
        return "".join(p.read_text(errors="replace") for p in trigger_files())

    wait_until(lambda: "LIVE-010" in rest_log(), timeout=60, interval=1,
               what=lambda: f"LIVE-010 through the REST API; trigger logs: {trigger_logs()[-3000:]}")
    ti = task_instance(api, "acc_live_logs", run_id)
    assert ti["state"] == "deferred", ti  # read while the gang still runs
    seen_at_crash = max(int(n) for n in re.findall(r"LIVE-(\d{3})", rest_log()))
    stack.crash_and_restart("triggerer")
    ti = wait_state(api, "acc_live_logs", run_id, {"success", "failed"}, timeout=240)
    assert ti["state"] == "success", ti
    # the live copies: the trigger's "rank 0 (<pod>):" records (the triggerer also logs the event, whose
    # payload carries rank 0's final tail for the worker)
    records = [json.loads(x) for x in trigger_logs().splitlines() if x.startswith("{")]
    live = "\n".join(r["event"] for r in records if str(r.get("event", "")).startswith("rank 0 ("))
    numbers = [int(n) for n in re.findall(r"LIVE-(\d{3})", live)]
    assert sorted(numbers) == list(range(1, 61)), (seen_at_crash, numbers)
    assert len(trigger_files()) == 2  # the crashed triggerer's file and its successor's
    print(f"\nlive logs: LIVE-{seen_at_crash:03d} seen before the triggerer crash; 60 lines, each once")


def _deferred_with_pods(api, core, dag_id: str, pods: int) -> str:
    run_id = trigger(api, dag_id)
    wait_until(lambda: running_pods(core, dag_id, pods), timeout=180, interval=0.5, what=f"{dag_id}'s gang running")
    wait_state(api, dag_id, run_id, {"deferred"})
    assert len(objects_of(core, dag_id)) == pods + 2  # pods, the headless Service, the PodGroup
    return run_id


def test_marked_failed_while_deferred_deletes_everything(platform):
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    run_id = _deferred_with_pods(api, core, "acc_mark_failed", 2)
    # a trigger deleted before any triggerer loaded it gets no on_kill (see README: not covered)
    wait_until(lambda: trigger_started(stack, "acc_mark_failed", run_id), timeout=60, interval=0.5,
               what="the triggerer running the trigger")
    api.request("PATCH", f"/api/v2/dags/acc_mark_failed/dagRuns/{api.quote(run_id)}/taskInstances/train",
                json={"new_state": "failed"})
    t0 = time.monotonic()
    assert wait_until(lambda: not objects_of(core, "acc_mark_failed"), timeout=GRACE + 25, interval=0.5,
                      what="every object of the marked-failed task deleted")
    print(f"\nmarked failed -> every object gone: {time.monotonic() - t0:.1f} s (grace period {GRACE} s)")
    assert task_instance(api, "acc_mark_failed", run_id)["state"] == "failed"
    assert "stopped by a user: deleted" in task_log(stack, "acc_mark_failed", run_id, 1)


def test_execution_timeout_while_deferred_deletes_everything(platform):
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    run_id = _deferred_with_pods(api, core, "acc_timeout", 2)
    ti = wait_state(api, "acc_timeout", run_id, {"failed"}, timeout=120)
    t0 = time.monotonic()
    assert wait_until(lambda: not objects_of(core, "acc_timeout"), timeout=GRACE + 25, interval=0.5,
                      what="every object of the timed-out task deleted")
    print(f"\nexecution_timeout -> every object gone {time.monotonic() - t0:.1f} s after the task failed")
    assert ti["try_number"] == 1
    assert "deleting" in task_log(stack, "acc_timeout", run_id, 1)


def test_finetune_dag_survives_a_spot_interruption(platform, kube_cluster):
    """The seed's pipeline as written in dags/: its daily run is created by the scheduler."""
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    unpause(api, "finetune_pipeline")
    runs = wait_until(lambda: api.request("GET", "/api/v2/dags/finetune_pipeline/dagRuns")["dag_runs"], timeout=120,
                      interval=1, what="the scheduler creating the pipeline's daily run")
    run_id = runs[0]["dag_run_id"]
    pods = wait_until(lambda: running_pods(core, "finetune_pipeline", 2), timeout=240, interval=0.5,
                      what=lambda: f"the fine-tuning gang running; {_cluster_view(core, platform)}")
    wait_state(api, "finetune_pipeline", run_id, {"deferred"}, task_id="finetune", timeout=60)
    time.sleep(8)  # a few epochs: checkpoints at steps > 0
    kube_cluster.interrupt(pods[0].spec.node_name, notice=1.0, replace_after=2.0)

    assert wait_run(api, "finetune_pipeline", run_id, timeout=300) == "success"
    ti = task_instance(api, "finetune_pipeline", run_id, "finetune")
    assert (ti["state"], ti["try_number"]) == ("success", 1), ti
    result = xcom(api, "finetune_pipeline", run_id, "finetune")
    assert (result["interruptions"], result["preemptions"], result["attempts"]) == (1, 0, 2), result
    assert result["resumed_from_step"] and result["resumed_from_step"] > 0, result
    log = task_log(stack, "finetune_pipeline", run_id, 1, "finetune")
    steps = [int(s) for s in re.findall(r"resuming from checkpoint step (\d+)", log)]
    assert steps and steps[-1] == result["resumed_from_step"] > 0, log[-6000:]
    assert "interrupted" in log and "without spending a retry" in log
    assert task_instance(api, "finetune_pipeline", run_id, "register_model")["state"] == "success"
    assert wait_until(lambda: not objects_of(core, "finetune_pipeline"), timeout=60, what="objects deleted")


def test_a_disruption_right_after_the_deferral_spends_no_retry(platform):
    """Airflow 3.3 fails a try whose trigger event resumes it before the scheduler has drained the
    executor's "success" of the worker that deferred (apache/airflow#66374, #71580). The gang is evicted
    as soon as the task shows deferred, after its first deferral and again after the operator's
    re-deferral, usually before the scheduler drained that success (printed); its pod takes 6 s to
    save, which the resumed operator waits for while running, where the late success fails the try.
    GangTrigger holds each event until the deferral settled: the task keeps try 1 and counts both.
    (With [airflow_gpu] deferral_settle_seconds = 0 this test fails: try 2.)"""
    api, core, stack = platform["api"], platform["core"], platform["stack"]
    dag_id = "acc_quick_disruption"
    run_id = trigger(api, dag_id)
    evicted = []
    for attempt in (1000, 1001):
        selector = f"{C.LABEL_DAG_ID}={dag_id},{C.LABEL_ATTEMPT}={attempt}"

        def deferred_with_pod():
            pods = core.list_pod_for_all_namespaces(label_selector=selector).items
            ti = task_instance(api, dag_id, run_id)
            assert ti["try_number"] <= 1, f"a retry was spent: {ti}"  # 0 until first scheduled
            return pods if pods and ti["state"] == "deferred" else None

        # the attempt's pods exist before its worker defers: its pod plus "deferred" is this deferral
        (pod,) = wait_until(deferred_with_pod, timeout=180, interval=0.2, what=f"attempt {attempt} deferred")
        core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace,
                                            {"metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}})
        evicted.append(time.time())
    ti = wait_state(api, dag_id, run_id, {"success", "failed", "up_for_retry"}, timeout=180)
    assert (ti["state"], ti["try_number"]) == ("success", 1), (ti, task_log(stack, dag_id, run_id, 1)[-4000:])
    result = xcom(api, dag_id, run_id)
    assert (result["interruptions"], result["preemptions"], result["attempts"]) == (2, 0, 3), result
    # where each eviction landed: before the scheduler drained the deferring worker's success is inside
    # the race window (it fails the try without the settle time); the drain takes 0.2-6 s, so not asserted
    drained = [dt.datetime.fromisoformat(m).timestamp() for m in re.findall(
        r"^(\S+) \[info\s*\] Received executor event with state success for task instance "
        rf"TaskInstanceKey\(dag_id='{dag_id}'", (stack.home / "logs" / "scheduler.log").read_text(), re.M)]
    # (one drained success per deferral: the k-th is the k-th deferral's)
    when = [f"{d - e:.1f} s before" if d > e else f"{e - d:.1f} s after" for e, d in zip(evicted, drained)]
    print(f"\nevicted {' and '.join(when)} the deferring worker's success was drained; try 1, 3 attempts, "
          "2 interruptions")
