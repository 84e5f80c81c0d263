"""Kubernetes objects -> the core vocabulary (Node, PodRequest, Gang, RunningGang): the one reader
of these shapes (scheduler, UI, demo).

Accepts objects as the official client returns them (V1Pod, V1Node ...) or plain dicts in the wire
format (camelCase, as the cache keeps them). Everything is converted to a wire-format dict first,
so there is one code path. No I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Iterable, Mapping

from kubernetes.utils.quantity import parse_quantity

from airflow_gpu import constants as C
from airflow_gpu.constants import (  # noqa: F401 - re-exported: callers import them with the conversion
    PODGROUP_GROUP,
    PODGROUP_KIND,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
)
from airflow_gpu.core.model import (
    Gang,
    Node,
    Placement,
    PodRequest,
    RunningGang,
    Taint,
    Toleration,
    TopologyLevel,
    TopologyRequirement,
)
from airflow_gpu.core.tiers import (  # noqa: F401
    DEFAULT_TIER,
    Identity,
    TierPolicy,
    decide,
    identity,
    placed_by,
    resolve_tier,
    tier_of_priority_class,
)
from airflow_gpu.kube.wire import (  # noqa: F401 - re-exported: one time parser (wire.py), read with the objects
    MAX_EPOCH_SECONDS,
    ConversionError,
    api_time,
    as_dict,
    parse_time,
)


def key_of(obj: Mapping) -> str:
    """namespace/name, or name for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def hint_time(value: Any, where: str, problems: list[str]) -> float | None:
    """A time written by users (a hint): parsed, or None with the problem appended."""
    try:
        return parse_time(value)
    except ConversionError as exc:
        problems.append(f"{where}: {exc}; ignored")
        return None


def _quantity(value: Any, where: str) -> Decimal:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError) as exc:
        raise ConversionError(f"{where}: {value!r} is not a Kubernetes quantity ({exc})") from None


def _milli(value: Any, where: str) -> int:
    return int(math.ceil(_quantity(value, where) * 1000))


def _mib(value: Any, where: str) -> int:
    return int(math.ceil(_quantity(value, where) / (1 << 20)))


def _count(value: Any, where: str) -> int:
    q = _quantity(value, where)
    if q != q.to_integral_value() or q < 0:
        raise ConversionError(f"{where}: {value!r} must be a whole non-negative number")
    return int(q)


# --- nodes ----------------------------------------------------------------------------------


def capacity_type_of(labels: Mapping[str, str]) -> str:
    """spot | on-demand from the labels Karpenter, EKS and GKE set."""
    karpenter = labels.get(C.NODE_CAPACITY_TYPE_KARPENTER, "").lower()
    if karpenter:
        return C.CAPACITY_SPOT if karpenter == "spot" else C.CAPACITY_ON_DEMAND
    eks = labels.get(C.NODE_CAPACITY_TYPE_EKS, "").upper()
    if eks:
        return C.CAPACITY_SPOT if eks == "SPOT" else C.CAPACITY_ON_DEMAND
    if labels.get(C.NODE_GKE_SPOT, "").lower() == "true":
        return C.CAPACITY_SPOT
    return C.CAPACITY_ON_DEMAND


def capacity_types_selected(selector: Mapping[str, str]) -> tuple[str, ...]:
    """The capacity type a pod's node selector pins (one of the labels capacity_type_of reads), or ()
    when it pins none. An explicit choice, e.g. the operator's spot="always": the tier's on-demand
    default must not override it (the pod could then bind nowhere)."""
    if not any(k in selector for k in (C.NODE_CAPACITY_TYPE_KARPENTER, C.NODE_CAPACITY_TYPE_EKS, C.NODE_GKE_SPOT)):
        return ()
    return (capacity_type_of(selector),)


def node_ready(node: Mapping) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True  # no conditions reported yet: treat like a fresh node


def node_from_k8s(obj: Any) -> Node:
    node = as_dict(obj)
    meta = node.get("metadata") or {}
    name = meta.get("name") or ""
    where = f"node {name}"
    labels: dict[str, str] = dict(meta.get("labels") or {})
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    mig: list[tuple[str, int]] = []
    for res, qty in sorted(alloc.items()):
        if res.startswith(C.RESOURCE_MIG_PREFIX):
            n = _count(qty, f"{where} allocatable[{res}]")
            if n:
                mig.append((res[len(C.RESOURCE_MIG_PREFIX):], n))
    taints = [
        Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect") or "NoSchedule")
        for t in (node.get("spec") or {}).get("taints") or []
    ]
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append(Taint(key=C.TAINT_UNSCHEDULABLE, effect="NoSchedule"))
    if not node_ready(node):
        taints.append(Taint(key=C.TAINT_NOT_READY, effect="NoSchedule"))
    gpu_memory = labels.get(C.NODE_GPU_MEMORY, "0")
    return Node(
        name=name,
        cpu_milli=_milli(alloc.get("cpu", 0), f"{where} allocatable[cpu]"),
        memory_mib=_mib(alloc.get("memory", 0), f"{where} allocatable[memory]") if "memory" in alloc else 0,
        gpu_count=_count(alloc.get(C.RESOURCE_GPU, 0), f"{where} allocatable[{C.RESOURCE_GPU}]"),
        gpu_product=labels.get(C.NODE_GPU_PRODUCT),
        gpu_memory_mib=int(gpu_memory) if gpu_memory.isdigit() else 0,
        mig_slices=tuple(mig),
        labels=tuple(sorted(labels.items())),
        taints=tuple(taints),
        capacity_type=capacity_type_of(labels),
        zone=labels.get(C.NODE_ZONE, ""),
        rack=labels.get(C.NODE_RACK, ""),
        clique=labels.get(C.NODE_GPU_CLIQUE, ""),
    )


# --- pods -----------------------------------------------------------------------------------


def pod_is_terminal(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_is_terminating(pod: Mapping) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_node(pod: Mapping) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def pod_holds_resources(pod: Mapping) -> bool:
    """Bound and not finished: its requests count against the node (a terminating pod still runs)."""
    return pod_node(pod) is not None and not pod_is_terminal(pod)


def pod_is_pending_for(pod: Mapping, scheduler_name: str) -> bool:
    spec = pod.get("spec") or {}
    return (
        spec.get("schedulerName") == scheduler_name
        and not spec.get("nodeName")
        and not spec.get("schedulingGates")  # gated (e.g. by Kueue): not ready to be scheduled
        and not pod_is_terminal(pod)
        and not pod_is_terminating(pod)
    )


def _container_requests(container: Mapping) -> dict[str, Any]:
    res = container.get("resources") or {}
    merged = dict(res.get("limits") or {})  # requests default to limits (extended resources: must equal)
    merged.update(res.get("requests") or {})
    return merged


def _effective_requests(spec: Mapping, where: str) -> dict[str, Decimal]:
    """What the pod occupies, as kube-scheduler counts it: max(sum of containers, each init container)
    plus pod overhead."""
    total: dict[str, Decimal] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for res, qty in _container_requests(c).items():
            total[res] = total.get(res, Decimal(0)) + _quantity(qty, f"{where} containers[{i}].resources[{res}]")
    for i, c in enumerate(spec.get("initContainers") or []):
        for res, qty in _container_requests(c).items():
            q = _quantity(qty, f"{where} initContainers[{i}].resources[{res}]")
            if q > total.get(res, Decimal(0)):
                total[res] = q
    for res, qty in (spec.get("overhead") or {}).items():
        total[res] = total.get(res, Decimal(0)) + _quantity(qty, f"{where} overhead[{res}]")
    return total


def _required_affinity(spec: Mapping, where: str) -> dict[str, str]:
    """Required node affinity, in the form the placement filters understand: one term whose
    expressions are `In` with a single value (the same as a nodeSelector). Anything richer is
    refused with the field named, rather than silently ignored."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return {}
    field_path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    if len(terms) > 1 or terms[0].get("matchFields"):
        raise ConversionError(f"{where}: {field_path}: several nodeSelectorTerms or matchFields are not supported "
                              f"by the airflow-gpu scheduler; use one term or spec.nodeSelector")
    out = {}
    for i, expr in enumerate(terms[0].get("matchExpressions") or []):
        values = expr.get("values") or []
        if expr.get("operator") != "In" or len(values) != 1:
            raise ConversionError(f"{where}: {field_path}.nodeSelectorTerms[0].matchExpressions[{i}]: only "
                                  f"operator In with one value is supported; use spec.nodeSelector for {expr.get('key')}")
        out[expr["key"]] = values[0]
    return out


def tolerations_of(spec: Mapping) -> tuple[Toleration, ...]:
    return tuple(
        Toleration(
            key=t.get("key") or "",
            operator=t.get("operator") or "Equal",
            value=t.get("value") or "",
            effect=t.get("effect") or "",
        )
        for t in spec.get("tolerations") or []
    )


def gpu_products_of(annotations: Mapping[str, str]) -> tuple[str, ...]:
    raw = annotations.get(C.ANNOTATION_GPU_PRODUCTS, "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def pod_request_from_k8s(obj: Any, product_labels: Mapping[str, str] | None = None) -> PodRequest:
    """product_labels: quota product name -> node label value (nvidia.com/gpu.product), so the accepted
    products annotation may name either."""
    pod = as_dict(obj)
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = key_of(pod)
    where = f"pod {name}"
    req = _effective_requests(spec, where)
    mig = [(r[len(C.RESOURCE_MIG_PREFIX):], q) for r, q in req.items() if r.startswith(C.RESOURCE_MIG_PREFIX) and q > 0]
    if len(mig) > 1 or (mig and mig[0][1] != 1):
        raise ConversionError(f"{where}: requests {dict(mig)} MIG slices; one pod may ask for exactly one slice")
    gpus = req.get(C.RESOURCE_GPU, Decimal(0))
    if gpus != gpus.to_integral_value() or gpus < 0:
        raise ConversionError(f"{where}: {C.RESOURCE_GPU}={gpus} must be a whole number of GPUs")
    selector = dict(spec.get("nodeSelector") or {})
    selector.update(_required_affinity(spec, where))
    try:
        return PodRequest(
            name=name,
            cpu_milli=int(math.ceil(req.get("cpu", Decimal(0)) * 1000)),
            memory_mib=int(math.ceil(req.get("memory", Decimal(0)) / (1 << 20))),
            gpus=int(gpus),
            mig_profile=mig[0][0] if mig else None,
            gpu_products=tuple((product_labels or {}).get(p, p) for p in gpu_products_of(meta.get("annotations") or {})),
            node_selector=tuple(sorted(selector.items())),
            tolerations=tolerations_of(spec),
            capacity_types=capacity_types_selected(selector),
        )
    except ValueError as exc:
        raise ConversionError(f"{where}: {exc}") from None


# --- gangs ----------------------------------------------------------------------------------


def gang_key_of_pod(pod: Mapping) -> str | None:
    """namespace/podgroup for a pod in a gang (coscheduling label first, then ours), else None."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    group = labels.get(C.LABEL_COSCHEDULING_POD_GROUP) or labels.get(C.LABEL_GANG)
    return f"{meta.get('namespace')}/{group}" if group else None


def min_member(podgroup: Mapping | None) -> int:
    if not podgroup:
        return 1
    value = (podgroup.get("spec") or {}).get("minMember", 1)
    if not isinstance(value, int) or value < 1:
        raise ConversionError(f"PodGroup {key_of(podgroup)}: spec.minMember={value!r} must be an integer >= 1")
    return value


def schedule_timeout(podgroup: Mapping | None) -> int | None:
    """spec.scheduleTimeoutSeconds of a PodGroup (scheduler-plugins CRD); None when absent."""
    value = ((podgroup or {}).get("spec") or {}).get("scheduleTimeoutSeconds")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConversionError(f"PodGroup {key_of(podgroup)}: spec.scheduleTimeoutSeconds={value!r} must be an "
                              f"integer >= 1 (seconds), or left out for no timeout")
    return value


def tiers_never_preempting(priorityclasses: Mapping[str, Mapping]) -> frozenset[str]:
    """The tiers whose PriorityClass (name -> object) says preemptionPolicy: Never."""
    return frozenset(tier_of_priority_class(name) for name, pc in priorityclasses.items()
                     if pc.get("preemptionPolicy") == "Never")


@dataclass
class ConversionContext:
    """What a Kubernetes object does not say by itself: which team owns a namespace, what a tier allows."""

    team_by_namespace: dict[str, str] = field(default_factory=dict)
    tiers: dict[str, TierPolicy] = field(default_factory=dict)
    product_labels: dict[str, str] = field(default_factory=dict)  # quota product -> node gpu.product label

    @classmethod
    def from_config(cls, cfg) -> "ConversionContext":
        """From an airflow_gpu.config.QuotaConfig (None: no teams, no tiers)."""
        if cfg is None:
            return cls()
        return cls(
            team_by_namespace={t.namespace: t.name for t in cfg.teams},
            tiers=cfg.tier_policies(),
            product_labels={p.name: p.node_label for p in cfg.products if p.node_label},
        )


def _first(values: Iterable[str | None]) -> str | None:
    for v in values:
        if v:
            return v
    return None


def parse_topology(value: str | None, where: str) -> TopologyRequirement:
    """'clique' | 'rack:hard' | 'zone:soft' ... -> TopologyRequirement."""
    if not value:
        return TopologyRequirement()
    level, _, mode = value.partition(":")
    try:
        lvl = TopologyLevel(level.strip().lower())
    except ValueError:
        allowed = ", ".join(t.value for t in TopologyLevel)
        raise ConversionError(f"{where}: annotation {C.ANNOTATION_TOPOLOGY}={value!r}: level must be one of {allowed}") from None
    if mode.strip().lower() not in ("", "hard", "soft"):
        raise ConversionError(f"{where}: annotation {C.ANNOTATION_TOPOLOGY}={value!r}: mode must be hard or soft")
    return TopologyRequirement(level=lvl, hard=mode.strip().lower() == "hard")


MAX_EXPECTED_DURATION = 366 * 86400.0  # a hint beyond a year is a typo; backfill needs no more


MAX_RESTART_SECONDS = 7 * 86400.0  # restart overhead, checkpoint time: beyond a week is a typo


def expected_duration(text: str | None, where: str) -> float | None:
    """The expected-duration-seconds hint: a finite number of seconds in (0, MAX_EXPECTED_DURATION]."""
    return seconds_hint(text, where, C.ANNOTATION_EXPECTED_DURATION, MAX_EXPECTED_DURATION, "3600", zero=False)


def seconds_hint(text: str | None, where: str, key: str, maximum: float = MAX_RESTART_SECONDS,
                 example: str = "120", zero: bool = True) -> float | None:
    """A hint of seconds in annotation `key`: a finite number in [0 (or over it), maximum]; None if absent."""
    if not text:
        return None
    low = 0 if zero else 1
    fix = f"must be seconds between {low} and {maximum:.0f}, e.g. {example}"
    try:
        value = float(text[:64])
    except ValueError:
        raise ConversionError(f"{where}: annotation {key}={text[:64]!r} {fix}") from None
    if not math.isfinite(value) or not (0 <= value if zero else 0 < value) or value > maximum:
        raise ConversionError(f"{where}: annotation {key}={text[:64]!r} {fix}")
    return value


def _hint(parse, default, problems: list[str] | None):
    """parse() a user-written hint; with a problems list an invalid one becomes `default`."""
    if problems is None:
        return parse()
    try:
        return parse()
    except ConversionError as exc:
        problems.append(f"{exc}; ignored")
        return default


def gang_identity(key: str, podgroup: Mapping | None, pods: list[Mapping], ctx: ConversionContext) -> Identity:
    """Team (the namespace's) and tier (the pods' PriorityClass's) of gang `key`; `ignored`: the
    team and tier labels of the PodGroup and the pods that say otherwise, each message naming the gang
    (core.tiers.identity)."""
    namespace = (pods[0].get("metadata") or {}).get("namespace", "") if pods else key.partition("/")[0]
    who = identity(namespace, [(p.get("spec") or {}).get("priorityClassName") for p in pods], ctx.team_by_namespace,
                   ctx.tiers, [m.get("labels") for m in [(podgroup or {}).get("metadata") or {}]
                               + [p.get("metadata") or {} for p in pods]])
    return replace(who, ignored=tuple(f"gang {key}: {msg}" for msg in who.ignored)) if who.ignored else who


def gang_from_k8s(
    key: str,
    podgroup: Mapping | None,
    pods: list[Mapping],
    ctx: ConversionContext,
    members: list[PodRequest] | None = None,
    pinned: Iterable[str] = (),
    min_member: int = 0,
    hints: list[str] | None = None,
) -> Gang:
    """A Gang for PodGroup `key` (or a lone pod) and its pods. Team and tier are `gang_identity`'s
    (the namespace, the PriorityClass; never a label). Annotations on the PodGroup win over those on
    the pods; priority is the highest spec.priority among the pods. Each pod keeps its own request
    (pod sets: a launcher and its workers). `pinned`: nodes where members of the group already run,
    which pin the rest to their topology domain; `min_member`: how many of `pods` must be placed
    together at least (0: all). `hints`: when a list, user-written hints that are invalid (expected
    duration, topology) are ignored and their problems appended, and so are team/tier labels that
    contradict the namespace/PriorityClass; when None, invalid hints raise ConversionError (a pending
    gang waits with the field named), contradicting labels are ignored all the same."""
    if not pods:
        raise ConversionError(f"gang {key}: no pods")
    pg_meta = (podgroup or {}).get("metadata") or {}
    metas = [pg_meta] + [p.get("metadata") or {} for p in pods]
    annotation = lambda k: _first((m.get("annotations") or {}).get(k) for m in metas)  # noqa: E731
    who = gang_identity(key, podgroup, pods, ctx)
    if hints is not None:
        hints.extend(who.ignored)
    team, tier = who.team, who.tier
    priorities = [(p.get("spec") or {}).get("priority") for p in pods]
    known = [int(p) for p in priorities if p is not None]
    checkpointable = (annotation(C.ANNOTATION_CHECKPOINTABLE) or "").lower() == "true"
    mixed = (annotation(C.ANNOTATION_GPU_PRODUCTS_MIXED) or "").lower() == "true"
    duration = _hint(lambda: expected_duration(annotation(C.ANNOTATION_EXPECTED_DURATION), f"gang {key}"),
                     None, hints)
    created = [parse_time(m.get("creationTimestamp")) for m in metas]
    created_at = parse_time(pg_meta.get("creationTimestamp")) or min((c for c in created if c), default=0.0)
    reqs = tuple(members if members is not None else (pod_request_from_k8s(p, ctx.product_labels) for p in pods))
    restart = _hint(lambda: seconds_hint(annotation(C.ANNOTATION_RESTART_OVERHEAD), f"gang {key}",
                                         C.ANNOTATION_RESTART_OVERHEAD), None, hints)
    checkpoint_seconds = _hint(lambda: seconds_hint(annotation(C.ANNOTATION_CHECKPOINT_SECONDS), f"gang {key}",
                                                    C.ANNOTATION_CHECKPOINT_SECONDS, example="60"), None, hints)
    decision = decide(ctx.tiers.get(tier), reqs, checkpointable, max(known) if known else None, restart)
    return Gang(
        name=key,
        team=team,
        tier=tier,
        priority=decision.priority,
        members=decision.members,
        topology=_hint(lambda: parse_topology(annotation(C.ANNOTATION_TOPOLOGY), f"gang {key}"),
                       TopologyRequirement(), hints),
        preemptible=decision.preemptible,
        checkpointable=checkpointable,
        spot_eligible=decision.spot_eligible,
        created_at=created_at or 0.0,
        expected_duration=duration,
        pinned=tuple(sorted(set(pinned))),
        min_member=min_member if 0 < min_member < len(reqs) else 0,
        products_mixed=mixed,
        restart_overhead=decision.restart_overhead,
        checkpoint_seconds=checkpoint_seconds,
        max_wait=decision.max_wait,
        band_priority=decision.band_priority,
    )


def running_gang_from_k8s(
    key: str,
    podgroup: Mapping | None,
    pods: list[Mapping],
    ctx: ConversionContext,
    placements: tuple[Placement, ...],
    *,
    ours: bool = True,
    members: list[PodRequest] | None = None,
    hints: list[str] | None = None,
    borrowed: bool | None = None,
) -> RunningGang:
    """A RunningGang for bound pods. Pods another scheduler placed are never preemption victims here.
    `borrowed`: admitted on borrowed quota, from the scheduler's plan record (None: the annotation).
    A running gang always counts (capacity, quota, preemption): user-written hints that are invalid
    are ignored, their problems appended to `hints`."""
    hints = [] if hints is None else hints
    gang = placed_by(gang_from_k8s(key, podgroup, pods, ctx, members, hints=hints), ours)
    starts = []
    for p in pods:
        status = p.get("status") or {}
        t = hint_time(status.get("startTime"), f"pod {key_of(p)} status.startTime", hints)
        if t is None:
            for cond in status.get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
                    t = hint_time(cond.get("lastTransitionTime"), f"pod {key_of(p)} PodScheduled condition", hints)
        starts.append(t if t is not None else gang.created_at)
    started_at = min(starts) if starts else gang.created_at
    checkpoints = [
        hint_time(((m.get("metadata") or {}).get("annotations") or {}).get(C.ANNOTATION_LAST_CHECKPOINT_TIME),
                  f"{'PodGroup' if m is podgroup else 'pod'} {key_of(m)}: annotation "
                  f"{C.ANNOTATION_LAST_CHECKPOINT_TIME}", hints)
        for m in ([podgroup] if podgroup else []) + list(pods)
    ]
    ck = max((c for c in checkpoints if c is not None), default=None)
    if borrowed is None:  # a reader without the scheduler's records (the UI) goes by the annotation
        borrowed = any(
            ((m.get("metadata") or {}).get("annotations") or {}).get(C.ANNOTATION_BORROWED) == "true"
            for m in [podgroup or {}, *pods]
        )
    return RunningGang(
        gang=gang,
        placements=placements,
        started_at=started_at,
        last_checkpoint_at=ck,
        borrowed=borrowed,
    )
