"""securityContext on the local cluster (security.py), through the official client and kubectl: the
user, groups, capabilities and no_new_privs a container process runs with (also for `kubectl exec`),
a read-only root, runAsNonRoot refusing to start a root container, 422 for what a local process
cannot be given, and a root that shows none of the host's files but an image's (isolation.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

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


PRIVILEGED_OPS = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(result):
    return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]
name = socket.gethostname().encode()
os.makedirs("/mnt/probe", exist_ok=True)
print(json.dumps({
    "cap_bnd": next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapBnd:")),
    "cap_inh": next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapInh:")),
    "mount": call(libc.mount(b"tmpfs", b"/mnt/probe", b"tmpfs", 0, None)),  # its own mount namespace
    "sethostname": call(libc.sethostname(name, len(name))),  # the same name: the host's stays as it is
    "nice": call(libc.setpriority(0, 0, -1)),  # raising its priority takes CAP_SYS_NICE
    # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create): needs no capability
    "keyctl": "ok" if libc.syscall(250, 0, -3, 1) >= 0 else errno.errorcode[ctypes.get_errno()],
}), flush=True)
"""
DEFAULT_CAPS_MASK = sum(1 << bit for bit in (0, 1, 4, 3, 27, 13, 6, 7, 31, 8, 10, 18, 5, 29))  # containerd's 14


def test_every_container_gets_the_runtimes_default_capabilities(kube_cluster, ns):
    """A container naming no capabilities has containerd's default set, as on a node: it cannot mount,
    set the host name or raise its priority; `add` adds exactly what it names; privileged keeps them all."""
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod("plain", script=PRIVILEGED_OPS))
    core.create_namespaced_pod(ns, pod("net-admin", sc={"capabilities": {"add": ["NET_ADMIN"]}}, script=PRIVILEGED_OPS))
    core.create_namespaced_pod(ns, pod("privileged", sc={"privileged": True}, script=PRIVILEGED_OPS))
    plain = report(kube_cluster, ns, "plain")
    assert int(plain["cap_bnd"], 16) == DEFAULT_CAPS_MASK and plain["cap_inh"] == "0000000000000000"
    assert (plain["mount"], plain["sethostname"], plain["nice"]) == ("EPERM", "EPERM", "EACCES")
    assert plain["keyctl"] == "ok"  # no seccomp profile named: Unconfined, the kubelet's default
    net_admin = report(kube_cluster, ns, "net-admin")
    assert int(net_admin["cap_bnd"], 16) == DEFAULT_CAPS_MASK | 1 << 12  # CAP_NET_ADMIN
    own_bounding = next(int(l.split()[1], 16) for l in open("/proc/self/status") if l.startswith("CapBnd:"))
    privileged = report(kube_cluster, ns, "privileged")
    assert int(privileged["cap_bnd"], 16) == own_bounding  # the cluster's, started by this test process
    assert (privileged["mount"], privileged["sethostname"], privileged["nice"]) == ("ok", "ok", "ok")


def test_kubectl_exec_has_the_containers_capabilities(kube_cluster, ns):
    core = kube_cluster.core()
    core.create_namespaced_pod(ns, pod("sleeper", script="import time; time.sleep(60)"))
    wait_until(lambda: core.read_namespaced_pod("sleeper", ns).status.phase == "Running", 30, 0.1, "running")
    out = kube_cluster.kubectl("exec", "sleeper", "-n", ns, "--", "grep", "CapEff", "/proc/self/status").stdout
    assert int(out.split()[1], 16) == DEFAULT_CAPS_MASK
    core.delete_namespaced_pod("sleeper", ns, grace_period_seconds=0)


UNSHARE_USER = """
import json, subprocess
run = subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True)
print(json.dumps({"unshare": run.returncode, "stderr": run.stderr.strip()}), flush=True)
"""


def test_seccomp_runtime_default_is_enforced_and_unconfined_is_not(kube_cluster, ns):
    """RuntimeDefault is containerd's default profile: keyctl, unshare and odd personalities get EPERM
    (also under `kubectl exec`). keyctl works in an Unconfined container of the same pod spec, unshare
    --user outside (inside, the container's chroot refuses a user namespace whatever its profile)."""
    core = kube_cluster.core()
    runtime_default = {"seccompProfile": {"type": "RuntimeDefault"}}
    core.create_namespaced_pod(ns, pod("confined", runtime_default, script=PRIVILEGED_OPS))
    core.create_namespaced_pod(ns, pod("unconfined", runtime_default, {"seccompProfile": {"type": "Unconfined"}},
                                       script=PRIVILEGED_OPS))
    core.create_namespaced_pod(ns, pod("unshare", sc=runtime_default, script=UNSHARE_USER))
    confined, unconfined = report(kube_cluster, ns, "confined"), report(kube_cluster, ns, "unconfined")
    assert confined["keyctl"] == "EPERM" and unconfined["keyctl"] == "ok"
    assert (confined["mount"], confined["nice"]) == ("EPERM", "EACCES")
    unshare = report(kube_cluster, ns, "unshare")
    assert unshare["unshare"] == 1 and "Operation not permitted" in unshare["stderr"]
    assert subprocess.run(["unshare", "--user", "true"]).returncode == 0  # outside: allowed
    sleeper = pod("sleeper", runtime_default, script="import time; time.sleep(60)")
    core.create_namespaced_pod(ns, sleeper)
    wait_until(lambda: core.read_namespaced_pod("sleeper", ns).status.phase == "Running", 30, 0.1, "running")
    execd = kube_cluster.kubectl("exec", "sleeper", "-n", ns, "--", "setarch", "-R", "true", check=False)
    assert execd.returncode != 0 and "Operation not permitted" in execd.stderr  # personality(ADDR_NO_RANDOMIZE)
    core.delete_namespaced_pod("sleeper", ns, grace_period_seconds=0)


def test_the_runtime_default_profile_follows_the_containers_capabilities():
    """As containerd's DefaultProfile: CAP_SYS_ADMIN in the bounding set allows unshare (a user namespace
    here, outside any chroot), the default set does not; clone3 answers ENOSYS so libc falls back."""
    from airflow_gpu.localcluster.kubelet import seccomp
    from airflow_gpu.localcluster.kubelet.security import DEFAULT_CAPS

    def run(caps, *argv):
        return subprocess.run(seccomp.loader_argv(seccomp.runtime_default(caps)) + list(argv),
                              capture_output=True, text=True)
    denied = run(DEFAULT_CAPS, "unshare", "--user", "true")
    assert denied.returncode == 1 and "Operation not permitted" in denied.stderr
    assert run((*DEFAULT_CAPS, "SYS_ADMIN"), "unshare", "--user", "true").returncode == 0
    clone3 = run(DEFAULT_CAPS, sys.executable, "-c", "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                 "print(libc.syscall(435, None, 0), ctypes.get_errno())")  # clone3(NULL, 0)
    assert clone3.stdout.split() == ["-1", "38"]  # ENOSYS


READ_ALL = """
import errno, json, os, stat, sys
def read(path):
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        return "read"
    except OSError as exc:
        return errno.errorcode[exc.errno]
import airflow_gpu  # this project's Python runs: the interpreter, its packages and the source are there
print(json.dumps({"reads": {path: read(path) for path in sys.argv[1:]},
                  "disks": sorted(n for n in os.listdir("/dev") if stat.S_ISBLK(os.stat("/dev/" + n).st_mode)),
                  "tmp": sorted(os.listdir("/tmp")), "etc": sorted(os.listdir("/etc"))}), flush=True)
"""


def test_a_pod_reads_no_host_secret(kube_cluster, ns, tmp_path):
    """Even as root (which reads any file on the host): a 0600 file under /tmp, a token file outside the
    state dir, the cluster's admin kubeconfig and cluster.json, /etc/shadow and the Airflow password file
    are not there; /dev has no disk; /etc is an image's (passwd, no shadow) and /tmp holds nothing of the host's."""
    private = tmp_path / "private.key"
    private.write_text("host secret")
    token_file = tmp_path / "cluster-token"
    token_file.write_text("admin-token")
    passwords = Path(os.environ["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    created = not passwords.exists()
    if created:
        passwords.write_text('{"admin": "hunter2"}')
    for path in (private, token_file, passwords):
        os.chmod(path, 0o600)
    secrets = [str(private), str(token_file), str(kube_cluster.kubeconfig), str(kube_cluster.state_dir / "cluster.json"),
               "/etc/shadow", "/etc/gshadow", str(passwords)]
    assert all(os.path.exists(p) for p in secrets), "the host files the pod must not see are there"
    try:
        body = pod("reader", script=READ_ALL)
        body["spec"]["containers"][0]["command"] += [*secrets, "/etc/passwd"]
        kube_cluster.core().create_namespaced_pod(ns, body)
        seen = report(kube_cluster, ns, "reader")
    finally:
        if created:
            passwords.unlink()
    assert {p: seen["reads"][p] for p in secrets} == {p: "ENOENT" for p in secrets}
    assert seen["reads"]["/etc/passwd"] == "read"
    # /tmp holds only the paths to the pod's own directory (the tests' state dir is under /tmp) and to
    # the Python the pod runs (mounted read-only: a checkout under /tmp puts its .venv there)
    expected = {path.relative_to("/tmp").parts[0] for path in (kube_cluster.state_dir.resolve(), Path(sys.prefix).resolve())
                if path.is_relative_to("/tmp")}
    assert sorted(seen["tmp"]) == sorted(expected)
    assert seen["disks"] == []
    assert "passwd" in seen["etc"] and not {"shadow", "gshadow", "sudoers", "ssh"} & set(seen["etc"])
