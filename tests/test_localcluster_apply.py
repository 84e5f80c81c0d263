"""Server-side apply on the local cluster through kubectl 1.32 and the official client: managedFields,
removal of fields a manager stops applying, conflicts (and --force-conflicts), `kubectl diff
--server-side` exit codes, dry-run replies with the live resourceVersion; ConfigMaps, Deployments,
Pods and PodGroups."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests
from kubernetes import client



@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "apply", "pools": [{"name": "gpu", "count": 1, "gpu": {"count": 4}}]}


def apply(kube_cluster, ns: str, manifest: dict, *extra: str, check: bool = True):
    return kube_cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", *extra, input=json.dumps(manifest),
                                check=check)


def diff(kube_cluster, ns: str, manifest: dict) -> int:
    return kube_cluster.kubectl("diff", "--server-side", "-n", ns, "-f", "-", input=json.dumps(manifest),
                                check=False).returncode


def managers(obj: dict) -> dict[str, dict]:
    return {f"{e['manager']}/{e['operation']}": e["fieldsV1"] for e in obj["metadata"].get("managedFields") or []}


def get(kube_cluster, ns: str, kind: str, name: str) -> dict:
    return json.loads(kube_cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", "--show-managed-fields").stdout)


def test_configmap_apply_diff_removal_and_conflicts(kube_cluster, ns):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "labels": {"a": "1", "b": "2"}},
          "data": {"x": "1", "y": "2", "on": "yes"}}
    assert "serverside-applied" in apply(kube_cluster, ns, cm).stdout
    live = get(kube_cluster, ns, "configmap", "settings")
    assert live["data"] == {"x": "1", "y": "2", "on": "yes"}
    assert managers(live)["kubectl/Apply"]["f:data"] == {".": {}, "f:x": {}, "f:y": {}, "f:on": {}}
    assert diff(kube_cluster, ns, cm) == 0  # nothing would change
    rv = live["metadata"]["resourceVersion"]
    apply(kube_cluster, ns, cm)
    assert get(kube_cluster, ns, "configmap", "settings")["metadata"]["resourceVersion"] == rv  # a no-op is not written
    kube_cluster.kubectl("label", "configmap", "settings", "-n", ns, "other=kept")  # owned by kubectl-label
    changed = {**cm, "metadata": {"name": "settings", "labels": {"a": "1"}}, "data": {"x": "1", "z": "3"}}
    assert diff(kube_cluster, ns, changed) == 1
    apply(kube_cluster, ns, changed)
    live = get(kube_cluster, ns, "configmap", "settings")
    assert live["data"] == {"x": "1", "z": "3"}  # y and on were this manager's: removed
    assert live["metadata"]["labels"] == {"a": "1", "other": "kept"}  # b removed, kubectl-label's label stays
    kube_cluster.kubectl("patch", "configmap", "settings", "-n", ns, "--type=merge", "-p", '{"data":{"x":"patched"}}')
    refused = apply(kube_cluster, ns, changed, check=False)
    assert refused.returncode != 0 and 'conflict with "kubectl-patch" using v1: .data.x' in refused.stderr
    apply(kube_cluster, ns, changed, "--force-conflicts")
    live = get(kube_cluster, ns, "configmap", "settings")
    assert live["data"]["x"] == "1" and "f:x" not in managers(live).get("kubectl-patch/Update", {}).get("f:data", {})


def test_deployment_apply_merges_containers_by_name(kube_cluster, ns):
    def deployment(env: list[dict], image: str = "demo:1") -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                         "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [
                             {"name": "main", "image": image, "env": env}]}}}}
    first = deployment([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
    apply(kube_cluster, ns, first)
    kube_cluster.kubectl("rollout", "status", "deployment/api", "-n", ns, "--timeout=30s")
    assert diff(kube_cluster, ns, first) == 0
    second = deployment([{"name": "A", "value": "1"}], image="demo:2")
    assert diff(kube_cluster, ns, second) == 1
    apply(kube_cluster, ns, second)
    live = get(kube_cluster, ns, "deployment", "api")
    container = live["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "demo:2" and container["env"] == [{"name": "A", "value": "1"}]
    fields = managers(live)["kubectl/Apply"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert list(fields) == ['k:{"name":"main"}'] and 'k:{"name":"A"}' in fields['k:{"name":"main"}']["f:env"]
    assert live["spec"]["template"]["spec"]["restartPolicy"] == "Always"  # defaults are nobody's, and stay
    kube_cluster.kubectl("rollout", "status", "deployment/api", "-n", ns, "--timeout=30s")


def test_pod_and_podgroup_apply(kube_cluster, ns):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"v": "1"}},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "demo:1"}]}}
    apply(kube_cluster, ns, pod)
    apply(kube_cluster, ns, {**pod, "metadata": {"name": "p", "labels": {"v": "2"}}})
    assert get(kube_cluster, ns, "pod", "p")["metadata"]["labels"] == {"v": "2"}
    immutable = json.loads(json.dumps(pod))
    immutable["spec"]["containers"][0]["command"] = ["true"]
    refused = apply(kube_cluster, ns, immutable, check=False)
    assert refused.returncode != 0 and "Forbidden: pod updates may not change fields" in refused.stderr
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g"},
             "spec": {"minMember": 2, "scheduleTimeoutSeconds": 30}}
    apply(kube_cluster, ns, group)
    assert diff(kube_cluster, ns, group) == 0
    smaller = {**group, "spec": {"minMember": 3}}
    assert diff(kube_cluster, ns, smaller) == 1
    apply(kube_cluster, ns, smaller)
    assert get(kube_cluster, ns, "podgroup", "g")["spec"] == {"minMember": 3}  # timeout dropped by its manager


def test_apply_api_details(kube_cluster, ns):
    url = f"{kube_cluster.server}/api/v1/namespaces/{ns}/configmaps/raw"
    headers = {"content-type": "application/apply-patch+yaml"}
    body = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: raw}\ndata: {k: v, y: n}\n"  # YAML 1.2: strings
    missing = requests.patch(url, data=body, headers=headers, timeout=10)
    assert missing.status_code == 400 and "fieldManager is required" in missing.json()["message"]
    created = requests.patch(url, params={"fieldManager": "me"}, data=body, headers=headers, timeout=10)
    assert created.status_code == 201
    rv = created.json()["metadata"]["resourceVersion"]
    dry = requests.patch(url, params={"fieldManager": "me", "dryRun": "All"}, headers=headers, timeout=10,
                         data=body.replace("k: v", "k: w"))
    assert dry.status_code == 200 and dry.json()["data"] == {"k": "w", "y": "n"}
    assert dry.json()["metadata"]["resourceVersion"] == rv
    assert client.CoreV1Api(kube_cluster.api_client()).read_namespaced_config_map("raw", ns).data == {"k": "v", "y": "n"}
    status = requests.patch(f"{url}/status", params={"fieldManager": "me"}, data=body, headers=headers, timeout=10)
    assert status.status_code in (404, 415)


DROP_ENV_ITEM = """
import json
from airflow_gpu.localcluster.registry import fieldmanager
from airflow_gpu.localcluster.registry.resources import Registry
rt = Registry().by_key("apps/deployments")
def deployment(env):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
            "spec": {"selector": {"matchLabels": {"app": "api"}}, "template": {"metadata": {"labels": {"app": "api"}},
                     "spec": {"containers": [{"name": "main", "image": "x", "env": env}]}}}}
def env(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]["env"]
live = fieldmanager.apply(rt, "v1", None, deployment([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]),
                          "kubectl", False)
shared = fieldmanager.apply(rt, "v1", live, deployment([{"name": "B", "value": "2"}]), "other", False)
print(json.dumps([env(fieldmanager.apply(rt, "v1", live, deployment([{"name": "A", "value": "1"}]), "kubectl", False)),
                  env(fieldmanager.apply(rt, "v1", shared, deployment([{"name": "A", "value": "1"}]), "kubectl", False))]))
"""


def test_dropped_list_item_is_removed_whole_whatever_the_hash_seed():
    """The removal order once came from a set, so it changed with PYTHONHASHSEED: in half the server
    processes the key field of a dropped env item went first and the rest of the item stayed behind."""
    runs = {seed: subprocess.Popen([sys.executable, "-c", DROP_ENV_ITEM], stdout=subprocess.PIPE, text=True,
                                   env={"PYTHONHASHSEED": str(seed), "PATH": ""}) for seed in range(8)}
    for seed, proc in runs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, seed
        dropped, kept_by_other = json.loads(out)
        assert dropped == [{"name": "A", "value": "1"}], seed
        assert kept_by_other == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], seed  # "other" owns B
