"""securityContext on the local cluster (security.py), through the official client and kubectl: the
user, groups, capabilities and no_new_privs a container process runs with (also for `kubectl exec`),
a read-only root, runAsNonRoot refusing to start a root container, and 422 for what a local process
cannot be given."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools.processes import wait_until

REPORT = """
import errno, json, os
def status(field):
    return next(l.split(":", 1)[1].strip() for l in open("/proc/self/status") if l.startswith(field + ":"))
def write(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
                  "cap_eff": status("CapEff"), "cap_bnd": status("CapBnd"), "no_new_privs": status("NoNewPrivs"),
                  "root": write("/opt-written-by-container"), "cwd": write("here.txt"),
                  "scratch": write("/scratch/file"), "shm": write("/dev/shm/file")}), flush=True)
"""


@pytest.fixture
def ns(kube_cluster):
    name = f"s-{uuid.uuid4().hex[:8]}"
    kube_cluster.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def pod(name: str, pod_sc: dict | None = None, sc: dict | None = None, script: str = REPORT) -> dict:
    return {"metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "securityContext": pod_sc or {},
                     "volumes": [{"name": "scratch", "emptyDir": {}}],
                     "containers": [{"name": "main", "image": "python:3.11", "securityContext": sc or {},
                                     "command": [sys.executable, "-c", script],
                                     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}


def report(kube_cluster, ns: str, name: str) -> dict:
    core = kube_cluster.core()
    wait_until(lambda: core.read_namespaced_pod(name, ns).status.phase in ("Succeeded", "Failed"), 60, 0.1,
               f"pod {name} finished")
    log = core.read_namespaced_pod_log(name, ns, _preload_content=False).data.decode()
    assert core.read_namespaced_pod(name, ns).status.phase == "Succeeded", log
    return json.loads(log.strip().splitlines()[-1])


def test_user_groups_and_a_read_only_root(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod("as-user", {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                                                   "supplementalGroups": [4000], "runAsNonRoot": True}))
    core.create_namespaced_pod(ns, pod("read-only", sc={"readOnlyRootFilesystem": True}))
    core.create_namespaced_pod(ns, pod("default"))
    user = report(kube_cluster, ns, "as-user")
    assert (user["uid"], user["gid"], user["groups"]) == (1000, 3000, [2000, 4000])
    assert user["cap_eff"] == "0000000000000000"  # a non-root process has no effective capabilities
    # the root is the image's (root-owned): a non-root user cannot write there, nor in its working dir
    assert (user["root"], user["cwd"], user["scratch"], user["shm"]) == ("EACCES", "EACCES", "ok", "ok")
    read_only = report(kube_cluster, ns, "read-only")
    assert read_only["uid"] == 0
    assert (read_only["root"], read_only["cwd"], read_only["scratch"], read_only["shm"]) == ("EROFS", "EROFS", "ok", "ok")
    plain = report(kube_cluster, ns, "default")
    assert (plain["uid"], plain["root"], plain["cwd"], plain["scratch"]) == (0, "ok", "ok", "ok")
    assert plain["no_new_privs"] == "0"


def test_kubectl_exec_runs_as_the_container_user(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod("sleeper", {"runAsUser": 1234}, script="import time; time.sleep(60)"))
    wait_until(lambda: core.read_namespaced_pod("sleeper", ns).status.phase == "Running", 30, 0.1, "running")
    out = kube_cluster.kubectl("exec", "sleeper", "-n", ns, "--", "id", "-u").stdout.strip()
    assert out == "1234"
    core.delete_namespaced_pod("sleeper", ns, grace_period_seconds=0)


def test_capabilities_and_no_new_privs(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod("caps", sc={"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                                                   "allowPrivilegeEscalation": False}))
    core.create_namespaced_pod(ns, pod("default-caps", sc={"capabilities": {"drop": ["NET_RAW"]}}))
    caps = report(kube_cluster, ns, "caps")
    assert caps["uid"] == 0 and int(caps["cap_bnd"], 16) == 1 << 10  # CAP_NET_BIND_SERVICE only
    assert int(caps["cap_eff"], 16) == 1 << 10 and caps["no_new_privs"] == "1"
    bounding = int(report(kube_cluster, ns, "default-caps")["cap_bnd"], 16)
    assert not bounding & (1 << 13) and bounding & (1 << 0) and not bounding & (1 << 21)  # no NET_RAW, CHOWN, no SYS_ADMIN


@pytest.mark.parametrize("pod_sc, message", [
    ({"runAsNonRoot": True}, "container has runAsNonRoot and image will run as root"),
    ({"runAsNonRoot": True, "runAsUser": 0}, "container's runAsUser breaks non-root policy"),
], ids=["no-user", "uid-0"])
def test_run_as_non_root_keeps_a_root_container_from_starting(kube_cluster, ns, pod_sc, message):
    core = kube_cluster.core()
    created = core.create_namespaced_pod(ns, pod("root", pod_sc))
    expected = f'{message} (pod: "root_{ns}({created.metadata.uid})", container: main)'
    waiting = wait_until(lambda: (lambda s: s[0].state.waiting if s and s[0].state.waiting and
                                  s[0].state.waiting.reason == "CreateContainerConfigError" else None)(
        core.read_namespaced_pod("root", ns).status.container_statuses), 30, 0.1, "CreateContainerConfigError")
    assert waiting.message == expected
    assert core.read_namespaced_pod("root", ns).status.phase == "Pending"
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=root").items
    assert any(e.reason == "Failed" and e.type == "Warning" and e.message == f"Error: {expected}" for e in events)
    core.delete_namespaced_pod("root", ns, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(ns).items, 30, 0.1, "pod deleted")


@pytest.mark.parametrize("pod_sc, sc, field, text", [
    ({"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}, {}, "spec.securityContext.sysctls",
     "cannot set sysctls"),
    ({}, {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
     "spec.containers[0].securityContext.seccompProfile.type", "Localhost seccomp profiles cannot be loaded"),
    ({"runAsUser": -1}, {}, "spec.securityContext.runAsUser", "must be between 0 and 2147483647, inclusive"),
    ({}, {"procMount": "Unmasked"}, "spec.containers[0].securityContext.procMount", "only procMount Default"),
], ids=["sysctls", "seccomp-localhost", "negative-uid", "proc-unmasked"])
def test_what_cannot_be_honoured_is_refused(kube_cluster, ns, pod_sc, sc, field, text):
    with pytest.raises(ApiException) as err:
        kube_cluster.core().create_namespaced_pod(ns, pod("refused", pod_sc, sc))
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    cause = next(c for c in body["details"]["causes"] if c["field"] == field)
    assert text in cause["message"] and field in body["message"]


def test_accepted_profiles_are_not_refused(kube_cluster, ns):
    """RuntimeDefault seccomp (deploy/'s scheduler asks for it) and SELinux options are accepted."""
    created = kube_cluster.core().create_namespaced_pod(ns, pod(
        "accepted", {"seccompProfile": {"type": "RuntimeDefault"}, "seLinuxOptions": {"level": "s0:c1"}},
        {"appArmorProfile": {"type": "RuntimeDefault"}}))
    assert created.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert report(kube_cluster, ns, "accepted")["uid"] == 0
