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
    assert len(docs) == 4 + 5 * 2 + 2  # PriorityClasses, Namespace + GPU quota per team, 2 tier quotas
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
    gpu_quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in by_kind["ResourceQuota"]
                  if q["metadata"]["name"] == "airflow-gpu-quota"}
    assert gpu_quotas["team-nlp"] == {"requests.nvidia.com/gpu": "8"}
    assert gpu_quotas["team-serving"] == {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-1g.10gb": "22",
                                          "requests.nvidia.com/mig-3g.40gb": "2"}
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
    deployed = {d["metadata"]["name"]: d for d in yaml.safe_load_all((repo_root / "deploy" / "priorityclasses.yaml").read_text())}
    assert deployed.keys() == rendered.keys()
    for name, doc in deployed.items():
        assert (doc["value"], doc.get("preemptionPolicy")) == (rendered[name]["value"], rendered[name].get("preemptionPolicy")), name
