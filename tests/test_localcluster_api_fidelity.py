"""Small fidelity fixes seen through kubectl 1.32 and the official client: Status details, /openapi/v2
(protobuf, as kubectl asks), `kubectl explain` descriptions, log sinceTime at sub-second precision."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import requests
from kubernetes import client

from airflow_gpu.devtools.processes import wait_until


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "fidelity", "pools": [{"name": "gpu", "count": 1, "gpu": {"count": 2}}]}


def test_every_status_has_details(kube_cluster):
    for path in ("/api/v1/nosuchthing", "/apis/apps/v1/namespaces/default/deployments/missing", "/nowhere"):
        response = requests.get(kube_cluster.server + path, timeout=10)
        body = response.json()
        assert response.status_code == 404 and body["kind"] == "Status" and isinstance(body["details"], dict), body
    bad = requests.post(kube_cluster.server + "/api/v1/namespaces/default/pods", data="{", timeout=10,
                        headers={"content-type": "application/json"}).json()
    assert bad["code"] == 400 and bad["details"] == {}


def test_kubectl_debug_reports_instead_of_panicking(kube_cluster, ns):
    kube_cluster.kubectl("run", "target", "-n", ns, "--image=demo:1", "--restart=Never")
    result = kube_cluster.kubectl("debug", "target", "-n", ns, "--image=busybox", "--profile=general", check=False)
    assert result.returncode != 0 and "panic" not in result.stderr and "goroutine" not in result.stderr, result.stderr
    assert "error" in result.stderr.lower()


def test_openapi_v2_protobuf_and_explain_descriptions(kube_cluster):
    described = kube_cluster.kubectl("explain", "deployment.spec.replicas").stdout
    assert "Number of desired pods" in described and "<empty>" not in described
    pods = kube_cluster.kubectl("explain", "pods.spec.containers").stdout
    assert "List of containers belonging to the pod" in pods
    v2 = kube_cluster.kubectl("explain", "deployment.spec.strategy", "--output=plaintext-openapiv2").stdout
    assert "The deployment strategy to use to replace existing pods" in v2 and "rollingUpdate" in v2
    swagger = requests.get(kube_cluster.server + "/openapi/v2", headers={"accept": "application/json"}, timeout=30).json()
    deployment = swagger["definitions"]["V1Deployment"]
    assert deployment["x-kubernetes-group-version-kind"] == [{"group": "apps", "version": "v1", "kind": "Deployment"}]
    containers = swagger["definitions"]["V1PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name" and containers["items"]["$ref"] == \
        "#/definitions/V1Container"


def test_log_since_time_keeps_sub_second_precision(kube_cluster, ns):
    core = client.CoreV1Api(kube_cluster.api_client())
    script = "import time\nfor i in range(12):\n    print('line', i, flush=True); time.sleep(0.09)\n"
    core.create_namespaced_pod(ns, {"metadata": {"name": "ticks"}, "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "python:3.11", "command": ["python", "-c", script]}]}})
    wait_until(lambda: core.read_namespaced_pod("ticks", ns).status.phase == "Succeeded", 30, what="ticks done")

    def logs(**params) -> list[str]:
        response = core.read_namespaced_pod_log("ticks", ns, _preload_content=False, **params)
        return response.data.decode().splitlines()

    stamped = logs(timestamps=True)
    assert len(stamped) == 12
    times = [line.split(" ", 1)[0] for line in stamped]
    parsed = [dt.datetime.fromisoformat(t[:26] + "+00:00") for t in times]
    # a sinceTime between two lines of the same second: everything at or after it, nothing before
    for k in range(1, 12):
        if parsed[k].second == parsed[k - 1].second:
            break
    else:
        pytest.fail(f"no two lines in one second: {times}")
    middle = parsed[k - 1] + (parsed[k] - parsed[k - 1]) / 2
    since = middle.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raw = requests.get(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/ticks/log",
                       params={"sinceTime": since}, timeout=10).text.splitlines()
    assert raw == [f"line {i}" for i in range(k, 12)], (since, times)
    exact = requests.get(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/ticks/log",
                         params={"sinceTime": times[k]}, timeout=10).text.splitlines()
    assert exact[0] == f"line {k}"
    bad = requests.get(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/ticks/log",
                       params={"sinceTime": "yesterday"}, timeout=10)
    assert bad.status_code == 400 and "sinceTime" in bad.json()["message"]
    assert json.loads(requests.get(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/ticks/log",
                                   params={"sinceSeconds": "1.5"}, timeout=10).text)["code"] == 400
