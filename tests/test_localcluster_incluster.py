"""In-cluster clients on the local cluster: default ServiceAccounts, the TokenRequest API and projected
tokens, the official client's load_incluster_config() inside a pod over TLS, RBAC enforced for
service-account tokens, and `kubectl auth can-i` / `auth whoami` / `create token`; deploy/'s scheduler
RBAC is enough for the real scheduler running as a pod, and no wider."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools.gangs import create_gang, gang_binding_state, list_pods
from airflow_gpu.devtools.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SEED = REPO / "examples" / "seed-quotas.yaml"
TEAM_NS = "team-vision"


@pytest.fixture
def ns(kube_cluster):
    name = f"ic-{uuid.uuid4().hex[:8]}"
    kube_cluster.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def incluster(kube_cluster) -> tuple[str, str]:
    info = json.loads((kube_cluster.state_dir / "cluster.json").read_text())
    return info["inClusterServer"], info["inClusterCA"]


def token_client(kube_cluster, token: str) -> client.ApiClient:
    server, ca = incluster(kube_cluster)
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = server, ca
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def token_kubeconfig(kube_cluster, token: str, path: Path, namespace: str) -> Path:
    server, ca = incluster(kube_cluster)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}]}))
    return path


def kubectl_as(kube_cluster, kubeconfig: Path, *args, check=True):
    return kube_cluster.kubectl("--kubeconfig", str(kubeconfig), *args, check=check)


def grant(kube_cluster, ns: str, account: str, rules: list[dict]) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_cluster.api_client())
    rbac.create_namespaced_role(ns, {"metadata": {"name": f"{account}-role"}, "rules": rules})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": f"{account}-binding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{account}-role"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]})


def wait_done(core, ns, name, timeout=60.0) -> client.V1Pod:
    wait_until(lambda: core.read_namespaced_pod(name, ns).status.phase in ("Succeeded", "Failed"), timeout, 0.1,
               f"pod {name} done")
    return core.read_namespaced_pod(name, ns)


def pod_log(core, ns, name) -> str:
    return core.read_namespaced_pod_log(name, ns, _preload_content=False).data.decode()


def test_every_namespace_gets_a_default_service_account_and_the_root_ca(kube_cluster, ns):
    core = kube_cluster.core()
    assert core.read_namespaced_service_account("default", ns).metadata.uid
    ca = core.read_namespaced_config_map("kube-root-ca.crt", ns).data["ca.crt"]
    assert ca == Path(incluster(kube_cluster)[1]).read_text()
    names = kube_cluster.kubectl("get", "serviceaccounts", "-n", ns, "-o", "name").stdout.split()
    assert names == ["serviceaccount/default"]


def test_a_pod_naming_a_missing_service_account_is_refused(kube_cluster, ns):
    core = kube_cluster.core()
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {
            "serviceAccountName": "ghost", "containers": [{"name": "main", "image": "x"}]}})
    assert err.value.status == 403
    assert f'error looking up service account {ns}/ghost: serviceaccount "ghost" not found' in \
        json.loads(err.value.body)["message"]


def test_admission_adds_the_token_volume_unless_automount_is_off(kube_cluster, ns):
    core = kube_cluster.core()
    pod = core.create_namespaced_pod(ns, {"metadata": {"name": "auto"}, "spec": {
        "containers": [{"name": "main", "image": "x"}], "schedulerName": "nobody"}})
    volume = next(v for v in pod.spec.volumes if v.name.startswith("kube-api-access-"))
    paths = sorted(s.service_account_token.path if s.service_account_token else
                   (s.config_map.items[0].path if s.config_map else s.downward_api.items[0].path)
                   for s in volume.projected.sources)
    assert paths == ["ca.crt", "namespace", "token"]
    assert [(m.mount_path, m.read_only) for m in pod.spec.containers[0].volume_mounts] == [(TOKEN_DIR, True)]
    core.create_namespaced_service_account(ns, {"metadata": {"name": "quiet"}, "automountServiceAccountToken": False})
    quiet = core.create_namespaced_pod(ns, {"metadata": {"name": "quiet"}, "spec": {
        "serviceAccountName": "quiet", "containers": [{"name": "main", "image": "x"}], "schedulerName": "nobody"}})
    assert not quiet.spec.volumes and not quiet.spec.containers[0].volume_mounts


def test_pod_uses_load_incluster_config_under_its_service_account(kube_cluster, ns):
    """The official client inside a pod: token and CA at the standard paths, TLS, RBAC of its account."""
    core = kube_cluster.core()
    core.create_namespaced_service_account(ns, {"metadata": {"name": "lister"}})
    grant(kube_cluster, ns, "lister", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    script = f"""
import json, os
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_incluster_config()
api = client.CoreV1Api()
ns = open("{TOKEN_DIR}/namespace").read()
out = {{"ns": ns, "kubeconfig": os.environ.get("KUBECONFIG"), "host": client.Configuration.get_default_copy().host,
        "pods": sorted(p.metadata.name for p in api.list_namespaced_pod(ns).items)}}
for what, call in (("other_ns", lambda: api.list_namespaced_pod("default")),
                   ("delete", lambda: api.delete_namespaced_pod("reader", ns)),
                   ("secrets", lambda: api.list_namespaced_secret(ns))):
    try:
        call()
        out[what] = "allowed"
    except ApiException as exc:
        out[what] = exc.status
print(json.dumps(out))
"""
    core.create_namespaced_pod(ns, {"metadata": {"name": "reader"}, "spec": {
        "serviceAccountName": "lister", "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "x", "command": [sys.executable, "-c", script]}]}})
    pod = wait_done(core, ns, "reader")
    text = pod_log(core, ns, "reader")
    assert pod.status.phase == "Succeeded", text
    seen = json.loads(text.strip().splitlines()[-1])
    assert seen["ns"] == ns and seen["kubeconfig"] is None
    assert seen["host"] == incluster(kube_cluster)[0]
    assert seen["pods"] == ["reader"]
    assert seen["other_ns"] == 403 and seen["delete"] == 403 and seen["secrets"] == 403


def test_kubectl_create_token_auth_whoami_and_can_i(kube_cluster, ns, tmp_path):
    core = kube_cluster.core()
    core.create_namespaced_service_account(ns, {"metadata": {"name": "bot"}})
    grant(kube_cluster, ns, "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
                                    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}])
    token = kube_cluster.kubectl("create", "token", "bot", "-n", ns, "--duration=15m").stdout.strip()
    assert token.count(".") == 2
    cfg = token_kubeconfig(kube_cluster, token, tmp_path / "bot.kubeconfig", ns)
    whoami = json.loads(kubectl_as(kube_cluster, cfg, "auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:bot"
    assert f"system:serviceaccounts:{ns}" in whoami["status"]["userInfo"]["groups"]
    assert kubectl_as(kube_cluster, cfg, "auth", "can-i", "list", "configmaps").stdout.strip() == "yes"
    assert kubectl_as(kube_cluster, cfg, "auth", "can-i", "get", "pods", "--subresource=log").stdout.strip() == "yes"
    denied = kubectl_as(kube_cluster, cfg, "auth", "can-i", "delete", "configmaps", check=False)
    assert denied.returncode == 1 and denied.stdout.strip() == "no"
    assert kubectl_as(kube_cluster, cfg, "get", "configmaps", "-o", "name").stdout.split() == ["configmap/kube-root-ca.crt"]
    forbidden = kubectl_as(kube_cluster, cfg, "get", "pods", "-n", "default", check=False)
    assert forbidden.returncode == 1
    assert (f'pods is forbidden: User "system:serviceaccount:{ns}:bot" cannot list resource "pods" in API group "" '
            'in the namespace "default"') in forbidden.stderr
    # the admin: whoami, and can-i anything
    admin = json.loads(kube_cluster.kubectl("auth", "whoami", "-o", "json").stdout)
    assert "system:masters" in admin["status"]["userInfo"]["groups"]
    assert kube_cluster.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    # a deleted service account's tokens stop working at once
    core.delete_namespaced_service_account("bot", ns)
    gone = kubectl_as(kube_cluster, cfg, "get", "configmaps", check=False)
    assert gone.returncode == 1 and "Unauthorized" in gone.stderr


def test_token_review_and_audience(kube_cluster, ns):
    core = kube_cluster.core()
    other = core.create_namespaced_service_account_token(
        "default", ns, {"spec": {"audiences": ["vault"], "expirationSeconds": 600}}).status.token
    with pytest.raises(ApiException) as err:  # a token for another audience is not an API credential
        client.CoreV1Api(token_client(kube_cluster, other)).list_namespaced_config_map(ns)
    assert err.value.status == 401
    auth = client.AuthenticationV1Api(kube_cluster.api_client())
    review = auth.create_token_review({"spec": {"token": other, "audiences": ["vault"]}})
    assert review.status.authenticated and review.status.user.username == f"system:serviceaccount:{ns}:default"
    assert not auth.create_token_review({"spec": {"token": other}}).status.authenticated


def _apply_deploy_rbac(kube_cluster) -> None:
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "priorityclasses.yaml"):
        kube_cluster.kubectl("apply", "-f", str(REPO / "deploy" / "base" / name))
    # the teams' namespaces and quotas of the seed config (the scheduler places gangs of known teams only)
    rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    kube_cluster.kubectl("apply", "-f", "-", input=rendered)


def test_deploy_rbac_runs_the_scheduler_in_cluster_and_no_wider(kube_cluster, ns):
    """The real scheduler as a pod with deploy/'s ServiceAccount and RBAC: it takes its Lease and binds a
    gang; its token is refused (403) everything deploy/rbac.yaml does not grant."""
    _apply_deploy_rbac(kube_cluster)
    core = kube_cluster.core()
    system = "airflow-gpu-system"
    core.create_namespaced_config_map(system, {"metadata": {"name": "airflow-gpu-quotas"}, "data": {
        "quotas.yaml": SEED.read_text()}})
    core.create_namespaced_pod(system, {"metadata": {"name": "scheduler"}, "spec": {
        "serviceAccountName": "airflow-gpu-scheduler", "restartPolicy": "Never",
        "volumes": [{"name": "quotas", "configMap": {"name": "airflow-gpu-quotas"}}],
        "containers": [{"name": "scheduler", "image": "airflow-gpu:0.1.0",
                        "command": [sys.executable, "-m", "airflow_gpu", "scheduler",
                                    "--config=/etc/airflow-gpu/quotas.yaml", f"--leader-elect-namespace={system}",
                                    "--identity=$(POD_NAME)", "--retry-period=0.5"],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "volumeMounts": [{"name": "quotas", "mountPath": "/etc/airflow-gpu", "readOnly": True}]}]}})
    try:
        api = kube_cluster.api_client()
        names = create_gang(api, TEAM_NS, "pair", members=2, gpus=1, sim_seconds=60,
                            priority_class="airflow-gpu-production-training")

        def bound():
            return gang_binding_state(list_pods(api, TEAM_NS)).get(f"{TEAM_NS}/pair") == (2, 2)
        wait_until(bound, 90, 0.2, lambda: f"gang bound by the in-cluster scheduler:\n{pod_log(core, system, 'scheduler')}")
        lease = client.CoordinationV1Api(api).read_namespaced_lease("airflow-gpu-scheduler", system)
        assert lease.spec.holder_identity == "scheduler"
        text = pod_log(core, system, "scheduler")
        assert "403" not in text and "Forbidden" not in text, text
        assert core.read_namespaced_pod("scheduler", system).status.phase == "Running"
        assert all(core.read_namespaced_pod(n, TEAM_NS).spec.node_name for n in names)
    finally:
        core.delete_namespaced_pod("scheduler", system, grace_period_seconds=0)

    token = core.create_namespaced_service_account_token("airflow-gpu-scheduler", system, {"spec": {}}).status.token
    as_scheduler = token_client(kube_cluster, token)
    sched_core = client.CoreV1Api(as_scheduler)
    assert sched_core.list_pod_for_all_namespaces(limit=1).items is not None  # granted: pods list
    sched_core.read_namespaced_pod(names[0], TEAM_NS)  # granted: pods get
    forbidden = {
        "create pods": lambda: sched_core.create_namespaced_pod(ns, {"metadata": {"name": "x"}, "spec": {
            "containers": [{"name": "m", "image": "x"}]}}),
        "delete pods": lambda: sched_core.delete_namespaced_pod(names[0], TEAM_NS),
        "list secrets": lambda: sched_core.list_secret_for_all_namespaces(),
        "patch nodes": lambda: sched_core.patch_node("cpu-0", {"metadata": {"labels": {"x": "y"}}}),
        "get other leases": lambda: client.CoordinationV1Api(as_scheduler).read_namespaced_lease("other", system),
        "leases elsewhere": lambda: client.CoordinationV1Api(as_scheduler).read_namespaced_lease(
            "airflow-gpu-scheduler", ns),
    }
    statuses = {}
    for what, call in forbidden.items():
        try:
            call()
            statuses[what] = "allowed"
        except ApiException as exc:
            statuses[what] = exc.status
    assert statuses == {what: 403 for what in forbidden}
