"""Workload APIs on the local cluster through clients nobody here wrote (kubectl 1.32, the official
client): apps/v1 Deployment/ReplicaSet rollouts, batch/v1 Jobs, policy/v1 PodDisruptionBudgets with the
Eviction API, node Leases and heartbeats; `kubectl apply -k deploy/`."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.devtools.processes import wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "workloads", "podGCSeconds": 2, "nodeLeaseRenewSeconds": 0.5, "nodeStatusReportSeconds": 1,
            "pools": [{"name": "gpu", "count": 2, "gpu": {"count": 4}, "cpu": "32", "memory": "64Gi"}]}


@pytest.fixture(scope="module")
def api(kube_cluster):
    return kube_cluster.api_client()


@pytest.fixture
def ns(kube_cluster):
    name = f"w-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    return name


def deployment(name: str, replicas: int, surge=1, unavailable=0, image="demo:1") -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"terminationGracePeriodSeconds": 1,
                                           "containers": [{"name": "main", "image": image}]}}}}


def job(name: str, script: str, **spec) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {**spec, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                                                   "containers": [{"name": "main", "image": "python:3.11",
                                                                   "command": ["python", "-c", script]}]}}}}


def condition(obj, ctype: str):
    return next((c for c in obj.status.conditions or [] if c.type == ctype and c.status == "True"), None)


def test_apply_k_deploy_creates_the_scheduler_deployment(kube_cluster):
    result = kube_cluster.kubectl("apply", "-k", str(REPO_ROOT / "deploy"))
    assert "deployment.apps/airflow-gpu-scheduler created" in result.stdout
    again = kube_cluster.kubectl("apply", "-k", str(REPO_ROOT / "deploy"))
    assert "deployment.apps/airflow-gpu-scheduler unchanged" in again.stdout
    apps = client.AppsV1Api(kube_cluster.api_client())
    d = wait_until(lambda: (lambda d: d if (d.status.replicas or 0) == 2 else None)(
        apps.read_namespaced_deployment("airflow-gpu-scheduler", "airflow-gpu-system")), 20, what="2 replicas")
    rs = apps.list_namespaced_replica_set("airflow-gpu-system").items
    assert len(rs) == 1 and rs[0].metadata.owner_references[0].uid == d.metadata.uid
    assert rs[0].metadata.annotations[C.ANNOTATION_DEPLOYMENT_REVISION] == "1"
    pods = client.CoreV1Api(kube_cluster.api_client()).list_namespaced_pod(
        "airflow-gpu-system", label_selector="app.kubernetes.io/name=airflow-gpu-scheduler").items
    assert len(pods) == 2 and all(p.metadata.owner_references[0].name == rs[0].metadata.name for p in pods)
    assert all(p.metadata.labels[C.LABEL_POD_TEMPLATE_HASH] for p in pods)
    kube_cluster.kubectl("scale", "deployment/airflow-gpu-scheduler", "-n", "airflow-gpu-system", "--replicas=0")
    wait_until(lambda: not client.CoreV1Api(kube_cluster.api_client()).list_namespaced_pod("airflow-gpu-system").items,
               30, what="scheduler pods gone after scale to 0")


def test_rolling_update_keeps_within_surge_and_unavailable(kube_cluster, api, ns):
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("web", 4, surge=1, unavailable=0))
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")
    seen = {"max_pods": 0, "min_ready": 99}
    pods: dict[str, object] = {}
    stop = threading.Event()

    def observe():
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_pod, ns, timeout_seconds=40):
            pod = event["object"]
            if event["type"] == "DELETED" or pod.metadata.deletion_timestamp:
                pods.pop(pod.metadata.name, None)
            else:
                pods[pod.metadata.name] = pod
            ready = sum(1 for p in pods.values() if any(c.type == "Ready" and c.status == "True"
                                                        for c in p.status.conditions or []))
            seen["max_pods"] = max(seen["max_pods"], len(pods))
            if len(pods) >= 4:
                seen["min_ready"] = min(seen["min_ready"], ready)
            if stop.is_set():
                w.stop()

    thread = threading.Thread(target=observe, daemon=True)
    thread.start()
    wait_until(lambda: len(pods) == 4, 10, what="watch sees the 4 pods")
    kube_cluster.kubectl("rollout", "restart", "deployment/web", "-n", ns)
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=40s")
    stop.set()  # the watch thread ends at its next event or its timeout (daemon)
    d = apps.read_namespaced_deployment("web", ns)
    assert d.status.updated_replicas == 4 and d.status.available_replicas == 4 and d.status.replicas == 4
    assert d.status.observed_generation == d.metadata.generation == 2
    assert seen["max_pods"] <= 5, seen  # replicas + maxSurge
    assert seen["min_ready"] >= 4, seen  # maxUnavailable 0: never fewer than 4 ready
    rss = apps.list_namespaced_replica_set(ns).items
    assert sorted((r.spec.replicas, r.metadata.annotations[C.ANNOTATION_DEPLOYMENT_REVISION]) for r in rss) == \
        [(0, "1"), (4, "2")]
    history = kube_cluster.kubectl("rollout", "history", "deployment/web", "-n", ns).stdout
    assert "1 " in history and "2 " in history
    kube_cluster.kubectl("scale", "deployment/web", "-n", ns, "--replicas=2")
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")
    table = kube_cluster.kubectl("get", "deployment", "web", "-n", ns).stdout.split("\n")
    assert table[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"] and table[1].split()[:4] == \
        ["web", "2/2", "2", "2"]
    kube_cluster.kubectl("rollout", "undo", "deployment/web", "-n", ns)
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")
    rss = apps.list_namespaced_replica_set(ns).items  # the undo re-used revision 1's replica set
    assert sorted((r.spec.replicas, r.metadata.annotations[C.ANNOTATION_DEPLOYMENT_REVISION]) for r in rss) == \
        [(0, "2"), (2, "3")]
    kube_cluster.kubectl("delete", "deployment", "web", "-n", ns)
    wait_until(lambda: not core.list_namespaced_pod(ns).items and not apps.list_namespaced_replica_set(ns).items,
               20, what="garbage collection of the replica sets and pods")


def test_recreate_strategy_stops_old_pods_first(kube_cluster, api, ns):
    apps = client.AppsV1Api(api)
    body = deployment("batchy", 2)
    body["spec"]["strategy"] = {"type": "Recreate"}
    apps.create_namespaced_deployment(ns, body)
    kube_cluster.kubectl("rollout", "status", "deployment/batchy", "-n", ns, "--timeout=30s")
    kube_cluster.kubectl("set", "image", "deployment/batchy", "main=demo:2", "-n", ns)
    kube_cluster.kubectl("rollout", "status", "deployment/batchy", "-n", ns, "--timeout=30s")
    events = [e for e in client.CoreV1Api(api).list_namespaced_event(ns).items if e.reason == "ScalingReplicaSet"]
    events.sort(key=lambda e: e.metadata.name)
    messages = [e.message for e in events]
    down = next(i for i, m in enumerate(messages) if "Scaled down" in m and "from 2 to 0" in m)
    up = [i for i, m in enumerate(messages) if "Scaled up" in m]
    assert up[-1] > down, messages
    images = {p.spec.containers[0].image for p in client.CoreV1Api(api).list_namespaced_pod(ns).items
              if not p.metadata.deletion_timestamp}
    assert images == {"demo:2"}


def test_kubectl_create_job_and_job_semantics(kube_cluster, api, ns):
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    kube_cluster.kubectl("create", "job", "hello", "-n", ns, "--image=python:3.11", "--",
                         "python", "-c", "print('hello from a job')")
    kube_cluster.kubectl("wait", "--for=condition=complete", "job/hello", "-n", ns, "--timeout=30s")
    assert kube_cluster.kubectl("logs", "job/hello", "-n", ns).stdout == "hello from a job\n"
    table = kube_cluster.kubectl("get", "job", "hello", "-n", ns).stdout.split("\n")
    assert table[0].split()[:3] == ["NAME", "STATUS", "COMPLETIONS"] and table[1].split()[:3] == \
        ["hello", "Complete", "1/1"]
    # completions 3, parallelism 2: never more than 2 at once, 3 successes
    batch.create_namespaced_job(ns, job("three", "import time; time.sleep(0.5)", completions=3, parallelism=2))
    wait_until(lambda: condition(batch.read_namespaced_job("three", ns), "Complete"), 40, what="three complete")
    three = batch.read_namespaced_job("three", ns)
    assert three.status.succeeded == 3 and not three.status.failed and three.status.completion_time
    pods = core.list_namespaced_pod(ns, label_selector=f"{C.LABEL_JOB_NAME}=three").items
    assert len(pods) == 3 and all(not p.metadata.finalizers for p in pods)
    # backoffLimit 1: two failed pods, then BackoffLimitExceeded
    batch.create_namespaced_job(ns, job("fails", "raise SystemExit(3)", backoffLimit=1))
    wait_until(lambda: condition(batch.read_namespaced_job("fails", ns), "Failed"), 40, what="fails failed")
    fails = batch.read_namespaced_job("fails", ns)
    assert fails.status.failed == 2 and condition(fails, "Failed").reason == "BackoffLimitExceeded"
    # suspend: no pods until resumed
    batch.create_namespaced_job(ns, job("later", "print('resumed')", suspend=True))
    wait_until(lambda: condition(batch.read_namespaced_job("later", ns), "Suspended"), 10, what="suspended")
    assert not core.list_namespaced_pod(ns, label_selector=f"{C.LABEL_JOB_NAME}=later").items
    batch.patch_namespaced_job("later", ns, {"spec": {"suspend": False}})
    wait_until(lambda: condition(batch.read_namespaced_job("later", ns), "Complete"), 30, what="resumed job done")
    # Indexed: one pod per index, JOB_COMPLETION_INDEX set
    batch.create_namespaced_job(ns, job("indexed", "import os; print('index', os.environ['JOB_COMPLETION_INDEX'])",
                                        completions=2, parallelism=2, completionMode="Indexed"))
    wait_until(lambda: condition(batch.read_namespaced_job("indexed", ns), "Complete"), 30, what="indexed done")
    assert batch.read_namespaced_job("indexed", ns).status.completed_indexes == "0-1"
    logs = sorted(core.read_namespaced_pod_log(p.metadata.name, ns, _preload_content=False).data.decode()
                  for p in core.list_namespaced_pod(ns, label_selector=f"{C.LABEL_JOB_NAME}=indexed").items)
    assert logs == ["index 0\n", "index 1\n"]


def test_pod_failure_policy_ignores_disruptions_and_fails_on_exit_code(kube_cluster, api, ns):
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                                              "values": [42]}}]}
    batch.create_namespaced_job(ns, job("train", "import time; time.sleep(60)", backoffLimit=0,
                                        podFailurePolicy=policy))
    first = wait_until(lambda: [p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"], 20,
                       what="the job's pod running")[0]
    core.create_namespaced_pod_eviction(first.metadata.name, ns, {"metadata": {"name": first.metadata.name, "namespace": ns}})
    replacement = wait_until(lambda: [p for p in core.list_namespaced_pod(ns).items
                                      if p.metadata.name != first.metadata.name and p.status.phase == "Running"],
                             30, what="a replacement pod")
    train = batch.read_namespaced_job("train", ns)
    assert not train.status.failed and not condition(train, "Failed")  # the disruption was not a failure
    assert replacement
    batch.create_namespaced_job(ns, job("crash", "raise SystemExit(42)", backoffLimit=6, podFailurePolicy=policy))
    wait_until(lambda: condition(batch.read_namespaced_job("crash", ns), "Failed"), 30, what="crash failed")
    crash = batch.read_namespaced_job("crash", ns)
    assert condition(crash, "Failed").reason == "PodFailurePolicy" and crash.status.failed == 1
    assert "exit code 42" in condition(crash, "Failed").message
    invalid = job("bad", "pass", podFailurePolicy=policy)
    invalid["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, invalid)
    assert err.value.status == 422 and "podFailurePolicy" in json.loads(err.value.body)["message"]


def pdb_status(policy, ns: str, name: str, **want):
    """The budget's status once the disruption controller has observed its generation and shows `want`."""
    def ready():
        pdb = policy.read_namespaced_pod_disruption_budget(name, ns)
        s = pdb.status
        if s is None or s.observed_generation != pdb.metadata.generation:
            return None
        return s if all(getattr(s, k) == v for k, v in want.items()) else None
    return wait_until(ready, 10, what=f"pdb {name} status {want}")


def evict(core, ns: str, name: str):
    return core.create_namespaced_pod_eviction(name, ns, {"metadata": {"name": name, "namespace": ns}})


HOLD = "example.com/hold"  # a finalizer of the test's own: the evicted pod stays terminating until removed


def test_eviction_honours_pod_disruption_budget(kube_cluster, api, ns):
    apps, core, policy = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("serve", 3))
    kube_cluster.kubectl("rollout", "status", "deployment/serve", "-n", ns, "--timeout=30s")
    kube_cluster.kubectl("create", "poddisruptionbudget", "serve", "-n", ns, "--selector=app=serve",
                         "--min-available=3")
    pdb_status(policy, ns, "serve", current_healthy=3)
    pods = core.list_namespaced_pod(ns).items
    victim, second = pods[0].metadata.name, pods[1].metadata.name
    with pytest.raises(ApiException) as err:
        evict(core, ns, victim)
    body = json.loads(err.value.body)
    assert err.value.status == 429 and body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0] == {"reason": "DisruptionBudget",
                                            "message": "The disruption budget serve needs 3 healthy pods and has 3 currently"}
    table = kube_cluster.kubectl("get", "pdb", "serve", "-n", ns).stdout.split("\n")
    assert table[1].split()[:4] == ["serve", "3", "N/A", "0"]
    policy.patch_namespaced_pod_disruption_budget("serve", ns, {"spec": {"minAvailable": 2}})
    pdb_status(policy, ns, "serve", disruptions_allowed=1)
    nodes = [n.metadata.name for n in core.list_node().items]
    for node in nodes:  # the replacement pod stays Pending
        kube_cluster.kubectl("cordon", node)
    core.patch_namespaced_pod(victim, ns, {"metadata": {"finalizers": [HOLD]}})
    try:
        evict(core, ns, victim)
        with pytest.raises(ApiException) as err:  # the eviction took the budget's only disruption
            evict(core, ns, second)
        assert err.value.status == 429
        # An integer minAvailable counts the selected pods themselves (disruption controller,
        # getExpectedPodCount): the terminating victim and its Pending replacement are both expected.
        held = pdb_status(policy, ns, "serve", expected_pods=4)
        assert (held.current_healthy, held.desired_healthy, held.disruptions_allowed) == (2, 2, 0)
        assert not held.disrupted_pods  # the victim is being deleted: no longer an announced eviction
        assert core.read_namespaced_pod(victim, ns).metadata.deletion_timestamp is not None
        core.patch_namespaced_pod(victim, ns, {"metadata": {"finalizers": None}})
        wait_until(lambda: victim not in {p.metadata.name for p in core.list_namespaced_pod(ns).items}, 10,
                   what="victim gone")
        gone = pdb_status(policy, ns, "serve", expected_pods=3)
        assert (gone.current_healthy, gone.desired_healthy, gone.disruptions_allowed) == (2, 2, 0)
        assert sum(p.status.phase == "Pending" for p in core.list_namespaced_pod(ns).items) == 1
    finally:
        for node in nodes:
            kube_cluster.kubectl("uncordon", node)
    kube_cluster.kubectl("rollout", "status", "deployment/serve", "-n", ns, "--timeout=30s")
    pdb_status(policy, ns, "serve", current_healthy=3, disruptions_allowed=1)
    evict(core, ns, second)


def test_pdb_scales_from_controllers(kube_cluster, api, ns):
    """maxUnavailable and percentages count the controllers' scale: a Deployment's replicas, however many
    ReplicaSets hold its pods mid-rollout. A Job has no scale subresource: such a budget fails safe."""
    apps, core, policy = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    batch = client.BatchV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("web", 2, surge=2))
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")
    kube_cluster.kubectl("create", "pdb", "web", "-n", ns, "--selector=app=web", "--max-unavailable=1")
    pdb_status(policy, ns, "web", expected_pods=2, desired_healthy=1, current_healthy=2, disruptions_allowed=1)
    nodes = [n.metadata.name for n in core.list_node().items]
    for node in nodes:  # the new ReplicaSet's pods stay Pending: the rollout holds two ReplicaSets of 2
        kube_cluster.kubectl("cordon", node)
    try:
        kube_cluster.kubectl("rollout", "restart", "deployment/web", "-n", ns)
        wait_until(lambda: sorted(rs.spec.replicas for rs in apps.list_namespaced_replica_set(ns).items) == [2, 2],
                   10, what="two ReplicaSets of 2")
        wait_until(lambda: len(core.list_namespaced_pod(ns).items) == 4, 10, what="4 pods")
        pdb_status(policy, ns, "web", expected_pods=2, desired_healthy=1, current_healthy=2, disruptions_allowed=1)
    finally:
        for node in nodes:
            kube_cluster.kubectl("uncordon", node)
    kube_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")
    batch.create_namespaced_job(ns, job("crunch", "import time; time.sleep(60)", parallelism=2, completions=2))
    wait_until(lambda: len(core.list_namespaced_pod(ns, label_selector="job-name=crunch").items) == 2, 10,
               what="job pods")
    kube_cluster.kubectl("create", "pdb", "crunch", "-n", ns, "--selector=job-name=crunch", "--min-available=50%")
    failed = wait_until(lambda: condition_any(policy.read_namespaced_pod_disruption_budget("crunch", ns),
                                              "DisruptionAllowed", "SyncFailed"), 10, what="SyncFailed")
    assert failed.status == "False" and failed.message == "jobs.batch does not implement the scale subresource"
    assert policy.read_namespaced_pod_disruption_budget("crunch", ns).status.disruptions_allowed == 0
    batch.delete_namespaced_job("crunch", ns, propagation_policy="Background")


def condition_any(obj, ctype: str, reason: str):
    return next((c for c in (obj.status and obj.status.conditions) or [] if c.type == ctype and c.reason == reason),
                None)


def test_node_leases_and_heartbeats(kube_cluster, api):
    coordination, core = client.CoordinationV1Api(api), client.CoreV1Api(api)
    lease = coordination.read_namespaced_lease("gpu-0", C.NODE_LEASE_NAMESPACE)
    assert lease.spec.holder_identity == "gpu-0" and lease.spec.lease_duration_seconds == 40
    assert lease.metadata.owner_references[0].kind == "Node"
    first = lease.spec.renew_time
    beat = {c.type: c.last_heartbeat_time for c in core.read_node("gpu-0").status.conditions}["Ready"]
    wait_until(lambda: coordination.read_namespaced_lease("gpu-0", C.NODE_LEASE_NAMESPACE).spec.renew_time > first,
               5, what="lease renewal")
    wait_until(lambda: {c.type: c.last_heartbeat_time for c in core.read_node("gpu-0").status.conditions}["Ready"]
               > beat, 5, what="node status heartbeat")
    described = kube_cluster.kubectl("describe", "node", "gpu-0").stdout
    assert "HolderIdentity:  gpu-0" in described and "Failed to get lease" not in described
    kube_cluster.not_ready("gpu-1")
    try:
        stale = coordination.read_namespaced_lease("gpu-1", C.NODE_LEASE_NAMESPACE).spec.renew_time
        wait_until(lambda: coordination.read_namespaced_lease("gpu-0", C.NODE_LEASE_NAMESPACE).spec.renew_time
                   > stale + dt.timedelta(seconds=1.5), 10, what="gpu-0 renewing")
        assert coordination.read_namespaced_lease("gpu-1", C.NODE_LEASE_NAMESPACE).spec.renew_time == stale
    finally:
        kube_cluster.ready("gpu-1")
