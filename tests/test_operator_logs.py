"""Issue 26: what the task log and the XCom show of a gang (dag.test() with the local cluster, the GPU
scheduler and SeaweedFS, as tests/test_operator_run.py, whose fixtures these reuse):

- a failing rank's tail (its marker, exit code) with a header per rank, and the exception naming it;
- a 400 KB log: its final line is in the task log, after a line saying what was cut;
- on_finish_action="delete_succeeded_pod": the failed try's ended pods stay (kubectl logs works), the
  retry starts fresh pods; after a success nothing is left; rank 0's return.json is the XCom `result`;
- invalid return.json: a task error that says so;
- a spot interruption and a preemption in one try: each attempt's last lines and the resume step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import airflow_gpu

from airflow_gpu import constants as C
from airflow_gpu.devtools.processes import wait_until
from tests.test_operator_run import leftovers, platform, run_dag  # noqa: F401 - platform is a fixture

pytestmark = pytest.mark.slow
SOURCE = str(Path(airflow_gpu.__file__).resolve().parent.parent)

RANK_1_DIES = (
    "import os, sys, time\n"
    "rank = int(os.environ['RANK'])\n"
    "if rank == 1:\n"
    "    print('rank one starting', flush=True); time.sleep(2)\n"
    "    print('MARKER-RANK1 CUDA out of memory', flush=True); sys.exit(1)\n"
    "for i in range(300):\n"
    "    print(f'rank0 step {i}', flush=True); time.sleep(0.5)\n")

LONG_LOG = (
    "import sys\n"
    "for i in range(4000):\n"
    "    print(f'{i:06d} ' + 'x' * 93)\n"  # 100 bytes a line: 400 KB
    "print('FINAL-MARKER Traceback: the real error', flush=True); sys.exit(1)\n")


def _xcom(ti: dict) -> dict:
    return ti["xcom"] if isinstance(ti["xcom"], dict) else json.loads(ti["xcom"])


def test_a_failed_rank_s_tail_and_the_exception_name_it(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "logs_rank1", (
        'team="nlp", tier="production-training", workers=2, gpus_per_worker=1, retries=0, image="python:3.11", '
        f'cmds=["{sys.executable}", "-c", {RANK_1_DIES!r}]'))
    ti = result["tis"]["train"]
    assert ti["state"] == "failed", log[-6000:]
    assert "MARKER-RANK1 CUDA out of memory" in log, log[-6000:]
    headers = [line[line.index("===== rank "):] for line in log.splitlines() if "===== rank " in line]
    rank1 = next((h for h in headers if h.startswith("===== rank 1: pod ")), None)
    assert rank1, log[-8000:]
    assert "exit code 1 (Error)" in rank1 and " on node " in rank1 and "on node -" not in rank1, headers
    assert any(h.startswith("===== rank 0: pod ") for h in headers), headers
    # the exception: the failed rank, its exit code and its last lines
    failure = next(line for line in log.splitlines() if "failed (application failure) - rank 1: pod" in line)
    assert "exit code 1 (Error)" in failure, failure
    assert "MARKER-RANK1" in log[log.index(failure):], log[-4000:]
    assert wait_until(lambda: not leftovers(platform["core"], "logs_rank1"), timeout=60, what="objects deleted")


def test_return_json_is_the_result_and_nothing_is_left(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    writes = ("from airflow_gpu.checkpoint import write_result; import os\n"
              "print('training done'); write_result({'loss': 0.125, 'model': 's3://models/m1', 'rank': os.environ['RANK']})")
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "logs_result", (
        'team="nlp", tier="production-training", workers=2, gpus_per_worker=1, retries=0, image="python:3.11", '
        f'on_finish_action="delete_succeeded_pod", cmds=["{sys.executable}", "-c", {writes!r}], '
        f'env_vars={{"PYTHONPATH": {SOURCE!r}}}'))  # the pods import this checkout's airflow_gpu
    ti = result["tis"]["train"]
    assert ti["state"] == "success", log[-6000:]
    assert _xcom(ti)["result"] == {"loss": 0.125, "model": "s3://models/m1", "rank": "0"}, _xcom(ti)
    assert wait_until(lambda: not leftovers(platform["core"], "logs_result"), timeout=60, what="objects deleted")


def test_invalid_return_json_is_a_clear_error(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    writes = "import os; open(os.environ['AIRFLOW_GPU_RESULT_PATH'], 'w').write('{loss: 0.1')"
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "logs_badresult", (
        'team="nlp", tier="production-training", workers=1, gpus_per_worker=1, retries=0, image="python:3.11", '
        f'cmds=["{sys.executable}", "-c", {writes!r}]'))
    ti = result["tis"]["train"]
    assert ti["state"] == "failed", log[-6000:]
    assert "succeeded but its result is unusable: /airflow/xcom/return.json from rank 0 is not valid JSON" in log, \
        log[-6000:]


def test_an_interruption_and_a_preemption_in_one_try_leave_each_attempt_s_last_lines(platform, sqlite_airflow_db,
                                                                                     kube_cluster, seaweedfs):
    """Team nlp's best-effort gang on spot: attempt 1000's node is interrupted; attempt 1001 is preempted by
    the GPU scheduler for the team's production gang, which overflows onto spot (spot_fallback) and needs both
    spot nodes. The try's log holds both attempts' last lines (each header with its attempt, the SIGTERM
    stop-save line among them) and attempt 1002's resume step; the XCom counts one of each."""
    import time

    from airflow_gpu.devtools import gangs as G
    from airflow_gpu.kube import TaskInstanceRef, WorkloadSpec, build
    from airflow_gpu.kube.cleanup import delete_task_instance_objects_sync
    from tests.test_operator_run import S3_SECRET, TRAINER

    bucket, core = platform["buckets"]["nlp"], platform["core"]  # the team's own bucket
    preemptor = TaskInstanceRef("logs_preemptor", "finetune", "manual__1")
    production = build(WorkloadSpec(
        team="nlp", namespace="team-nlp", tier=C.TIER_PRODUCTION_TRAINING, image="python:3.11", workers=2,
        gpus_per_worker=4, task_instance=preemptor, attempt=1000,
        capacity_type=C.CAPACITY_SPOT, checkpoint_uri=f"s3://{bucket}/preemptor", termination_grace_period=1,
        annotations={C.ANNOTATION_SIM_DURATION: "600"}))
    production_pods = f"{C.LABEL_GANG}={production.name}"

    def running(attempt: str):
        def pod():
            pods = core.list_namespaced_pod("team-nlp", label_selector=(
                f"{C.LABEL_DAG_ID}=logs_spot,{C.LABEL_ATTEMPT}={attempt}")).items
            return next((p for p in pods if p.status.phase == "Running" and p.spec.node_name), None)
        return wait_until(pod, timeout=180, what=f"attempt {attempt} training")

    def interrupt_then_preempt():
        pod = running("1000")
        time.sleep(4)  # a few epochs: checkpoints at steps > 0
        kube_cluster.interrupt(pod.spec.node_name, notice=1.0, replace_after=2.0)
        running("1001")
        time.sleep(4)
        G.submit_gang(kube_cluster.api_client(), production)
        bound = lambda: [p for p in core.list_namespaced_pod("team-nlp", label_selector=production_pods).items  # noqa: E731
                         if p.spec.node_name]
        wait_until(lambda: len(bound()) == 2, timeout=120, what="the production gang bound on the spot nodes")
        # its work done (deleted here): attempt 1002 gets the spot nodes back
        core.delete_collection_namespaced_pod("team-nlp", label_selector=production_pods, grace_period_seconds=0)

    try:
        result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "logs_spot", (
            f'team="nlp", tier="best-effort-training", workers=1, gpus_per_worker=4, checkpoint="s3://{bucket}/lspot", '
            f'spot="always", retries=1, image="python:3.11", cmds={TRAINER!r}, secrets=[{{"secret": "{S3_SECRET}"}}], '
            f'termination_grace_period=15, env_vars={{"{C.ENV_EXAMPLE_EPOCHS}": "40", '
            f'"{C.ENV_EXAMPLE_STEP_SECONDS}": "0.02"}}'), timeout=600, during=interrupt_then_preempt)
    finally:  # the production gang's pods, Service and PodGroup
        from kubernetes import client

        delete_task_instance_objects_sync(core, client.CustomObjectsApi(core.api_client), "team-nlp",
                                          preemptor.selector(), production.group_resource, grace=0)
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("success", 1), log[-8000:]
    assert (_xcom(ti)["interruptions"], _xcom(ti)["preemptions"], _xcom(ti)["attempts"]) == (1, 1, 3), _xcom(ti)
    lines = log.splitlines()
    for attempt, preempted in ((1000, False), (1001, True)):
        ended = [x for x in lines if f"attempt {attempt} (gang " in x and "ended: disrupted" in x]
        assert ended and ("preempt" in ended[0].lower()) == preempted, (ended, log[-8000:])
        head = next((i for i, x in enumerate(lines) if "===== rank 0: pod " in x and f", attempt {attempt} =====" in x),
                    None)
        assert head is not None, log[-8000:]
        end = next(i for i in range(head, len(lines)) if "===== end of rank 0" in lines[i])
        block = "\n".join(lines[head:end])
        assert '"event": "epoch"' in block and '"event": "stopped"' in block, block[-3000:]
    resumed = [json.loads(x[x.index("{"):]) for x in lines if '"event": "resume"' in x and x.lstrip().startswith("{")]
    assert any(r["attempt"] == 1002 and r["step"] > 0 for r in resumed), log[-8000:]
