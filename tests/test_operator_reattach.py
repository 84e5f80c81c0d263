"""GpuTrainingOperator's submission against the local cluster, one step at a time (no Airflow processes:
airflow_gpu.devtools.operator_run stands in for the task runner and its durable state store):
- a worker killed while the task is deferred: the restarted execute() reattaches to the same pod UIDs
  and creates nothing new;
- on_kill deletes every object of the task instance;
- a ResourceQuota refusal at creation defers (logged with the quota's message), not a failure, and
  the same attempt is submitted when the quota frees.
No GPU scheduler runs here: the pods stay pending, which is all these steps need."""

from __future__ import annotations

import json
import time

import pytest

from airflow_gpu import constants as C
from airflow_gpu.devtools.operator_run import DictStateStore, FakeTaskInstance, context_for, execute_until_deferred
from airflow_gpu.devtools.processes import wait_until

SEED = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    import subprocess
    import sys

    rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    kube_cluster.kubectl("apply", "-f", "-", input=rendered)
    return kube_cluster


@pytest.fixture(autouse=True)
def connection(cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(cluster.kubeconfig)}}))


def operator(task_id: str, **kw):
    from airflow_gpu.operators import GpuTrainingOperator

    args = dict(team="research", tier="best-effort-training", workers=2, gpus_per_worker=4, image="python:3.11",
                retries=2, poll_interval=0.5, config_file=str(SEED))
    args.update(kw)
    return GpuTrainingOperator(task_id=task_id, **args)


def pods_of(cluster, dag_id: str) -> dict[str, str]:
    pods = cluster.core().list_namespaced_pod("team-research", label_selector=f"{C.LABEL_DAG_ID}={dag_id}").items
    return {p.metadata.name: p.metadata.uid for p in pods if not p.metadata.deletion_timestamp}


def test_restarted_worker_reattaches_to_the_same_uids(cluster):
    store = DictStateStore()
    ti = FakeTaskInstance("reattach", "train", "manual__1")
    first = execute_until_deferred(operator("train"), context_for(ti, store))
    created = pods_of(cluster, "reattach")
    assert len(created) == 2 and first.trigger.pod_uids == created
    # the worker dies (SIGKILL) while deferred; Airflow's retry runs execute() again in a new process
    second = execute_until_deferred(operator("train"), context_for(ti, DictStateStore(json.loads(json.dumps(store.data)))))
    assert second.trigger.pod_uids == created and pods_of(cluster, "reattach") == created  # no duplicates
    assert second.trigger.gang_name == first.trigger.gang_name and second.kwargs["run"]["attempt"] == 1000

    # a stored gang whose pods are gone (deleted meanwhile) is resubmitted as the next attempt
    cluster.core().delete_collection_namespaced_pod("team-research", label_selector=f"{C.LABEL_DAG_ID}=reattach",
                                                     grace_period_seconds=0)
    wait_until(lambda: not pods_of(cluster, "reattach"), timeout=30, what="pods gone")
    third = execute_until_deferred(operator("train"), context_for(ti, store))
    assert third.kwargs["run"]["attempt"] == 1001 and set(third.trigger.pod_uids) == set(pods_of(cluster, "reattach"))
    op = operator("train")
    execute_until_deferred(op, context_for(ti, store))
    op.on_kill()
    wait_until(lambda: not pods_of(cluster, "reattach"), timeout=60, what="on_kill deleted the pods")
    services = cluster.core().list_namespaced_service("team-research", label_selector=f"{C.LABEL_DAG_ID}=reattach")
    assert services.items == []
    groups = cluster.custom().list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "team-research",
                                                            "podgroups", label_selector=f"{C.LABEL_DAG_ID}=reattach")
    assert groups["items"] == []


class Recorder:
    """Stands in for the operator's logger in GangClient: keeps the formatted messages."""

    def __init__(self):
        self.lines: list[str] = []

    def _add(self, msg, *args, **_):
        self.lines.append(msg % args if args else msg)

    info = warning = error = exception = debug = _add


def test_resource_quota_refusal_defers_and_submits_when_the_quota_frees(cluster, monkeypatch):
    """Issue 27 item 5: no worker slot is held while a ResourceQuota refuses the gang: execute() defers
    (a timer of poll_interval, the quota's message in the log); back from it, the same attempt is
    submitted again, adopting what was created, until the quota admits it."""
    from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_gpu.operators import GpuTrainingOperator
    from airflow_gpu.operators.cluster import GangClient

    core = cluster.core()
    blocker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "quota-blocker"},
               "spec": {"schedulerName": "nobody", "priorityClassName": "airflow-gpu-best-effort-training",
                        "containers": [{"name": "c", "image": "x", "resources": {"limits": {C.RESOURCE_GPU: "12"}}}]}}
    core.create_namespaced_pod("team-research", blocker)  # 12 of research's 16 preemptible GPUs
    recorder = Recorder()
    monkeypatch.setattr(GpuTrainingOperator, "_client", lambda self: GangClient(
        cluster.api_client(), recorder, on_quota=self._defer_for_quota))
    ti = FakeTaskInstance("quota", "train", "manual__1")
    store = DictStateStore()
    started = time.monotonic()
    deferred = execute_until_deferred(operator("train"), context_for(ti, store))
    assert time.monotonic() - started < 10  # deferred at the first refusal, not waited out
    assert isinstance(deferred.trigger, TimeDeltaTrigger) and deferred.method_name == "execute_after_quota"
    refusals = [x for x in recorder.lines if "refused by a ResourceQuota" in x]
    assert refusals and "exceeded quota: airflow-gpu-preemptible" in refusals[0]
    run = deferred.kwargs["run"]
    assert run["attempt"] == 1000 and run["attempts"] == 1
    # still refused: deferred again, same attempt, same gang name
    with pytest.raises(TaskDeferred) as again:
        operator("train").execute_after_quota(context_for(ti, store), event=None, run=run)
    assert again.value.method_name == "execute_after_quota" and again.value.kwargs["run"]["gang"] == run["gang"]
    core.delete_namespaced_pod("quota-blocker", "team-research", grace_period_seconds=0)
    with pytest.raises(TaskDeferred) as admitted:
        operator("train").execute_after_quota(context_for(ti, store), event=None, run=again.value.kwargs["run"])
    assert admitted.value.method_name == "execute_complete"
    final = admitted.value.kwargs["run"]
    assert (final["attempt"], final["attempts"], final["gang"]) == (1000, 1, run["gang"])
    assert set(admitted.value.trigger.pod_uids) == set(pods_of(cluster, "quota")) and len(final["pods"]) == 2


def test_execution_timeout_while_deferred_deletes_the_gang(cluster):
    """The triggerer's timeout (what is left of execution_timeout) resumes the task with __fail__: the
    gang goes before the task fails."""
    import datetime as dt

    from airflow.sdk.bases.operator import TriggerFailureReason
    from airflow.sdk.exceptions import TaskDeferralTimeout

    op = operator("train", execution_timeout=dt.timedelta(minutes=5))
    ti = FakeTaskInstance("timeout", "train", "manual__1")
    deferred = execute_until_deferred(op, context_for(ti, DictStateStore()))
    assert dt.timedelta(minutes=4) < deferred.timeout <= dt.timedelta(minutes=5)
    assert len(pods_of(cluster, "timeout")) == 2
    resumed = operator("train", execution_timeout=dt.timedelta(minutes=5))  # a fresh worker process
    with pytest.raises(TaskDeferralTimeout):
        resumed.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, context_for(ti, None))
    wait_until(lambda: not pods_of(cluster, "timeout"), timeout=60, what="the gang deleted")


def test_an_object_the_api_refuses_as_invalid_fails_without_retry(cluster):
    """A spec the cluster refuses at admission (422; here a hostPath volume, which the local cluster
    does not offer) fails the task without spending a retry, with the API's message; nothing stays."""
    from airflow.sdk.exceptions import AirflowFailException

    op = operator("train", pod_template_dict={"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/tmp"}}],
                                                       "containers": [{"name": "base", "volumeMounts": [
                                                           {"name": "h", "mountPath": "/data"}]}]}})
    ti = FakeTaskInstance("invalid", "train", "manual__1")
    with pytest.raises(AirflowFailException) as info:
        op.execute(context_for(ti, DictStateStore()))
    assert "argument 'pod_template_dict'" in str(info.value) and "hostPath" in str(info.value), str(info.value)
    assert "without spending a retry" in str(info.value)
    wait_until(lambda: not pods_of(cluster, "invalid"), timeout=60, what="nothing left")
    groups = cluster.custom().list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "team-research",
                                                            "podgroups", label_selector=f"{C.LABEL_DAG_ID}=invalid")
    assert groups["items"] == []


def test_a_spec_breaking_the_namespace_s_pod_security_level_fails_without_retry_and_kpo_s_contexts_fix_it(cluster):
    """A namespace enforcing Pod Security "restricted" refuses the default spec with kube-apiserver's
    403 "violates PodSecurity": the task fails without a retry, naming the fix (KPO's security
    contexts), and nothing stays; with those contexts set the same gang is created."""
    from airflow.sdk.exceptions import AirflowFailException

    label = "pod-security.kubernetes.io/enforce"
    cluster.core().patch_namespace("team-research", {"metadata": {"labels": {label: "restricted"}}})
    try:
        ti = FakeTaskInstance("podsecurity", "train", "manual__1")
        with pytest.raises(AirflowFailException) as info:
            operator("train").execute(context_for(ti, DictStateStore()))
        message = str(info.value)
        assert 'violates PodSecurity "restricted:latest"' in message and "allowPrivilegeEscalation != false" in message
        assert "container_security_context" in message and "without spending a retry" in message, message
        wait_until(lambda: not pods_of(cluster, "podsecurity"), timeout=60, what="nothing left")

        compliant = operator("train", security_context={"runAsNonRoot": True, "runAsUser": 1000,
                                                        "seccompProfile": {"type": "RuntimeDefault"}},
                             container_security_context={"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}})
        deferred = execute_until_deferred(compliant, context_for(FakeTaskInstance("podsecurity", "train", "manual__2"),
                                                                 DictStateStore()))
        assert len(deferred.trigger.pod_uids) == 2
        compliant.on_kill()
    finally:
        cluster.core().patch_namespace("team-research", {"metadata": {"labels": {label: None}}})
    wait_until(lambda: not pods_of(cluster, "podsecurity"), timeout=60, what="on_kill deleted the pods")
