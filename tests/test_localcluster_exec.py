"""exec / attach / cp / port-forward on the local cluster over WebSocket, through kubectl 1.32 and the
official client's kubernetes.stream (v5.channel.k8s.io, v4 fallback); unsupported protocols get a Status.
kubectl port-forward (SPDY): test_localcluster_portforward."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest
import requests
import websockets
from kubernetes import client
from kubernetes.stream import portforward, stream

from airflow_gpu.devtools.processes import free_port, wait_until


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "exec", "pools": [{"name": "gpu", "count": 1, "gpu": {"count": 2}}]}


@pytest.fixture(scope="module")
def ns(kube_cluster):
    name = f"x-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    return name


@pytest.fixture(scope="module")
def core(kube_cluster):
    return client.CoreV1Api(kube_cluster.api_client())


def run_pod(core, ns: str, name: str, script: str, env: dict | None = None) -> None:
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", script],
                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container]}})
    wait_until(lambda: core.read_namespaced_pod(name, ns).status.phase == "Running", 30, what=f"{name} running")


@pytest.fixture(scope="module")
def sleeper(core, ns):
    run_pod(core, ns, "sleeper", "import time; time.sleep(600)", env={"GREETING": "hello-from-env"})
    return "sleeper"


def test_kubectl_exec_streams_exit_code_stdin_and_env(kube_cluster, ns, sleeper):
    result = kube_cluster.kubectl("exec", sleeper, "-n", ns, "--", "sh", "-c",
                                  'echo "out $GREETING"; echo err >&2; exit 3', check=False)
    assert result.returncode == 3 and result.stdout == "out hello-from-env\n" and "err\n" in result.stderr
    piped = kube_cluster.kubectl("exec", "-i", sleeper, "-n", ns, "--", "sh", "-c", "tr a-z A-Z", input="shout\n")
    assert piped.stdout == "SHOUT\n"
    where = kube_cluster.kubectl("exec", sleeper, "-n", ns, "--", "pwd").stdout.strip()
    assert where.endswith(f"/pods/{ns}/sleeper-" + where.rsplit("-", 1)[1]) and "/pods/" in where
    missing = kube_cluster.kubectl("exec", sleeper, "-n", ns, "--", "no-such-binary", check=False)
    assert missing.returncode != 0 and "no-such-binary" in missing.stderr


def test_kubectl_cp_both_ways(kube_cluster, ns, sleeper, tmp_path):
    source = tmp_path / "payload.txt"
    source.write_text("line one\nline two\n")
    kube_cluster.kubectl("cp", str(source), f"{ns}/{sleeper}:payload.txt")
    assert kube_cluster.kubectl("exec", sleeper, "-n", ns, "--", "cat", "payload.txt").stdout == "line one\nline two\n"
    back = tmp_path / "back.txt"
    kube_cluster.kubectl("cp", f"{ns}/{sleeper}:payload.txt", str(back))
    assert back.read_text() == "line one\nline two\n"


def test_python_stream_exec_v5_stdin_close_and_tty(kube_cluster, core, ns, sleeper):
    out = stream(core.connect_get_namespaced_pod_exec, sleeper, ns, command=["sh", "-c", "echo hi; echo oops >&2; exit 4"],
                 stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
    out.run_forever(timeout=20)
    assert (out.read_stdout(), out.read_stderr(), out.returncode) == ("hi\n", "oops\n", 4)
    assert out.subprotocol == "v5.channel.k8s.io"
    cat = stream(core.connect_get_namespaced_pod_exec, sleeper, ns, command=["sh", "-c", "cat; echo done"],
                 stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    cat.write_stdin("through stdin\n")
    cat.close_channel(0)  # v5: end of stdin, so cat ends
    cat.run_forever(timeout=20)
    assert cat.read_stdout() == "through stdin\ndone\n" and cat.returncode == 0
    tty = stream(core.connect_get_namespaced_pod_exec, sleeper, ns, command=["sh", "-c", "tty"], stderr=True,
                 stdin=True, stdout=True, tty=True, _preload_content=False)
    tty.run_forever(timeout=20)
    assert tty.read_stdout().startswith("/dev/pts/") and tty.returncode == 0
    # v4 only (older clients): no close channel, same exit status
    v4 = stream(core.connect_get_namespaced_pod_exec, sleeper, ns, command=["sh", "-c", "exit 2"], stderr=True,
                stdin=False, stdout=True, tty=False, _preload_content=False,
                _request_timeout=20, _headers={"sec-websocket-protocol": "v4.channel.k8s.io"})
    v4.run_forever(timeout=20)
    assert v4.subprotocol == "v4.channel.k8s.io" and v4.returncode == 2


def test_python_portforward_reaches_the_pods_loopback(kube_cluster, core, ns):
    port = free_port()
    run_pod(core, ns, "web", f"import http.server as h; h.test(h.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')",
            env={"PYTHONUNBUFFERED": "1"})
    wait_until(lambda: "Serving HTTP" in core.read_namespaced_pod_log("web", ns, _preload_content=False).data.decode(),
               20, what="http server up")
    forward = portforward(core.connect_get_namespaced_pod_portforward, "web", ns, ports=str(port))
    sock = forward.socket(port)
    sock.setblocking(True)
    sock.settimeout(20)
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    assert received.startswith(b"HTTP/1.0 200 OK") and forward.error(port) is None
    nothing = free_port()
    refused = portforward(core.connect_get_namespaced_pod_portforward, "web", ns, ports=str(nothing))
    probe = refused.socket(nothing)
    probe.settimeout(20)
    assert probe.recv(10) == b""  # the error channel closes the local end
    assert "connection refused" in refused.error(nothing)


def test_kubectl_attach_follows_output(kube_cluster, core, ns):
    run_pod(core, ns, "ticker", "import time\nfor i in range(300):\n    print('tick', i, flush=True); time.sleep(0.2)\n")
    attach = subprocess.Popen(["kubectl", "attach", "ticker", "-n", ns, "-c", "main"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=kube_cluster.kubectl_env())
    try:
        time.sleep(3)
    finally:
        attach.terminate()
        out, _ = attach.communicate(timeout=10)
    ticks = [line for line in out.splitlines() if line.startswith("tick")]
    assert len(ticks) >= 3, out
    numbers = [int(t.split()[1]) for t in ticks]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # in order, none lost


def test_unsupported_requests_get_a_status_not_a_transport_error(kube_cluster, ns, sleeper):
    base = kube_cluster.server.replace("http", "ws", 1) + f"/api/v1/namespaces/{ns}/pods"

    async def refused(url: str, protocols: list[str]):
        try:
            async with websockets.connect(url, subprotocols=protocols):
                return None
        except websockets.InvalidStatus as exc:
            return exc.response.status_code, json.loads(exc.response.body)

    code, status = asyncio.run(refused(f"{base}/{sleeper}/exec?command=ls&stdout=1", ["v1.channel.k8s.io"]))
    assert code == 400 and status["kind"] == "Status" and "v5.channel.k8s.io" in status["message"]
    code, status = asyncio.run(refused(f"{base}/missing/exec?command=ls&stdout=1", ["v5.channel.k8s.io"]))
    assert code == 404 and status["reason"] == "NotFound"
    plain = requests.post(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/{sleeper}/exec?command=ls", timeout=10)
    assert plain.status_code == 400 and "Upgrade request required" in plain.json()["message"]
    spdy_exec = requests.post(f"{kube_cluster.server}/api/v1/namespaces/{ns}/pods/{sleeper}/exec?command=ls&stdout=1",
                              headers={"connection": "Upgrade", "upgrade": "SPDY/3.1"}, timeout=10)
    assert spdy_exec.status_code == 400 and "v5.channel.k8s.io" in spdy_exec.json()["message"]  # exec: WebSocket only
