"""ResourceQuota: usage and admission, with the real quota admission plugin's messages."""

from __future__ import annotations

from decimal import Decimal

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.podutil import is_terminal, pod_limits, pod_requests, quantity
from airflow_gpu.localcluster.registry.resources import ResourceType

QUOTA_KEY = "/resourcequotas"
POD_KEY = "/pods"
STANDARD = ("cpu", "memory", "ephemeral-storage")
COUNTED = {"/pods": "pods", "/services": "services", "/configmaps": "configmaps", "/secrets": "secrets",
           "/resourcequotas": "resourcequotas"}


def format_quantity(value: Decimal) -> str:
    if value == value.to_integral_value():
        n = int(value)
        for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if n >= size and n % size == 0:
                return f"{n // size}{suffix}"
        return str(n)
    return f"{int(value * 1000)}m"


def pod_usage(pod: dict) -> dict[str, Decimal]:
    usage = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for name, value in pod_requests(pod).items():
        usage[f"requests.{name}"] = value
        if name in STANDARD:
            usage[name] = value
    for name, value in pod_limits(pod).items():
        if name in STANDARD:
            usage[f"limits.{name}"] = value
    return usage


def _scope_matches(quota: dict, pod: dict) -> bool:
    spec = quota.get("spec") or {}
    pod_spec = pod.get("spec") or {}
    best_effort = not pod_requests(pod) and not pod_limits(pod)
    terminating = pod_spec.get("activeDeadlineSeconds") is not None
    checks = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    checks += (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    for expr in checks:
        scope, op, values = expr.get("scopeName"), expr.get("operator", "Exists"), expr.get("values") or []
        if scope == "PriorityClass":
            name = pod_spec.get("priorityClassName")
            ok = {"In": name in values, "NotIn": name not in values,
                  "Exists": bool(name), "DoesNotExist": not name}.get(op, False)
        else:
            ok = {"BestEffort": best_effort, "NotBestEffort": not best_effort,
                  "Terminating": terminating, "NotTerminating": not terminating}.get(scope, True)
            if op == "DoesNotExist":
                ok = not ok
        if not ok:
            return False
    return True


def quota_used(store, quota: dict) -> dict[str, Decimal]:
    """Usage of the quota's namespace in the resources the quota limits."""
    ns = quota["metadata"]["namespace"]
    hard = (quota.get("spec") or {}).get("hard") or {}
    used = {name: Decimal(0) for name in hard}
    for pod in store.values(POD_KEY, ns):
        if is_terminal(pod) or not _scope_matches(quota, pod):
            continue
        for name, value in pod_usage(pod).items():
            if name in used:
                used[name] += value
    for key, word in COUNTED.items():
        if key == POD_KEY:
            continue
        for name in (word, f"count/{word}"):
            if name in used:
                used[name] = Decimal(len(store.entries(key, ns)))
    return used


def admit(store, rt: ResourceType, obj: dict) -> None:
    """Raise 403 Forbidden if creating obj would exceed a ResourceQuota of its namespace."""
    ns = obj["metadata"].get("namespace")
    if not ns:
        return
    quotas = store.values(QUOTA_KEY, ns)
    if not quotas:
        return
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "")
    if rt.key == POD_KEY:
        usage = pod_usage(obj)
    else:
        word = COUNTED.get(rt.key, rt.plural)
        suffix = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
        usage = {word: Decimal(1), f"count/{suffix}": Decimal(1)}
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = (quota.get("spec") or {}).get("hard") or {}
        if rt.key == POD_KEY and not _scope_matches(quota, obj):
            continue
        qname = quota["metadata"]["name"]
        if rt.key == POD_KEY:
            missing = _missing_specs(obj, hard)
            if missing:
                raise errors.forbidden(rt.plural, name, f"failed quota: {qname}: must specify {missing}", rt.group)
        relevant = [r for r in sorted(hard) if r in usage]
        if not relevant:
            continue
        used = quota_used(store, quota)
        over = [r for r in relevant if used[r] + usage[r] > quantity(hard[r])]
        if over:
            fmt = lambda values: ",".join(f"{r}={format_quantity(values[r])}" for r in over)  # noqa: E731
            limited = ",".join(f"{r}={hard[r]}" for r in over)
            raise errors.forbidden(
                rt.plural, name,
                f"exceeded quota: {qname}, requested: {fmt(usage)}, used: {fmt(used)}, limited: {limited}", rt.group)


def _missing_specs(pod: dict, hard: dict) -> str:
    """'limits.cpu for: c1; requests.memory for: c1' when the quota needs values the pod lacks."""
    parts = []
    for res in sorted(hard):
        kind, _, base = res.partition(".")
        if res in STANDARD[:2]:
            kind, base = "requests", res
        if kind not in ("requests", "limits") or base not in STANDARD[:2]:
            continue
        lacking = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            resources = c.get("resources") or {}
            have = (resources.get("limits") or {}) if kind == "limits" else \
                {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            if base not in have:
                lacking.append(c.get("name", ""))
        if lacking:
            parts.append(f"{kind}.{base} for: {','.join(lacking)}")
    return "; ".join(dict.fromkeys(parts))
