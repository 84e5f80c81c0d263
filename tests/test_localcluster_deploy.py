"""deploy/ on the local cluster as on a real one (issue 12 acceptance): `kubectl apply -k deploy/` exits 0,
the scheduler runs as the Deployment's pods (the manifest's own command) with in-cluster config under
deploy/'s ServiceAccount and RBAC, one replica holds the Lease and binds a gang, and
`kubectl rollout restart` hands leadership over to a pod of the new ReplicaSet, which binds again.
That the RBAC is no wider than needed (403 on the rest) is tested in test_localcluster_incluster.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kubernetes import client

from airflow_gpu.devtools.gangs import create_gang, gang_binding_state, list_pods
from airflow_gpu.devtools.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
QUOTAS = REPO / "deploy" / "base" / "quotas.yaml"  # what apply -k ships as the airflow-gpu-quotas ConfigMap
SYSTEM, TEAM_NS, LEASE = "airflow-gpu-system", "team-research", "airflow-gpu-scheduler"
SELECTOR = "app.kubernetes.io/name=airflow-gpu-scheduler"


def _scheduler_pods(core) -> list[client.V1Pod]:
    return [p for p in core.list_namespaced_pod(SYSTEM, label_selector=SELECTOR).items
            if not p.metadata.deletion_timestamp]


def _holder(api) -> str | None:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(LEASE, SYSTEM).spec.holder_identity
    except client.ApiException:
        return None


def _logs(kube_cluster) -> str:
    return kube_cluster.kubectl("logs", "-n", SYSTEM, "-l", SELECTOR, "--tail=20", "--prefix", check=False).stdout


def _bind_gang(kube_cluster, api, name: str) -> None:
    create_gang(api, TEAM_NS, name, members=2, gpus=1, sim_seconds=120, priority_class="airflow-gpu-production-training")
    wait_until(lambda: gang_binding_state(list_pods(api, TEAM_NS)).get(f"{TEAM_NS}/{name}") == (2, 2), 120, 0.2,
               lambda: f"gang {name} bound by the in-cluster scheduler:\n{_logs(kube_cluster)}")


def test_apply_k_deploy_runs_the_scheduler_in_cluster_and_rollout_restart_hands_over(kube_cluster):
    core, api = kube_cluster.core(), kube_cluster.api_client()
    applied = kube_cluster.kubectl("apply", "-k", str(REPO / "deploy"))
    assert "deployment.apps/airflow-gpu-scheduler created" in applied.stdout
    rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(QUOTAS)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    kube_cluster.kubectl("apply", "-f", "-", input=rendered)  # the teams' namespaces and quotas
    kube_cluster.kubectl("-n", SYSTEM, "rollout", "status", "deployment/airflow-gpu-scheduler", "--timeout=120s",
                         timeout=150)

    pods = {p.metadata.name: p for p in _scheduler_pods(core)}
    wait_until(lambda: _holder(api) in pods, 60, 0.2, lambda: f"a replica holds the Lease:\n{_logs(kube_cluster)}")
    first_leader = _holder(api)
    for pod in pods.values():
        assert pod.spec.service_account_name == "airflow-gpu-scheduler"
        assert not any(e.name == "KUBECONFIG" for c in pod.spec.containers for e in c.env or [])
    _bind_gang(kube_cluster, api, "before")
    # both replicas kept running (no crash loop, e.g. on the metrics port) and nothing was refused
    assert all(s.restart_count == 0 for p in _scheduler_pods(core) for s in p.status.container_statuses), \
        _logs(kube_cluster)
    assert "Forbidden" not in _logs(kube_cluster)

    kube_cluster.kubectl("-n", SYSTEM, "rollout", "restart", "deployment/airflow-gpu-scheduler")
    kube_cluster.kubectl("-n", SYSTEM, "rollout", "status", "deployment/airflow-gpu-scheduler", "--timeout=150s",
                         timeout=180)
    wait_until(lambda: not (set(pods) & {p.metadata.name for p in core.list_namespaced_pod(
        SYSTEM, label_selector=SELECTOR).items}), 90, 0.2, "the old replicas are gone")
    new_pods = {p.metadata.name for p in _scheduler_pods(core)}
    assert len(new_pods) == 2 and not new_pods & set(pods)
    wait_until(lambda: _holder(api) in new_pods, 90, 0.2,
               lambda: f"a new replica took the Lease from {first_leader}:\n{_logs(kube_cluster)}")
    _bind_gang(kube_cluster, api, "after")
