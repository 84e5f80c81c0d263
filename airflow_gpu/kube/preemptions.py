"""The scheduler's record of the pods it preempted, both ways: a ConfigMap in its own namespace whose
data maps each preempted pod's UID to {pod, by, at}.

Why: a preempted pod is evicted, and the Eviction API sets the pod's DisruptionTarget reason to
EvictionByEvictionAPI over the scheduler's PreemptionByScheduler (the real API server's
UpdatePodCondition replaces a condition of the same type), the reason a spot drain gives too. A
trigger that reads late, after the pods are gone, cannot tell the two apart from the pods. Only the
scheduler's service account writes in its namespace (deploy/base/rbac.yaml), so this record, unlike a
label or annotation a pod owner could write, says who preempted whom.

Writes are JSON merge patches that add one key per pod (no read-modify-write race) and drop keys
older than the record's TTL; the Airflow side only `get`s the one object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from airflow_gpu import constants as C
from airflow_gpu.kube.names import digest

RECORD_TTL_SECONDS = 7 * 86400.0  # longer than any deferral a late trigger would still read
MAX_ENTRIES = 4000  # ~150 bytes each: well under the 1 MiB object limit


def record_name(scheduler_name: str = C.DEFAULT_SCHEDULER_NAME) -> str:
    name = f"{C.PREEMPTIONS_CONFIGMAP_PREFIX}{scheduler_name}"
    return name if len(name) <= 253 else f"{name[:240]}-{digest(scheduler_name)}"


@dataclass(frozen=True)
class Preempted:
    uid: str
    pod: str  # namespace/name
    by: str  # the preemptor gang
    at: float  # epoch seconds


def record_manifest(namespace: str, scheduler_name: str, entries: Iterable[Preempted]) -> dict:
    """A new record holding `entries`."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": record_name(scheduler_name), "namespace": namespace,
                         "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}},
            "data": _data(entries)}


def record_patch(entries: Iterable[Preempted], expired: Iterable[str] = ()) -> dict:
    """A merge patch adding `entries` and removing the `expired` pod UIDs."""
    data: dict[str, str | None] = {uid: None for uid in expired}
    data.update(_data(entries))
    return {"data": data}


def _data(entries: Iterable[Preempted]) -> dict[str, str]:
    return {e.uid: json.dumps({"pod": e.pod, "by": e.by, "at": round(e.at, 3)}, separators=(",", ":"))
            for e in entries if e.uid}


def read_record(configmap: Mapping | None) -> dict[str, Preempted]:
    """pod UID -> Preempted, from the ConfigMap as the API returns it (entries that cannot be read
    are skipped: only the scheduler writes here, but a record is never a reason to crash)."""
    out: dict[str, Preempted] = {}
    for uid, text in ((configmap or {}).get("data") or {}).items():
        try:
            value = json.loads(text)
            out[uid] = Preempted(uid, str(value["pod"]), str(value["by"]), float(value["at"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def expired_uids(record: Mapping[str, Preempted], now: float, ttl: float = RECORD_TTL_SECONDS,
                 keep: int = MAX_ENTRIES) -> list[str]:
    """UIDs to drop: older than `ttl`, and the oldest beyond `keep` entries."""
    old = [uid for uid, e in record.items() if now - e.at > ttl]
    rest = sorted((e for uid, e in record.items() if uid not in set(old)), key=lambda e: e.at)
    return old + [e.uid for e in rest[: max(0, len(rest) - keep)]]
