"""The local cluster through the official Python clients (kubernetes sync, kubernetes_asyncio)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools.processes import wait_until
from airflow_gpu import constants as C

SHARED_CRDS = Path(__file__).resolve().parents[2] / "shared" / "crds"


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    return wait_until(predicate, timeout, interval, what)


@pytest.fixture
def ns(kube_cluster):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_cluster.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def pod_body(name, command=None, restart="Never", gpus=0, annotations=None, grace=None, scheduler=None, **spec):
    container = {"name": "main", "image": "python:3.11"}
    if command:
        container["command"] = command
    if gpus:
        container["resources"] = {"limits": {C.RESOURCE_GPU: str(gpus)}}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": restart, "containers": [container], **spec}}
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    if scheduler:
        body["spec"]["schedulerName"] = scheduler
    return body


def pod_log(core, ns, name) -> str:
    # kubernetes 36 returns str(bytes) for text/plain bodies (a real cluster's logs too): read raw
    return core.read_namespaced_pod_log(name, ns, _preload_content=False).data.decode()


def phase(core, ns, name):
    try:
        return core.read_namespaced_pod(name, ns).status.phase
    except ApiException as exc:
        if exc.status == 404:
            return "Gone"
        raise


def test_version_nodes_and_gpu_capacity(kube_cluster):
    core = kube_cluster.core()
    version = client.VersionApi(kube_cluster.api_client()).get_code()
    assert (version.major, version.minor) == ("1", "32")
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) >= {"gpu-od-0", "gpu-od-1", "gpu-spot-0", "gpu-spot-1", "gpu-mig-0", "cpu-0"}
    od = nodes["gpu-od-0"]
    assert od.status.allocatable[C.RESOURCE_GPU] == "4"
    assert od.metadata.labels[C.NODE_GPU_PRODUCT] == "NVIDIA-A100-SXM4-80GB"
    assert od.metadata.labels[C.NODE_CAPACITY_TYPE_KARPENTER] == C.CAPACITY_ON_DEMAND
    assert od.metadata.labels[C.NODE_GPU_CLIQUE] == "clique-1"
    spot = nodes["gpu-spot-0"]
    assert spot.metadata.labels[C.NODE_CAPACITY_TYPE_KARPENTER] == C.CAPACITY_SPOT
    assert [(t.key, t.effect) for t in spot.spec.taints] == [(C.TAINT_SPOT, "NoSchedule")]
    mig = nodes["gpu-mig-0"]
    assert mig.metadata.labels[C.NODE_MIG_STRATEGY] == "mixed"
    assert mig.status.allocatable[C.RESOURCE_GPU] == "1"
    assert mig.status.allocatable[C.RESOURCE_MIG_PREFIX + "3g.40gb"] == "1"
    assert mig.status.allocatable[C.RESOURCE_MIG_PREFIX + "1g.10gb"] == "2"
    by_label = core.list_node(label_selector=f"{C.NODE_CAPACITY_TYPE_KARPENTER} in (spot)").items
    assert {n.metadata.name for n in by_label} == {"gpu-spot-0", "gpu-spot-1"}


def test_process_pod_log_env_and_exit_code(kube_cluster, ns):
    core = kube_cluster.core()
    script = ("import os,sys; print('name', os.environ['NAME'], 'ns', os.environ['NS'], 'team', os.environ['TEAM']);"
              "print('ip', os.environ['IP'], 'cpu', os.environ['CPU'], 'gpus', os.environ['NVIDIA_VISIBLE_DEVICES']);"
              "print('cwd', os.getcwd()); sys.exit(3)")
    body = pod_body("proc", ["python", "-c", script], gpus=2)
    body["metadata"]["labels"] = {"team": "vision"}
    body["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    body["spec"]["containers"][0]["env"] = [
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ]
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "proc") == "Failed", what="pod Failed")
    pod = core.read_namespaced_pod("proc", ns)
    state = pod.status.container_statuses[0].state.terminated
    assert (state.exit_code, state.reason) == (3, "Error")
    log = pod_log(core, ns, "proc")
    assert f"name proc ns {ns} team vision" in log
    assert f"ip {pod.status.pod_ip} cpu 2 gpus GPU-" in log
    assert log.count("GPU-") == 2
    cwd = next(line for line in log.splitlines() if line.startswith("cwd "))[4:]
    assert Path(cwd).is_relative_to(kube_cluster.state_dir) and f"proc-{pod.metadata.uid[:8]}" in cwd
    assert pod.status.pod_ip.startswith("127.")
    assert {c.type: c.status for c in pod.status.conditions}["PodScheduled"] == "True"


def test_simulated_container_and_restart_policy(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod_body("sim", annotations={C.ANNOTATION_SIM_DURATION: "0.3"}))
    core.create_namespaced_pod(ns, pod_body("simfail", restart="OnFailure",
                                            annotations={C.ANNOTATION_SIM_DURATION: "0.1", C.ANNOTATION_SIM_EXIT_CODE: "1"}))
    wait_for(lambda: phase(core, ns, "sim") == "Succeeded", what="sim pod Succeeded")
    pod = core.read_namespaced_pod("sim", ns)
    assert pod.status.container_statuses[0].state.terminated.reason == "Completed"
    assert "simulated container main" in pod_log(core, ns, "sim")
    wait_for(lambda: core.read_namespaced_pod("simfail", ns).status.container_statuses
             and core.read_namespaced_pod("simfail", ns).status.container_statuses[0].restart_count >= 1,
             what="OnFailure restart")
    assert phase(core, ns, "simfail") in ("Running", "Pending")


def test_active_deadline_seconds(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod_body("deadline", ["python", "-c", "import time; time.sleep(60)"],
                                            activeDeadlineSeconds=1, grace=1))
    wait_for(lambda: phase(core, ns, "deadline") == "Failed", what="DeadlineExceeded")
    assert core.read_namespaced_pod("deadline", ns).status.reason == "DeadlineExceeded"


def test_delete_sends_sigterm_then_grace(kube_cluster, ns):
    core = kube_cluster.core()
    script = ("import signal,sys,time,pathlib\n"
              "def h(s,f):\n print('got SIGTERM', flush=True); pathlib.Path('sigterm').write_text('1'); time.sleep(0.5); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM,h)\nprint('ready', flush=True)\ntime.sleep(120)\n")
    core.create_namespaced_pod(ns, pod_body("term", ["python", "-c", script], grace=10))
    wait_for(lambda: "ready" in (pod_log(core, ns, "term") if phase(core, ns, "term") == "Running" else ""),
             what="process ready")
    workdir = next(kube_cluster.state_dir.glob(f"pods/{ns}/term-*"))
    started = time.monotonic()
    deleted = core.delete_namespaced_pod("term", ns)
    assert deleted.metadata.deletion_timestamp is not None  # graceful: still there, terminating
    wait_for(lambda: phase(core, ns, "term") == "Gone", what="pod removed")
    assert time.monotonic() - started < 8  # exited on SIGTERM, no SIGKILL wait
    assert (workdir / "sigterm").read_text() == "1"
    assert "got SIGTERM" in (workdir / "main.0.log").read_text()


def test_sigkill_after_grace_period(kube_cluster, ns):
    core = kube_cluster.core()
    script = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
    core.create_namespaced_pod(ns, pod_body("stubborn", ["python", "-c", script], grace=30))
    # Running comes with the process start; SIGTERM is ignored only once Python has run the script
    wait_for(lambda: phase(core, ns, "stubborn") == "Running" and "ready" in pod_log(core, ns, "stubborn"),
             what="handler installed")
    w = watch.Watch()
    rv = core.read_namespaced_pod("stubborn", ns).metadata.resource_version
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", ns, grace_period_seconds=1)
    final = None
    for event in w.stream(core.list_namespaced_pod, ns, field_selector="metadata.name=stubborn", resource_version=rv,
                          timeout_seconds=15):
        if event["object"].status.container_statuses and event["object"].status.container_statuses[0].state.terminated:
            final = event["object"].status.container_statuses[0].state.terminated
        if event["type"] == "DELETED":
            break
    w.stop()
    assert 0.9 < time.monotonic() - started < 10
    assert final is not None and final.exit_code == 137


def test_watch_create_patch_delete_and_stale_update(kube_cluster, ns):
    core = kube_cluster.core()
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg", "labels": {"a": "1"}}, "data": {"k": "v"}})
    core.patch_namespaced_config_map("cfg", ns, {"data": {"k2": "v2"}})
    core.patch_namespaced_config_map("cfg", ns, [{"op": "add", "path": "/data/k3", "value": "v3"}])
    core.delete_namespaced_config_map("cfg", ns)
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], dict(event["object"].data or {})))
        if event["type"] == "DELETED":
            w.stop()
    assert [t for t, _ in seen] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert seen[2][1] == {"k": "v", "k2": "v2", "k3": "v3"}
    # optimistic concurrency: an update with a stale resourceVersion is 409 Conflict
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg2"}, "data": {"k": "1"}})
    core.patch_namespaced_config_map("cfg2", ns, {"data": {"k": "2"}})
    cm.data = {"k": "3"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("cfg2", ns, cm)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg2"}})
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"


def test_watch_bookmarks_and_resume(kube_cluster, ns):
    base = kube_cluster.server
    core = kube_cluster.core()
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "late"}})
    r = requests.get(f"{base}/api/v1/namespaces/{ns}/configmaps?watch=true&allowWatchBookmarks=true"
                     f"&resourceVersion={rv}&timeoutSeconds=3", stream=True)
    assert r.headers.get("Transfer-Encoding") == "chunked"
    lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[0]["type"] == "ADDED" and lines[0]["object"]["metadata"]["name"] == "late"
    bookmarks = [e for e in lines if e["type"] == "BOOKMARK"]
    assert bookmarks and int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) >= int(rv) + 1
    r = requests.get(f"{base}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=bogus")
    assert json.loads(r.text.splitlines()[0])["object"]["code"] == 400


def test_selectors_and_deletecollection(kube_cluster, ns):
    core = kube_cluster.core()
    for i, (tier, team) in enumerate([("a", "x"), ("b", "x"), ("c", "y")]):
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"cm{i}", "labels": {"tier": tier, "team": team}}})
    names = lambda sel: sorted(c.metadata.name for c in core.list_namespaced_config_map(ns, label_selector=sel).items)  # noqa: E731
    assert names("tier in (a,b)") == ["cm0", "cm1"]
    assert names("tier notin (a),team=x") == ["cm1"]
    assert names("team!=x") == ["cm2", "kube-root-ca.crt"]  # != matches objects without the label
    assert names("!missing,team") == ["cm0", "cm1", "cm2"]
    assert [c.metadata.name for c in core.list_namespaced_config_map(ns, field_selector="metadata.name=cm2").items] == ["cm2"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map(ns, field_selector="data.k=1")
    assert err.value.status == 400
    core.delete_collection_namespaced_config_map(ns, label_selector="team=x")
    assert names("") == ["cm2", "kube-root-ca.crt"]  # every namespace has the root CA ConfigMap, as on a real cluster


def test_owner_reference_garbage_collection(kube_cluster, ns):
    core = kube_cluster.core()
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_pod(ns, {**pod_body("child", annotations={C.ANNOTATION_SIM_DURATION: "100"}),
                                    "metadata": {"name": "child", "ownerReferences": [ref]}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "child-secret", "ownerReferences": [ref]}})
    wait_for(lambda: phase(core, ns, "child") == "Running", what="child running")
    core.delete_namespaced_config_map("owner", ns)
    wait_for(lambda: phase(core, ns, "child") == "Gone", what="dependent pod collected")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("child-secret", ns)
    assert err.value.status == 404


def test_admission_priority_quota_and_scheduler_name(kube_cluster, ns):
    core = kube_cluster.core()
    sched = client.SchedulingV1Api(kube_cluster.api_client())
    pc_name = f"prod-{ns}"
    sched.create_priority_class({"metadata": {"name": pc_name}, "value": 1000})
    pod = core.create_namespaced_pod(ns, pod_body("prio", scheduler=C.DEFAULT_SCHEDULER_NAME, priorityClassName=pc_name))
    assert pod.spec.priority == 1000 and pod.spec.scheduler_name == C.DEFAULT_SCHEDULER_NAME
    plain = core.create_namespaced_pod(ns, pod_body("plain", scheduler=C.DEFAULT_SCHEDULER_NAME))
    assert plain.spec.priority == 0
    defaulted = core.create_namespaced_pod(ns, {**pod_body("dflt"), "metadata": {"name": "dflt"}})
    assert defaulted.spec.scheduler_name == "default-scheduler"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, pod_body("noclass", priorityClassName="nope"))
    body = json.loads(err.value.body)
    assert err.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == 'pods "noclass" is forbidden: no PriorityClass with name nope was found'
    # spec.priority is the PriorityClass's, never the pod owner's (the scheduler orders and preempts by
    # it): Priority admission rejects one that disagrees, with or without a class, and an update can't
    # change it (issue 32)
    for name, spec in (("self-prio", {}), ("over-prio", {"priorityClassName": pc_name})):
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(ns, pod_body(name, scheduler="nobody", priority=1000000, **spec))
        computed = 1000 if spec else 0
        assert err.value.status == 403 and json.loads(err.value.body)["message"] == (
            f'pods "{name}" is forbidden: the integer value of priority (1000000) must not be provided in pod spec; '
            f"priority admission controller computed {computed} from the given PriorityClass name")
    assert core.create_namespaced_pod(ns, pod_body("same-prio", scheduler="nobody", priority=1000,
                                                   priorityClassName=pc_name)).spec.priority == 1000
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("same-prio", ns, {"spec": {"priority": 1000000}})
    assert err.value.status == 422 and core.read_namespaced_pod("same-prio", ns).spec.priority == 1000
    # a pod naming another scheduler waits for a Binding
    time.sleep(0.3)
    assert core.read_namespaced_pod("prio", ns).spec.node_name is None
    # the real API answers a Binding with a Status, which the generated client cannot turn into a
    # V1Binding: callers read the raw response, as with a real cluster
    response = core.create_namespaced_pod_binding("prio", ns, client.V1Binding(
        metadata=client.V1ObjectMeta(name="prio"), target=client.V1ObjectReference(kind="Node", name="gpu-od-1")),
        _preload_content=False)
    assert json.loads(response.data)["status"] == "Success"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding("prio", ns, {"metadata": {"name": "prio"}, "target": {"name": "gpu-od-0"}},
                                           _preload_content=False)
    assert err.value.status == 409
    wait_for(lambda: core.read_namespaced_pod("prio", ns).spec.node_name == "gpu-od-1", what="bound")
    # ResourceQuota on GPUs: the real "exceeded quota" message
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    core.create_namespaced_pod(ns, pod_body("g1", gpus=2, scheduler="nobody"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, pod_body("g2", gpus=1, scheduler="nobody"))
    body = json.loads(err.value.body)
    assert err.value.status == 403
    assert body["message"] == ('pods "g2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
                               "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2")
    wait_for(lambda: (core.read_namespaced_resource_quota("gpus", ns).status.used or {}).get("requests.nvidia.com/gpu") == "2",
             what="quota status.used")


def test_default_scheduler_fit_taints_and_unschedulable(kube_cluster, ns):
    core = kube_cluster.core()
    spot_sel = {C.NODE_CAPACITY_TYPE_KARPENTER: "spot"}
    core.create_namespaced_pod(ns, pod_body("spot-no-tol", nodeSelector=spot_sel))
    core.create_namespaced_pod(ns, pod_body("spot-tol", annotations={C.ANNOTATION_SIM_DURATION: "100"}, nodeSelector=spot_sel,
                                            tolerations=[{"key": C.TAINT_SPOT, "operator": "Exists", "effect": "NoSchedule"}]))
    core.create_namespaced_pod(ns, pod_body("mig", annotations={C.ANNOTATION_SIM_DURATION: "100"}, containers=[
        {"name": "main", "image": "x", "resources": {"limits": {C.RESOURCE_MIG_PREFIX + "1g.10gb": "1"}}}]))
    core.create_namespaced_pod(ns, pod_body("huge", gpus=64))
    wait_for(lambda: core.read_namespaced_pod("spot-tol", ns).spec.node_name, what="spot pod scheduled")
    assert core.read_namespaced_pod("spot-tol", ns).spec.node_name.startswith("gpu-spot-")
    wait_for(lambda: core.read_namespaced_pod("mig", ns).spec.node_name == "gpu-mig-0", what="MIG pod on MIG node")

    def unschedulable(name):
        conds = core.read_namespaced_pod(name, ns).status.conditions or []
        return next((c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)
    cond = wait_for(lambda: unschedulable("spot-no-tol"), what="untolerated taint")
    assert "untolerated taint" in cond.message
    assert "Insufficient nvidia.com/gpu" in wait_for(lambda: unschedulable("huge"), what="insufficient").message


def test_bad_requests_are_status_objects(kube_cluster, ns):
    base = f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods"
    cases = [
        (requests.post(base, data=b"{not json", headers={"Content-Type": "application/json"}), 400),
        (requests.post(base, json={"apiVersion": "v1", "kind": "Gadget", "metadata": {"name": "x"}}), 400),
        (requests.post(f"{kube_cluster.server}/api/v1/namespaces/{ns}/gadgets", json={"metadata": {"name": "x"}}), 404),
        (requests.post(base, json={"apiVersion": "v1", "kind": "Pod", "metadata": {},
                                   "spec": {"containers": [{"name": "c", "image": "i"}]}}), 422),
        (requests.post(base, json={"metadata": {"name": "q"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"cpu": "lots"}}}]}}), 400),
        (requests.post(base + "?fieldValidation=Strict", json={"metadata": {"name": "u"}, "spec": {
            "containers": [{"name": "c", "image": "i", "bogus": 1}]}}), 400),
        (requests.post(base, json={"metadata": {"name": "noimg"}, "spec": {"containers": [{"name": "c"}]}}), 422),
        (requests.get(base + "/missing"), 404),
    ]
    for response, code in cases:
        body = response.json()
        assert response.status_code == code, (code, body)
        assert body["kind"] == "Status" and body["code"] == code and body["status"] == "Failure"
    assert "metadata.name: Required value" in cases[3][0].json()["message"]
    assert cases[3][0].json()["details"]["causes"][0]["field"] == "metadata.name"
    assert "quantities must match the regular expression" in cases[4][0].json()["message"]
    assert 'unknown field "spec.containers[0].bogus"' in cases[5][0].json()["message"]
    assert cases[6][0].json()["details"]["causes"][0]["field"] == "spec.containers[0].image"
    # Warn (the default) keeps the object, drops the field and says so in a Warning header
    r = requests.post(base, json={"metadata": {"name": "warned"}, "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}],
                                                                          "schedulerName": "nobody"}})
    assert r.status_code == 201 and "unknown field" in r.headers["Warning"]
    assert kube_cluster.core().read_namespaced_pod("warned", ns).metadata.name == "warned"


def test_custom_resources_volcano_kueue_and_podgroups(kube_cluster, ns):
    ext = client.ApiextensionsV1Api(kube_cluster.api_client())
    custom = kube_cluster.custom()
    for crd_file in ("scheduling.volcano.sh_podgroups.yaml", "kueue.x-k8s.io_localqueues.yaml"):
        crd = yaml.safe_load((SHARED_CRDS / crd_file).read_text())
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            assert exc.status == 409
    pg = custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "gang"},
        "spec": {"minMember": 4}})
    assert pg["spec"]["minMember"] == 4
    custom.patch_namespaced_custom_object_status("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "gang",
                                                 {"status": {"phase": "Scheduled", "running": 4}})
    got = custom.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "gang")
    assert got["status"]["phase"] == "Scheduled" and got["spec"]["minMember"] == 4
    vpg = custom.create_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", ns, "podgroups", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "vgang"},
        "spec": {"minMember": 2, "queue": "default"}})
    assert vpg["kind"] == "PodGroup" and vpg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    lq = custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "team-a"},
        "spec": {"clusterQueue": "cq"}})
    assert lq["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    stored = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues")
    assert [i["metadata"]["name"] for i in stored["items"]] == ["team-a"]
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "bad"},
            "spec": {"minMember": 1, "nonsense": True}}, field_validation="Strict")
    assert err.value.status == 400 and 'unknown field "spec.nonsense"' in json.loads(err.value.body)["message"]


def test_kubernetes_asyncio_watch(kube_cluster, ns):
    from kubernetes_asyncio import client as aclient, config as aconfig, watch as awatch

    async def main():
        configuration = aclient.Configuration()
        await aconfig.load_kube_config(config_file=str(kube_cluster.kubeconfig), client_configuration=configuration)
        async with aclient.ApiClient(configuration) as api:
            core = aclient.CoreV1Api(api)
            rv = (await core.list_namespaced_pod(ns)).metadata.resource_version
            await core.create_namespaced_pod(ns, pod_body("apod", annotations={C.ANNOTATION_SIM_DURATION: "0.2"}))
            phases = []
            w = awatch.Watch()
            async for event in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=10):
                phases.append(event["object"].status.phase)
                if event["object"].status.phase == "Succeeded":
                    w.stop()
            return phases

    phases = asyncio.run(main())
    assert phases[-1] == "Succeeded" and "Running" in phases


def test_bearer_token_required(tmp_path):
    from fixtures.kube import start_kube_cluster

    spec = {"name": "tok", "pools": [{"name": "n", "count": 1, "gpu": {"count": 1}}]}
    with start_kube_cluster(tmp_path, spec, token="s3cret") as cluster:
        assert cluster.server.startswith("https://")
        r = requests.get(f"{cluster.server}/api/v1/nodes", verify=cluster.ca_file)
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"
        assert [n.metadata.name for n in cluster.core().list_node().items] == ["n-0"]
        assert "n-0" in cluster.kubectl("get", "nodes").stdout


def test_status_subresource_eviction_lease_and_propagation(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod_body("st", scheduler="nobody"))
    # status is written through /status only
    core.patch_namespaced_pod_status("st", ns, {"status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waiting for gang"}]}})
    core.patch_namespaced_pod("st", ns, {"metadata": {"labels": {"x": "1"}}, "status": {"phase": "Running"}})
    pod = core.read_namespaced_pod("st", ns)
    assert pod.status.phase == "Pending" and pod.metadata.labels == {"x": "1"}
    assert [(c.type, c.reason) for c in pod.status.conditions] == [("PodScheduled", "Unschedulable")]
    # Eviction API: DisruptionTarget first, then graceful deletion
    slow_stop = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(0)))\n"
                 "print('ready', flush=True)\ntime.sleep(100)\n")
    core.create_namespaced_pod(ns, pod_body("ev", ["python", "-c", slow_stop], grace=5))
    wait_for(lambda: phase(core, ns, "ev") == "Running" and "ready" in pod_log(core, ns, "ev"), what="running")
    core.create_namespaced_pod_eviction("ev", ns, client.V1Eviction(metadata=client.V1ObjectMeta(name="ev", namespace=ns)),
                                        _preload_content=False)
    seen = core.read_namespaced_pod("ev", ns)  # takes a second to stop: still there, terminating
    cond = next(c for c in seen.status.conditions if c.type == C.CONDITION_DISRUPTION_TARGET)
    assert cond.reason == C.REASON_EVICTION_BY_EVICTION_API and seen.metadata.deletion_timestamp
    wait_for(lambda: phase(core, ns, "ev") == "Gone", what="evicted pod removed")
    # leases (leader election): optimistic concurrency
    coord = client.CoordinationV1Api(kube_cluster.api_client())
    lease = coord.create_namespaced_lease(ns, {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a",
                                                                                      "leaseDurationSeconds": 15}})
    lease.spec.holder_identity = "b"
    coord.replace_namespaced_lease("leader", ns, lease)
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("leader", ns, lease)
    assert err.value.status == 409
    # propagationPolicy: Orphan keeps dependents (without the ownerReference), Foreground deletes them first
    for policy in ("Orphan", "Foreground"):
        owner = core.create_namespaced_config_map(ns, {"metadata": {"name": f"own-{policy.lower()}"}})
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid}
        core.create_namespaced_secret(ns, {"metadata": {"name": f"dep-{policy.lower()}", "ownerReferences": [ref]}})
        core.delete_namespaced_config_map(owner.metadata.name, ns, propagation_policy=policy)
    wait_for(lambda: not [s for s in core.list_namespaced_secret(ns).items if s.metadata.name == "dep-foreground"],
             what="foreground deletion of the dependent")
    orphan = core.read_namespaced_secret("dep-orphan", ns)
    assert not orphan.metadata.owner_references
    wait_for(lambda: [c.metadata.name for c in core.list_namespaced_config_map(ns).items
                      if c.metadata.name.startswith("own-")] == [], what="owners gone")


def test_init_containers_and_services_and_secrets_env(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"token": "abc"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"MODE": "fast"}})
    svc = core.create_namespaced_service(ns, {"metadata": {"name": "job-1"}, "spec": {
        "clusterIP": "None", "selector": {"job": "1"}, "ports": [{"port": 29500}]}})
    assert svc.spec.cluster_ip == "None" and svc.spec.ports[0].target_port == 29500
    script = "import os; print(os.environ['TOKEN'], os.environ['MODE'], open('init.txt').read())"
    core.create_namespaced_pod(ns, pod_body(
        "withinit", ["python", "-c", script],
        initContainers=[{"name": "init", "image": "busybox", "command": ["python", "-c", "open('init.txt','w').write('initialised')"]}],
        containers=[{"name": "main", "image": "x", "command": ["python", "-c", script],
                     "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
                     "envFrom": [{"configMapRef": {"name": "cfg"}}]}]))
    wait_for(lambda: phase(core, ns, "withinit") == "Succeeded", what="pod with init container")
    assert pod_log(core, ns, "withinit") == "abc fast initialised\n"
    pod = core.read_namespaced_pod("withinit", ns)
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0


def test_log_options_timestamps_tail_stderr_previous(kube_cluster, ns):
    core = kube_cluster.core()
    script = "import sys; print('out 1'); print('err 1', file=sys.stderr); print('out 2'); sys.exit(1)"
    core.create_namespaced_pod(ns, pod_body("logs", ["python", "-c", script], restart="OnFailure"))
    wait_for(lambda: (core.read_namespaced_pod("logs", ns).status.container_statuses or [None])[0] is not None
             and core.read_namespaced_pod("logs", ns).status.container_statuses[0].restart_count >= 1, what="a restart")
    raw = lambda **kw: core.read_namespaced_pod_log("logs", ns, _preload_content=False, **kw).data.decode()  # noqa: E731
    previous = raw(previous=True)
    assert sorted(previous.splitlines()) == ["err 1", "out 1", "out 2"]
    assert raw(previous=True, tail_lines=1) in ("out 2\n", "err 1\n")
    stamped = raw(previous=True, timestamps=True).splitlines()
    assert all(len(line.split(" ", 1)[0]) == 30 and line.split(" ", 1)[0].endswith("Z") for line in stamped)
    assert raw(previous=True, since_seconds=3600) == previous


def test_namespace_deletion_stops_its_pods(kube_cluster):
    core = kube_cluster.core()
    name = f"gone-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    script = ("import signal,sys,time,pathlib\n"  # takes 1.5 s to stop, so the namespace is seen Terminating
              "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path('bye').write_text('1'), time.sleep(1.5), sys.exit(0)))\n"
              "print('ready', flush=True)\ntime.sleep(60)\n")
    core.create_namespaced_pod(name, pod_body("worker", ["python", "-c", script]))
    core.create_namespaced_config_map(name, {"metadata": {"name": "cfg"}})
    wait_for(lambda: phase(core, name, "worker") == "Running" and "ready" in pod_log(core, name, "worker"),
             what="handler installed")
    workdir = next(kube_cluster.state_dir.glob(f"pods/{name}/worker-*"))
    core.delete_namespace(name)
    assert core.read_namespace(name).status.phase == "Terminating"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(name, {"metadata": {"name": "late"}})
    assert err.value.status == 403
    wait_for(lambda: name not in [n.metadata.name for n in core.list_namespace().items], what="namespace removed")
    assert (workdir / "bye").read_text() == "1"


def test_generate_name_and_patch_flavours(kube_cluster, ns):
    core = kube_cluster.core()
    made = core.create_namespaced_config_map(ns, {"metadata": {"generateName": "job-"}, "data": {"a": "1", "b": "2"}})
    assert made.metadata.name.startswith("job-") and len(made.metadata.name) == 9
    url = f"{kube_cluster.server}/api/v1/namespaces/{ns}/configmaps/{made.metadata.name}"
    r = requests.patch(url, data=json.dumps({"data": {"a": None, "c": "3"}}),
                       headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200 and r.json()["data"] == {"b": "2", "c": "3"}
    r = requests.patch(url, data=json.dumps({"data": {"b": "x"}}), headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["kind"] == "Status"
    # strategic merge on a node: taints merge by key, labels merge
    node = "cpu-0"
    core.patch_node(node, {"metadata": {"labels": {"extra": "1"}},
                           "spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}})
    core.patch_node(node, {"spec": {"taints": [{"key": "other", "effect": "PreferNoSchedule"}]}})
    got = core.read_node(node)
    assert {t.key for t in got.spec.taints} == {"maintenance", "other"} and got.metadata.labels["extra"] == "1"
    core.patch_node(node, {"spec": {"taints": [{"key": "maintenance", "$patch": "delete"},
                                               {"key": "other", "$patch": "delete"}]}})
    assert not core.read_node(node).spec.taints


def test_pod_reaches_the_api_in_cluster_as_its_service_account(kube_cluster, ns):
    """Never with the admin kubeconfig: KUBECONFIG is not set, the in-cluster config is the pod's token."""
    core = kube_cluster.core()
    script = ("import os; from kubernetes import client, config; config.load_incluster_config();"
              "print(os.environ.get('KUBECONFIG'), "
              "client.AuthenticationV1Api().create_self_subject_review({}).status.user_info.username)")
    body = pod_body("selfaware", ["python", "-c", script])
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "selfaware") in ("Succeeded", "Failed"), what="pod done")
    assert pod_log(core, ns, "selfaware").strip() == f"None system:serviceaccount:{ns}:default"
