"""Issue 10, item 9 and the minor list: the API server bounds request bodies (3 MiB, as the real
one), YAML alias expansion and nesting depth; bad query parameters and bodies are 400, never 500."""

from __future__ import annotations

import json

import pytest
import requests

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "blobs.example.io"},
    "spec": {"group": "example.io", "scope": "Namespaced",
             "names": {"plural": "blobs", "singular": "blob", "kind": "Blob"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@pytest.fixture(scope="module")
def api(kube_cluster):
    session = requests.Session()
    base = kube_cluster.server
    r = session.post(f"{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD)
    assert r.status_code == 201, r.text
    session.post(f"{base}/api/v1/namespaces/default/pods", json={
        "metadata": {"name": "p"}, "spec": {"schedulerName": "none", "containers": [{"name": "c", "image": "i"}]}})
    return session, base


def _alias_bomb() -> bytes:
    lines = ["apiVersion: example.io/v1", "kind: Blob", "metadata: {name: bomb}", 'a0: &a0 ["xxxxxxxx","xxxxxxxx"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]")
    lines.append("spec: *a8")
    return "\n".join(lines).encode()


def test_yaml_alias_bomb_is_refused(api, kube_cluster):
    session, base = api
    body = _alias_bomb()
    assert len(body) < 600
    r = session.post(f"{base}/apis/example.io/v1/namespaces/default/blobs", data=body,
                     headers={"content-type": "application/yaml"}, timeout=10)
    assert r.status_code == 413 and "more than" in r.json()["message"], r.text[:500]
    assert session.get(f"{base}/apis/example.io/v1/namespaces/default/blobs/bomb").status_code == 404
    assert (kube_cluster.state_dir / "store.log").stat().st_size < 5 * 2**20


def test_body_over_3mib_is_413(api):
    session, base = api
    blob = {"apiVersion": "example.io/v1", "kind": "Blob", "metadata": {"name": "big"}, "data": "x" * (4 * 2**20)}
    r = session.post(f"{base}/apis/example.io/v1/namespaces/default/blobs", data=json.dumps(blob),
                     headers={"content-type": "application/json"}, timeout=20)
    assert r.status_code == 413 and "3145728" in r.json()["message"]
    ok = blob | {"metadata": {"name": "fits"}, "data": "x" * (2 * 2**20)}
    assert session.post(f"{base}/apis/example.io/v1/namespaces/default/blobs", json=ok).status_code == 201


@pytest.mark.parametrize("depth, status", [(50, 201), (10_000, 400)])
def test_nesting_depth(api, depth, status):
    session, base = api
    body = '{"apiVersion":"example.io/v1","kind":"Blob","metadata":{"name":"deep-%d"},"spec":%s1%s}' % (
        depth, "[" * depth, "]" * depth)
    r = session.post(f"{base}/apis/example.io/v1/namespaces/default/blobs", data=body,
                     headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code in ((status,) if status == 201 else (400, 413)), r.text[:300]


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/api/v1/namespaces/default/pods?limit=abc", None),
    ("GET", "/api/v1/namespaces/default/pods?limit=-1", None),
    ("DELETE", "/api/v1/namespaces/default/pods/p?gracePeriodSeconds=abc", None),
    ("POST", "/api/v1/namespaces/default/pods/p/eviction", {"deleteOptions": "now"}),
    ("POST", "/api/v1/namespaces/default/pods/p/eviction", {"deleteOptions": {"gracePeriodSeconds": "x"}}),
])
def test_bad_parameters_are_400(api, method, path, body):
    session, base = api
    r = session.request(method, base + path, json=body, timeout=10)
    assert r.status_code == 400, (r.status_code, r.text[:300])
