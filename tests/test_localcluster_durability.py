"""Issue 10, items 3, 4, 8: an answered write survives kill -9; a corrupt store.log line is refused,
naming the line, and nothing is cut; the state dir keeps secrets private."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.localcluster.registry.store import CorruptLog, Store

SPEC = {"name": "durable", "pools": [{"name": "a", "count": 1, "gpu": {"count": 8}}]}
ROUNDS = 20


def _burst(server: str, prefix: str, acked: list[tuple[str, int]], stop: threading.Event, k: int) -> None:
    """Create ConfigMaps until the server dies; remember (name, resourceVersion) of every 201."""
    session = requests.Session()
    i = 0
    while not stop.is_set():
        name = f"{prefix}-{k}-{i}"
        i += 1
        try:
            r = session.post(f"{server}/api/v1/namespaces/default/configmaps", timeout=5,
                             json={"metadata": {"name": name}, "data": {"k": "v" * 200}})
        except requests.RequestException:
            return
        if r.status_code == 201:
            acked.append((name, int(r.json()["metadata"]["resourceVersion"])))


@pytest.mark.slow
def test_no_acknowledged_create_lost_over_kill9_rounds(tmp_path):
    rng = random.Random(10)
    acked: list[tuple[str, int]] = []
    lost_total = 0
    for rnd in range(ROUNDS):
        with start_kube_cluster(tmp_path, SPEC) as cluster:
            # every create answered in an earlier round is there, with its resourceVersion
            items = requests.get(f"{cluster.server}/api/v1/namespaces/default/configmaps", timeout=10).json()["items"]
            stored = {i["metadata"]["name"]: int(i["metadata"]["resourceVersion"]) for i in items}
            lost = [(n, rv) for n, rv in acked if stored.get(n) != rv]
            lost_total += len(lost)
            assert not lost, f"round {rnd}: {len(lost)} acknowledged creates lost, e.g. {lost[:3]}"
            top = max((rv for _, rv in acked), default=0)
            stop = threading.Event()
            this_round: list[tuple[str, int]] = []
            threads = [threading.Thread(target=_burst, args=(cluster.server, f"r{rnd}", this_round, stop, k))
                       for k in range(4)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.2, 0.5))
            cluster.process.kill9()  # mid-burst: no shutdown code runs
            stop.set()
            for t in threads:
                t.join(10)
            assert this_round, f"round {rnd}: no create was answered before the kill"
            # resourceVersions are never handed out twice across a restart
            assert min(rv for _, rv in this_round) > top
            acked += this_round
    assert lost_total == 0 and len(acked) > ROUNDS * 20


def test_state_dir_is_private_and_token_not_in_argv(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-for-test\n")
    os.chmod(token_file, 0o600)
    env = {"AIRFLOW_GPU_CLUSTER_TOKEN": ""}
    with start_kube_cluster(tmp_path, SPEC, token="s3cret-token-for-test") as cluster:
        cmdline = Path(f"/proc/{cluster.pid}/cmdline").read_bytes()
        assert b"s3cret" not in cmdline
        core = cluster.core()
        core.create_namespaced_secret("default", {"metadata": {"name": "s3"}, "stringData": {"key": "AKIA-secret"}})
        state = cluster.state_dir
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        for name in ("store.log", "cluster.json", "kubeconfig"):
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    # --token-file: the token read from a file; a missing file is exit 2 naming the flag
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "up", "--spec", str(spec), "--state-dir",
                          str(tmp_path / "other"), "--token-file", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    assert out.returncode == 2 and "--token-file" in out.stderr and "No such file" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "up", "--spec", str(spec), "--token", "x"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unrecognized arguments: --token" in out.stderr


def _store_with(tmp_path: Path, n: int) -> Path:
    store = Store(tmp_path)
    for i in range(n):
        store.create("/configmaps", {"metadata": {"namespace": "default", "name": f"c{i}"}})
    store.close()
    return tmp_path / "store.log"


def test_corrupt_line_is_refused_naming_it_and_nothing_is_cut(tmp_path):
    log_path = _store_with(tmp_path, 100)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[41] = b'[42,"A","/configmaps","default",garbage\n'
    log_path.write_bytes(b"".join(lines))
    before = log_path.read_bytes()
    with pytest.raises(CorruptLog, match=r"store.log:42: cannot parse this line .*--fresh"):
        Store(tmp_path).load()
    assert log_path.read_bytes() == before  # nothing truncated or rewritten
    # a line of valid JSON but the wrong shape is refused the same way
    lines[41] = b'{"not": "a write"}\n'
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(CorruptLog, match="store.log:42"):
        Store(tmp_path).load()


CM = '{"metadata":{"name":"c41","namespace":"default","resourceVersion":"42"}}'


@pytest.mark.parametrize("line, problem", [  # issue 32: valid JSON of the wrong shape crashed start
    ('[42,"A","/configmaps","default","c41",[]]', "must be a JSON object with metadata"),
    ('[42,"A","/configmaps","default","c41",{}]', "must be a JSON object with metadata"),
    ('[42,"A","/configmaps","default","c41",null]', "must be a JSON object with metadata"),
    ('{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}', "expected a list of 6 items, got dict"),
    ('[42,"A","/configmaps","default"]', "expected a list of 6 items, got list of 4"),
    ('["x","A","/configmaps","default","c41",' + CM + ']', "resourceVersion 'x' is not a non-negative integer"),
    ('[true,"A","/configmaps","default","c41",' + CM + ']', "is not a non-negative integer"),
    ('[null,"S","","","",null]', "is not a non-negative integer"),
    ('[42,"Q","/configmaps","default","c41",' + CM + ']', "op 'Q' is not one of A, M, D, S, P"),
    ('[42,"A",5,"default","c41",' + CM + ']', "key, namespace and name must be strings"),
    ('[42,"A","/configmaps","default","c41",{"metadata":{"name":"c41","namespace":"default"}}]',
     "resourceVersion 'None' is not the line's 42"),
    ('[42,"A","/configmaps","default","c41",{"metadata":{"name":"c41","namespace":"default",'
     '"resourceVersion":"abc"}}]', "resourceVersion 'abc' is not the line's 42"),
    ('[41,"A","/configmaps","default","c41",{"metadata":{"name":"c41","namespace":"default",'
     '"resourceVersion":"41"}}]', "resourceVersion 41 does not follow the previous write's 41"),
    ('[42,"A","/configmaps","default","c41",{"metadata":{"name":"other","namespace":"default",'
     '"resourceVersion":"42"}}]', "metadata names default/other, the line default/c41"),
    ('[42,"A","/configmaps","default","c41",{"metadata":{"name":"c41","namespace":"default",'
     '"resourceVersion":"42"},"spec":[1]}]', "spec must be a JSON object"),
    ('[42,"D","/configmaps","default","c41",' + CM + ']', "a deletion carries no object"),
])
def test_parseable_but_invalid_line_is_refused_naming_it(tmp_path, line, problem):
    log_path = _store_with(tmp_path, 50)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[41] = line.encode() + b"\n"
    log_path.write_bytes(b"".join(lines))
    before = log_path.read_bytes()
    with pytest.raises(CorruptLog) as info:
        Store(tmp_path).load()
    message = str(info.value)
    assert "store.log:42: not a valid write: " in message and problem in message and "--fresh" in message, message
    assert log_path.read_bytes() == before


def test_cluster_up_refuses_an_invalid_line_without_a_traceback(tmp_path):
    """A real cluster's log (nodes, CRDs, leases, a pod) passes the checks on restart; one line
    made invalid makes `cluster up` exit 2 naming it, with no traceback."""
    with start_kube_cluster(tmp_path, SPEC) as cluster:
        cluster.core().create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "schedulerName": "none", "containers": [{"name": "c", "image": "i"}]}})
    with start_kube_cluster(tmp_path, SPEC) as cluster:
        assert cluster.core().read_namespaced_pod("p", "default").metadata.name == "p"
    log_path = tmp_path / "state" / "store.log"
    lines = log_path.read_bytes().splitlines(keepends=True)
    at = next(i for i, raw in enumerate(lines) if b'"/pods","default","p"' in raw)
    write = json.loads(lines[at])
    write[5]["spec"] = [write[5]["spec"]]  # valid JSON, the wrong shape
    lines[at] = json.dumps(write).encode() + b"\n"
    log_path.write_bytes(b"".join(lines))
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "up", "--spec", str(tmp_path / "cluster-spec.yaml"),
                          "--state-dir", str(tmp_path / "state"), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"store.log:{at + 1}: not a valid write: the object's spec must be a JSON object" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "--fresh" in out.stderr


def test_torn_last_line_is_set_aside_not_replayed(tmp_path):
    log_path = _store_with(tmp_path, 10)
    with open(log_path, "ab") as fh:
        fh.write(b'[11,"A","/configmaps","default","torn",{"meta')
    store = Store(tmp_path)
    assert store.load()
    assert len(store.values("/configmaps")) == 10 and store.rv == 10
    assert (tmp_path / "store.torn").read_bytes().startswith(b'[11,"A"')
    assert log_path.read_bytes().endswith(b"\n")
