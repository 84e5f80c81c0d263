"""Gangs of pods for the scheduler's tests, benchmark and demo: PodGroups and pods created with the
official client, the scheduler started as a child process, and checks of what got bound where."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.devtools.processes import ManagedProcess, wait_until  # noqa: F401 - re-exported for callers
from airflow_gpu.kube import GangManifests, group_manifest, member_name, membership
from airflow_gpu.kube.client import api_client  # noqa: F401 - re-exported for the tests and benches


DEPLOY_PRIORITY_CLASSES = Path(__file__).resolve().parents[2] / "deploy" / "base" / "priorityclasses.yaml"


def install_priority_classes(api: client.ApiClient, path: Path = DEPLOY_PRIORITY_CLASSES) -> None:
    """The tiers' PriorityClasses as deploy/ installs them (already there is fine)."""
    import yaml

    sched = client.SchedulingV1Api(api)
    for doc in yaml.safe_load_all(Path(path).read_text()):
        try:
            sched.create_priority_class(doc)
        except ApiException as exc:
            if exc.status != 409:
                raise


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def pod_manifest(name: str, namespace: str, gpus: int = 1, group: str | None = None,
                 scheduler_name: str = C.DEFAULT_SCHEDULER_NAME, priority_class: str | None = None,
                 annotations: dict | None = None, labels: dict | None = None, command: list[str] | None = None,
                 grace: int | None = None, sim_seconds: float | None = None, cpu: str = "100m",
                 env: dict | None = None, node_selector: dict | None = None) -> dict:
    ann = dict(annotations or {})
    if sim_seconds is not None:
        ann[C.ANNOTATION_SIM_DURATION] = str(sim_seconds)
    lab = dict(labels or {})
    if group:
        lab.update(membership(C.GANG_BACKEND_AIRFLOW_GPU, group).labels)
    container = {"name": "main", "image": "python:3.11",
                 "resources": {"requests": {"cpu": cpu, "memory": "256Mi"},
                               "limits": {C.RESOURCE_GPU: str(gpus)} if gpus else {}}}
    if command:
        container["command"] = command
    if env:
        container["env"] = [{"name": k, "value": str(v)} for k, v in env.items()]
    spec = {"schedulerName": scheduler_name, "restartPolicy": "Never", "containers": [container]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": lab, "annotations": ann}, "spec": spec}


def create_podgroup(api: client.ApiClient, namespace: str, name: str, min_member: int,
                    annotations: dict | None = None, labels: dict | None = None) -> dict:
    body = group_manifest(C.GANG_BACKEND_AIRFLOW_GPU, namespace, name, min_member, labels=labels,
                          annotations=annotations)
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        C.PODGROUP_GROUP, C.PODGROUP_VERSION, namespace, C.PODGROUP_PLURAL, body)


def create_gang(api: client.ApiClient, namespace: str, name: str, members: int, gpus: int,
                pg_annotations: dict | None = None, **pod_kw) -> list[str]:
    """A PodGroup of `members` pods with `gpus` GPUs each; returns the pod names."""
    create_podgroup(api, namespace, name, members, pg_annotations)
    core = client.CoreV1Api(api)
    names = [member_name(name, i) for i in range(members)]
    for pod_name in names:
        # the answer is read (.data): only then does the client put its connection back in the pool
        core.create_namespaced_pod(namespace, pod_manifest(pod_name, namespace, gpus, group=name, **pod_kw),
                                   _preload_content=False).data
    return names


def submit_gang(api: client.ApiClient, gang: GangManifests) -> dict[str, str]:
    """Create a gang's objects in order (group, Service, pods); returns pod name -> UID."""
    ns = gang.pods[0]["metadata"]["namespace"]
    if gang.group is not None:
        res = gang.group_resource
        client.CustomObjectsApi(api).create_namespaced_custom_object(res.group, res.version, ns, res.plural, gang.group)
    core = client.CoreV1Api(api)
    if gang.service is not None:
        core.create_namespaced_service(ns, gang.service)
    return {p["metadata"]["name"]: core.create_namespaced_pod(ns, p).metadata.uid for p in gang.pods}


def list_pods(api: client.ApiClient, namespace: str | None = None) -> list[dict]:
    core = client.CoreV1Api(api)
    resp = (core.list_namespaced_pod(namespace, _preload_content=False) if namespace
            else core.list_pod_for_all_namespaces(_preload_content=False))
    return json.loads(resp.data)["items"]


def get_podgroup(api: client.ApiClient, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        C.PODGROUP_GROUP, C.PODGROUP_VERSION, namespace, C.PODGROUP_PLURAL, name)


def events_for(api: client.ApiClient, namespace: str, name: str | None = None) -> list[dict]:
    resp = client.CoreV1Api(api).list_namespaced_event(namespace, _preload_content=False)
    items = json.loads(resp.data)["items"]
    return [e for e in items if name is None or (e.get("involvedObject") or {}).get("name") == name]


def gang_binding_state(pods: list[dict]) -> dict[str, tuple[int, int]]:
    """PodGroup name -> (bound members, members) over live (non-terminal) pods."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in pods:
        group = (p["metadata"].get("labels") or {}).get(C.LABEL_COSCHEDULING_POD_GROUP)
        if not group or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        key = f"{p['metadata']['namespace']}/{group}"
        out[key][1] += 1
        if p["spec"].get("nodeName"):
            out[key][0] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def overcommitted_nodes(api: client.ApiClient) -> dict[str, tuple[int, int]]:
    """Nodes whose live bound pods ask for more GPUs than the node has: node -> (asked, allocatable)."""
    core = client.CoreV1Api(api)
    nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
    cap = {n["metadata"]["name"]: int(n["status"]["allocatable"].get(C.RESOURCE_GPU, "0")) for n in nodes}
    used: dict[str, int] = defaultdict(int)
    for p in list_pods(api):
        node = p["spec"].get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            for c in p["spec"]["containers"]:
                used[node] += int(((c.get("resources") or {}).get("limits") or {}).get(C.RESOURCE_GPU, 0))
    return {n: (u, cap.get(n, 0)) for n, u in used.items() if u > cap.get(n, 0)}


def scheduler_process(kubeconfig: str | Path, log_path: Path, config_path: str | Path | None = None,
                      identity: str | None = None, metrics_port: int = 0, lease: tuple = (3.0, 2.0, 0.5),
                      extra: list[str] | None = None) -> ManagedProcess:
    """`airflow-gpu scheduler` as a child process (stopped by PID). Short lease timings by default so
    that a standby takes over within seconds after a kill -9."""
    ensure_namespace(api_client(kubeconfig), C.DEFAULT_SCHEDULER_NAMESPACE)  # as deploy/base creates it
    argv = [sys.executable, "-m", "airflow_gpu", "scheduler", "--kubeconfig", str(kubeconfig),
            "--lease-duration", str(lease[0]), "--renew-deadline", str(lease[1]), "--retry-period", str(lease[2]),
            "--leader-elect-namespace", C.DEFAULT_SCHEDULER_NAMESPACE]
    if config_path:
        argv += ["--config", str(config_path)]
    if identity:
        argv += ["--identity", identity]
    if metrics_port:
        argv += ["--metrics-port", str(metrics_port)]
    argv += list(extra or [])
    return ManagedProcess(name=identity or "scheduler", argv=argv, log_path=log_path)


def scheduler_samples(port: int, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample named `name` (its labels, its value) on a scheduler's --metrics-port."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def scheduler_metric(port: int, name: str) -> float:
    """The first sample of `name` on a scheduler's --metrics-port (0 when absent)."""
    samples = scheduler_samples(port, name)
    return samples[0][1] if samples else 0.0
