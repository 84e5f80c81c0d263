"""One scheduling cycle's picture of the cluster, built from a cache View: the Snapshot with every
running pod and every held plan reserved, the pending gangs in queue order, the running gangs
(preemption candidates, quota usage) and the placement plans found on PodGroups.

Deterministic for a given View (pods sorted by name), so a restarted scheduler rebuilds the same
picture from the API alone.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from airflow_gpu import constants as C
from airflow_gpu.core.model import GPU_MILLI, Gang, Node, Placement, PodRequest, RunningGang
from airflow_gpu.core.snapshot import OverCommitError, Snapshot
from airflow_gpu.scheduler.cache import View
from airflow_gpu.scheduler.convert import (
    ConversionContext,
    ConversionError,
    gang_from_k8s,
    gang_key_of_pod,
    key_of,
    min_member,
    node_from_k8s,
    pod_holds_resources,
    pod_is_pending_for,
    pod_is_terminal,
    pod_request_from_k8s,
    running_gang_from_k8s,
)

log = logging.getLogger(__name__)

PLAN_BINDING = "binding"  # members are being bound: complete on restart
PLAN_NOMINATED = "nominated"  # victims are being evicted: GPUs held for this gang until they are gone


@dataclass
class Plan:
    """The placement a gang was given, written on its PodGroup before any member is bound."""

    state: str
    placements: dict[str, Placement]  # pod key -> placement
    at: float
    victims: tuple[str, ...] = ()  # pod keys being evicted for this plan (nominated only)
    borrowed: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "state": self.state,
                "at": round(self.at, 3),
                "borrowed": self.borrowed,
                "victims": list(self.victims),
                "pods": {
                    k: {"node": p.node, "gpus": [list(s) for s in p.gpu_shares], "mig": p.mig_profile}
                    for k, p in self.placements.items()
                },
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, members: dict[str, PodRequest]) -> "Plan":
        data = json.loads(text)
        placements = {}
        for key, p in (data.get("pods") or {}).items():
            req = members.get(key)
            placements[key] = Placement(
                pod=key,
                node=p["node"],
                gpu_shares=tuple(tuple(s) for s in p.get("gpus") or ()),
                mig_profile=p.get("mig"),
                cpu_milli=req.cpu_milli if req else 0,
                memory_mib=req.memory_mib if req else 0,
            )
        return cls(
            state=data.get("state", PLAN_BINDING),
            placements=placements,
            at=float(data.get("at") or 0),
            victims=tuple(data.get("victims") or ()),
            borrowed=bool(data.get("borrowed")),
        )


@dataclass
class Unit:
    """An admission unit: a PodGroup's pods, or one pod without a group."""

    key: str
    podgroup: dict | None
    pods: list[dict] = field(default_factory=list)

    @property
    def min_member(self) -> int:
        return min_member(self.podgroup)

    def pending(self, scheduler_name: str, assumed: dict[str, str]) -> list[dict]:
        return [p for p in self.pods if pod_is_pending_for(p, scheduler_name) and key_of(p) not in assumed]

    def bound(self, assumed: dict[str, str]) -> list[dict]:
        return [p for p in self.pods if (pod_holds_resources(p) or key_of(p) in assumed) and not pod_is_terminal(p)]

    @property
    def owner(self) -> dict | None:
        """The object that carries the gang's plan, wait reason and events: its PodGroup, or the lone pod."""
        if self.podgroup is not None:
            return self.podgroup
        return self.pods[0] if len(self.pods) == 1 and gang_key_of_pod(self.pods[0]) is None else None

    def annotation(self, name: str) -> str | None:
        meta = (self.owner or {}).get("metadata") or {}
        return (meta.get("annotations") or {}).get(name)

    def plan_text(self) -> str | None:
        return self.annotation(C.ANNOTATION_PLACEMENT)


@dataclass
class World:
    snapshot: Snapshot  # running pods and held plans reserved
    units: dict[str, Unit]
    pending: list[tuple[Unit, Gang]]  # complete gangs waiting, queue order (priority, then age)
    incomplete: list[tuple[Unit, str]]  # gangs whose members do not all exist yet, with the reason
    running: list[RunningGang]
    running_units: dict[str, Unit]  # gang name -> unit, for the running gangs
    plans: dict[str, Plan]  # unit key -> plan found on its PodGroup
    plan_ready: dict[str, bool]  # unit key -> every unbound member of the plan fits now
    invalid: list[tuple[Unit, str]]  # units whose objects cannot be understood, with the error
    nodes: dict[str, Node]
    ignored_hints: list[tuple[Unit, str]] = field(default_factory=list)  # invalid user hints, ignored


def group_units(view: View) -> dict[str, Unit]:
    units: dict[str, Unit] = {}
    for key, pg in view.podgroups.items():
        units[key] = Unit(key, pg)
    for pod in sorted(view.pods.values(), key=key_of):
        gkey = gang_key_of_pod(pod)
        if gkey is None:
            units[key_of(pod)] = Unit(key_of(pod), None, [pod])
        else:
            units.setdefault(gkey, Unit(gkey, None)).pods.append(pod)
    return units


def _hold(snap: Snapshot, node: str, req: PodRequest) -> bool:
    """Reserve `req` on `node` for a plan; True if it fits whole. Which GPUs of the node does not
    matter on Kubernetes (the device plugin picks them), so the plan's GPU indices are not replayed:
    after a restart the running pods' indices are re-chosen and could collide with them. If it does
    not fit whole (victims still terminating), what is free of it is held under a hold name, so
    nobody else takes the GPUs as they are freed."""
    try:
        i = snap.node_index(node)
    except KeyError:
        return False  # node gone
    try:
        snap.assume(snap.placement_for(req, i))
        return True
    except OverCommitError:
        pass
    free = snap.gpu_free[i]
    if req.gpus:
        shares = tuple((int(g), GPU_MILLI) for g in np.flatnonzero(free == GPU_MILLI)[: req.gpus])
    elif req.gpu_milli:
        shares = tuple((int(g), int(min(free[g], req.gpu_milli))) for g in np.flatnonzero(free > 0)[:1])
    else:
        shares = ()
    partial = Placement(
        pod=f"{req.name}#held",
        node=node,
        gpu_shares=shares,
        cpu_milli=min(req.cpu_milli, int(snap.cpu_free[i])),
        memory_mib=min(req.memory_mib, int(snap.mem_free[i])),
    )
    try:
        snap.assume(partial)
    except OverCommitError:
        pass
    return False


def _assume_running(snap: Snapshot, key: str, req: PodRequest, node: str) -> Placement | None:
    try:
        i = snap.node_index(node)
    except KeyError:
        return None  # node deleted while the pod object lingers
    try:
        placement = snap.placement_for(req, i)
        snap.assume(placement)
        return placement
    except OverCommitError as exc:
        # Over-committed by someone else (or node shrank): count what fits, say so once per cycle.
        log.warning("running pod %s does not fit its node's capacity: %s", key, exc)
        return None


class Memo:
    """Conversions of unchanged objects, kept between cycles (keyed by uid and resourceVersion, so a
    changed object is converted again), and the empty Snapshot of an unchanged node list (its static
    masks stay cached). Only a speed-up: a fresh Memo gives the same World."""

    def __init__(self) -> None:
        self.pods: dict[tuple, PodRequest] = {}
        self.nodes: dict[tuple, Node] = {}
        self.empty: tuple[tuple, Snapshot] | None = None

    @staticmethod
    def _version(obj: dict) -> tuple:
        meta = obj.get("metadata") or {}
        return (meta.get("uid"), meta.get("name"), meta.get("namespace"), meta.get("resourceVersion"))

    def pod(self, obj: dict, ctx: ConversionContext) -> PodRequest:
        v = self._version(obj)
        req = self.pods.get(v) if v[3] else None
        if req is None:
            req = pod_request_from_k8s(obj, ctx.product_labels)
            if v[3]:
                self.pods[v] = req
        return req

    def node(self, obj: dict) -> Node:
        v = self._version(obj)
        n = self.nodes.get(v) if v[3] else None
        if n is None:
            n = node_from_k8s(obj)
            if v[3]:
                self.nodes[v] = n
        return n

    def snapshot(self, nodes: list[Node]) -> Snapshot:
        key = tuple(nodes)
        if self.empty is None or self.empty[0] != key:
            self.empty = (key, Snapshot.from_nodes(nodes))
        return self.empty[1].copy()

    def prune(self, view: View) -> None:
        live_pods = {self._version(p) for p in view.pods.values()}
        self.pods = {k: v for k, v in self.pods.items() if k in live_pods}
        live_nodes = {self._version(n) for n in view.nodes.values()}
        self.nodes = {k: v for k, v in self.nodes.items() if k in live_nodes}


def build_world(view: View, scheduler_name: str, ctx: ConversionContext, now: float | None = None,
                memo: Memo | None = None) -> World:
    now = time.time() if now is None else now
    memo = memo or Memo()
    nodes: dict[str, Node] = {}
    for name, obj in sorted(view.nodes.items()):
        try:
            nodes[name] = memo.node(obj)
        except ConversionError as exc:
            log.warning("%s", exc)
    snap = memo.snapshot(list(nodes.values()))
    units = group_units(view)
    running: list[RunningGang] = []
    running_units: dict[str, Unit] = {}
    invalid: list[tuple[Unit, str]] = []
    ignored_hints: list[tuple[Unit, str]] = []
    requests: dict[str, PodRequest] = {}

    # 1. what runs holds its resources
    for unit in units.values():
        held = unit.bound(view.assumed)
        if not held:
            continue
        placements = []
        for pod in held:
            key = key_of(pod)
            try:
                req = requests[key] = memo.pod(pod, ctx)
            except ConversionError as exc:
                invalid.append((unit, str(exc)))
                continue
            except _MALFORMED as exc:
                invalid.append((unit, _malformed(unit, exc)))
                continue
            node = (pod.get("spec") or {}).get("nodeName") or view.assumed.get(key)
            placement = _assume_running(snap, key, req, node)
            if placement is not None:
                placements.append(placement)
        if placements:
            ours = all((p.get("spec") or {}).get("schedulerName") == scheduler_name for p in held)
            hints: list[str] = []
            try:
                rg = running_gang_from_k8s(unit.key, unit.podgroup, held, ctx, tuple(placements), ours=ours,
                                           members=[requests[key_of(p)] for p in held if key_of(p) in requests],
                                           hints=hints)
            except ConversionError as exc:
                invalid.append((unit, str(exc)))
                continue
            except _MALFORMED as exc:  # one odd object must never stop the cycle for every gang
                invalid.append((unit, _malformed(unit, exc)))
                continue
            finally:
                ignored_hints += [(unit, h) for h in hints]
            running.append(rg)
            running_units[rg.gang.name] = unit

    # 2. plans hold their GPUs (bind in progress, or victims being evicted)
    plans: dict[str, Plan] = {}
    plan_ready: dict[str, bool] = {}
    for unit in units.values():
        text = unit.plan_text()
        if not text:
            continue
        pending = unit.pending(scheduler_name, view.assumed)
        members = {}
        for pod in pending:
            try:
                members[key_of(pod)] = requests.get(key_of(pod)) or memo.pod(pod, ctx)
            except _MALFORMED:
                pass
        try:
            plan = Plan.from_json(text, members)
        except _MALFORMED as exc:
            invalid.append((unit, f"PodGroup {unit.key}: annotation {C.ANNOTATION_PLACEMENT} is not a plan: {exc}"))
            continue
        plans[unit.key] = plan
        ready = True
        for key in sorted(members):
            placement = plan.placements.get(key)
            if placement is None or placement.node not in nodes:
                ready = False
                continue
            ready = _hold(snap, placement.node, members[key]) and ready
        plan_ready[unit.key] = ready

    # 3. complete gangs wait in priority order, then oldest first
    pending: list[tuple[Unit, Gang]] = []
    incomplete: list[tuple[Unit, str]] = []
    for unit in units.values():
        if unit.key in plans:
            continue
        waiting = unit.pending(scheduler_name, view.assumed)
        if not waiting:
            continue
        if unit.podgroup is None and gang_key_of_pod(waiting[0]) is not None:
            incomplete.append((unit, f"waiting for PodGroup {unit.key} to be created"))
            continue
        try:
            need = unit.min_member
        except ConversionError as exc:
            invalid.append((unit, str(exc)))
            continue
        bound = unit.bound(view.assumed)
        alive = len(waiting) + len(bound)
        if alive < need:
            incomplete.append((unit, f"gang has {alive} of {need} pods; waiting for the rest to be created"))
            continue
        try:
            # minMember counts bound members too: the rest must place at least what is missing
            bound_nodes = [(p.get("spec") or {}).get("nodeName") or view.assumed.get(key_of(p)) for p in bound]
            gang = gang_from_k8s(unit.key, unit.podgroup, waiting, ctx, [memo.pod(p, ctx) for p in waiting],
                                 pinned=[n for n in bound_nodes if n], min_member=max(1, need - len(bound)))
        except ConversionError as exc:
            invalid.append((unit, str(exc)))
            continue
        except _MALFORMED as exc:
            invalid.append((unit, _malformed(unit, exc)))
            continue
        pending.append((unit, gang))
    pending.sort(key=lambda ug: (-ug[1].priority, ug[1].created_at, ug[1].name))
    return World(snap, units, pending, incomplete, running, running_units, plans, plan_ready, invalid, nodes,
                 ignored_hints)


# What reading a malformed object can raise beyond ConversionError (a list where a map belongs, a
# number where a string does): the unit is reported and skipped, every other gang is scheduled.
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError)


def _malformed(unit: Unit, exc: Exception) -> str:
    log.warning("gang %s: malformed object skipped", unit.key, exc_info=True)
    return f"gang {unit.key}: an object of this gang is malformed ({type(exc).__name__}: {str(exc)[:200]}); " \
           f"skipped until it is fixed"

