"""`kubectl port-forward` (kubectl 1.32) on the local cluster: SPDY/3.1 streams tunnelled in WebSocket
(what kubectl tries first) and plain SPDY after an HTTP upgrade (its fallback), two connections at once,
a port nothing listens on (kubectl reports the error, the server goes on), and the SPDY framing itself."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from kubernetes import client

from airflow_gpu.devtools.processes import free_port, wait_until
from airflow_gpu.localcluster.kubelet import spdy


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "portforward", "pools": [{"name": "gpu", "count": 1, "gpu": {"count": 2}}]}


@pytest.fixture(scope="module")
def web(kube_cluster):
    """(namespace, port): a pod "web" serving its working directory over HTTP on its loopback address."""
    ns = f"pf-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", ns)
    core = client.CoreV1Api(kube_cluster.api_client())
    port = free_port()
    script = ("import http.server as h, pathlib; pathlib.Path('hello.txt').write_text('hello through the tunnel'); "
              f"h.ThreadingHTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()")
    core.create_namespaced_pod(ns, {"metadata": {"name": "web"}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "python:3.11", "command": ["python", "-c", script]}]}})
    wait_until(lambda: core.read_namespaced_pod("web", ns).status.phase == "Running", 30, what="web running")
    return ns, port


class PortForward:
    """`kubectl port-forward` in the background, stopped by its PID."""

    def __init__(self, kube_cluster, ns: str, remote_port: int, websockets: bool = True):
        self.local = free_port()
        env = kube_cluster.kubectl_env()
        if not websockets:
            env["KUBECTL_PORT_FORWARD_WEBSOCKETS"] = "false"  # kubectl's own switch: plain SPDY only
        self.proc = subprocess.Popen(["kubectl", "port-forward", "-n", ns, "pod/web", f"{self.local}:{remote_port}",
                                      "-v=4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        wait_until(self._ready, 30, what="kubectl port-forward listening")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"kubectl port-forward exited {self.proc.returncode}: {self.proc.stderr.read()}")
        self.lines.append(self.proc.stdout.readline())
        return "Forwarding from 127.0.0.1" in self.lines[-1]

    def get(self, path: str) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.local}/{path}", timeout=20)

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        _, err = self.proc.communicate(timeout=20)
        return err


@pytest.mark.parametrize("websockets", [True, False], ids=["websocket-tunnel", "plain-spdy"])
def test_kubectl_port_forward_serves_concurrent_connections(kube_cluster, web, websockets):
    ns, port = web
    forward = PortForward(kube_cluster, ns, port, websockets)
    try:
        assert forward.get("hello.txt").text == "hello through the tunnel"
        with ThreadPoolExecutor(2) as pool:  # two connections at once: two stream pairs on one SPDY session
            answers = list(pool.map(forward.get, ["hello.txt", ""] * 4))
        assert [a.status_code for a in answers] == [200] * 8
        assert answers[0].text == "hello through the tunnel" and "hello.txt" in answers[1].text
        big = forward.get("/")  # the server still answers after eight stream pairs came and went
        assert big.status_code == 200
    finally:
        err = forward.stop()
    assert "error" not in err.lower(), err
    assert ("tunneling_dialer" in err) == websockets and "fallback" not in err, err  # the transport asked for


def test_port_without_listener_is_reported_and_the_server_goes_on(kube_cluster, web):
    ns, port = web
    forward = PortForward(kube_cluster, ns, free_port())
    try:
        with pytest.raises(requests.ConnectionError):
            forward.get("hello.txt")
        forward.proc.wait(timeout=30)  # kubectl 1.32 gives up the session after a forwarding error
    finally:
        err = forward.stop()
    assert "error forwarding port" in err and "connection refused" in err, err
    again = PortForward(kube_cluster, ns, port)
    try:
        assert again.get("hello.txt").text == "hello through the tunnel"
    finally:
        again.stop()


def test_spdy_frames_round_trip():
    """What the server parses is what a client (spdystream) writes: one zlib context per direction,
    frames split anywhere by the transport; the dictionary is the SPDY/3 one (its Adler-32 is fixed)."""
    assert len(spdy.DICTIONARY) == 1423 and zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2
    client_codec, server_codec = spdy.HeaderCodec(), spdy.HeaderCodec()
    wire = b""
    for sid, stream_type in ((1, "error"), (3, "data")):
        block = client_codec.encode({"streamType": stream_type, "port": "8080", "requestID": "0"})
        payload = sid.to_bytes(4, "big") + bytes(6) + block
        wire += spdy._control(spdy.SYN_STREAM, 0, payload)
    wire += spdy.encode_data(3, b"GET / HTTP/1.0\r\n\r\n", fin=True) + spdy.encode_ping(1) + spdy.encode_goaway(3)
    parser = spdy.FrameParser(server_codec)
    frames = [f for i in range(0, len(wire), 7) for f in parser.feed(wire[i:i + 7])]
    assert [f.kind for f in frames] == [spdy.SYN_STREAM, spdy.SYN_STREAM, 0, spdy.PING, spdy.GOAWAY]
    assert frames[1].headers == {"streamtype": "data", "port": "8080", "requestid": "0"} and frames[1].stream_id == 3
    assert frames[2].data == b"GET / HTTP/1.0\r\n\r\n" and frames[2].fin and frames[3].ping_id == 1
    reply = spdy.FrameParser(client_codec).feed(spdy.encode_syn_reply(server_codec, 3))
    assert reply[0].kind == spdy.SYN_REPLY and reply[0].stream_id == 3 and reply[0].headers == {}
    with pytest.raises(spdy.ProtocolError):
        spdy.FrameParser(spdy.HeaderCodec()).feed(spdy._control(spdy.SYN_STREAM, 0, bytes(10) + b"not zlib"))
