"""`airflow-gpu pools render-k8s`: Namespaces, ResourceQuotas and PriorityClasses that the Kubernetes
1.37 schemas accept in strict mode (unknown fields rejected)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from airflow_gpu.config import load_config
from airflow_gpu.pools.k8s import render_k8s

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return list(yaml.safe_load_all(out.stdout))


def test_every_manifest_is_valid_kubernetes_1_37_strict(docs):
    assert len(docs) == 4 + 5 * 3 + 2  # PriorityClasses, Namespace + 2 GPU quotas per team, 2 tier quotas
    for doc in docs:
        assert kubernetes_validate.validate(doc, "1.37", strict=True) == "1.37"


def test_strict_validation_can_fail(docs):
    quota = next(d for d in docs if d["kind"] == "ResourceQuota")
    bad = {**quota, "spec": {**quota["spec"], "hardd": {"pods": "1"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.37", strict=True)


def test_quotas_and_priority_classes_match_the_config(docs):
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    assert sorted(n["metadata"]["name"] for n in by_kind["Namespace"]) == sorted(
        f"team-{t}" for t in ("nlp", "vision", "recsys", "research", "serving"))
    quotas = {(q["metadata"]["namespace"], q["metadata"]["name"]): q["spec"] for q in by_kind["ResourceQuota"]}
    guaranteed_classes = ["airflow-gpu-inference", "airflow-gpu-interactive", "airflow-gpu-production-training"]
    for ns in ("team-nlp", "team-vision", "team-recsys", "team-research", "team-serving"):
        # every pod is counted by exactly one of the two: non-preemptible tiers' classes In, all others NotIn
        for name, op in (("airflow-gpu-guaranteed", "In"), ("airflow-gpu-preemptible", "NotIn")):
            (expr,) = quotas[(ns, name)]["scopeSelector"]["matchExpressions"]
            assert expr == {"scopeName": "PriorityClass", "operator": op, "values": guaranteed_classes}
    assert quotas[("team-nlp", "airflow-gpu-guaranteed")]["hard"] == {"requests.nvidia.com/gpu": "8"}
    assert quotas[("team-research", "airflow-gpu-guaranteed")]["hard"] == {"requests.nvidia.com/gpu": "8"}
    assert quotas[("team-research", "airflow-gpu-preemptible")]["hard"] == {"requests.nvidia.com/gpu": "16"}
    assert quotas[("team-serving", "airflow-gpu-guaranteed")]["hard"] == {
        "requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-1g.10gb": "22", "requests.nvidia.com/mig-3g.40gb": "2"}
    classes = {p["metadata"]["name"]: p for p in by_kind["PriorityClass"]}
    prod, best = classes["airflow-gpu-production-training"], classes["airflow-gpu-best-effort-training"]
    assert prod["value"] > best["value"] and prod["preemptionPolicy"] == "PreemptLowerPriority"
    assert best["preemptionPolicy"] == "Never" and not any(p["globalDefault"] for p in classes.values())
    # research may not run inference or production-training: zero pods at those PriorityClasses
    tiers = next(q for q in by_kind["ResourceQuota"]
                 if q["metadata"]["name"] == "airflow-gpu-tiers" and q["metadata"]["namespace"] == "team-research")
    (expr,) = tiers["spec"]["scopeSelector"]["matchExpressions"]
    assert tiers["spec"]["hard"] == {"pods": "0"} and expr["scopeName"] == "PriorityClass"
    assert sorted(expr["values"]) == ["airflow-gpu-inference", "airflow-gpu-production-training"]
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "airflow-gpu"


def test_deploy_priority_classes_match_render_k8s(repo_root):
    """deploy/priorityclasses.yaml is what `pools render-k8s` renders from the seed quotas: no drift."""
    rendered = {d["metadata"]["name"]: d for d in render_k8s(load_config(repo_root / "examples" / "seed-quotas.yaml"))
                if d["kind"] == "PriorityClass"}
    deployed = {d["metadata"]["name"]: d for d in yaml.safe_load_all((repo_root / "deploy" / "base" / "priorityclasses.yaml").read_text())}
    assert deployed.keys() == rendered.keys()
    for name, doc in deployed.items():
        assert (doc["value"], doc.get("preemptionPolicy")) == (rendered[name]["value"], rendered[name].get("preemptionPolicy")), name


def _gpu_pod(name: str, gpus: int, priority_class: str | None) -> dict:
    spec = {"schedulerName": "airflow-gpu-absent", "restartPolicy": "Never",  # stays pending: quota counts it
            "containers": [{"name": "main", "image": "python:3.11",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_resource_quotas_by_tier_class_on_the_cluster(kubeconfig, repo_root):
    """The acceptance case of issue 11 §3 on the local cluster: with one 8-GPU best-effort gang pending in
    team-nlp (quota 8), an 8-GPU production pod is admitted at creation (the scheduler decides at binding);
    a second best-effort pod, or one without a PriorityClass, is refused with 403 "exceeded quota"."""
    from kubernetes import client, config as kconfig
    from kubernetes.client.rest import ApiException

    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")
    api = kconfig.new_client_from_config(config_file=kubeconfig)
    core, sched = client.CoreV1Api(api), client.SchedulingV1Api(api)
    for doc in render_k8s(cfg):
        if doc["kind"] == "PriorityClass":
            sched.create_priority_class(doc)
        elif doc["kind"] == "Namespace":
            core.create_namespace(doc)
        elif doc["metadata"]["namespace"] == "team-nlp":
            core.create_namespaced_resource_quota("team-nlp", doc)
    core.create_namespaced_pod("team-nlp", _gpu_pod("sweep-0", 8, "airflow-gpu-best-effort-training"))
    core.create_namespaced_pod("team-nlp", _gpu_pod("finetune-0", 8, "airflow-gpu-production-training"))
    for name, pc in (("sweep-1", "airflow-gpu-best-effort-training"), ("plain-0", None)):
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod("team-nlp", _gpu_pod(name, 1, pc))
        assert refused.value.status == 403 and "exceeded quota: airflow-gpu-preemptible" in refused.value.body
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("team-nlp", _gpu_pod("finetune-1", 1, "airflow-gpu-inference"))
    assert refused.value.status == 403 and "exceeded quota: airflow-gpu-guaranteed" in refused.value.body
    from airflow_gpu.devtools.processes import wait_until

    def used() -> dict:  # status.used is kept current by the quota controller, shortly after the writes
        return {q.metadata.name: (q.status.used or {}).get("requests.nvidia.com/gpu")
                for q in core.list_namespaced_resource_quota("team-nlp").items}
    wait_until(lambda: used() == {"airflow-gpu-guaranteed": "8", "airflow-gpu-preemptible": "8"}, timeout=30,
               what=f"status.used of both quotas at 8 GPUs (now {used()})")
