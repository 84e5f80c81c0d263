"""Issue 10, item 9 and the minor list: the API server bounds request bodies (3 MiB, as the real
one), YAML alias expansion and nesting depth; bad query parameters and bodies are 400, never 500."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import requests

from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import wait_until

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


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset), False while it is open."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_half_open_and_slow_connections_are_bounded(tmp_path):
    """Issue 32 (minor list): 300 connections that never finish a request head (half of them send a
    partial one, slowloris) neither hold the server's fds nor keep it from answering: past
    --max-connections a connection is closed at once, the rest after --header-timeout."""
    spec = {"name": "slowloris", "pools": [{"name": "a", "count": 1, "gpu": {"count": 1}}]}
    timeout, limit = 4.0, 200
    with start_kube_cluster(tmp_path, spec, args=("--header-timeout", str(timeout),
                                                  "--max-connections", str(limit))) as cluster:
        host, port = cluster.server.rsplit("//", 1)[1].split(":")
        fds_before = len(os.listdir(f"/proc/{cluster.pid}/fd"))
        keep = requests.Session()  # a client that sent its request in time keeps its connection
        assert keep.get(f"{cluster.server}/version", timeout=5).status_code == 200
        opened_at = time.monotonic()
        socks = []
        try:
            for i in range(300):
                sock = socket.create_connection((host, int(port)), timeout=5)
                if i % 2:
                    sock.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                sock.setblocking(False)  # a socket with a timeout would wait in recv despite MSG_DONTWAIT
                socks.append(sock)
            trickler = socket.create_connection((host, int(port)), timeout=5)  # a byte every 0.2 s
            trickler.sendall(b"GET /version HTTP/1.1\r\nX-Slow: ")
            trickler.setblocking(False)
            socks.append(trickler)
            refused = wait_until(lambda: sum(map(_closed_by_server, socks)) >= 300 - limit or None, 5,
                                 what="the connections past the limit closed")
            assert refused and time.monotonic() - opened_at < timeout, "closed only by the head timeout"
            deadline = time.monotonic() + timeout + 5
            while not all(map(_closed_by_server, socks)) and time.monotonic() < deadline:
                if not _closed_by_server(trickler):
                    try:
                        trickler.send(b"a")  # a valid header value, growing: the timer is not reset
                    except OSError:
                        pass
                time.sleep(0.2)
            open_left = [i for i, s in enumerate(socks) if not _closed_by_server(s)]
            assert not open_left, f"{len(open_left)} connections still open after {time.monotonic() - opened_at:.1f}s"
            assert time.monotonic() - opened_at > timeout * 0.9  # the ones within the limit got their time
            # the server answers, on a new connection and on the kept-alive one, and its fds are back
            assert requests.get(f"{cluster.server}/version", timeout=5).status_code == 200
            assert keep.get(f"{cluster.server}/api/v1/namespaces", timeout=5).status_code == 200
            wait_until(lambda: len(os.listdir(f"/proc/{cluster.pid}/fd")) <= fds_before + 5 or None, 5,
                       what="the server's fds back to where they were")
        finally:
            for sock in socks:
                sock.close()
