"""Pod arithmetic shared by admission, the default scheduler and the kubelet."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

TERMINAL = ("Succeeded", "Failed")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc)


def quantity(value) -> Decimal:
    return Decimal(parse_quantity(value))


def _add(into: dict[str, Decimal], resources: dict | None) -> None:
    for name, value in (resources or {}).items():
        into[name] = into.get(name, Decimal(0)) + quantity(value)


def container_requests(container: dict) -> dict[str, Decimal]:
    """Requests, defaulting to limits as the API server does when only limits are given."""
    res = container.get("resources") or {}
    out: dict[str, Decimal] = {}
    _add(out, res.get("limits"))
    for name, value in (res.get("requests") or {}).items():
        out[name] = quantity(value)
    return out


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """Effective requests: max(sum of containers, largest init container) + overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in container_requests(c).items():
            if v > total.get(k, Decimal(0)):
                total[k] = v
    _add(total, spec.get("overhead"))
    return total


def pod_limits(pod: dict) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        _add(total, (c.get("resources") or {}).get("limits"))
    return total


def is_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def tolerates(tolerations: list | None, taint: dict) -> bool:
    for t in tolerations or []:
        effect = t.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        key = t.get("key")
        if op == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def set_condition(status: dict, ctype: str, value: str, reason: str | None = None, message: str | None = None) -> bool:
    """Set a pod/node condition; returns whether anything changed."""
    conditions = status.setdefault("conditions", [])
    for cond in conditions:
        if cond["type"] == ctype:
            if cond.get("status") == value and cond.get("reason") == reason and cond.get("message") == message:
                return False
            if cond.get("status") != value:
                cond["lastTransitionTime"] = now_iso()
            cond["status"] = value
            for k, v in (("reason", reason), ("message", message)):
                if v is None:
                    cond.pop(k, None)
                else:
                    cond[k] = v
            cond["lastProbeTime"] = None
            return True
    cond = {"type": ctype, "status": value, "lastProbeTime": None, "lastTransitionTime": now_iso()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    conditions.append(cond)
    return True


def get_condition(obj: dict, ctype: str) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None
