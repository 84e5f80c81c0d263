"""The chargeback ledger's records (core.chargeback.Usage) from durable sources.

1. Pods on the cluster: one record per pod that held GPUs (start = its container start, end = its
   container end, or now while it runs); node -> product and capacity type; a pod with a
   DisruptionTarget condition lost the GPU-seconds since its last checkpoint (annotation), by
   preemption (PreemptionByScheduler) or interruption (every other disruption reason); a pod of a
   relaunched attempt (its interruptions/preemptions annotations) first lost its restart overhead
   (core.model.restart_lost_gpu_seconds), a record of cause restart.
2. The operator's XCom results in the Airflow metadata DB, for task tries whose pods are gone (pods of
   an interrupted node are garbage-collected; the operator deletes a disrupted attempt's pods and, at
   the end, the try's): the try's GPU-seconds and those it lost to interruptions and to preemptions,
   per capacity type of its attempts, each its own record; the product the operator reports. A result
   written before the operator kept the capacity types has capacity type unknown (priced on-demand).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

from airflow_gpu import constants as C
from airflow_gpu.config.core import mig_gpus
from airflow_gpu.core.chargeback import CAPACITY_UNKNOWN, CAUSE_INTERRUPTION, CAUSE_PREEMPTION, CAUSE_RESTART, Usage
from airflow_gpu.core.model import gpu_seconds_lost
from airflow_gpu.core.tiers import restart_overhead_of, tier_of_priority_class
from airflow_gpu.kube.convert import ConversionError, capacity_type_of, hint_time, key_of, parse_time, seconds_hint
from airflow_gpu.kube.outcome import LOST_GPU_SECONDS_KEYS, USAGE_BY_CAPACITY
from airflow_gpu.kube.state import disruption_cause as cause_of_reason
from airflow_gpu.kube.state import disruption_target

KNOWN_CAPACITY = (C.CAPACITY_SPOT, C.CAPACITY_ON_DEMAND)


def try_key(labels: Mapping[str, str]) -> tuple | None:
    """(dag_id, task_id, run_id, try_number) of an operator's pod, None for other pods."""
    parts = tuple(labels.get(k) for k in (C.LABEL_DAG_ID, C.LABEL_TASK_ID, C.LABEL_RUN_ID, C.LABEL_TRY_NUMBER))
    return parts if all(parts) else None


def pod_gpus(pod: Mapping, gpus_of_mig: Callable[[str], float] = mig_gpus) -> float:
    """Whole GPUs, MIG slices by `gpus_of_mig(profile)` (default: the profile's name, in pool slots)."""
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        req = {**((c.get("resources") or {}).get("limits") or {}), **((c.get("resources") or {}).get("requests") or {})}
        for name, value in req.items():
            if name == C.RESOURCE_GPU:
                total += float(value)
            elif name.startswith(C.RESOURCE_MIG_PREFIX):
                total += float(value) * gpus_of_mig(name[len(C.RESOURCE_MIG_PREFIX):])
    return total


def _run_span(pod: Mapping, now: float) -> tuple[float, float] | None:
    starts, ends, running = [], [], False
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state:
            starts.append(parse_time(state["running"].get("startedAt")))
            running = True
        elif "terminated" in state:
            starts.append(parse_time(state["terminated"].get("startedAt")))
            ends.append(parse_time(state["terminated"].get("finishedAt")))
    starts = [s for s in starts if s]
    if not starts:
        return None
    end = now if running or not ends else max(e for e in ends if e) if any(ends) else now
    return min(starts), end


def disruption_cause(pod: Mapping) -> str | None:
    target = disruption_target(pod)
    return cause_of_reason(target[0]) if target else None


def usage_from_pods(pods: Iterable[Mapping], nodes: Mapping[str, Mapping], team_of, product_of,
                    now: float | None = None, cfg=None) -> list[Usage]:
    """`team_of(pod)` and `product_of(node_label)` come from the quota config; a MIG slice counts the
    GPUs `cfg` says for its profile on the node's product (config.core.mig_gpus)."""
    now = time.time() if now is None else now
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = nodes.get((pod.get("spec") or {}).get("nodeName") or "") or {}
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        product = product_of(node_labels.get(C.NODE_GPU_PRODUCT))
        gpus = pod_gpus(pod, lambda profile: mig_gpus(profile, cfg, (product,)))
        span = _run_span(pod, now)
        if not gpus or span is None:
            continue
        capacity = capacity_type_of(node_labels) if node else CAPACITY_UNKNOWN
        cause = disruption_cause(pod)
        start = span[0]
        paid = min(restart_seconds(pod, cfg), span[1] - span[0])
        if paid > 0:  # the restart computed nothing: lost, a record of its own
            start = span[0] + paid
            out.append(Usage(team_of(pod), product, capacity, gpus, span[0], start, gpus * paid, CAUSE_RESTART,
                             key_of(pod)))
        lost = 0.0
        if cause:
            ckpt = hint_time((meta.get("annotations") or {}).get(C.ANNOTATION_LAST_CHECKPOINT_TIME), "checkpoint", [])
            lost = gpu_seconds_lost(gpus, start, span[1], ckpt or None)
        out.append(Usage(team_of(pod), product, capacity, gpus, start, span[1], lost, cause, key_of(pod)))
    return out


def restart_seconds(pod: Mapping, cfg=None) -> float:
    """Restart overhead of the pod's attempt: 0 for a first launch; a relaunch after a disruption (the
    operator counts them on the pod) pays the gang's own overhead (annotation), else its tier's
    (core.tiers.restart_overhead_of, the PriorityClass's tier in `cfg`)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        relaunches = int(notes.get(C.ANNOTATION_INTERRUPTIONS) or 0) + int(notes.get(C.ANNOTATION_PREEMPTIONS) or 0)
    except ValueError:
        return 0.0
    if relaunches <= 0:
        return 0.0
    try:
        own = seconds_hint(notes.get(C.ANNOTATION_RESTART_OVERHEAD), "pod", C.ANNOTATION_RESTART_OVERHEAD)
    except ConversionError:
        own = None
    tier = tier_of_priority_class((pod.get("spec") or {}).get("priorityClassName") or "")
    return restart_overhead_of(cfg.tier_policies().get(tier) if cfg is not None else None, own)


def usage_from_xcom(results: Iterable[Mapping], covered: set[tuple]) -> list[Usage]:
    """`results`: dicts with team, product, try (dag, task, run, try), start, end and the operator's
    XCom value (gpu_seconds, lost_gpu_seconds, interruptions, preemptions). Tries in `covered` are
    already counted from their pods."""
    out = []
    for r in results:
        if r["try"] in covered:
            continue
        value = r["value"] or {}
        start, end, ref = r["start"], r["end"], "/".join(map(str, r["try"]))
        span = max(1e-9, end - start)
        # per capacity type of the try's attempts (an older result: the whole try, capacity unknown);
        # in each, a record per cause for its lost GPU-seconds (the try's span, as many GPUs as make them
        # up) and one for the rest: the totals stay whole, interruptions and preemptions apart
        parts = value.get(USAGE_BY_CAPACITY) or {CAPACITY_UNKNOWN: value}
        for capacity, part in parts.items():
            capacity = capacity if capacity in KNOWN_CAPACITY else CAPACITY_UNKNOWN
            gpu_seconds = float(part.get("gpu_seconds") or 0)
            if gpu_seconds <= 0:
                continue
            lost = lost_by_cause(part)
            for cause, seconds in lost.items():
                if seconds > 0:
                    out.append(Usage(r["team"], r["product"], capacity, seconds / span, start, end, seconds, cause, ref))
            rest = gpu_seconds - sum(lost.values())
            if rest > 0:
                out.append(Usage(r["team"], r["product"], capacity, rest / span, start, end, 0.0, None, ref))
    return out


def lost_by_cause(value: Mapping) -> dict[str, float]:
    """GPU-seconds a try lost per cause, from the operator's XCom result. A result written before the
    operator kept the causes apart has only the total: it is split by the number of disruptions of
    each cause (an estimate, equal losses per disruption)."""
    if any(k in value for k in LOST_GPU_SECONDS_KEYS.values()):
        return {cause: max(0.0, float(value.get(key) or 0)) for cause, key in LOST_GPU_SECONDS_KEYS.items()}
    total = max(0.0, float(value.get("lost_gpu_seconds") or 0))
    counts = {CAUSE_INTERRUPTION: int(value.get("interruptions") or 0), CAUSE_PREEMPTION: int(value.get("preemptions") or 0)}
    n = sum(counts.values())
    if not n:  # lost work with no disruption counted: the operator only loses work to disruptions
        return {CAUSE_INTERRUPTION: total, CAUSE_PREEMPTION: 0.0} if total else {}
    return {cause: total * c / n for cause, c in counts.items()}
