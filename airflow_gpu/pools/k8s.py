"""The Kubernetes side of the quota config: per team a Namespace and ResourceQuotas, per tier a
PriorityClass. Plain dicts (apiVersion/kind/metadata/spec), rendered to YAML for kubectl apply.

Kubernetes cannot tell GPU products apart in a ResourceQuota (every product is `nvidia.com/gpu`), so
the namespace's hard limit is the team's ceiling summed over products; the per-product bound is the
Airflow pool and the GPU scheduler. MIG instances are their own resources (`nvidia.com/mig-<profile>`,
the device plugin's mixed strategy), summed over products that offer the same profile name.
"""

from __future__ import annotations

from collections import defaultdict

import yaml

from airflow_gpu import constants
from airflow_gpu.config import QuotaConfig, Team

RESOURCE_QUOTA_NAME = "airflow-gpu-quota"
TIER_QUOTA_NAME = "airflow-gpu-tiers"


def render_k8s(cfg: QuotaConfig) -> list[dict]:
    docs: list[dict] = [_priority_class(cfg, tier) for tier in cfg.tiers]
    for team in cfg.teams:
        docs.append(_namespace(team))
        docs.append(_gpu_quota(team))
        disallowed = [t.priority_class_name for t in cfg.tiers if not team.allows_tier(t.name)]
        if disallowed:
            docs.append(_tier_quota(team, disallowed))
    return docs


def render_k8s_yaml(cfg: QuotaConfig) -> str:
    return yaml.safe_dump_all(render_k8s(cfg), sort_keys=False, explicit_start=True)


def _labels(team: Team | None = None) -> dict:
    labels = {constants.LABEL_MANAGED_BY: constants.MANAGED_BY_VALUE}
    if team is not None:
        labels[constants.LABEL_TEAM] = team.name
    return labels


def _priority_class(cfg: QuotaConfig, tier) -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": tier.priority_class_name,
                     "labels": {**_labels(), constants.LABEL_TIER: tier.name}},
        "value": tier.priority,
        "globalDefault": False,
        "preemptionPolicy": tier.preemption_policy,
        "description": tier.description or f"airflow-gpu tier {tier.name}",
    }


def _namespace(team: Team) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team.namespace, "labels": _labels(team)}}


def _gpu_quota(team: Team) -> dict:
    hard: dict[str, str] = {f"requests.{constants.RESOURCE_GPU}": str(sum(team.ceiling_gpus(p) for p in team.products()))}
    mig: dict[str, int] = defaultdict(int)
    for profiles in team.mig_quota.values():
        for profile, count in profiles.items():
            mig[profile] += count
    for profile, count in sorted(mig.items()):
        hard[f"requests.{constants.RESOURCE_MIG_PREFIX}{profile}"] = str(count)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": RESOURCE_QUOTA_NAME, "namespace": team.namespace, "labels": _labels(team)},
        "spec": {"hard": hard},
    }


def _tier_quota(team: Team, disallowed_classes: list[str]) -> dict:
    """Zero pods at the PriorityClasses of tiers the team may not use: the API server rejects them."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": TIER_QUOTA_NAME, "namespace": team.namespace, "labels": _labels(team)},
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": disallowed_classes}]},
        },
    }
