"""Informer-style cache: list + watch of the objects the scheduler decides on, relisting on 410 Gone.

Objects are kept as wire-format dicts (the JSON the API server sends, read with the official client
and `_preload_content=False`): decoding 10,000 pods into client model classes costs seconds, a dict
costs nothing, and convert.py reads dicts. Stored objects are replaced, never mutated, so a shallow
copy of a store is a consistent view for one scheduling cycle.

The cache has no state of its own that a restart could lose: everything is relisted from the API on
start. The one overlay, `assume_bound`, covers the gap between a Binding the scheduler made and the
watch event that shows it (as kube-scheduler's assumed pods do); it is dropped when the event arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from airflow_gpu.constants import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from airflow_gpu.kube.convert import key_of

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder().decode  # 3x json.loads on a pod event: a fill's watch decodes tens of thousands

KINDS = ("pods", "nodes", "podgroups", "priorityclasses", "resourcequotas", "plans")
WATCH_TIMEOUT_SECONDS = 240  # the server ends a watch after this; we start a new one from the last version


TRACKED = ("pods", "podgroups")  # the kinds whose changed keys a View carries (Changes)


@dataclass(frozen=True)
class Changes:
    """The keys of the pods and PodGroups added, replaced or removed in the cache between the view
    before (`since`) and this one (`upto`): a reader that kept what it derived from the view before
    looks at these alone (state.Grouping) instead of comparing every object."""

    since: tuple
    upto: tuple
    pods: frozenset[str]
    podgroups: frozenset[str]


class ChangeLog:
    """The keys changed in a store of objects since the last `take()`, per tracked kind, for its
    Views (Changes). Not thread-safe: the store calls it under its own lock."""

    def __init__(self) -> None:
        self._changed: dict[str, set[str] | None] = {k: None for k in TRACKED}  # None: anything may have
        self._taken = 0
        self._token = object()  # another store's views (a restart's) are never taken for this one's

    def mark(self, kind: str, key: str) -> None:
        """The object of `key` was stored, replaced or removed."""
        changed = self._changed.get(kind)
        if changed is not None:
            changed.add(key)

    def lost(self, kind: str) -> None:
        """Every object of `kind` may have changed (a relist)."""
        if kind in TRACKED:
            self._changed[kind] = None

    def take(self) -> Changes | None:
        """The changes since the last take (None: not known), and start counting again."""
        since, self._taken = (self._token, self._taken), self._taken + 1
        pods, pgs = self._changed["pods"], self._changed["podgroups"]
        self._changed = {k: set() for k in TRACKED}
        return None if pods is None or pgs is None else \
            Changes(since, (self._token, self._taken), frozenset(pods), frozenset(pgs))


@dataclass
class View:
    """One consistent-enough read of the cache for a scheduling cycle."""

    pods: dict[str, dict]
    nodes: dict[str, dict]
    podgroups: dict[str, dict]
    priorityclasses: dict[str, dict]
    resourcequotas: dict[str, dict]
    assumed: dict[str, str] = field(default_factory=dict)  # pod key -> node, bound but not yet seen
    plans: dict[str, dict] = field(default_factory=dict)  # the scheduler's plan ConfigMaps, by key
    changes: Changes | None = None  # since the cache's view before this one (None: not known)


class Gone(Exception):
    """The resource version we watch from is too old (HTTP 410): relist."""


class ClusterCache:
    def __init__(self, api_client: client.ApiClient, on_change: Callable[[str, str, dict], None] | None = None,
                 plan_namespace: str | None = None, plan_selector: str | None = None,
                 kinds: tuple[str, ...] | None = None, resync_seconds: float | None = None):
        """plan_namespace / plan_selector: where the scheduler keeps its plan ConfigMaps (its own
        namespace) and the label selector of its own; without a namespace no plans are watched.
        kinds: watch only these (a reader such as the UI); "plans" among them without a namespace
        watches the selector's plans in every namespace. resync_seconds: relist each kind at least
        this often (a watch that silently missed an event is corrected within this bound)."""
        self.api_client = api_client
        self.plan_namespace = plan_namespace
        self.plan_selector = plan_selector
        unknown = set(kinds or ()) - set(KINDS)
        if unknown:
            raise ValueError(f"kinds: unknown {sorted(unknown)}; one of {KINDS}")
        self.kinds = tuple(kinds) if kinds else KINDS if plan_namespace else tuple(k for k in KINDS if k != "plans")
        self.resync_seconds = resync_seconds
        self._tombstones: dict[str, int] = {}  # plans key -> resourceVersion we deleted
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._stores: dict[str, dict[str, dict]] = {k: {} for k in KINDS}
        self._assumed: dict[str, str] = {}
        self._log = ChangeLog()  # the keys changed since the last view
        self._synced = {k: threading.Event() for k in self.kinds}
        self._stop = threading.Event()
        self.relists = {k: 0 for k in self.kinds}  # observable: how often each kind was relisted (410 Gone etc.)

    # --- the per-kind list functions of the official client ------------------------------
    def _list(self, kind: str, **kw):
        kw["_preload_content"] = False
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces(**kw)
        if kind == "nodes":
            return self.core.list_node(**kw)
        if kind == "resourcequotas":
            return self.core.list_resource_quota_for_all_namespaces(**kw)
        if kind == "priorityclasses":
            return self.scheduling.list_priority_class(**kw)
        if kind == "podgroups":
            return self.custom.list_cluster_custom_object(PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL, **kw)
        if kind == "plans" and not self.plan_namespace:
            return self.core.list_config_map_for_all_namespaces(label_selector=self.plan_selector, **kw)
        if kind == "plans":
            return self.core.list_namespaced_config_map(self.plan_namespace, label_selector=self.plan_selector, **kw)
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> "ClusterCache":
        for kind in self.kinds:
            threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True).start()
        return self

    def wait_synced(self, timeout: float = 30.0, kinds: tuple[str, ...] | None = None) -> bool:
        """Every kind (or those of `kinds`) listed once, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        return all(self._synced[k].wait(max(0.0, deadline - time.monotonic())) for k in kinds or self.kinds)

    def stop(self) -> None:
        """Stop applying events. The watch threads are daemons blocked in a read: closing their
        response from here can block on the reader's lock, so they are left to end with the process
        (or with the watch's timeoutSeconds)."""
        self._stop.set()

    # --- reads ----------------------------------------------------------------------------
    def view(self) -> View:
        with self._lock:
            return View(**{k: dict(v) for k, v in self._stores.items()}, assumed=dict(self._assumed),
                        changes=self._log.take())

    def get(self, kind: str, key: str) -> dict | None:
        with self._lock:
            return self._stores[kind].get(key)

    def observe_write(self, kind: str, obj: dict) -> None:
        """Store the object a write of ours returned, so the next cycle sees it even before the watch
        event arrives (a plan written must never be planned again). Never goes back in time."""
        with self._lock:
            self._store_if_newer(self._stores[kind], key_of(obj), obj)
            self._log.mark(kind, key_of(obj))

    def observe_delete(self, kind: str, obj: dict) -> None:
        """Forget an object we deleted (answered with its last state), so the next cycle does not
        see it even if a watch event of an earlier version arrives before the DELETED one."""
        key = key_of(obj)
        with self._lock:
            self._stores[kind].pop(key, None)
            self._log.mark(kind, key)
            try:
                self._tombstones[key] = int((obj.get("metadata") or {}).get("resourceVersion") or 0)
            except (TypeError, ValueError):
                self._tombstones[key] = 0

    def assume_bound(self, pod_key: str, node: str) -> None:
        with self._lock:
            self._assumed[pod_key] = node

    def forget_assumed(self, pod_key: str) -> None:
        with self._lock:
            self._assumed.pop(pod_key, None)

    # --- list + watch loop ----------------------------------------------------------------
    def _run(self, kind: str) -> None:
        backoff = 0.2
        rv = None
        listed_at = 0.0
        while not self._stop.is_set():
            try:
                if rv is not None and self.resync_seconds and time.monotonic() - listed_at >= self.resync_seconds:
                    rv = None
                if rv is None:
                    rv = self._relist(kind)
                    listed_at = time.monotonic()
                    self._synced[kind].set()
                rv = self._watch(kind, rv)
                backoff = 0.2
            except Gone:
                log.info("watch %s: resource version %s is gone (410); relisting", kind, rv)
                rv = None
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                if exc.status == 404 and kind == "podgroups":
                    # CRD not installed (yet): an empty store, and look again later
                    log.warning("PodGroup CRD %s/%s is not served; gangs need it", PODGROUP_GROUP, PODGROUP_VERSION)
                    self._synced[kind].set()
                else:
                    log.warning("list/watch %s failed: %s %s", kind, exc.status, exc.reason)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # noqa: BLE001 - connection errors of every kind: retry, never die
                if self._stop.is_set():
                    return
                log.warning("list/watch %s: %s: %s", kind, type(exc).__name__, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _relist(self, kind: str) -> str:
        resp = self._list(kind, _request_timeout=60)
        try:
            body = _decode(resp.data)
        finally:
            resp.release_conn()
        fresh = {key_of(o): o for o in body.get("items") or []}
        with self._lock:
            if kind == "plans":
                self._tombstones.clear()
            old = self._stores[kind]
            self._stores[kind] = fresh
            self._log.lost(kind)
            self.relists[kind] += 1
            if kind == "pods":
                self._drop_stale_assumptions_locked()
        if self.on_change and (old or fresh):
            self.on_change(kind, "RELIST", {})
        return (body.get("metadata") or {}).get("resourceVersion") or "0"

    def _watch(self, kind: str, rv: str) -> str:
        resp = self._list(
            kind,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_seconds(),
            _request_timeout=(10, self._watch_seconds() + 30),
        )
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = _decode(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiException(status=obj.get("code") or 500, reason=obj.get("message"))
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if etype == "BOOKMARK":
                    continue
                self._apply(kind, etype, obj)
        finally:
            resp.release_conn()
        return rv

    def _watch_seconds(self) -> int:
        if self.resync_seconds:
            return max(1, min(WATCH_TIMEOUT_SECONDS, int(self.resync_seconds)))
        return WATCH_TIMEOUT_SECONDS

    def _apply(self, kind: str, etype: str, obj: dict) -> None:
        key = key_of(obj)
        with self._lock:
            store = self._stores[kind]
            self._log.mark(kind, key)
            if etype == "DELETED":
                if not (kind == "plans" and self._newer_than(store.get(key), obj)):  # not one written since
                    store.pop(key, None)
                self._tombstones.pop(key, None)
                if kind == "pods":
                    self._assumed.pop(key, None)
            elif kind == "plans" and self._deleted_locked(key, obj):
                pass
            else:
                self._store_if_newer(store, key, obj)
                if kind == "pods" and (obj.get("spec") or {}).get("nodeName"):
                    self._assumed.pop(key, None)
        if self.on_change:
            self.on_change(kind, etype, obj)

    def _deleted_locked(self, key: str, obj: dict) -> bool:
        """An event of a plan we deleted, no newer than the deletion (a newer one: created again)."""
        if key not in self._tombstones:
            return False
        try:
            newer = int((obj.get("metadata") or {}).get("resourceVersion") or 0) > self._tombstones[key]
        except (TypeError, ValueError):
            newer = True
        if newer:
            del self._tombstones[key]
        return not newer

    @staticmethod
    def _newer_than(old: dict | None, obj: dict) -> bool:
        try:
            return old is not None and int(old["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
        except (KeyError, TypeError, ValueError):
            return False

    @staticmethod
    def _store_if_newer(store: dict, key: str, obj: dict) -> None:
        old = store.get(key)
        if old is not None:
            try:
                if int(old["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"]):
                    return  # resourceVersions are etcd revisions in practice; opaque ones: last write wins
            except (KeyError, TypeError, ValueError):
                pass
        store[key] = obj

    def _drop_stale_assumptions_locked(self) -> None:
        pods = self._stores["pods"]
        for key in list(self._assumed):
            pod = pods.get(key)
            if pod is None or (pod.get("spec") or {}).get("nodeName"):
                del self._assumed[key]
