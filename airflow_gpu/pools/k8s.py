"""The Kubernetes side of the quota config: per team a Namespace and ResourceQuotas, per tier a
PriorityClass. Plain dicts (apiVersion/kind/metadata/spec), rendered to YAML for kubectl apply.

ResourceQuotas per tier class, like the pools: `airflow-gpu-guaranteed` counts the pods of the
non-preemptible tiers' PriorityClasses (scopeSelector PriorityClass In) up to the guarantee;
`airflow-gpu-preemptible` counts every other pod (PriorityClass NotIn: best-effort tiers, pods of no
or a foreign PriorityClass) up to quota + borrowing. A production gang is therefore never refused at
creation because the team's own best-effort pods fill the namespace: it is created, and the GPU
scheduler enforces the combined guarantee at binding time by preempting them (Kueue's split of
submission and admission). ResourceQuota scopes are immutable, so the old unscoped
`airflow-gpu-quota` is replaced, not changed: `kubectl delete resourcequota airflow-gpu-quota -n <ns>`
after applying the new ones (README, "Pools per team and tier class").

Kubernetes cannot tell GPU products apart in a ResourceQuota (every product is `nvidia.com/gpu`), so
each limit is summed over products; the per-product bound is the GPU scheduler's. MIG instances are
their own resources (`nvidia.com/mig-<profile>`, the device plugin's mixed strategy), summed over
products that offer the same profile name, in both quotas (MIG quota is not borrowable).
"""

from __future__ import annotations

from collections import defaultdict

import yaml

from airflow_gpu import constants
from airflow_gpu.config import QuotaConfig, Team
from airflow_gpu.core.tiers import TIER_CLASS_GUARANTEED, TIER_CLASSES

QUOTA_NAME_PREFIX = "airflow-gpu-"  # + tier class: airflow-gpu-guaranteed, airflow-gpu-preemptible
LEGACY_RESOURCE_QUOTA_NAME = "airflow-gpu-quota"  # before tier classes: one unscoped quota
TIER_QUOTA_NAME = "airflow-gpu-tiers"


def resource_quota_name(tier_class: str) -> str:
    return f"{QUOTA_NAME_PREFIX}{tier_class}"


def render_k8s(cfg: QuotaConfig) -> list[dict]:
    docs: list[dict] = [_priority_class(cfg, tier) for tier in cfg.tiers]
    for team in cfg.teams:
        docs.append(_namespace(team))
        guaranteed = [t.priority_class_name for t in cfg.tiers if cfg.tier_class(t.name) == TIER_CLASS_GUARANTEED]
        for cls in TIER_CLASSES:  # both, always: every pod of the namespace is counted by exactly one
            docs.append(_gpu_quota(cfg, team, cls, guaranteed))
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


def _gpu_quota(cfg: QuotaConfig, team: Team, cls: str, guaranteed_classes: list[str]) -> dict:
    if cls == TIER_CLASS_GUARANTEED:
        gpus = sum(team.quota_gpus(p) for p in team.products())
        operator = "In"
    else:
        gpus = sum(team.ceiling_gpus(p) for p in team.products())
        operator = "NotIn"  # also pods of no PriorityClass: the unknown-tier rule treats them as preemptible
    hard: dict[str, str] = {f"requests.{constants.RESOURCE_GPU}": str(gpus)}
    mig: dict[str, int] = defaultdict(int)
    for profiles in team.mig_quota.values():
        for profile, count in profiles.items():
            mig[profile] += count
    for profile, count in sorted(mig.items()):
        hard[f"requests.{constants.RESOURCE_MIG_PREFIX}{profile}"] = str(count)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": resource_quota_name(cls), "namespace": team.namespace,
                     "labels": {**_labels(team), constants.LABEL_TIER_CLASS: cls}},
        "spec": {
            "hard": hard,
            "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": operator, "values": sorted(guaranteed_classes)}]},
        },
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
