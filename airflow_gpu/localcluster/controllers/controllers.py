"""Control loops of a real control plane, scaled down: garbage collector (ownerReferences, foreground
deletion), namespace deletion, ResourceQuota status, PodGC for pods of vanished nodes, and the taint
manager that evicts pods from nodes with NoExecute taints (node NotReady/unreachable)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import defaultdict

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.admission import quota
from airflow_gpu.localcluster.events import Recorder
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.podutil import is_terminal, now_iso, parse_time, tolerates

log = logging.getLogger(__name__)
POD_KEY, NODE_KEY, NAMESPACE_KEY, QUOTA_KEY = "/pods", "/nodes", "/namespaces", "/resourcequotas"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


class Controllers:
    def __init__(self, objects: ObjectAPI, events: Recorder, pod_gc_seconds: float = 40.0,
                 event_ttl_seconds: float = 3600.0):
        self.objects, self.store, self.registry, self.events = objects, objects.store, objects.registry, events
        self.pod_gc_seconds = pod_gc_seconds
        self.event_ttl_seconds = event_ttl_seconds
        self._event_ttl_task: asyncio.Task | None = None
        self.dependents: dict[str, set[tuple[str, str, str]]] = defaultdict(set)  # owner uid -> objects
        self.uids: dict[str, tuple[str, str, str]] = {}
        self._quota_dirty: set[str] = set()
        self._quota_handle = None
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}  # taint manager, per pod
        self.store.listeners.append(self._on_event)

    def start(self) -> None:
        self._event_ttl_task = asyncio.get_running_loop().create_task(self._expire_events())

    def stop(self) -> None:
        if self._event_ttl_task is not None:
            self._event_ttl_task.cancel()

    async def _expire_events(self) -> None:
        """Events live event_ttl_seconds, as with kube-apiserver's --event-ttl (etcd leases there)."""
        while True:
            await asyncio.sleep(min(60.0, self.event_ttl_seconds / 2))
            cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=self.event_ttl_seconds)
            for ev in self.store.values("/events"):
                stamp = parse_time(ev.get("lastTimestamp") or ev["metadata"].get("creationTimestamp"))
                if stamp is not None and stamp < cutoff:
                    try:
                        self.store.delete("/events", ev["metadata"]["namespace"], ev["metadata"]["name"], "events")
                    except errors.ApiError:
                        pass

    def rebuild(self) -> None:
        """Index every stored object (after start or a reload of the store)."""
        self.dependents.clear()
        self.uids.clear()
        for rt in self.registry.all():
            for obj in self.store.values(rt.key):
                self._index(rt.key, obj)
        for ns in self.store.values(NAMESPACE_KEY):
            if ns["metadata"].get("deletionTimestamp"):
                self._later(self._sync_namespace, ns["metadata"]["name"])
        for node in self.store.values(NODE_KEY):
            self._later(self._taint_manager, node["metadata"]["name"])
        for q in self.store.values(QUOTA_KEY):
            self._quota_dirty.add(q["metadata"]["namespace"])
        self._schedule_quota()

    def _index(self, key: str, obj: dict) -> None:
        meta = obj["metadata"]
        ident = (key, meta.get("namespace", ""), meta["name"])
        self.uids[meta["uid"]] = ident
        for ref in meta.get("ownerReferences") or []:
            self.dependents[ref["uid"]].add(ident)

    @staticmethod
    def _later(fn, *args) -> None:
        asyncio.get_running_loop().call_soon(fn, *args)

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace", "")
        if etype == "DELETED":
            self.uids.pop(meta["uid"], None)
            if self.dependents.get(meta["uid"]):
                self._later(self._collect, meta["uid"])
        else:
            if old is not None:
                for ref in old["metadata"].get("ownerReferences") or []:
                    self.dependents[ref["uid"]].discard((key, ns, meta["name"]))
            self._index(key, obj)
            if meta.get("deletionTimestamp") and "foregroundDeletion" in (meta.get("finalizers") or []):
                self._later(self._foreground, key, ns, meta["name"])
        if key == NAMESPACE_KEY and meta.get("deletionTimestamp"):
            self._later(self._sync_namespace, meta["name"])
        if ns and key != "/events":
            ns_obj = self.store.get(NAMESPACE_KEY, "", ns)
            if ns_obj is not None and ns_obj["metadata"].get("deletionTimestamp") and etype == "DELETED":
                self._later(self._sync_namespace, ns)
        if key in (POD_KEY, QUOTA_KEY) or (ns and key in quota.COUNTED):
            if key == QUOTA_KEY or self.store.objects[QUOTA_KEY] and any(
                    n == ns for n, _ in self.store.objects[QUOTA_KEY]):
                if not (key == QUOTA_KEY and etype == "MODIFIED" and old is not None
                        and old.get("spec") == obj.get("spec")):
                    self._quota_dirty.add(ns)
                    self._schedule_quota()
        if key == NODE_KEY:
            if etype != "DELETED":
                self._later(self._unschedulable_taint, meta["name"])
            if etype == "DELETED":
                asyncio.get_running_loop().call_later(self.pod_gc_seconds, self._pod_gc, meta["name"])
            elif old is None or (old.get("spec") or {}).get("taints") != (obj.get("spec") or {}).get("taints"):
                self._later(self._taint_manager, meta["name"])
        if key == POD_KEY and etype == "DELETED":
            timer = self._timers.pop((ns, meta["name"]), None)
            if timer:
                timer.cancel()

    # --- garbage collector --------------------------------------------------------------------
    def _collect(self, owner_uid: str) -> None:
        for key, ns, name in list(self.dependents.pop(owner_uid, ())):
            obj = self.store.get(key, ns, name)
            if obj is None:
                continue
            owners = [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]
            if any(uid in self.uids for uid in owners):
                continue  # another owner is alive
            rt = self.registry.by_key(key)
            try:
                self.objects.delete(rt, ns, name, propagation="Background")
            except errors.ApiError:
                pass

    def _foreground(self, key: str, ns: str, name: str) -> None:
        obj = self.store.get(key, ns, name)
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        alive = [d for d in self.dependents.get(uid, ()) if self.store.get(*d) is not None]
        for dkey, dns, dname in alive:
            dep = self.store.get(dkey, dns, dname)
            if not dep["metadata"].get("deletionTimestamp"):
                try:
                    self.objects.delete(self.registry.by_key(dkey), dns, dname, propagation="Foreground")
                except errors.ApiError:
                    pass
        if not any(self.store.get(*d) is not None for d in alive):
            self.objects.remove_finalizer(self.registry.by_key(key), obj, "foregroundDeletion")

    # --- namespaces ---------------------------------------------------------------------------
    def _sync_namespace(self, name: str) -> None:
        ns_obj = self.store.get(NAMESPACE_KEY, "", name)
        if ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp"):
            return
        remaining = 0
        for rt in self.registry.all():
            if not rt.namespaced:
                continue
            for obj in self.store.values(rt.key, name):
                remaining += 1
                if rt.key == "/events" or obj["metadata"].get("deletionTimestamp"):
                    if rt.key == "/events":
                        self.store.delete(rt.key, name, obj["metadata"]["name"])
                    continue
                try:
                    self.objects.delete(rt, name, obj["metadata"]["name"])
                except errors.ApiError:
                    pass
        if not any(self.store.entries(rt.key, name) for rt in self.registry.all() if rt.namespaced):
            self.store.delete(NAMESPACE_KEY, "", name, "namespaces")

    # --- quota status ---------------------------------------------------------------------------
    def _schedule_quota(self) -> None:
        if self._quota_handle is None:
            self._quota_handle = asyncio.get_running_loop().call_later(0.1, self._update_quotas)

    def _update_quotas(self) -> None:
        self._quota_handle = None
        dirty, self._quota_dirty = self._quota_dirty, set()
        for ns in dirty:
            for q in self.store.values(QUOTA_KEY, ns):
                used = {k: quota.format_quantity(v) for k, v in quota.quota_used(self.store, q).items()}
                hard = dict((q.get("spec") or {}).get("hard") or {})
                if (q.get("status") or {}) != {"hard": hard, "used": used}:
                    new = deep_copy(q)
                    new["status"] = {"hard": hard, "used": used}
                    self.objects.update_status(QUOTA_KEY, new)

    # --- PodGC ---------------------------------------------------------------------------------
    def _pod_gc(self, node: str) -> None:
        if self.store.get(NODE_KEY, "", node) is not None:
            return
        for pod in self.store.values(POD_KEY):
            if pod["spec"].get("nodeName") != node:
                continue
            if not is_terminal(pod):
                pod = self.objects.mark_disruption(pod, C.REASON_DELETION_BY_POD_GC, "PodGC: node no longer exists")
                new = deep_copy(pod)
                new["status"]["phase"] = "Failed"
                self.objects.update_status(POD_KEY, new)
            try:
                self.store.delete(POD_KEY, pod["metadata"]["namespace"], pod["metadata"]["name"], "pods")
            except errors.ApiError:
                pass

    # --- TaintNodesByCondition: cordoned nodes carry node.kubernetes.io/unschedulable:NoSchedule ------
    def _unschedulable_taint(self, node_name: str) -> None:
        node = self.store.get(NODE_KEY, "", node_name)
        if node is None:
            return
        taints = (node.get("spec") or {}).get("taints") or []
        has = any(t.get("key") == UNSCHEDULABLE_TAINT for t in taints)
        wanted = bool((node.get("spec") or {}).get("unschedulable"))
        if has == wanted:
            return
        new = deep_copy(node)
        if wanted:
            new["spec"]["taints"] = taints + [{"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": now_iso()}]
        else:
            new["spec"]["taints"] = [t for t in taints if t.get("key") != UNSCHEDULABLE_TAINT]
            if not new["spec"]["taints"]:
                del new["spec"]["taints"]
        self.objects.update_status(NODE_KEY, new)

    # --- taint manager ---------------------------------------------------------------------------
    def _taint_manager(self, node_name: str) -> None:
        node = self.store.get(NODE_KEY, "", node_name)
        if node is None:
            return
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        loop = asyncio.get_running_loop()
        for pod in self.store.values(POD_KEY):
            if pod["spec"].get("nodeName") != node_name or is_terminal(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            ident = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            old = self._timers.pop(ident, None)
            if old:
                old.cancel()
            seconds = None
            for taint in taints:
                matching = [t for t in pod["spec"].get("tolerations") or [] if tolerates([t], taint)]
                if not matching:
                    seconds = 0
                    break
                bounded = [t["tolerationSeconds"] for t in matching if t.get("tolerationSeconds") is not None]
                if bounded and len(bounded) == len(matching):
                    seconds = min(bounded) if seconds is None else min(seconds, min(bounded))
            if seconds is not None:
                self._timers[ident] = loop.call_later(max(seconds, 0), self._evict_for_taint, ident, node_name)

    def _evict_for_taint(self, ident: tuple[str, str], node_name: str) -> None:
        self._timers.pop(ident, None)
        pod = self.store.get(POD_KEY, *ident)
        if pod is None or pod["spec"].get("nodeName") != node_name or pod["metadata"].get("deletionTimestamp"):
            return
        self.objects.mark_disruption(pod, C.REASON_DELETION_BY_TAINT_MANAGER, "Taint manager: deleting due to NoExecute taint")
        self.events.pod(pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {ident[0]}/{ident[1]}",
                        component="taint-eviction-controller")
        try:
            self.objects.delete(self.registry.by_key(POD_KEY), ident[0], ident[1])
        except errors.ApiError:
            pass
