"""Pod volumes and write confinement on the local cluster, through the official client and kubectl:
emptyDir (also as /dev/shm), configMap, secret, downwardAPI, projected, subPath, readOnly; hostPath
and PVCs refused at admission; a container's absolute paths never reach the host outside its pod dir."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools.processes import wait_until


@pytest.fixture
def ns(kube_cluster):
    name = f"v-{uuid.uuid4().hex[:8]}"
    kube_cluster.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def wait_phase(core, ns, name, phases=("Succeeded", "Failed"), timeout=60.0) -> client.V1Pod:
    wait_until(lambda: core.read_namespaced_pod(name, ns).status.phase in phases, timeout, 0.1,
               f"pod {name} in {phases}")
    return core.read_namespaced_pod(name, ns)


def pod_log(core, ns, name, container=None) -> str:
    resp = core.read_namespaced_pod_log(name, ns, container=container, _preload_content=False)
    return resp.data.decode()


def pod_dir(kube_cluster, pod: client.V1Pod) -> Path:
    return kube_cluster.state_dir / "pods" / pod.metadata.namespace / f"{pod.metadata.name}-{pod.metadata.uid[:8]}"


def py(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_every_volume_type_is_seen_at_its_mount_path(kube_cluster, ns):
    core = core_api = kube_cluster.core()
    core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"},
                                           "data": {"a.txt": "alpha", "b.txt": "beta"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}})
    script = """
import json, os, stat
out = {}
def read(p):
    return open(p).read()
out["cm_all"] = sorted(n for n in os.listdir("/etc/settings") if not n.startswith("."))
out["cm_item"] = read("/etc/only-b/renamed/b")
out["secret"] = read("/etc/creds/password")
out["secret_mode"] = oct(stat.S_IMODE(os.stat("/etc/creds/password").st_mode))
out["downward_name"] = read("/etc/podinfo/name")
out["downward_labels"] = read("/etc/podinfo/labels")
out["projected"] = sorted(os.listdir("/projected"))
out["projected_ns"] = read("/projected/ns")
out["subpath"] = read("/config/a.txt")
out["from_init"] = read("/scratch/init.txt")
open("/dev/shm/torch-ring", "w").write("x" * 1024)
out["shm"] = os.path.exists("/dev/shm/torch-ring")
try:
    open("/etc/settings/new", "w").write("no")
    out["read_only"] = False
except OSError as exc:
    out["read_only"] = exc.errno
print(json.dumps(out))
"""
    body = {
        "metadata": {"name": "vols", "labels": {"app": "vols"}},
        "spec": {
            "restartPolicy": "Never",
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "only-b", "configMap": {"name": "settings", "items": [{"key": "b.txt", "path": "renamed/b"}]}},
                {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
                {"name": "podinfo", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "proj", "projected": {"sources": [
                    {"configMap": {"name": "settings", "items": [{"key": "a.txt", "path": "a"}]}},
                    {"secret": {"name": "creds"}},
                    {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            ],
            "initContainers": [{"name": "init", "image": "busybox", "command": py(
                "open('/scratch/init.txt', 'w').write('from init')"),
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
            "containers": [{"name": "main", "image": "python:3.11", "command": py(script), "volumeMounts": [
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "shm", "mountPath": "/dev/shm"},
                {"name": "settings", "mountPath": "/etc/settings", "readOnly": True},
                {"name": "only-b", "mountPath": "/etc/only-b"},
                {"name": "creds", "mountPath": "/etc/creds"},
                {"name": "podinfo", "mountPath": "/etc/podinfo"},
                {"name": "proj", "mountPath": "/projected"},
                {"name": "settings", "mountPath": "/config/a.txt", "subPath": "a.txt"},
            ]}],
        },
    }
    core_api.create_namespaced_pod(ns, body)
    pod = wait_phase(core, ns, "vols")
    text = pod_log(core, ns, "vols", "main")
    assert pod.status.phase == "Succeeded", text
    seen = json.loads(text.strip().splitlines()[-1])
    assert seen["cm_all"] == ["a.txt", "b.txt"]
    assert seen["cm_item"] == "beta"
    assert seen["secret"] == "s3cret" and seen["secret_mode"] == "0o400"
    assert seen["downward_name"] == "vols" and seen["downward_labels"] == 'app="vols"'
    assert seen["projected"] == ["a", "ns", "password"] and seen["projected_ns"] == ns
    assert seen["subpath"] == "alpha"
    assert seen["from_init"] == "from init"
    assert seen["shm"] is True
    assert seen["read_only"] == 30  # EROFS
    # the Memory emptyDir backing /dev/shm is in the pod's directory, shared by its containers
    assert (pod_dir(kube_cluster, pod) / "volumes" / "shm" / "torch-ring").stat().st_size == 1024


def test_writes_outside_volumes_stay_in_the_pod_directory(kube_cluster, ns):
    """KubernetesPodOperator's XCom sidecar path, /etc, /tmp and a new top-level dir: none on the host."""
    core = kube_cluster.core()
    marker = uuid.uuid4().hex[:8]
    host_paths = [Path(f"/etc/airflow-gpu-escape-{marker}"), Path(f"/tmp/airflow-gpu-escape-{marker}"),
                  Path(f"/airflow-gpu-escape-{marker}")]
    script = f"""
import os
os.makedirs("/airflow/xcom", exist_ok=True)
open("/airflow/xcom/return.json", "w").write('{{"answer": 42}}')
open("/etc/airflow-gpu-escape-{marker}", "w").write("x")
open("/tmp/airflow-gpu-escape-{marker}", "w").write("x")
os.makedirs("/airflow-gpu-escape-{marker}/deep")
open("here.txt", "w").write("cwd is the pod directory")
print(os.listdir("{kube_cluster.state_dir}"))
"""
    core.create_namespaced_pod(ns, {"metadata": {"name": "escape"}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "main", "image": "x", "command": py(script)}]}})
    pod = wait_phase(core, ns, "escape")
    text = pod_log(core, ns, "escape")
    assert pod.status.phase == "Succeeded", text
    for path in host_paths + [Path("/airflow/xcom/return.json")]:
        assert not path.exists(), f"{path} was written on the host"
    pdir = pod_dir(kube_cluster, pod)
    assert (pdir / "here.txt").read_text() == "cwd is the pod directory"
    uppers = list((pdir / ".rootfs").glob("main-*/upper"))
    assert len(uppers) == 1
    assert json.loads((uppers[0] / "airflow/xcom/return.json").read_text()) == {"answer": 42}
    assert (uppers[0] / f"etc/airflow-gpu-escape-{marker}").exists()
    # the cluster's state dir (store log with every Secret, admin kubeconfig) is hidden: only pods/ shows
    assert "['pods']" in text


def test_xcom_through_a_shared_emptydir_between_containers(kube_cluster, ns):
    """The KubernetesPodOperator layout: base writes /airflow/xcom/return.json, the sidecar reads it."""
    core = kube_cluster.core()
    mount = [{"name": "xcom", "mountPath": "/airflow/xcom"}]
    core.create_namespaced_pod(ns, {"metadata": {"name": "xcom"}, "spec": {
        "restartPolicy": "Never", "volumes": [{"name": "xcom", "emptyDir": {}}],
        "containers": [
            {"name": "base", "image": "x", "volumeMounts": mount,
             "command": py("import json; json.dump({'rows': 7}, open('/airflow/xcom/return.json', 'w'))")},
            {"name": "airflow-xcom-sidecar", "image": "alpine", "volumeMounts": mount, "command": py(
                "import os, time\n"
                "while not os.path.exists('/airflow/xcom/return.json'): time.sleep(0.05)\n"
                "time.sleep(0.2); print(open('/airflow/xcom/return.json').read())")},
        ]}})
    pod = wait_phase(core, ns, "xcom")
    assert pod.status.phase == "Succeeded"
    assert json.loads(pod_log(core, ns, "xcom", "airflow-xcom-sidecar").strip()) == {"rows": 7}
    assert not Path("/airflow/xcom/return.json").exists()


def test_missing_configmap_keeps_the_pod_creating_until_it_exists(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, {"metadata": {"name": "waits"}, "spec": {
        "restartPolicy": "Never", "volumes": [{"name": "cfg", "configMap": {"name": "later"}}],
        "containers": [{"name": "main", "image": "x", "command": py("print(open('/cfg/k').read())"),
                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}})

    def failed_mount():
        events = core.list_namespaced_event(ns, field_selector="involvedObject.name=waits").items
        return [e for e in events if e.reason == "FailedMount"]
    wait_until(failed_mount, 30, 0.1, "a FailedMount event")
    assert 'configmap "later" not found' in failed_mount()[0].message
    assert core.read_namespaced_pod("waits", ns).status.phase == "Pending"
    core.create_namespaced_config_map(ns, {"metadata": {"name": "later"}, "data": {"k": "finally"}})
    pod = wait_phase(core, ns, "waits")
    assert pod.status.phase == "Succeeded"
    assert pod_log(core, ns, "waits").strip() == "finally"


@pytest.mark.parametrize("volume, field, words", [
    ({"name": "h", "hostPath": {"path": "/var/lib"}}, "spec.volumes[0].hostPath", "hostPath volumes are refused"),
    ({"name": "p", "persistentVolumeClaim": {"claimName": "data"}}, "spec.volumes[0].persistentVolumeClaim",
     "no persistent volumes"),
])
def test_host_path_and_pvc_are_refused_at_admission(kube_cluster, ns, volume, field, words):
    core = kube_cluster.core()
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, {"metadata": {"name": "refused"}, "spec": {
            "volumes": [volume], "containers": [{"name": "main", "image": "x", "command": ["true"],
                                                 "volumeMounts": [{"name": volume["name"], "mountPath": "/data"}]}]}})
    assert err.value.status == 422
    status = json.loads(err.value.body)
    causes = {c["field"]: c["message"] for c in status["details"]["causes"]}
    assert words in causes[field] and "use emptyDir" in causes[field]


def test_mount_of_an_undeclared_volume_is_refused_with_kubectl(kube_cluster, ns):
    manifest = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nomount", "namespace": ns},
                           "spec": {"containers": [{"name": "main", "image": "x", "volumeMounts": [
                               {"name": "ghost", "mountPath": "/ghost"}]}]}})
    result = kube_cluster.kubectl("apply", "-f", "-", input=manifest, check=False)
    assert result.returncode == 1
    assert 'spec.containers[0].volumeMounts[0].name: Not found: "ghost"' in result.stderr


def test_a_container_sees_and_signals_only_its_own_processes(kube_cluster, ns):
    """KubernetesPodOperator stops its XCom sidecar with `kill -2 $(pgrep -u $(id -u) -f 'sh')` run by
    exec: in the container's PID namespace that reaches the sidecar only, never a shell of the host."""
    import os
    import signal
    import subprocess

    core = kube_cluster.core()
    # a shell on the host whose command line matches the pattern; it must survive the kill
    bystander = subprocess.Popen(["sh", "-c", "trap 'exit 9' INT; while true; do sleep 0.1; done"],
                                 start_new_session=True)
    try:
        core.create_namespaced_pod(ns, {"metadata": {"name": "sidecar"}, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "airflow-xcom-sidecar", "image": "alpine",
                            "command": ["sh", "-c", 'trap "exit 0" INT; while true; do sleep 1; done;']}]}})
        wait_phase(core, ns, "sidecar", ("Running",))
        pids = kube_cluster.kubectl("exec", "sidecar", "-n", ns, "--", "sh", "-c", "ls /proc | grep '^[0-9]'").stdout
        seen = sorted(int(p) for p in pids.split())
        assert seen[0] == 1 and str(os.getpid()) not in pids.split() and len(seen) < 8, seen
        kube_cluster.kubectl("exec", "sidecar", "-n", ns, "--", "sh", "-c",
                             "kill -2 $(pgrep -u $(id -u) -f 'sh')", check=False)
        pod = wait_phase(core, ns, "sidecar", timeout=30)
        assert pod.status.phase == "Succeeded"  # the sidecar's trap ran: exit 0
        assert bystander.poll() is None, "a host process was signalled from inside a container"
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)
        bystander.wait()
