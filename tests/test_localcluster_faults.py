"""Faults of the local cluster: spot interruption, node NotReady, API server restart, shutdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from kubernetes import watch
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools.processes import wait_until
from airflow_gpu import constants as C
from fixtures.kube import start_kube_cluster

SPOT_TOLERATION = {"key": C.TAINT_SPOT, "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def kube_spec():
    return {
        "name": "faults",
        "podGCSeconds": 0.5,
        "watchHistory": 50,
        "pools": [
            {"name": "od", "count": 1, "gpu": {"count": 8}, "capacityType": "on-demand", "zone": "z1"},
            {"name": "spot", "count": 3, "gpu": {"count": 8}, "capacityType": "spot", "zone": "z2",
             "racks": ["r1", "r2", "r3"], "cliques": ["c1", "c2", "c3"]},
        ],
    }


@pytest.fixture
def ns(kube_cluster):
    name = f"f-{uuid.uuid4().hex[:8]}"
    kube_cluster.core().create_namespace({"metadata": {"name": name}})
    return name


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    return wait_until(predicate, timeout, interval, what)


# The process records when SIGTERM arrives, then exits like a training loop that saved its checkpoint.
TRAINER = ("import signal,sys,time,pathlib\n"
           "def term(*a):\n pathlib.Path('sigterm-at').write_text(repr(time.time())); sys.exit(0)\n"
           "signal.signal(signal.SIGTERM, term)\nprint('ready', flush=True)\ntime.sleep(300)\n")


def spot_pod(name, node, script=TRAINER, grace=5):
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeName": node, "terminationGracePeriodSeconds": grace,
        "tolerations": [SPOT_TOLERATION],
        "containers": [{"name": "main", "image": "trainer", "command": [sys.executable, "-c", script],
                        "resources": {"limits": {C.RESOURCE_GPU: "4"}}}]}}


def running(core, ns, name):
    try:
        pod = core.read_namespaced_pod(name, ns)
    except ApiException:
        return False
    return pod.status.phase == "Running"


class ConditionClock:
    """Watches pods and records when each first shows DisruptionTarget."""

    def __init__(self, core, ns):
        self.seen: dict[str, tuple[float, str]] = {}
        self.final: dict[str, object] = {}
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, ns), daemon=True)
        self._thread.start()
        time.sleep(0.3)

    def _run(self, core, ns):
        try:
            self._watch(core, ns)
        except Exception:  # the stream is cut when the test stops watching
            pass

    def _watch(self, core, ns):
        for event in self._w.stream(core.list_namespaced_pod, ns, timeout_seconds=60):
            pod = event["object"]
            self.final[pod.metadata.name] = (event["type"], pod)
            for cond in pod.status.conditions or []:
                if cond.type == C.CONDITION_DISRUPTION_TARGET and pod.metadata.name not in self.seen:
                    self.seen[pod.metadata.name] = (time.time(), cond.reason)

    def stop(self):
        self._w.stop()


def test_spot_interruption_eviction_mode(kube_cluster, ns):
    core = kube_cluster.core()
    for i in range(2):
        core.create_namespaced_pod(ns, spot_pod(f"train-{i}", "spot-0"))
    wait_for(lambda: all(running(core, ns, f"train-{i}") for i in range(2)), what="pods running")
    workdirs = {f"train-{i}": next(kube_cluster.state_dir.glob(f"pods/{ns}/train-{i}-*")) for i in range(2)}
    wait_for(lambda: all(" stdout F ready" in (d / "main.0.log").read_text() for d in workdirs.values()), what="ready")
    clock = ConditionClock(core, ns)
    result = kube_cluster.interrupt("spot-0", notice=1.0, replace_after=1.5)
    assert sorted(result["pods"]) == [f"{ns}/train-0", f"{ns}/train-1"]
    node = core.read_node("spot-0")
    assert any(t.key == C.TAINT_KARPENTER_DISRUPTED and t.effect == "NoSchedule" for t in node.spec.taints)
    wait_for(lambda: all((d / "sigterm-at").exists() for d in workdirs.values()), what="SIGTERM after the notice")
    for name, workdir in workdirs.items():
        marked_at, reason = clock.seen[name]
        assert reason == C.REASON_EVICTION_BY_EVICTION_API
        assert marked_at < float((workdir / "sigterm-at").read_text())  # condition first, then the signal
        assert float((workdir / "sigterm-at").read_text()) - marked_at > 0.8  # the notice
    wait_for(lambda: all(core.list_namespaced_pod(ns).items == [] for _ in [0]), what="pods deleted")
    wait_for(lambda: "spot-0" not in [n.metadata.name for n in core.list_node().items], what="node removed")
    clock.stop()
    replacement = wait_for(lambda: [n for n in core.list_node().items if n.metadata.name == "spot-3"], what="replacement")[0]
    assert replacement.metadata.labels[C.NODE_CAPACITY_TYPE_KARPENTER] == "spot"
    assert replacement.metadata.labels[C.NODE_GPU_CLIQUE] == "c1"
    assert any(t.key == C.TAINT_SPOT for t in replacement.spec.taints)
    assert not any(t.key == C.TAINT_KARPENTER_DISRUPTED for t in replacement.spec.taints)


def test_spot_interruption_shutdown_mode_via_cli(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, spot_pod("victim", "spot-1"))
    sim = spot_pod("simulated", "spot-1")
    del sim["spec"]["containers"][0]["command"]
    core.create_namespaced_pod(ns, sim)
    wait_for(lambda: running(core, ns, "victim") and running(core, ns, "simulated"), what="running")
    clock = ConditionClock(core, ns)
    cli = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "interrupt", "spot-1", "--notice", "0.5",
                          "--mode", "shutdown", "--kubeconfig", str(kube_cluster.kubeconfig)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert sorted(json.loads(cli.stdout)["pods"]) == [f"{ns}/simulated", f"{ns}/victim"]

    def failed():
        pod = core.read_namespaced_pod("victim", ns)
        return pod if pod.status.phase == "Failed" else None
    pod = wait_for(failed, what="victim Failed")
    assert (pod.status.reason, pod.status.message) == ("Terminated", "Pod was terminated in response to imminent node shutdown.")
    cond = next(c for c in pod.status.conditions if c.type == C.CONDITION_DISRUPTION_TARGET)
    assert cond.reason == C.REASON_TERMINATION_BY_KUBELET
    assert clock.seen["victim"][1] == C.REASON_TERMINATION_BY_KUBELET
    # the machine goes away, then PodGC removes what was left on it
    wait_for(lambda: "spot-1" not in [n.metadata.name for n in core.list_node().items], what="node removed")
    wait_for(lambda: core.list_namespaced_pod(ns).items == [], what="PodGC")
    clock.stop()
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "interrupt", "no-such-node",
                          "--kubeconfig", str(kube_cluster.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr and 'node "no-such-node" not found' in bad.stderr


def test_node_not_ready_taint_manager_and_recovery(kube_cluster, ns):
    core = kube_cluster.core()
    quick = spot_pod("quick", "spot-2")
    quick["spec"]["tolerations"].append({"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                         "effect": "NoExecute", "tolerationSeconds": 1})
    core.create_namespaced_pod(ns, quick)
    core.create_namespaced_pod(ns, spot_pod("patient", "spot-2"))
    wait_for(lambda: running(core, ns, "quick") and running(core, ns, "patient"), what="running")
    kube_cluster.not_ready("spot-2")
    node = core.read_node("spot-2")
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "Unknown"
    assert {(t.key, t.effect) for t in node.spec.taints} >= {("node.kubernetes.io/unreachable", "NoExecute")}
    ready = {c.type: c.status for c in core.read_namespaced_pod("patient", ns).status.conditions}["Ready"]
    assert ready == "False"

    def marked():
        pod = core.read_namespaced_pod("quick", ns)
        cond = next((c for c in pod.status.conditions if c.type == C.CONDITION_DISRUPTION_TARGET), None)
        return (pod, cond) if pod.metadata.deletion_timestamp and cond else None
    pod, cond = wait_for(marked, what="taint manager eviction")
    assert cond.reason == C.REASON_DELETION_BY_TAINT_MANAGER
    # the kubelet is unreachable: the pod stays Terminating until the node comes back
    time.sleep(0.5)
    assert core.read_namespaced_pod("quick", ns).metadata.deletion_timestamp is not None
    kube_cluster.ready("spot-2")
    wait_for(lambda: [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["patient"], what="quick gone")
    assert {c.type: c.status for c in core.read_node("spot-2").status.conditions}["Ready"] == "True"
    assert running(core, ns, "patient")


def test_apiserver_restart_keeps_state_and_running_pods(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, spot_pod("survivor", "od-0"))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "kept"}, "data": {"x": "1"}})
    wait_for(lambda: running(core, ns, "survivor"), what="running")
    workdir = next(kube_cluster.state_dir.glob(f"pods/{ns}/survivor-*"))
    before = core.read_namespaced_config_map("kept", ns)
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    kube_cluster.restart_apiserver()
    after = core.read_namespaced_config_map("kept", ns)
    assert (after.metadata.uid, after.metadata.resource_version, after.data) == \
        (before.metadata.uid, before.metadata.resource_version, {"x": "1"})
    assert running(core, ns, "survivor") and not (workdir / "sigterm-at").exists()
    # a watch resumes from the resourceVersion it had before the restart
    core.patch_namespaced_config_map("kept", ns, {"data": {"x": "2"}})
    events = []
    for event in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=2):
        events.append((event["type"], event["object"].data))
    assert events == [("MODIFIED", {"x": "2"})]
    core.delete_namespaced_pod("survivor", ns, grace_period_seconds=2)
    wait_for(lambda: (workdir / "sigterm-at").exists(), what="SIGTERM after restart")


def test_watch_too_old_resource_version_is_410(kube_cluster, ns):
    core = kube_cluster.core()
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    for i in range(120):  # the spec keeps 50 events of history
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"c{i}"}})
    with pytest.raises(ApiException) as err:
        for _ in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=2):
            pass
    assert err.value.status == 410
    r = requests.get(f"{kube_cluster.server}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion={rv}")
    event = json.loads(r.text.splitlines()[0])
    assert event["type"] == "ERROR" and event["object"]["reason"] == "Expired" and event["object"]["code"] == 410


def test_sigterm_stops_cluster_and_every_pod_process_then_state_survives(tmp_path):
    spec = {"name": "stop", "pools": [{"name": "n", "count": 1, "gpu": {"count": 2}}]}
    with start_kube_cluster(tmp_path, spec) as cluster:
        core = cluster.core()
        marker = f"stop-{uuid.uuid4().hex[:8]}"
        script = f"import time,pathlib; pathlib.Path('pid').write_text('{marker}'); time.sleep(300)"
        for name in ("a", "b"):
            core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [
                {"name": "main", "image": "x", "command": [sys.executable, "-c", script]}]}})
        for name in ("a", "b"):
            wait_for(lambda n=name: next(cluster.state_dir.glob(f"pods/default/{n}-*/pid"), None), what="pid")
        pids = host_pids(marker)  # the containers' processes and their PID 1s, as the host numbers them
        assert len(pids) >= 2
        for pid in pids:
            os.kill(pid, 0)  # alive
        second = subprocess.run([sys.executable, "-m", "airflow_gpu", "cluster", "up", "--spec", str(tmp_path / "cluster-spec.yaml"),
                                 "--state-dir", str(cluster.state_dir), "--fresh"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and "is in use by another cluster" in second.stderr
        cluster.process.stop(timeout=15)
        assert cluster.process.popen.returncode == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    # cold start on the same state dir: objects are still there
    with start_kube_cluster(tmp_path, spec) as again:
        names = sorted(p.metadata.name for p in again.core().list_namespaced_pod("default").items)
        assert names == ["a", "b"]
        assert Path(again.state_dir, "store.log").exists()


def host_pids(marker: str) -> list[int]:
    """Host PIDs of the processes whose command line holds `marker` (a container's process reports the
    PID of its own PID namespace, so the test looks from the host)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass
    return [p for p in pids if p != os.getpid()]


def test_killed_cluster_leaves_no_pod_processes(tmp_path):
    spec = {"name": "crash", "pools": [{"name": "n", "count": 1, "gpu": {"count": 1}}]}
    with start_kube_cluster(tmp_path, spec) as cluster:
        marker = f"crash-{uuid.uuid4().hex[:8]}"
        script = f"import time,pathlib; pathlib.Path('pid').write_text('{marker}'); time.sleep(300)"
        cluster.core().create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "main", "image": "x", "command": [sys.executable, "-c", script]}]}})
        pid_file = wait_for(lambda: next(cluster.state_dir.glob("pods/default/p-*/pid"), None), what="pid file")
        wait_for(lambda: pid_file.read_text(), what="pid")
        assert host_pids(marker)
        cluster.process.kill9()  # a crash: no shutdown code runs
        wait_for(lambda: not host_pids(marker), timeout=5, what="pod processes killed with their cluster")


def test_events_expire_after_their_ttl(tmp_path):
    spec = {"name": "ttl", "eventTTLSeconds": 2, "pools": [{"name": "n", "count": 1, "gpu": {"count": 1}}]}
    with start_kube_cluster(tmp_path, spec) as cluster:
        core = cluster.core()
        assert core.list_namespaced_event("default").items  # RegisteredNode
        wait_for(lambda: not core.list_namespaced_event("default").items, timeout=10, what="events expired")
