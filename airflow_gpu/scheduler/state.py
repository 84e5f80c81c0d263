"""One scheduling cycle's picture of the cluster, built once from a cache View (build_world), in
phases: the nodes; the pods, grouped into units (a PodGroup's pods or a lone pod), the running ones
held on the Snapshot (kept by deltas in the Memo); each unit's running gang and the Gang of its
pending members; then the cycle's CycleState (capacity, quota, preemption candidates), into which
each plan found in the scheduler's own namespace (never in annotations: pod owners write those) is
counted once core.plans has re-checked it against the cluster as it is. Every later step of the
cycle reads this World: nothing is converted or counted a second time.

Deterministic for a given View (pods sorted by name), so a restarted scheduler rebuilds the same
picture from the API alone.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from sortedcontainers import SortedDict, SortedList

from airflow_gpu import constants as C
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.live import QuotaLedger
from airflow_gpu.core.model import Gang, Node, Placement, PodRequest, RunningGang
from airflow_gpu.core.plans import hold_member, may_bind, recheck_plan
from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.quota import QuotaBook, placement_speed
from airflow_gpu.core.snapshot import OverCommitError, Snapshot
from airflow_gpu.kube.convert import (
    ConversionContext,
    ConversionError,
    gang_from_k8s,
    gang_identity,
    gang_key_of_pod,
    key_of,
    min_member,
    node_from_k8s,
    pod_holds_resources,
    pod_is_pending_for,
    pod_is_terminal,
    pod_is_terminating,
    pod_request_from_k8s,
    running_gang_from_k8s,
)
from airflow_gpu.scheduler.cache import View

log = logging.getLogger(__name__)

PLAN_BINDING = "binding"  # members are being bound: complete on restart
PLAN_NOMINATED = "nominated"  # victims are being evicted: GPUs held for this gang until they are gone
PLAN_ADMITTED = "admitted"  # bound on borrowed quota: kept while the gang runs, so reclaim knows it
PLAN_STATES = (PLAN_BINDING, PLAN_NOMINATED, PLAN_ADMITTED)
PLAN_VERSION = 1
MAX_PLAN_PODS = 10_000


@dataclass
class Plan:
    """What the scheduler must remember about a gang across a restart: where its members go (written
    before any member is bound), the victims a preemption is stopping, whether it was admitted on
    borrowed quota. Stored as a ConfigMap in the scheduler's own namespace (plan_store_name), tied
    to the UIDs of the owner (PodGroup or lone pod), of each member and of each victim, so a
    recreated object of the same name is never taken for the one the plan was made for."""

    state: str
    placements: dict[str, Placement]  # pod key -> placement
    at: float
    victims: tuple[str, ...] = ()  # pod keys being evicted for this plan (nominated only)
    borrowed: bool = False
    owner_key: str = ""
    owner_uid: str = ""
    pod_uids: dict[str, str] = field(default_factory=dict)  # member pod key -> uid
    victim_uids: dict[str, str] = field(default_factory=dict)  # victim pod key -> uid

    def to_record(self, scheduler_name: str) -> dict:
        return {
            "v": PLAN_VERSION,
            "scheduler": scheduler_name,
            "owner": {"key": self.owner_key, "uid": self.owner_uid},
            "state": self.state,
            "at": round(self.at, 3),
            "borrowed": self.borrowed,
            "victims": {k: self.victim_uids.get(k, "") for k in self.victims},
            "pods": {
                k: {"uid": self.pod_uids.get(k, ""), "node": p.node, "gpus": [list(s) for s in p.gpu_shares],
                    "mig": p.mig_profile}
                for k, p in self.placements.items()
            },
        }

    def to_json(self, scheduler_name: str = C.DEFAULT_SCHEDULER_NAME) -> str:
        return json.dumps(self.to_record(scheduler_name), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A plan record, checked field by field: ValueError naming the field if it is not one."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != PLAN_VERSION:
            raise ValueError(f"not a version {PLAN_VERSION} plan record")
        owner = data.get("owner")
        state = data.get("state")
        at = data.get("at")
        pods = data.get("pods")
        victims = data.get("victims") or {}
        if not isinstance(owner, dict) or not all(isinstance(owner.get(k), str) and owner.get(k) for k in ("key", "uid")):
            raise ValueError("owner: needs key and uid")
        if state not in PLAN_STATES:
            raise ValueError(f"state {state!r}: one of {', '.join(PLAN_STATES)}")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            raise ValueError(f"at {at!r}: epoch seconds")
        if not isinstance(pods, dict) or len(pods) > MAX_PLAN_PODS:
            raise ValueError("pods: a map of pod key to placement")
        if not isinstance(victims, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in victims.items()):
            raise ValueError("victims: a map of pod key to uid")
        placements, uids = {}, {}
        for key, p in pods.items():
            if not isinstance(p, dict) or not isinstance(p.get("node"), str) or not isinstance(p.get("uid"), str):
                raise ValueError(f"pods[{key}]: needs node and uid")
            gpus = p.get("gpus") or []
            if not isinstance(gpus, list) or not all(
                    isinstance(g, list) and len(g) == 2 and all(type(x) is int and x >= 0 for x in g) for g in gpus):
                raise ValueError(f"pods[{key}].gpus: a list of [gpu index, milli]")
            mig = p.get("mig")
            if mig is not None and not isinstance(mig, str):
                raise ValueError(f"pods[{key}].mig: a MIG profile name")
            placements[key] = Placement(pod=key, node=p["node"], gpu_shares=tuple(tuple(g) for g in gpus),
                                        mig_profile=mig)
            uids[key] = p["uid"]
        return cls(state=state, placements=placements, at=float(at), victims=tuple(victims),
                   borrowed=data.get("borrowed") is True, owner_key=owner["key"], owner_uid=owner["uid"],
                   pod_uids=uids, victim_uids=dict(victims))

    def for_members(self, members: dict[str, dict], requests: dict[str, PodRequest]) -> dict[str, Placement]:
        """The placements of `members` (pending pods, by key) that this plan was made for: same key
        and same UID, with the pod's own CPU and memory."""
        out = {}
        for key, pod in members.items():
            p = self.placements.get(key)
            if p is None or self.pod_uids.get(key) != _uid(pod):
                continue
            req = requests.get(key)
            out[key] = replace(p, cpu_milli=req.cpu_milli if req else 0, memory_mib=req.memory_mib if req else 0)
        return out


def plan_store_name(owner_uid: str) -> str:
    """The ConfigMap name of a gang's plan: fixed by the owner's UID, so one owner has one record."""
    return f"{C.PLAN_CONFIGMAP_PREFIX}{owner_uid}"


def _uid(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


@dataclass
class Unit:
    """An admission unit: a PodGroup's pods, or one pod without a group. `gang`: its pending members
    as this cycle converted them (build_world), read by every later step; None when none is pending
    or they cannot be read."""

    key: str
    podgroup: dict | None
    pods: list[dict] = field(default_factory=list)
    gang: Gang | None = None
    keys: list[str] = field(default_factory=list)  # key_of each of `pods`, as group_units read them

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

    @property
    def owner_uid(self) -> str:
        return _uid(self.owner)


@dataclass
class World:
    """One cycle's picture of the cluster, converted once (build_world) and read by every later step."""

    snapshot: Snapshot  # running pods and held plans reserved (the same object as state.snap)
    units: dict[str, Unit]
    pending: list[tuple[Unit, Gang]]  # complete gangs waiting, queue order (priority, then age)
    incomplete: list[tuple[Unit, str]]  # gangs whose members do not all exist yet, with the reason
    running: list[RunningGang]
    running_units: dict[str, Unit]  # gang name -> unit, for the running gangs
    plans: dict[str, Plan]  # unit key -> plan found on its PodGroup
    plan_ready: dict[str, bool]  # unit key -> every unbound member of the plan fits now
    invalid: list[tuple[Unit, str]]  # units whose objects cannot be understood, with the error
    nodes: dict[str, Node]
    # invalid user hints of running gangs and contradicting team/tier labels of any gang: ignored
    ignored_hints: list[tuple[Unit, str]] = field(default_factory=list)
    rejected_plans: list[tuple[Unit, Plan, str]] = field(default_factory=list)  # failed the re-check now
    stale_plans: list[tuple[str, str]] = field(default_factory=list)  # plan record key -> why it goes
    records: dict[str, Plan] = field(default_factory=dict)  # unit key -> its plan record, as read
    # capacity and quota of everything holding GPUs, the held plans counted, the preemption candidates:
    # what schedule_cycle decides on (built once, with the plans' re-check)
    state: CycleState | None = None
    derived: dict[str, Derived] = field(default_factory=dict)  # unit key -> what its objects gave (Memo)
    # what may differ from the World built before (with the same Memo), for readers kept by deltas:
    # the units grouped again and the running gangs looked at again (None: any of them)
    touched: set[str] | None = None
    running_changed: set[str] | None = None
    running_by_name: dict[str, RunningGang] = field(default_factory=dict)  # `running`, by gang name


def group_units(view: View) -> dict[str, Unit]:
    """The view's pods by unit: first every PodGroup's (in the view's order), then the units of pods
    without one (a lone pod, or members whose PodGroup does not exist yet) in the order of their
    first pod key. A lone pod named like a unit key takes that unit's place (never in practice;
    Grouping rebuilds from scratch while one does)."""
    units: dict[str, Unit] = {}
    for key, pg in view.podgroups.items():
        units[key] = Unit(key, pg)
    for key, pod in sorted(view.pods.items()):  # the cache's keys are key_of(pod)
        gkey = gang_key_of_pod(pod)
        if gkey is None:
            units[key] = Unit(key, None, [pod], keys=[key])
        else:
            unit = units.get(gkey)
            if unit is None:
                unit = units[gkey] = Unit(gkey, None)
            unit.pods.append(pod)
            unit.keys.append(key)
    return units


class Grouping:
    """group_units kept between cycles (the Memo's): a unit none of whose objects changed since the
    last cycle (the cache replaces an object that changes and never mutates one), nor which of its
    pods the cache assumes bound, is the very same Unit; only the others are grouped again. At
    50,000 pods the full grouping (a sort of every pod key) was a quarter of a steady cycle. Same
    units in the same order as group_units (tested against it)."""

    REBUILD_SHARE = 0.5  # more of the pods changed than this: grouped from scratch

    def __init__(self) -> None:
        self.pods: dict[str, tuple[dict, str | None]] = {}  # pod key -> (pod, its gang key)
        self.assumed: dict[str, str] = {}
        self.podgroups: dict[str, dict] = {}
        self.members: dict[str, list[str]] = {}  # unit key -> its pod keys, sorted
        self.loose: SortedDict = SortedDict()  # first pod key -> unit key, of the units without a PodGroup
        self.first: dict[str, str] = {}  # unit key -> its first pod key in `loose`
        self.lone: set[str] = set()  # keys of lone pods (a unit of their own)
        self.units: dict[str, Unit] = {}
        self.kept = False  # the fields above describe the last view
        self.at: tuple | None = None  # that view's place in its cache's sequence (Changes.upto)

    def group(self, view: View) -> tuple[dict[str, Unit], set[str] | None]:
        """The view's units and the keys of those grouped again (None: all of them)."""
        touched = self._update(view) if self.kept else None
        self.at = view.changes.upto if view.changes is not None else None
        if touched is None:
            self._rebuild(view)
            return self.units, None
        units: dict[str, Unit] = {}
        for key in view.podgroups:
            units[key] = self.units[key] if key not in touched else self._unit(key, view)
        for key in self.loose.values():
            units[key] = self.units[key] if key not in touched else self._unit(key, view)
        self.units = units
        return units, touched

    def _unit(self, key: str, view: View) -> Unit:
        keys = list(self.members.get(key, ()))
        return Unit(key, view.podgroups.get(key), [view.pods[k] for k in keys], keys=keys)

    def _rebuild(self, view: View) -> None:
        self.units = group_units(view)
        self.pods = {key: (pod, gang_key_of_pod(pod)) for key, pod in view.pods.items()}
        self.assumed, self.podgroups = dict(view.assumed), dict(view.podgroups)
        self.members = {key: list(unit.keys) for key, unit in self.units.items() if unit.keys}
        self.lone = {key for key, (_, gkey) in self.pods.items() if gkey is None}
        self.first = {key: unit.keys[0] for key, unit in self.units.items() if key not in view.podgroups}
        self.loose = SortedDict((first, key) for key, first in self.first.items())
        # a lone pod named like another unit replaces it in group_units: rare enough to always rebuild then
        gangs = {gkey for _, gkey in self.pods.values() if gkey is not None}
        self.kept = not (self.lone & (gangs | view.podgroups.keys()))

    def _update(self, view: View) -> set[str] | None:
        """Bring the kept grouping to `view`; the keys of the units it touched, or None where it cannot
        be (rebuild instead)."""
        pods, kept, pgs = view.pods, self.pods, view.podgroups
        # the cache's changes since the view grouped last, when this view is the very next one;
        # else every pod and PodGroup is compared with the one kept
        changes = view.changes if view.changes is not None and view.changes.since == self.at else None
        maybe = pods.keys() if changes is None else changes.pods
        changed = [key for key in maybe if (pod := pods.get(key)) is not None
                   and ((hit := kept.get(key)) is None or hit[0] is not pod)]
        if len(changed) > self.REBUILD_SHARE * len(pods):
            return None  # a relist, a restart's first cycles: grouping all again is cheaper
        gone = kept.keys() - pods.keys() if changes is None else [key for key in changes.pods
                                                                     if key in kept and key not in pods]
        flipped = {key for key, _ in view.assumed.items() ^ self.assumed.items() if key in pods}
        touched: set[str] = set()
        for key in gone:
            self._leave(key, kept.pop(key)[1], touched)
        for key in changed:
            old = kept.get(key)
            if old is not None:
                self._leave(key, old[1], touched)
            gkey = gang_key_of_pod(pods[key])
            kept[key] = (pods[key], gkey)
            if not self._join(key, gkey, view, touched):
                return None
        for key in flipped:  # its unit's derivations read which of its pods are assumed bound
            touched.add(kept[key][1] or key)
        kept_pgs = self.podgroups
        came_or_went = pgs.keys() ^ kept_pgs.keys() if changes is None else \
            [key for key in changes.podgroups if (key in pgs) != (key in kept_pgs)]
        for key in came_or_went:  # a PodGroup created or deleted: its members move
            if key in self.lone:
                return None
            touched.add(key)
            self._place(key, pgs)
        maybe = pgs.keys() if changes is None else changes.podgroups
        touched.update(key for key in maybe if key in pgs and kept_pgs.get(key) is not pgs[key])
        self.assumed = dict(view.assumed)
        if changes is None:
            self.podgroups = dict(pgs)
        else:
            for key in changes.podgroups:
                if key in pgs:
                    kept_pgs[key] = pgs[key]
                else:
                    kept_pgs.pop(key, None)
        return touched

    def _leave(self, key: str, gkey: str | None, touched: set[str]) -> None:
        ukey = gkey or key
        members = self.members.get(ukey)
        if members is not None:
            members.pop(bisect.bisect_left(members, key))
            if not members:
                del self.members[ukey]
        if gkey is None:
            self.lone.discard(key)
        touched.add(ukey)
        self._place(ukey, self.podgroups)

    def _join(self, key: str, gkey: str | None, view: View, touched: set[str]) -> bool:
        ukey = gkey or key
        if gkey is None:
            if key in view.podgroups or key in self.members:
                return False
            self.lone.add(key)
        elif gkey in self.lone:
            return False
        bisect.insort(self.members.setdefault(ukey, []), key)
        touched.add(ukey)
        self._place(ukey, view.podgroups)
        return True

    def _place(self, ukey: str, podgroups: dict) -> None:
        """Keep `loose` right for `ukey`: listed by its first pod key while it has pods and no PodGroup."""
        old = self.first.pop(ukey, None)
        if old is not None:
            del self.loose[old]
        members = self.members.get(ukey)
        if members and ukey not in podgroups:
            self.first[ukey] = members[0]
            self.loose[members[0]] = ukey


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


class Derived:
    """What build_world derives from one unit's objects, kept while they are the same objects (Memo.
    derived): its bound and waiting pods, the rows read_bound holds, its running gang and its
    pending gang (or why it has none), its PodGroup status as the scheduler wants it. Each slot is
    filled the first time a cycle needs it, with the inputs beyond the objects in its key."""

    __slots__ = ("sig", "objects", "held", "waiting", "terminating", "rows", "errors", "running", "pending", "planned",
                 "status")

    def __init__(self, sig: tuple, unit: Unit, held: list[dict], waiting: list[dict]):
        self.sig = sig
        self.objects = (unit.podgroup, unit.pods)  # alive while kept, so the ids in `sig` stay theirs
        self.held, self.waiting = held, waiting
        self.terminating = any(pod_is_terminating(p) for p in unit.pods)  # some member is being deleted
        self.rows: list[tuple[str, tuple, PodRequest, str]] | None = None  # (key, identity, request, node)
        self.errors: list[Exception] = []  # why bound pods could not be read
        self.running: tuple[tuple, object, list[str]] | None = None  # (key, RunningGang or error, hints)
        self.pending: tuple | None = None  # ("gang", Gang, ignored) | ("incomplete", why) | ("refused", error)
        self.planned: tuple | None = None  # the planned unit's gang: ("gang", Gang) | ("unreadable", why)
        self.status: tuple[tuple, dict | None] | None = None  # ((has plan, timed out), status; None: bad minMember)


def _status_only(old: dict | None, new: dict | None) -> bool:
    """`new` is `old` with only its status (and resourceVersion) changed: nothing a unit's entry was
    derived from (its spec, labels and annotations, never its status)."""
    if old is None or new is None or old.get("spec") != new.get("spec"):
        return False
    a, b = old.get("metadata") or {}, new.get("metadata") or {}
    skip = ("resourceVersion", "managedFields")
    return len(a.keys() - skip) == len(b.keys() - skip) and all(a[k] == b.get(k) for k in a if k not in skip)


class RunningGangs:
    """The running gangs of the units with bound pods, by unit key (in key order), kept by deltas
    (Memo.running): a cycle looks again only at the units whose entry may have changed (Grouping's
    touched units), whose pods the live snapshot held or released, or whose plan record came or
    went; every other unit's gang, ignored hints and errors are the last cycle's."""

    def __init__(self) -> None:
        self.gangs: dict[str, RunningGang] = {}  # unit key -> RunningGang (its gang's name is the key)
        self.order = SortedList()  # the keys of `gangs`, sorted: the order of World.running
        self.units: dict[str, Unit] = {}  # unit key -> its Unit, of the running gangs
        self.going: set[str] = set()  # keys of running gangs with a member being deleted
        self.hints: dict[str, tuple[Unit, list[str]]] = {}  # unit key -> its invalid hints, ignored
        self.errors: dict[str, tuple[Unit, list[Exception]]] = {}  # unit key -> why it cannot be read
        self.recorded: dict[str, tuple] = {}  # unit key -> what its plan record says of borrowing, as last read
        self.inputs: tuple | None = None  # what beyond the units the entries were derived with

    def running(self) -> list[RunningGang]:
        return list(map(self.gangs.__getitem__, self.order))

    def clear(self) -> None:
        self.gangs.clear()
        self.order.clear()
        self.units.clear()
        self.going.clear()
        self.hints.clear()
        self.errors.clear()

    def put(self, unit: Unit, rg: RunningGang) -> None:
        if unit.key not in self.gangs:
            self.order.add(unit.key)
        self.gangs[unit.key] = rg
        self.units[unit.key] = unit

    def drop(self, key: str) -> None:
        if self.gangs.pop(key, None) is not None:
            self.order.remove(key)
        self.units.pop(key, None)
        self.going.discard(key)
        self.hints.pop(key, None)
        self.errors.pop(key, None)


class Memo:
    """Conversions of unchanged objects, kept between cycles (pods and nodes keyed by uid and
    resourceVersion, so a changed object is converted again; each unit's Derived entry while its
    objects are the same ones), and the snapshot of the running pods kept by deltas (kube-scheduler's
    cache): each cycle only the units whose bound pods started, ended or moved since the last one
    are assumed or released, and the cycle works on a copy. Only a speed-up: a fresh Memo gives the same
    World, except which GPU indices of a node running pods are counted on (on Kubernetes the device
    plugin picks them; free capacity per node is the same)."""

    def __init__(self) -> None:
        self.pods: dict[tuple, PodRequest] = {}
        self.nodes: dict[tuple, Node] = {}
        self.node_list: tuple[dict, dict[str, Node]] | None = None  # the last view's node objects, as read
        self.empty: tuple[tuple, Snapshot] | None = None
        self.live: Snapshot | None = None  # the running pods held, on the node list of `empty`
        self.held: dict[str, tuple[tuple, Placement]] = {}  # pod key -> ((uid, node, request), placement)
        self.applied: dict[str, Derived] = {}  # unit key -> the entry whose bound pods `live` holds
        self.unheld: dict[str, tuple[tuple, str]] = {}  # pod key -> (its row, unit key): did not fit, tried again
        self.epochs: dict[str, int] = {}  # unit key -> changes whenever a pod of it is held or released on `live`
        self._ticks = itertools.count()
        self.quota: QuotaLedger | None = None  # quota usage of the running gangs, kept by deltas
        self.units: dict[str, Derived] = {}  # unit key -> what the last cycle derived from its objects
        self.grouping = Grouping()  # the units of the last view, regrouped where they changed
        self.waiting: set[str] = set()  # keys of the units with waiting pods (an entry's `waiting`)
        self.bound: dict[str, Derived] = {}  # unit key -> its entry, of the units with bound pods
        self.running = RunningGangs()
        self.built = True  # the last build_world ended (else the next one derives every unit again)

    def derived(self, unit: Unit, assumed: dict[str, str], scheduler_name: str) -> "Derived":
        """What was derived from `unit` last cycle, if its objects are the very same (the cache
        replaces an object that changes and never mutates one) and so is which of its pods the cache
        assumes bound; else a fresh entry."""
        sig = (id(unit.podgroup), tuple(map(id, unit.pods)), tuple(map(assumed.get, unit.keys)), scheduler_name)
        d = self.units.get(unit.key)
        if d is not None and d.sig != sig and d.sig[1:] == sig[1:] and _status_only(d.objects[0], unit.podgroup):
            d.sig, d.objects = sig, (unit.podgroup, unit.pods)  # e.g. the scheduler's own status write
        elif d is None or d.sig != sig:
            d = Derived(sig, unit, unit.bound(assumed), unit.pending(scheduler_name, assumed))
        return d

    def derive(self, units: dict[str, Unit], touched: set[str] | None, assumed: dict[str, str],
               scheduler_name: str) -> dict[str, "Derived"]:
        """Every unit's entry (unit key -> Derived), kept in place: only the `touched` units (None:
        all) are looked up again, a unit gone is forgotten. An untouched unit is the same Unit as
        last cycle, so its entry is the one derived then."""
        if touched is None:
            self.units = {key: self.derived(unit, assumed, scheduler_name) for key, unit in units.items()}
            self.waiting = {key for key, d in self.units.items() if d.waiting}
            return self.units
        for key in touched:
            unit = units.get(key)
            d = self.derived(unit, assumed, scheduler_name) if unit is not None else None
            if d is None:
                self.units.pop(key, None)
            else:
                self.units[key] = d
            if d is not None and d.waiting:
                self.waiting.add(key)
            else:
                self.waiting.discard(key)
        return self.units

    def ledger(self, book: QuotaBook, node_product: dict) -> QuotaLedger:
        """The quota ledger of the running gangs, started again for a new book or node list."""
        if self.quota is None or self.quota.book is not book or self.quota.node_product is not node_product:
            self.quota = QuotaLedger(book, node_product)
        return self.quota

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
            self.live, self.held, self.applied, self.unheld, self.epochs = None, {}, {}, {}, {}
        return self.empty[1].copy()

    def running_snapshot(self, nodes: list[Node], bound: dict[str, "Derived"],
                         changed: Iterable[str] | None = None) -> set[str] | None:
        """The live snapshot brought up to `bound` (unit key -> its entry, whose rows are its bound
        pods): only units whose entry changed since the last cycle are looked at (`changed`: the
        keys of those that may have, None: look at every one); their pods gone or changed are
        released first, then new ones assumed in pod key order (and those that did not fit before
        tried again). Returns the keys of the units whose pods it held or released (None: it
        started again, every unit may have), whose epoch moved."""
        self.snapshot(nodes)
        if self.live is None:
            self.live = self.empty[1].copy()
            changed = None
        live, held, applied, epochs = self.live, self.held, self.applied, self.epochs
        moved: set[str] = set()
        keys = list(applied) if changed is None else [k for k in changed if k in applied]
        for key in [k for k in keys if bound.get(k) is not applied[k]]:
            old, new = applied.pop(key), bound.get(key)
            keep = {row[0]: row[1] for row in new.rows} if new is not None else {}
            for row in old.rows:
                pod = row[0]
                self.unheld.pop(pod, None)
                if pod in held and keep.get(pod) != held[pod][0]:
                    live.forget(held.pop(pod)[1].pod)
                    epochs[key] = next(self._ticks)
                    moved.add(key)
            if new is None:
                epochs.pop(key, None)
        add = list(self.unheld.values())
        for key in bound if changed is None else [k for k in changed if k in bound]:
            d = bound[key]
            if applied.get(key) is not d:
                applied[key] = d
                add += [(row, key) for row in d.rows if row[0] not in held]
        for row, key in sorted(add, key=lambda a: a[0][0]):
            pod, ident, req, node = row
            placement = _assume_running(live, pod, req, node)
            if placement is None:
                self.unheld[pod] = (row, key)
                continue
            self.unheld.pop(pod, None)
            held[pod] = (ident, placement)
            epochs[key] = next(self._ticks)
            moved.add(key)
        return None if changed is None else moved

    def prune(self, view: View) -> None:
        live_pods = {self._version(p) for p in view.pods.values()}
        self.pods = {k: v for k, v in self.pods.items() if k in live_pods}
        live_nodes = {self._version(n) for n in view.nodes.values()}
        self.nodes = {k: v for k, v in self.nodes.items() if k in live_nodes}


def read_plan_records(view: View, units: dict[str, Unit]) -> tuple[dict[str, Plan], list[tuple[str, str]]]:
    """The plan records of the scheduler's namespace, matched to their gangs by owner UID: unit key
    -> Plan, and the records to delete (unreadable, misnamed, or whose owner is gone or recreated)."""
    found: dict[str, Plan] = {}
    stale: list[tuple[str, str]] = []
    for key, cm in sorted(view.plans.items()):
        text = (cm.get("data") or {}).get(C.PLAN_DATA_KEY) or ""
        try:
            plan = Plan.from_json(text)
        except ValueError as exc:
            stale.append((key, f"unreadable plan record: {exc}"))
            continue
        unit = units.get(plan.owner_key)  # by key, then the UID: a recreated owner is another object
        if unit is not None and unit.owner_uid != plan.owner_uid:
            unit = None
        if (cm.get("metadata") or {}).get("name") != plan_store_name(plan.owner_uid):
            stale.append((key, "plan record not named by its owner's UID"))
        elif unit is None:
            stale.append((key, f"the owner {plan.owner_key} of this plan is gone"))
        else:
            found[unit.key] = plan
    return found, stale


def build_world(view: View, scheduler_name: str, ctx: ConversionContext, now: float | None = None,
                memo: Memo | None = None, book: QuotaBook | None = None,
                policy: PreemptionPolicy | None = None) -> World:
    """The cycle's World, converted in phases: the nodes; the pods, grouped into units first (so that
    only members that hold resources or wait are read, never a finished pod), the bound ones held on
    the snapshot; each unit's running gang and the Gang of its pending members; then the cycle's one
    CycleState, into which every plan record is counted once re-checked (core.plans, with `book` and
    `policy`: those the scheduler decides with). Every later step of the cycle reads this World and
    its state; nothing is converted again."""
    now = time.time() if now is None else now
    memo = memo or Memo()
    b = _Build(view, scheduler_name, ctx, memo)
    nodes = b.read_nodes()
    if not memo.built:  # the last build stopped half-way: what is kept may be partly this view's
        memo.grouping.kept = False
    memo.built = False
    units, touched = memo.grouping.group(view)
    b.derived = memo.derive(units, touched, view.assumed, scheduler_name)
    records, stale_plans = read_plan_records(view, units)
    snap, moved = b.read_bound(nodes, touched)
    looked = b.running_gangs(units, records, snap, book, touched, moved)
    running, running_units = memo.running.running(), dict(memo.running.units)
    planned = {key for key, record in records.items() if record.state != PLAN_ADMITTED}
    pending, incomplete, unreadable = b.pending_gangs(units, planned)
    state = _cycle_state(snap, running, book, memo, looked)
    plans, plan_ready, rejected = b.recheck_plans(state, records, units, memo.running.gangs, running_units, unreadable,
                                                  nodes, now, policy or PreemptionPolicy())
    closing = b.closing_victims(records, units, running_units)
    if closing:  # after the re-checks, which judged every plan with these gangs still candidates
        state.running = [rg for rg in state.running if rg.gang.name not in closing]
    pending.sort(key=lambda ug: ug[1].queue_key)  # core's queue order (core.queue.queue_order)
    memo.built = True
    return World(snap, units, pending, incomplete, running, running_units, plans, plan_ready, b.invalid, nodes,
                 b.ignored_hints, rejected, stale_plans, records, state, b.derived, touched, looked,
                 dict(memo.running.gangs))


def _cycle_state(snap: Snapshot, running: list[RunningGang], book: QuotaBook | None, memo: Memo,
                 looked: set[str] | None) -> CycleState:
    """Capacity and quota of every running gang (terminating ones too, until their GPUs are free);
    the preemption candidates are those not terminating. Held plans are counted into it as they
    pass their re-check (_Build.recheck_plans). `looked`: the running gangs that may have changed
    since the last cycle (None: any), the only ones the quota ledger counts again."""
    going = memo.running.going
    candidates = [rg for rg in running if rg.gang.name not in going] if going else running
    if book is None:
        return CycleState.build(snap, candidates)
    kept = memo.quota
    ledger = memo.ledger(book, snap.shape.node_product)  # every running gang's quota, kept by deltas
    if looked is None or ledger is not kept:
        ledger.sync(running)
    else:
        for key in looked:
            ledger.put(key, memo.running.gangs.get(key))
    return ledger.cycle_state(snap, candidates)


class _Build:
    """The phases of build_world, sharing what they collect: each pod's request, the units that
    cannot be read, the hints ignored."""

    def __init__(self, view: View, scheduler_name: str, ctx: ConversionContext, memo: Memo):
        self.view, self.scheduler_name, self.ctx, self.memo = view, scheduler_name, ctx, memo
        self.requests: dict[str, PodRequest] = {}  # pod key -> request, of the planned gangs' pending pods
        self.invalid: list[tuple[Unit, str]] = []
        self.ignored_hints: list[tuple[Unit, str]] = []
        self.derived: dict[str, Derived] = {}  # unit key -> what its objects gave (Memo.derived)

    def refuse(self, unit: Unit, exc: Exception) -> None:
        """`unit` cannot be read this cycle: it waits with the problem named (one odd object must
        never stop the cycle for every gang)."""
        self.invalid.append((unit, str(exc) if isinstance(exc, ConversionError) else _malformed(unit, exc)))

    def read_nodes(self) -> dict[str, Node]:
        objs, kept = self.view.nodes, self.memo.node_list
        if kept is not None and len(kept[0]) == len(objs) and all(kept[0].get(n) is o for n, o in objs.items()):
            return kept[1]  # the very objects of last cycle (the cache replaces a node that changes)
        nodes: dict[str, Node] = {}
        for name, obj in sorted(objs.items()):
            try:
                nodes[name] = self.memo.node(obj)
            except _MALFORMED as exc:  # a node the scheduler cannot read takes no pods; the others do
                log.warning("node %s skipped: %s", name, exc)
        self.memo.node_list = (dict(objs), nodes)
        return nodes

    def read_bound(self, nodes: dict[str, Node], touched: set[str] | None) -> tuple[Snapshot, set[str] | None]:
        """What runs holds its resources: the units with bound pods (Memo.bound) and the live
        snapshot take this cycle's deltas (`touched`: the keys of the units whose entry may have
        changed, None: every unit), the cycle a copy. Returns it and the keys of the units whose
        pods the live snapshot held or released (None: every unit may have)."""
        view, memo, bound = self.view, self.memo, self.memo.bound
        if touched is None:
            bound.clear()
        for key in self.derived if touched is None else touched:
            d = self.derived.get(key)
            if d is None or not d.held:
                bound.pop(key, None)
                continue
            bound[key] = d
            if d.rows is None:  # a kept entry has its rows already
                d.rows = []
                for pod in d.held:
                    pkey = key_of(pod)
                    try:
                        req = memo.pod(pod, self.ctx)
                    except _MALFORMED as exc:
                        d.errors.append(exc)
                        continue
                    node = (pod.get("spec") or {}).get("nodeName") or view.assumed.get(pkey)
                    d.rows.append((pkey, (_uid(pod), node, req), req, node))
        moved = memo.running_snapshot(list(nodes.values()), bound, touched)
        return memo.live.copy(), moved

    def running_gangs(self, units: dict[str, Unit], records: dict[str, Plan], snap: Snapshot,
                      book: QuotaBook | None, touched: set[str] | None, moved: set[str] | None) -> set[str] | None:
        """Each unit with bound pods as its RunningGang (Memo.running), looked at again only where
        something it is derived from may have changed; the units read with errors are refused and
        ignored hints collected, every cycle. Returns the keys looked at (None: every one)."""
        idx, bound = self.memo.running, self.memo.bound
        inputs = (id(book), id(snap.shape.node_product))
        # what a running gang reads of its plan record: whether it runs on borrowed quota
        recorded = {key: (r.borrowed, frozenset(r.pod_uids.items())) for key, r in records.items()}
        keys: Iterable[str] | None = None
        if touched is None or moved is None or idx.inputs != inputs:
            idx.clear()
        else:  # and the units whose plan record came, went or changed
            keys = touched | moved | {k for k in recorded.keys() | idx.recorded.keys()
                                      if recorded.get(k) != idx.recorded.get(k)}
        idx.inputs, idx.recorded = inputs, recorded
        for key in bound if keys is None else keys:
            idx.drop(key)
            d, unit = bound.get(key), units.get(key)
            if d is not None and unit is not None:
                self._running_entry(idx, unit, d, records.get(key), snap, book)
        for unit, hints in idx.hints.values():
            self.ignored_hints += [(unit, h) for h in hints]
        for unit, errors in idx.errors.values():
            for exc in errors:
                self.refuse(unit, exc)
        return None if keys is None else set(keys)

    def _running_entry(self, idx: RunningGangs, unit: Unit, d: Derived, record: Plan | None, snap: Snapshot,
                       book: QuotaBook | None) -> None:
        held, epochs, node_product = self.memo.held, self.memo.epochs, snap.shape.node_product
        # borrowed quota is the scheduler's own record, never the user-writable annotation
        borrowed = bool(record and record.borrowed and any(record.pod_uids.get(key_of(p)) == _uid(p) for p in d.held))
        # beyond the unit's objects: which of its pods `live` holds (the epoch), the record, what sets the speed
        key = (epochs.get(unit.key), borrowed, id(book), id(node_product))
        if d.running is None or d.running[0] != key:
            placements = [held[row[0]][1] for row in d.rows if row[0] in held]
            d.running = (key, *self._running_gang(unit, d, placements, borrowed, snap, book)) if placements \
                else (key, None, [])
        _, rg, hints = d.running
        errors = list(d.errors)
        if rg is not None:
            if hints:
                idx.hints[unit.key] = (unit, hints)
            if isinstance(rg, Exception):
                errors.append(rg)
            else:
                idx.put(unit, rg)
                if d.terminating:
                    idx.going.add(unit.key)
        if errors:
            idx.errors[unit.key] = (unit, errors)

    def _running_gang(self, unit: Unit, d: Derived, placements: list[Placement], borrowed: bool,
                      snap: Snapshot, book: QuotaBook | None) -> tuple[RunningGang | Exception, list[str]]:
        held = d.held
        ours = all((p.get("spec") or {}).get("schedulerName") == self.scheduler_name for p in held)
        hints: list[str] = []
        try:
            rg = running_gang_from_k8s(unit.key, unit.podgroup, held, self.ctx, tuple(placements), ours=ours,
                                       members=[row[2] for row in d.rows], hints=hints, borrowed=borrowed)
        except _MALFORMED as exc:
            return exc, hints
        if book is not None and book.speeds:  # its expected end on the product it runs on
            rg = replace(rg, speed=placement_speed(rg.placements, snap.shape.node_product, book))
        return rg, hints

    def pending_gangs(self, units: dict[str, Unit], planned: set[str]
                      ) -> tuple[list[tuple[Unit, Gang]], list[tuple[Unit, str]], dict[str, str]]:
        """Each unit's pending members as its Gang (unit.gang). A unit with a plan record has the gang
        its plan places (re-checked later, never queued this cycle: a rejected plan is closed first);
        the others are complete gangs that queue, or incomplete or invalid ones. Returns the queue
        (unsorted), the incomplete units, and why a planned unit's members cannot be read."""
        memo, ctx = self.memo, self.ctx
        pending: list[tuple[Unit, Gang]] = []
        incomplete: list[tuple[Unit, str]] = []
        unreadable: dict[str, str] = {}
        for key in sorted(memo.waiting):  # the units with waiting pods, kept by deltas (Memo.derive)
            unit, d = units[key], self.derived[key]
            waiting = d.waiting
            unit.gang = None  # a Unit kept from the last cycle (Grouping) carries that cycle's
            if unit.key in planned:
                try:
                    for pod in waiting:
                        key = key_of(pod)
                        if key not in self.requests:
                            self.requests[key] = memo.pod(pod, ctx)
                except _MALFORMED as exc:
                    unreadable[unit.key] = str(exc)
                    continue
                if d.planned is None:
                    d.planned = self._planned_gang(unit, waiting)
                if d.planned[0] == "gang":
                    unit.gang = d.planned[1]
                else:
                    unreadable[unit.key] = d.planned[1]
                continue
            if d.pending is None:
                d.pending = self._pending_gang(unit, waiting, d.held)
            outcome = d.pending
            if outcome[0] == "incomplete":
                incomplete.append((unit, outcome[1]))
            elif outcome[0] == "refused":
                self.refuse(unit, outcome[1])
            else:
                unit.gang = outcome[1]
                self.ignored_hints += [(unit, h) for h in outcome[2]]
                pending.append((unit, outcome[1]))
        return pending, incomplete, unreadable

    def _planned_gang(self, unit: Unit, waiting: list[dict]) -> tuple:
        """The gang a plan places: ("gang", Gang), or ("unreadable", why)."""
        try:
            return "gang", gang_from_k8s(unit.key, unit.podgroup, waiting, self.ctx,
                                         [self.requests[key_of(p)] for p in waiting], hints=[])
        except _MALFORMED as exc:
            return "unreadable", str(exc)

    def _pending_gang(self, unit: Unit, waiting: list[dict], bound: list[dict]) -> tuple:
        """A unit's waiting members as a queued gang: ("gang", Gang, ignored labels), or
        ("incomplete", why), or ("refused", the error)."""
        view, memo, ctx = self.view, self.memo, self.ctx
        if unit.podgroup is None and gang_key_of_pod(waiting[0]) is not None:
            return "incomplete", f"waiting for PodGroup {unit.key} to be created"
        try:
            need = unit.min_member
        except ConversionError as exc:
            return "refused", exc
        alive = len(waiting) + len(bound)
        if alive < need:
            return "incomplete", f"gang has {alive} of {need} pods; waiting for the rest to be created"
        try:
            # minMember counts bound members too: the rest must place at least what is missing
            bound_nodes = [(p.get("spec") or {}).get("nodeName") or view.assumed.get(key_of(p)) for p in bound]
            gang = gang_from_k8s(unit.key, unit.podgroup, waiting, ctx, [memo.pod(p, ctx) for p in waiting],
                                 pinned=[n for n in bound_nodes if n], min_member=max(1, need - len(bound)))
            # invalid hints stop a pending gang (above); labels that contradict its team or tier never do
            return "gang", gang, gang_identity(unit.key, unit.podgroup, waiting, ctx).ignored
        except _MALFORMED as exc:
            return "refused", exc

    def closing_victims(self, records: dict[str, Plan], units: dict[str, Unit],
                        running_units: dict[str, Unit]) -> set[str]:
        """The running gangs still stopping for a nomination whose members are all bound (the loop
        closes it): no preemption candidates again."""
        if not any(record.state == PLAN_NOMINATED for record in records.values()):
            return set()  # without a nomination, no pod map of every running gang (tens of thousands)
        pod_unit = {key_of(p): u.key for u in running_units.values() for p in u.pods}
        return {pod_unit[v] for key, record in records.items()
                if record.state == PLAN_NOMINATED and not units[key].pending(self.scheduler_name, self.view.assumed)
                for v in record.victims if v in pod_unit}

    def recheck_plans(self, state: CycleState, records: dict[str, Plan], units: dict[str, Unit],
                      running: Mapping[str, RunningGang], running_units: dict[str, Unit], unreadable: dict[str, str],
                      nodes: dict[str, Node], now: float, policy: PreemptionPolicy
                      ) -> tuple[dict[str, Plan], dict[str, bool], list[tuple[Unit, Plan, str]]]:
        """Plans hold their GPUs (bind in progress, or victims being evicted) once re-checked against
        `state`, which holds every gang but them and, plan by plan, the plans kept before: a kept
        plan is counted into it (quota; its nominated victims are no candidates again) and its
        members are held on its snapshot (core.plans.hold_member). `running`: the running gangs by
        name (the Memo's own map: built afresh, it cost a pass over every running gang per cycle)."""
        view = self.view
        plans: dict[str, Plan] = {}
        plan_ready: dict[str, bool] = {}
        rejected: list[tuple[Unit, Plan, str]] = []
        if all(record.state == PLAN_ADMITTED for record in records.values()):
            return plans, plan_ready, rejected
        # only plans with victims read it (a binding's plan has none): every running pod's key, each
        # cycle a binding is in flight, cost more than the re-checks at 40,000 running pods
        pod_unit = {key_of(p): u for u in running_units.values() for p in u.pods} \
            if any(record.victims for record in records.values() if record.state != PLAN_ADMITTED) else {}
        for key, record in records.items():
            if record.state == PLAN_ADMITTED:
                continue
            unit = units[key]
            pending = {key_of(p): p for p in unit.pending(self.scheduler_name, view.assumed)}
            if not pending:
                plans[key] = record  # every member is bound: the loop closes the plan
                continue
            gang = unit.gang
            if gang is None:
                rejected.append((unit, record, f"its pending members cannot be read: {unreadable.get(key, '')}"))
                continue
            placements = record.for_members(pending, self.requests)
            alive = [v for v in record.victims if v in view.pods and _uid(view.pods[v]) == record.victim_uids.get(v)]
            to_stop: dict[str, RunningGang] = {}
            leaving: dict[str, RunningGang] = {}  # victims already terminating: they hold GPUs and quota until gone
            for v in alive:
                rg = running.get(pod_unit[v].key) if v in pod_unit else None
                if pod_is_terminating(view.pods[v]):
                    if rg is not None:
                        leaving[rg.gang.name] = rg
                    continue  # already going, whatever happens next
                if rg is None:
                    break
                to_stop[rg.gang.name] = rg
            else:
                leaving_gangs = [rg for name, rg in leaving.items() if name not in to_stop]
                reason = recheck_plan(state, gang, list(placements.values()), list(to_stop.values()),
                                      now=now, policy=policy, leaving=leaving_gangs)
                if reason is None:
                    bindable = may_bind(state, gang, list(placements.values()), bool(alive))
                    if record.state == PLAN_NOMINATED:
                        state.nominate(gang.team, list(placements.values()), [*to_stop.values(), *leaving_gangs])
                    else:
                        state.hold(gang.team, list(placements.values()), assume=False)
                    plans[key] = replace(record, placements=placements, victims=tuple(alive))
                    ready = bindable
                    for pkey in sorted(pending):
                        placement = placements.get(pkey)
                        if placement is None or placement.node not in nodes:
                            ready = False
                            continue
                        ready = hold_member(state.snap, placement.node, self.requests[pkey]) and ready
                    plan_ready[key] = ready
                    continue
                rejected.append((unit, record, reason))
                continue
            rejected.append((unit, record, "a pod it would preempt is no running gang of this scheduler's view"))
        return plans, plan_ready, rejected


# What reading a malformed object can raise beyond ConversionError (a list where a map belongs, a
# number where a string does): the unit is reported and skipped, every other gang is scheduled.
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError)


def _malformed(unit: Unit, exc: Exception) -> str:
    log.warning("gang %s: malformed object skipped", unit.key, exc_info=exc)
    return f"gang {unit.key}: an object of this gang is malformed ({type(exc).__name__}: {str(exc)[:200]}); " \
           f"skipped until it is fixed"

