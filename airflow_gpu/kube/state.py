"""Objects -> the state of a gang: pending, admitted, running, succeeded, failed or disrupted, and why.

Disruption is read from what Kubernetes records, not guessed from exit codes (docs/DESIGN.md, Spot):
the pod's DisruptionTarget condition (preemption, eviction, taint manager, kubelet shutdown, PodGC),
a pod whose node is gone (status.reason NodeLost, or its node absent from `live_nodes`), or a gang
that lost some members (deleted) while others remain. A disrupted gang is relaunched whole; a failed
one (non-zero exit without disruption) is the application's failure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.core.chargeback import CAUSE_INTERRUPTION, CAUSE_PREEMPTION
from airflow_gpu.kube.wire import api_time, as_dict

PENDING = "pending"  # not all members bound
ADMITTED = "admitted"  # every member bound, not all running yet
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"  # the application failed: normal Airflow failure and retry
DISRUPTED = "disrupted"  # interruption, preemption, node loss or partial loss: relaunch the whole gang
PHASES = (PENDING, ADMITTED, RUNNING, SUCCEEDED, FAILED, DISRUPTED)
TERMINAL = (SUCCEEDED, FAILED, DISRUPTED)

REASON_PARTIAL_LOSS = "PartialLoss"
REASON_ALL_LOST = "AllMembersLost"
REASON_STORE_UNAVAILABLE = "StoreUnavailable"  # an infrastructure failure: relaunched like an interruption
# CAUSE_PREEMPTION: a scheduler took the GPUs for higher-priority work; CAUSE_INTERRUPTION: the capacity
# went away (spot reclaim, drain, node lost, members lost). The chargeback's words, defined once there.


def disruption_cause(reason: str | None) -> str | None:
    """preemption | interruption for a DisruptionTarget reason (None: no disruption). The first
    reason a watcher saw counts: the Eviction API overwrites the scheduler's PreemptionByScheduler."""
    if not reason:
        return None
    return CAUSE_PREEMPTION if reason == C.REASON_PREEMPTION_BY_SCHEDULER else CAUSE_INTERRUPTION


def disruption_target(pod: Any) -> tuple[str, str] | None:
    """(reason, message) of the pod's DisruptionTarget condition when it is True (reason
    "DisruptionTarget" when it has none), else None: the one reader of that condition (gang state,
    trigger, chargeback, demo)."""
    cond = _condition(as_dict(pod).get("status") or {}, C.CONDITION_DISRUPTION_TARGET)
    if cond and cond.get("status") == "True":
        return cond.get("reason") or C.CONDITION_DISRUPTION_TARGET, cond.get("message") or ""
    return None


def stopping(pod: Any) -> bool:
    """Being deleted or told to stop (DisruptionTarget): its last lines are still to come."""
    return bool((as_dict(pod).get("metadata") or {}).get("deletionTimestamp")) or disruption_target(pod) is not None


def container_ended(pod: Any, container: str | None = None) -> bool:
    """The pod ended, or its training container did (a sidecar may still run)."""
    status = as_dict(pod).get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    states = [cs.get("state") or {} for cs in status.get("containerStatuses") or []
              if not container or cs.get("name") == container]
    return bool(states) and all("terminated" in s for s in states)


@dataclass(frozen=True)
class MemberState:
    name: str
    rank: int | None
    phase: str  # the pod's phase (Pending, Running, Succeeded, Failed, Unknown)
    node: str | None
    exit_code: int | None  # of the first terminated container that did not exit 0, else of the first
    disruption: str | None  # DisruptionTarget reason, or NodeLost
    disruption_message: str = ""
    deleting: bool = False
    uid: str = ""
    started_at: float | None = None  # status.startTime (epoch seconds)
    finished_at: float | None = None  # the latest container finishedAt


@dataclass(frozen=True)
class GangState:
    phase: str
    reason: str = ""  # why (disruption reason, wait reason, failed members' exit codes)
    wait_reason: str = ""  # the scheduler's, from the group object (empty when not waiting)
    gpu_product: str = ""  # the product the scheduler bound its GPU pods on (the group object's annotation)
    members: tuple[MemberState, ...] = ()
    expected: int = 0
    missing: tuple[str, ...] = ()  # expected member names with no pod (when names are known)
    exit_codes: dict[str, int] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def failed_pods(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members if m.phase == "Failed" and m.disruption is None)

    @property
    def disrupted_pods(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members if m.disruption is not None)

    def describe(self) -> str:
        """One line for a log: phase, reason, members."""
        counts: dict[str, int] = {}
        for m in self.members:
            counts[m.phase] = counts.get(m.phase, 0) + 1
        members = ", ".join(f"{n} {p}" for p, n in sorted(counts.items())) or "no pods"
        why = f": {self.reason}" if self.reason else ""
        return f"{self.phase}{why} ({members} of {self.expected})"


def _condition(status: dict, kind: str) -> dict | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _terminated(status: dict, container: str | None) -> list[dict]:
    out = []
    for cs in status.get("containerStatuses") or []:
        if container and cs.get("name") != container:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            out.append(term)
    return out


def _exit_code(terminated: list[dict]) -> int | None:
    codes = [int(t["exitCode"]) for t in terminated if t.get("exitCode") is not None]
    nonzero = [c for c in codes if c != 0]
    return nonzero[0] if nonzero else (codes[0] if codes else None)


def base_container_phase(status: dict, container: str | None, phase: str, deleting: bool = False) -> str:
    """The member's phase as its training container says: a pod whose `container` has ended is
    Succeeded or Failed by that container's exit code even while a sidecar keeps the pod Running (as
    KubernetesPodOperator waits for its base container only). Without `container`, with no other
    container, or while the pod is being deleted (its containers end because of that): the pod's phase."""
    statuses = status.get("containerStatuses") or []
    if not container or phase not in ("Pending", "Running") or deleting or len(statuses) < 2:
        return phase
    for cs in statuses:
        if cs.get("name") == container:
            term = (cs.get("state") or {}).get("terminated")
            if term and term.get("exitCode") is not None:
                return "Succeeded" if int(term["exitCode"]) == 0 else "Failed"
    return phase


def member_state(pod: Any, live_nodes: Collection[str] | None = None, container: str | None = None) -> MemberState:
    """container: the training container (KPO's base container); its end is the member's end."""
    pod = as_dict(pod)
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    phase = base_container_phase(status, container, status.get("phase") or "Pending",
                                 deleting=bool(meta.get("deletionTimestamp")))
    node = spec.get("nodeName") or None
    disruption, message = None, ""
    target = disruption_target(pod)
    if target:
        disruption, message = target
    elif status.get("reason") == C.POD_REASON_NODE_LOST:
        disruption, message = C.POD_REASON_NODE_LOST, status.get("message") or ""
    elif node and live_nodes is not None and node not in live_nodes and phase not in ("Succeeded", "Failed"):
        disruption, message = C.POD_REASON_NODE_LOST, f"node {node} no longer exists"
    rank_text = (meta.get("labels") or {}).get(C.LABEL_GANG_RANK)
    terminated = _terminated(status, container)
    finished = [t for t in (api_time(t.get("finishedAt")) for t in terminated) if t is not None]
    return MemberState(
        name=meta.get("name") or "",
        rank=int(rank_text) if rank_text and rank_text.isdigit() else None,
        phase=phase,
        node=node,
        exit_code=_exit_code(terminated),
        disruption=disruption,
        disruption_message=message,
        deleting=bool(meta.get("deletionTimestamp")),
        uid=meta.get("uid") or "",
        started_at=api_time(status.get("startTime")),
        finished_at=max(finished) if finished else None,
    )


def _wait_reason(group: dict | None, members: Iterable[MemberState], pods: list[dict]) -> str:
    if group:
        reason = ((group.get("metadata") or {}).get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON)
        if reason:
            return reason
        gstatus = group.get("status") or {}
        if gstatus.get("phase") == C.PODGROUP_PHASE_TIMED_OUT:
            return f"PodGroup {C.PODGROUP_PHASE_TIMED_OUT}: not scheduled within spec.scheduleTimeoutSeconds"
        for cond in gstatus.get("conditions") or []:  # Volcano: Unschedulable with the scheduler's message
            if cond.get("type") == "Unschedulable" and cond.get("status") == "True":
                return cond.get("message") or cond.get("reason") or "Unschedulable"
    for pod in pods:
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        if gates:
            return f"scheduling gated by {', '.join(g.get('name', '') for g in gates)}"
        cond = _condition(pod.get("status") or {}, "PodScheduled")
        if cond and cond.get("status") == "False" and cond.get("message"):
            return cond["message"]
    return ""


def gang_state(pods: Iterable[Any], podgroup: Any = None, *, expected: int | None = None,
               expected_names: Collection[str] | None = None, live_nodes: Collection[str] | None = None,
               container: str | None = None) -> GangState:
    """The state of one gang (or lone pod) from its pods and group object.

    expected: how many members the gang has (default: expected_names, else the group's
    spec.minMember, else the pods given). expected_names: the member names, to say which are
    missing. live_nodes: names of the nodes that exist, to tell a pod whose node vanished.
    container: the training container, whose exit code and end count (default: any container, the
    pod's phase)."""
    wire = [as_dict(p) for p in pods]
    group = as_dict(podgroup) if podgroup is not None else None
    members = tuple(sorted((member_state(p, live_nodes, container) for p in wire),
                           key=lambda m: (m.rank if m.rank is not None else 1 << 30, m.name)))
    if expected is None:
        if expected_names is not None:
            expected = len(expected_names)
        elif group is not None:
            expected = int((group.get("spec") or {}).get("minMember") or len(members))
        else:
            expected = len(members)
    present = {m.name for m in members}
    missing = tuple(sorted(set(expected_names or ()) - present))
    lost = len(missing) if expected_names is not None else max(0, expected - len(members))
    exit_codes = {m.name: m.exit_code for m in members if m.exit_code is not None}
    base = dict(members=members, expected=expected, missing=missing, exit_codes=exit_codes,
                gpu_product=(((group or {}).get("metadata") or {}).get("annotations") or {}).get(
                    C.ANNOTATION_GPU_PRODUCT) or "")

    disrupted = [m for m in members if m.disruption is not None]
    if disrupted:
        first = disrupted[0]
        detail = f" ({first.disruption_message})" if first.disruption_message else ""
        return GangState(DISRUPTED, f"{first.disruption} on {first.name}{detail}", **base)
    finished = [m for m in members if m.phase in ("Succeeded", "Failed")]
    failed = [m for m in members if m.phase == "Failed"]
    if failed and all(m.exit_code == C.EXIT_CODE_STORE_UNAVAILABLE for m in failed):
        names = ", ".join(m.name for m in failed)
        return GangState(DISRUPTED, f"{REASON_STORE_UNAVAILABLE}: {names} exited {C.EXIT_CODE_STORE_UNAVAILABLE} "
                                    f"(the checkpoint store stayed unreachable through "
                                    f"{C.ENV_S3_OUTAGE_SECONDS})", **base)
    if failed:
        codes = ", ".join(f"{m.name} exit {m.exit_code}" for m in failed)
        return GangState(FAILED, f"application failure: {codes}", **base)
    if expected and not members:
        return GangState(DISRUPTED, f"{REASON_ALL_LOST}: none of the {expected} pods exists", **base)
    deleting = [m for m in members if m.deleting and m.phase not in ("Succeeded", "Failed")]
    if lost or deleting:
        gone = (list(missing) or [f"{lost} pod(s)"]) if lost else []
        gone += [f"{m.name} (being deleted)" for m in deleting]
        return GangState(DISRUPTED, f"{REASON_PARTIAL_LOSS}: {', '.join(gone)} of {expected} lost", **base)
    if len(finished) == len(members) == expected:
        return GangState(SUCCEEDED, "", **base)
    if all(m.phase in ("Running", "Succeeded") for m in members) and len(members) >= expected:
        return GangState(RUNNING, "", **base)
    if all(m.node for m in members) and len(members) >= expected:
        return GangState(ADMITTED, "", **base)
    wait = _wait_reason(group, members, wire)
    return GangState(PENDING, wait, wait_reason=wait, **base)
