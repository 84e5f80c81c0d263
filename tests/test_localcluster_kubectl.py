"""The local cluster through kubectl v1.32 (/usr/bin/kubectl), as a user would drive it."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_gpu.devtools.processes import wait_until
from airflow_gpu import constants as C

SHARED_CRDS = Path(__file__).resolve().parents[2] / "shared" / "crds"

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: demo}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 20
  containers:
  - name: main
    image: python:3.11-slim
    command: ["python", "-c", {script!r}]
    resources:
      limits: {{nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
"""


@pytest.fixture(scope="module")
def kube_audit():
    return True


@pytest.fixture
def ns(kube_cluster):
    name = f"k-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)  # kubectl sends this one as protobuf
    return name


def wait_for(predicate, timeout=20.0, interval=0.1, what="condition"):
    return wait_until(predicate, timeout, interval, what)


def test_get_nodes_shows_gpu_capacity(kube_cluster):
    out = kube_cluster.kubectl("get", "nodes").stdout
    assert out.split("\n")[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert "gpu-od-0" in out and "Ready" in out
    cols = kube_cluster.kubectl("get", "nodes", "-o",
                                r"custom-columns=NAME:.metadata.name,GPU:.status.capacity.nvidia\.com/gpu,"
                                r"MIG:.status.capacity.nvidia\.com/mig-3g\.40gb").stdout
    rows = {line.split()[0]: line.split()[1:] for line in cols.strip().splitlines()[1:]}
    assert rows["gpu-od-0"] == ["4", "<none>"] and rows["gpu-mig-0"] == ["1", "1"]
    described = kube_cluster.kubectl("describe", "node", "gpu-spot-0").stdout
    assert "nvidia.com/gpu:" in described and f"{C.TAINT_SPOT}=true:NoSchedule" in described
    assert f"{C.NODE_CAPACITY_TYPE_KARPENTER}=spot" in described


def test_create_watch_logs_describe_events(kube_cluster, ns, tmp_path):
    watcher = subprocess.Popen(["kubectl", "get", "pods", "-n", ns, "-w"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=kube_cluster.kubectl_env())
    try:
        time.sleep(0.5)
        manifest = tmp_path / "pod.yaml"
        manifest.write_text(POD.format(name="hello", script="import time; print('hello from the pod', flush=True); "
                                                            "time.sleep(1.5); print('done')"))
        out = kube_cluster.kubectl("create", "-f", str(manifest), "-n", ns).stdout
        assert out.strip() == "pod/hello created"
        wait_for(lambda: "Completed" in kube_cluster.kubectl("get", "pod", "hello", "-n", ns).stdout,
                 what=lambda: kube_cluster.kubectl("get", "pod", "hello", "-n", ns, "-o", "yaml").stdout)
        logs = kube_cluster.kubectl("logs", "hello", "-n", ns).stdout
        assert logs == "hello from the pod\ndone\n"
        time.sleep(0.5)
    finally:
        watcher.terminate()
        watched = watcher.communicate(timeout=10)[0]
    statuses = [line.split()[2] for line in watched.splitlines()[1:] if line.startswith("hello")]
    # the watch shows the phase changes (its first line depends on when kubectl connected)
    assert "Running" in statuses and statuses[-1] == "Completed" and len(set(statuses)) >= 2, watched
    described = kube_cluster.kubectl("describe", "pod", "hello", "-n", ns).stdout
    assert "Status:           Succeeded" in described and "Exit Code:    0" in described
    assert "Successfully assigned" in described and "Started container main" in described
    events = kube_cluster.kubectl("get", "events", "-n", ns).stdout
    assert "Scheduled" in events and "pod/hello" in events and "Started" in events


def test_logs_follow_and_delete_with_grace_period(kube_cluster, ns, tmp_path):
    script = ("import signal,sys,time\n"
              "def bye(*a):\n print('SIGTERM received', flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "for i in range(1000):\n print('tick', i, flush=True); time.sleep(0.2)\n")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.format(name="ticker", script=script))
    kube_cluster.kubectl("create", "-f", str(manifest), "-n", ns)
    wait_for(lambda: "Running" in kube_cluster.kubectl("get", "pod", "ticker", "-n", ns).stdout, what="Running")
    follower = subprocess.Popen(["kubectl", "logs", "-f", "ticker", "-n", ns], stdout=subprocess.PIPE, text=True,
                                env=kube_cluster.kubectl_env())
    time.sleep(1.0)
    started = time.monotonic()
    out = kube_cluster.kubectl("delete", "pod", "ticker", "-n", ns, "--grace-period=5").stdout
    assert out.strip() == 'pod "ticker" deleted'
    assert time.monotonic() - started < 5  # exited on SIGTERM: no waiting for the grace period
    followed = follower.communicate(timeout=10)[0]
    assert "tick 0" in followed and followed.rstrip().endswith("SIGTERM received")
    assert "NotFound" in kube_cluster.kubectl("get", "pod", "ticker", "-n", ns, check=False).stderr


def test_validation_errors_from_kubectl(kube_cluster, ns, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n"
                   "  - name: c\n    image: x\n    colour: blue\n")
    result = kube_cluster.kubectl("create", "-f", str(bad), "-n", ns, check=False)
    assert result.returncode != 0 and 'unknown field "spec.containers[0].colour"' in result.stderr
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  - name: c\n")
    result = kube_cluster.kubectl("create", "-f", str(bad), "-n", ns, check=False)
    assert "is invalid" in result.stderr and "spec.containers[0].image: Required value" in result.stderr


def test_apply_create_then_update(kube_cluster, ns, tmp_path):
    manifest = tmp_path / "cm.yaml"
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  labels: {v: one}\n"
                        "data:\n  a: '1'\n  b: '2'\n")
    assert kube_cluster.kubectl("apply", "-f", str(manifest), "-n", ns).stdout.strip() == "configmap/settings created"
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  labels: {v: two}\n"
                        "data:\n  a: '10'\n")
    assert kube_cluster.kubectl("apply", "-f", str(manifest), "-n", ns).stdout.strip() == "configmap/settings configured"
    got = json.loads(kube_cluster.kubectl("get", "configmap", "settings", "-n", ns, "-o", "json").stdout)
    assert got["data"] == {"a": "10"} and got["metadata"]["labels"] == {"v": "two"}
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD.format(name="applied", script="import time; time.sleep(30)"))
    assert kube_cluster.kubectl("apply", "-f", str(pod), "-n", ns).stdout.strip() == "pod/applied created"
    pod.write_text(pod.read_text().replace("labels: {app: demo}", "labels: {app: demo, extra: 'yes'}"))
    assert kube_cluster.kubectl("apply", "-f", str(pod), "-n", ns).stdout.strip() == "pod/applied configured"
    labels = json.loads(kube_cluster.kubectl("get", "pod", "applied", "-n", ns, "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"app": "demo", "extra": "yes"}
    kube_cluster.kubectl("delete", "pod", "applied", "-n", ns, "--grace-period=1", "--wait=false")


def test_podgroups_and_other_crds(kube_cluster, ns, tmp_path):
    manifest = tmp_path / "pg.yaml"
    manifest.write_text("apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata:\n  name: gang-a\n"
                        "spec:\n  minMember: 4\n  scheduleTimeoutSeconds: 60\n")
    kube_cluster.kubectl("apply", "-f", str(manifest), "-n", ns)
    out = kube_cluster.kubectl("get", "podgroups", "-n", ns).stdout
    header, row = out.strip().splitlines()
    assert header.split()[:3] == ["NAME", "PHASE", "MINMEMBER"] and row.split()[0] == "gang-a" and "4" in row.split()
    assert "gang-a" in kube_cluster.kubectl("get", "pg", "-n", ns).stdout
    kube_cluster.kubectl("apply", "-f", str(SHARED_CRDS / "scheduling.volcano.sh_queues.yaml"))
    queue = tmp_path / "queue.yaml"
    queue.write_text("apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata:\n  name: team-a\n"
                     "spec:\n  weight: 2\n")
    wait_for(lambda: kube_cluster.kubectl("apply", "-f", str(queue), check=False).returncode == 0, what="Queue served")
    assert "team-a" in kube_cluster.kubectl("get", "queues.scheduling.volcano.sh").stdout


def test_imperative_creates_protobuf_bodies(kube_cluster, ns):
    k = kube_cluster.kubectl
    k("create", "configmap", "cm", "--from-literal=a=b", "-n", ns)
    k("create", "secret", "generic", "s", "--from-literal=k=v", "-n", ns)
    k("create", "quota", "gpus", "--hard=requests.nvidia.com/gpu=8,pods=20", "-n", ns)
    k("create", "priorityclass", f"pc-{ns}", "--value=1000", "--preemption-policy=Never")
    k("create", "serviceaccount", "robot", "-n", ns)
    assert json.loads(k("get", "cm", "cm", "-n", ns, "-o", "jsonpath={.data}").stdout) == {"a": "b"}
    assert json.loads(k("get", "secret", "s", "-n", ns, "-o", "jsonpath={.data}").stdout) == {"k": "dg=="}
    assert json.loads(k("get", "quota", "gpus", "-n", ns, "-o", "jsonpath={.spec.hard}").stdout) == \
        {"requests.nvidia.com/gpu": "8", "pods": "20"}
    assert k("get", "pc", f"pc-{ns}", "-o", "jsonpath={.value} {.preemptionPolicy}").stdout == "1000 Never"


def test_cordon_taints_and_drain_evicts(kube_cluster, ns, tmp_path):
    k = kube_cluster.kubectl
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.format(name="drained", script="import time; time.sleep(60)").replace(
        "spec:\n", "spec:\n  nodeName: gpu-od-1\n", 1))
    k("create", "-f", str(manifest), "-n", ns)
    wait_for(lambda: "Running" in k("get", "pod", "drained", "-n", ns).stdout, what="Running")
    k("cordon", "gpu-od-1")
    taints = lambda: k("get", "node", "gpu-od-1", "-o", "jsonpath={.spec.taints[*].key}").stdout  # noqa: E731
    wait_for(lambda: "node.kubernetes.io/unschedulable" in taints(), what="unschedulable taint")
    out = k("drain", "gpu-od-1", "--ignore-daemonsets", "--force", "--grace-period=1", timeout=60).stdout
    assert "pod/drained evicted" in out
    assert "NotFound" in k("get", "pod", "drained", "-n", ns, check=False).stderr
    k("uncordon", "gpu-od-1")
    wait_for(lambda: "unschedulable" not in taints(), what="taint removed")


def test_rbac_objects_are_stored(kube_cluster, ns):
    manifest = ("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: reader}\n"
                "rules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get, list, watch]\n")
    assert kube_cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest).stdout.strip() == \
        "role.rbac.authorization.k8s.io/reader created"
    assert "reader" in kube_cluster.kubectl("get", "roles", "-n", ns).stdout


def test_audit_log_names_verb_and_resource(kube_cluster, ns):
    kube_cluster.kubectl("get", "pods", "-n", ns)
    kube_cluster.kubectl("get", "podgroups", "-n", ns)
    events = [e for e in kube_cluster.audit_events() if (e.get("objectRef") or {}).get("namespace") == ns]
    seen = {(e["verb"], e["objectRef"]["apiGroup"], e["objectRef"]["resource"]) for e in events}
    assert ("list", "", "pods") in seen and ("list", "scheduling.x-k8s.io", "podgroups") in seen
    assert all(e["kind"] == "Event" and e["apiVersion"] == "audit.k8s.io/v1" and e["responseStatus"]["code"] == 200
               and e["userAgent"].startswith("kubectl") for e in events)


def test_a_log_follower_that_goes_away_ends_its_request(kube_cluster, ns, tmp_path):
    """The server stops following a pod's log when its client disconnects, as for a watch (it read on
    until the container ended); the request is then audited, with the container still running."""
    script = "import time\nfor i in range(1000):\n print('tick', i, flush=True); time.sleep(0.2)\n"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.format(name="ticker2", script=script))
    kube_cluster.kubectl("create", "-f", str(manifest), "-n", ns)
    wait_for(lambda: "Running" in kube_cluster.kubectl("get", "pod", "ticker2", "-n", ns).stdout, what="Running")

    def follows() -> list[dict]:
        return [e for e in kube_cluster.audit_events() if (e.get("objectRef") or {}).get("name") == "ticker2"
                and e["objectRef"].get("subresource") == "log"]
    follower = subprocess.Popen(["kubectl", "logs", "-f", "ticker2", "-n", ns], stdout=subprocess.PIPE, text=True,
                                env=kube_cluster.kubectl_env())
    assert follower.stdout.readline().startswith("tick 0")
    assert not follows()  # still following
    follower.kill()
    follower.communicate(timeout=10)
    wait_for(lambda: len(follows()) == 1, what="the followed log's request ended on the server")
    assert "Running" in kube_cluster.kubectl("get", "pod", "ticker2", "-n", ns).stdout
    kube_cluster.kubectl("delete", "pod", "ticker2", "-n", ns, "--grace-period=0")
