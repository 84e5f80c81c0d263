"""Issue 10 (minor list): the local API server refuses what the real one refuses - names and label
values with a trailing newline, malformed label keys, negative ResourceQuota and node capacities -
with 422 naming the field, and its audit log does not record a request without the token as an admin's."""

from __future__ import annotations

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
