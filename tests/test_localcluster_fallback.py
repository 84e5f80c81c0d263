"""When a container cannot be given a private mount namespace (isolation.py): a cluster without
CAP_SYS_ADMIN (started under setpriv, which drops it from the bounding set, as in an unprivileged
container) runs no container unconfined: each fails to start with a Warning Event naming the reason and
the fix. With `podIsolation: none` (the fix for such machines, chosen knowingly) containers run on the
host filesystem: they start (without the service-account token, which nothing can show at its path),
and a pod that asks for volumeMounts or a read-only root gets a StartError instead of a silently
unmounted volume."""

from __future__ import annotations

import json
import sys
import uuid

from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import wait_until
from airflow_gpu.localcluster.kubelet.security import SETPRIV

SPEC = {"name": "fallback", "pools": [{"name": "cpu", "count": 1, "cpu": "8", "memory": "16Gi"}]}


def finished(core, name: str):
    return wait_until(lambda: (lambda p: p if p.status.phase in ("Succeeded", "Failed") else None)(
        core.read_namespaced_pod(name, "default")), 60, 0.1, f"pod {name} finished")


def pod(name: str, script: str, **extra) -> dict:
    container = {"name": "main", "image": "python:3.11", "command": [sys.executable, "-c", script], **extra}
    volumes = [{"name": "scratch", "emptyDir": {}}] if "volumeMounts" in extra else []
    return {"metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "volumes": volumes, "containers": [container]}}


def start_error(core, name: str) -> str:
    done = finished(core, name)
    state = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed" and state.reason == "StartError"
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    assert any(e.type == "Warning" and e.reason == "Failed" and e.message == f"Error: {state.message}" for e in events)
    return state.message


def test_without_cap_sys_admin_no_container_runs_unconfined(tmp_path):
    marker = tmp_path / f"written-{uuid.uuid4().hex[:6]}"
    with start_kube_cluster(tmp_path / "c", SPEC, launcher=(SETPRIV, "--bounding-set=-sys_admin", "--")) as cluster:
        core = cluster.core()
        core.create_namespaced_pod("default", pod("confined", f"open({str(marker)!r}, 'w').write('x')"))
        message = start_error(core, "confined")
        assert "the container's filesystem cannot be confined" in message
        assert "unshare(CLONE_NEWNS): Operation not permitted" in message and "CAP_SYS_ADMIN" in message
        assert "podIsolation: none" in message  # the fix is named
        assert not marker.exists()  # nothing ran on the host instead
        assert "containers with a command will not start" in (cluster.state_dir.parent / "cluster.log").read_text()


def test_pod_isolation_none_runs_on_the_host_filesystem(tmp_path):
    marker = tmp_path / f"written-{uuid.uuid4().hex[:6]}"
    script = (f"import json, os; open({str(marker)!r}, 'w').write('x'); "
              "print(json.dumps({'service': 'KUBERNETES_SERVICE_HOST' in os.environ, "
              "'token': os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token')}))")
    with start_kube_cluster(tmp_path / "c", {**SPEC, "podIsolation": "none"}) as cluster:
        core = cluster.core()
        core.create_namespaced_pod("default", pod("host", script))
        core.create_namespaced_pod("default", pod("mounts", "print('never')",
                                                  volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}]))
        core.create_namespaced_pod("default", pod("read-only", "print('never')",
                                                  securityContext={"readOnlyRootFilesystem": True}))
        host = finished(core, "host")
        assert host.status.phase == "Succeeded"
        log = core.read_namespaced_pod_log("host", "default", _preload_content=False).data.decode()
        # the injected token volume is not shown (no mount namespace): no in-cluster credentials
        assert json.loads(log.strip().splitlines()[-1]) == {"service": True, "token": False}
        assert marker.read_text() == "x"  # unconfined: on the host, as chosen
        for name in ("mounts", "read-only"):
            assert "need podIsolation: mountns" in start_error(core, name)
