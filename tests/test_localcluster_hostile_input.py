"""Issue 10 (minor list): the local API server refuses what the real one refuses - names and label
values with a trailing newline, malformed label keys, negative ResourceQuota and node capacities -
with 422 naming the field, and its audit log does not record a request without the token as an admin's."""

from __future__ import annotations

import json

import pytest
import requests

from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import wait_until


def _pod(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"schedulerName": "none", "containers": [{"name": "c", "image": "i"}]}}


@pytest.mark.parametrize("path, body, field", [
    ("/api/v1/namespaces/default/pods", _pod("trailing\n"), "metadata.name"),
    ("/api/v1/namespaces/default/pods", _pod("v", {"a": "b\n"}), "metadata.labels"),
    ("/api/v1/namespaces/default/pods", _pod("k1", {"bad key!": "b"}), "metadata.labels"),
    ("/api/v1/namespaces/default/pods", _pod("k2", {"UPPER_/x": "b"}), "metadata.labels"),
    ("/api/v1/namespaces/default/pods", _pod("k3", {"a" * 64: "b"}), "metadata.labels"),
    ("/api/v1/namespaces/default/pods", _pod("k4", {"x\n": "b"}), "metadata.labels"),
    ("/api/v1/namespaces/default/resourcequotas",
     {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
      "spec": {"hard": {"requests.nvidia.com/gpu": "-4"}}}, "spec.hard[requests.nvidia.com/gpu]"),
    ("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "neg"},
                       "status": {"capacity": {"nvidia.com/gpu": "-8"}}}, "status.capacity[nvidia.com/gpu]"),
])
def test_invalid_objects_are_422_naming_the_field(kube_cluster, path, body, field):
    r = requests.post(kube_cluster.server + path, json=body, timeout=10)
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert field in r.json()["message"], r.text[:300]


def test_valid_label_keys_and_zero_quota_are_accepted(kube_cluster):
    base = kube_cluster.server
    r = requests.post(f"{base}/api/v1/namespaces/default/pods",
                      json=_pod("fine", {"airflow-gpu.io/team": "nlp", "app.kubernetes.io/name": "x", "k": ""}), timeout=10)
    assert r.status_code == 201, r.text[:300]
    r = requests.post(f"{base}/api/v1/namespaces/default/resourcequotas", timeout=10, json={
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "zero"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}})
    assert r.status_code == 201, r.text[:300]


def test_audit_log_records_401s_as_unauthenticated(tmp_path):
    with start_kube_cluster(tmp_path, {"name": "audit401", "pools": [{"name": "a", "count": 1, "gpu": {"count": 1}}]},
                            token="s3cret-token", audit=True) as cluster:
        verify = cluster.ca_file or True
        bad = requests.get(f"{cluster.server}/api/v1/namespaces/default/pods?probe=nobody", verify=verify, timeout=10)
        assert bad.status_code == 401
        good = requests.get(f"{cluster.server}/api/v1/namespaces/default/pods?probe=admin", verify=verify, timeout=10,
                            headers={"authorization": "Bearer s3cret-token"})
        assert good.status_code == 200

        def probes():  # the server writes an event at ResponseComplete, after the client has its answer
            found = {e["requestURI"].rsplit("=", 1)[-1]: e for e in cluster.audit_events() if "probe=" in e["requestURI"]}
            return found if len(found) == 2 else None
        events = wait_until(probes, 10, what="both probes in the audit log")
    assert events["nobody"]["user"] == {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
    assert events["nobody"]["responseStatus"]["code"] == 401
    assert events["admin"]["user"]["groups"] == ["system:masters"]


# Issue 32 (minor list): the fault-control endpoints answer a bad body with a 400/422 Status naming the
# field, never a 500, and do nothing
@pytest.mark.parametrize("action, body, code, field", [
    ("interrupt", b"not json", 400, "json parse error"),
    ("interrupt", b"[1, 2]", 400, "JSON object"),
    ("interrupt", b'"node"', 400, "JSON object"),
    ("interrupt", {}, 422, "node: required"),
    ("interrupt", {"node": 7}, 422, "node: required"),
    ("interrupt", {"node": "no-such-node"}, 422, 'node: node "no-such-node" not found'),
    ("interrupt", {"node": "NODE", "notice": "soon"}, 422, "notice: must be a number"),
    ("interrupt", {"node": "NODE", "notice": -1}, 422, "notice: must be a number"),
    ("interrupt", {"node": "NODE", "notice": True}, 422, "notice: must be a number"),
    ("interrupt", {"node": "NODE", "notice": 1e300}, 422, "notice: must be a number"),
    ("interrupt", {"node": "NODE", "replaceAfter": [1]}, 422, "replaceAfter: must be a number"),
    ("interrupt", {"node": "NODE", "mode": "explode"}, 422, "mode: must be one of eviction, shutdown"),
    ("interrupt", {"node": "NODE", "mode": {}}, 422, "mode: must be one of"),
    ("interrupt", {"node": "NODE", "nottice": 5}, 422, "nottice: unknown field"),
    ("not-ready", {"node": "NODE", "seconds": -5}, 422, "seconds: must be a number"),
    ("not-ready", {"node": "NODE", "seconds": "5"}, 422, "seconds: must be a number"),
    ("not-ready", {"node": ["NODE"]}, 422, "node: required"),
    ("ready", {"node": "ghost"}, 422, "node: node \"ghost\" not found"),
    ("ready", b"null", 400, "JSON object"),
    ("restart-apiserver", {"downSeconds": "x"}, 422, "downSeconds: must be a number"),
    ("restart-apiserver", {"downSeconds": -0.1}, 422, "downSeconds: must be a number"),
    ("restart-apiserver", {"down": 1}, 422, "down: unknown field"),
    ("latency", {"seconds": "slow"}, 422, "seconds: must be a number"),
    ("latency", {"seconds": float("inf")}, 400, "json parse error"),  # Infinity is not JSON
])
def test_control_endpoints_refuse_bad_bodies_naming_the_field(kube_cluster, action, body, code, field):
    node = kube_cluster.core().list_node().items[0].metadata.name
    if isinstance(body, dict):
        body = json.dumps(body).replace('"NODE"', json.dumps(node)).encode()
    r = requests.post(f"{kube_cluster.server}/_localcluster/{action}", data=body, timeout=10,
                      headers={"content-type": "application/json"})
    assert r.status_code == code, (r.status_code, r.text[:300])
    status = r.json()
    assert status["kind"] == "Status" and status["code"] == code and field in status["message"], status
    if code == 422:
        assert status["details"]["causes"][0]["field"] == field.split(":")[0]
    taints = [t.key for t in kube_cluster.core().read_node(node).spec.taints or []]
    assert not [t for t in taints if "disrupted" in t or "unreachable" in t], taints  # nothing was done


def test_control_endpoints_still_act_on_a_good_body(kube_cluster):
    node = kube_cluster.core().list_node().items[-1].metadata.name
    r = requests.post(f"{kube_cluster.server}/_localcluster/not-ready", json={"node": node, "seconds": 0.2}, timeout=10)
    assert r.status_code == 200 and r.json() == {"node": node, "notReady": True, "seconds": 0.2}, r.text[:300]
    wait_until(lambda: not [t for t in kube_cluster.core().read_node(node).spec.taints or [] if "unreachable" in t.key],
               10, what="the node ready again")
