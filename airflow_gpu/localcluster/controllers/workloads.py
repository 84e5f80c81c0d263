"""Workload controllers of kube-controller-manager, scaled down: ReplicaSet, Deployment (rolling update
with maxSurge/maxUnavailable, Recreate, revisions, history limit), Job (completions, parallelism,
backoffLimit, podFailurePolicy, suspend, activeDeadlineSeconds, Indexed completion) and the disruption
controller's PodDisruptionBudget status, which the Eviction API checks and takes from (evict_pod).

Each controller reconciles one object at a time from the store's current state (no informer lag), so
there are no "expectations" to track: a pod created in one sync is seen by the next. Syncs are
coalesced per object and run soon after any event that concerns it.

Not modelled: Job pod-recreation back-off (failed pods are replaced at once), progressDeadlineSeconds
(Progressing never turns False), and adoption of orphan pods that match a selector.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.events import Recorder
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.podutil import get_condition, is_terminal, now_iso, parse_time
from airflow_gpu.localcluster.registry.selectors import label_selector_object_matches
from airflow_gpu.localcluster.registry.store import encode
from airflow_gpu.localcluster.registry.workloadspec import int_or_percent

log = logging.getLogger(__name__)
POD_KEY = "/pods"
DEPLOY_KEY, RS_KEY = "apps/deployments", "apps/replicasets"
JOB_KEY, PDB_KEY = "batch/jobs", "policy/poddisruptionbudgets"
SAFE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # rand.SafeEncodeString's alphabet (pod-template-hash)
MAX_BURST = 500  # pods a controller creates in one sync (slow start in the real one)


def controller_uid(obj: dict) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def owner_ref(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def pod_ready(pod: dict) -> bool:
    cond = get_condition(pod, "Ready")
    return bool(cond and cond.get("status") == "True") and not pod["metadata"].get("deletionTimestamp")


def pod_available(pod: dict, min_ready_seconds: int, now: dt.datetime) -> bool:
    if not pod_ready(pod):
        return False
    if not min_ready_seconds:
        return True
    since = parse_time((get_condition(pod, "Ready") or {}).get("lastTransitionTime"))
    return since is not None and (now - since).total_seconds() >= min_ready_seconds


def is_active(pod: dict) -> bool:
    return not is_terminal(pod) and not pod["metadata"].get("deletionTimestamp")


def template_hash(template: dict) -> str:
    """pod-template-hash: a stable digest of the template, in the safe alphabet the real one uses."""
    digest = int.from_bytes(hashlib.sha256(encode(_sorted(template))).digest()[:8], "big")
    out = ""
    while len(out) < 10:
        digest, rem = divmod(digest, len(SAFE_CHARS))
        out += SAFE_CHARS[rem]
    return out


def _sorted(value):
    """Key-sorted with Go zero values (null, "", false, {}, []) dropped: templates that decode to the
    same Go struct compare and hash alike (kubectl sends creationTimestamp: null, protobuf stdin: false)."""
    if isinstance(value, dict):
        out = {k: _sorted(value[k]) for k in sorted(value)}
        return {k: v for k, v in out.items() if v not in (None, "", False, {}, [])}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _set_condition(conditions: list, ctype: str, status: str, reason: str, message: str,
                   update_time: bool = True) -> None:
    now = now_iso()
    for cond in conditions:
        if cond["type"] == ctype:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            if cond.get("status") != status or cond.get("reason") != reason or cond.get("message") != message:
                if "lastUpdateTime" in cond or update_time:
                    cond["lastUpdateTime"] = now
            cond.update(status=status, reason=reason, message=message)
            return
    cond = {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
    if update_time:
        cond["lastUpdateTime"] = now
    conditions.append(cond)


class Workloads:
    def __init__(self, objects: ObjectAPI, events: Recorder):
        self.objects, self.store, self.registry, self.events = objects, objects.store, objects.registry, events
        self._dirty: dict[tuple[str, str, str], None] = {}
        self._handle: asyncio.Handle | None = None
        self._timers: dict[tuple[str, str, str], asyncio.TimerHandle] = {}
        self.store.listeners.append(self._on_event)

    # --- event routing ------------------------------------------------------------------------
    def _queue(self, key: str, ns: str, name: str) -> None:
        self._dirty[(key, ns, name)] = None
        if self._handle is None:
            try:
                self._handle = asyncio.get_running_loop().call_soon(self._run)
            except RuntimeError:  # no loop (store replay in tests): resync() picks it up
                pass

    def _later(self, seconds: float, key: str, ns: str, name: str) -> None:
        ident = (key, ns, name)
        old = self._timers.pop(ident, None)
        if old is not None:
            old.cancel()
        self._timers[ident] = asyncio.get_running_loop().call_later(max(seconds, 0.05), self._queue, *ident)

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace", "")
        if key in (DEPLOY_KEY, RS_KEY, JOB_KEY, PDB_KEY):
            self._queue(key, ns, meta["name"])
            if key == RS_KEY:
                self._queue_owner(obj, DEPLOY_KEY)
            if key == JOB_KEY and etype == "DELETED":
                self._release_job_pods(meta["uid"], ns)
            return
        if key != POD_KEY:
            return
        self._queue_owner(obj, RS_KEY)
        self._queue_owner(obj, JOB_KEY)
        if etype == "DELETED":  # Recreate waits for the old pods to be gone: tell the deployment too
            for ref in meta.get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == "ReplicaSet":
                    rs = self.store.get(RS_KEY, ns, ref["name"])
                    if rs is not None:
                        self._queue_owner(rs, DEPLOY_KEY)
        if self.store.objects[PDB_KEY]:
            for pdb in self.store.values(PDB_KEY, ns):
                self._queue(PDB_KEY, ns, pdb["metadata"]["name"])

    def _queue_owner(self, obj: dict, owner_key: str) -> None:
        kind = {RS_KEY: "ReplicaSet", DEPLOY_KEY: "Deployment", JOB_KEY: "Job"}[owner_key]
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == kind:
                self._queue(owner_key, obj["metadata"].get("namespace", ""), ref["name"])

    def resync(self) -> None:
        for key in (DEPLOY_KEY, RS_KEY, JOB_KEY, PDB_KEY):
            for obj in self.store.values(key):
                self._queue(key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        for timer in self._timers.values():
            timer.cancel()

    def _run(self) -> None:
        self._handle = None
        for _ in range(20):  # a sync's writes queue more syncs; run them now, bounded
            dirty, self._dirty = self._dirty, {}
            if not dirty:
                return
            for key, ns, name in dirty:
                sync = {DEPLOY_KEY: self._sync_deployment, RS_KEY: self._sync_replicaset,
                        JOB_KEY: self._sync_job, PDB_KEY: self._sync_pdb}[key]
                try:
                    sync(ns, name)
                except errors.ApiError as exc:
                    log.debug("sync %s %s/%s: %s", key, ns, name, exc.message)
                except Exception:  # a controller bug must not stop the other controllers
                    log.exception("sync %s %s/%s failed", key, ns, name)
        if self._dirty and self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self._run)

    # --- helpers --------------------------------------------------------------------------------
    def _owned(self, key: str, ns: str, uid: str) -> list[dict]:
        return [o for o in self.store.values(key, ns) if controller_uid(o) == uid]

    def _write_status(self, key: str, obj: dict, status: dict) -> None:
        if obj.get("status") != status:
            new = dict(obj)
            new["status"] = status
            new["metadata"] = dict(obj["metadata"])
            self.objects.update_status(key, new)

    def _create_pod(self, owner: dict, template: dict, name_prefix: str, extra_labels: dict | None = None,
                    extra_annotations: dict | None = None, finalizers: list | None = None,
                    hostname: str | None = None, env: dict | None = None) -> bool:
        tmeta = template.get("metadata") or {}
        ns = owner["metadata"]["namespace"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": name_prefix, "namespace": ns,
            "labels": {**(tmeta.get("labels") or {}), **(extra_labels or {})},
            "ownerReferences": [owner_ref(owner)]}, "spec": deep_copy(template.get("spec") or {})}
        annotations = {**(tmeta.get("annotations") or {}), **(extra_annotations or {})}
        if annotations:
            pod["metadata"]["annotations"] = annotations
        if finalizers:
            pod["metadata"]["finalizers"] = list(finalizers)
        if hostname:
            pod["spec"]["hostname"] = hostname
        if env:
            for c in (pod["spec"].get("containers") or []) + (pod["spec"].get("initContainers") or []):
                c["env"] = [{"name": k, "value": v} for k, v in env.items()] + list(c.get("env") or [])
        try:
            created = self.objects.create(self.registry.by_key(POD_KEY), pod, ns)
        except errors.ApiError as exc:
            self.events.record(owner, "Warning", "FailedCreate", f"Error creating: {exc.message}",
                               self._component(owner))
            return False
        self.events.record(owner, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}",
                           self._component(owner))
        return True

    def _delete_pod(self, owner: dict, pod: dict) -> None:
        meta = pod["metadata"]
        try:
            self.objects.delete(self.registry.by_key(POD_KEY), meta["namespace"], meta["name"])
        except errors.ApiError:
            return
        self.events.record(owner, "Normal", "SuccessfulDelete", f"Deleted pod: {meta['name']}", self._component(owner))

    @staticmethod
    def _component(owner: dict) -> str:
        return {"ReplicaSet": "replicaset-controller", "Deployment": "deployment-controller",
                "Job": "job-controller"}.get(owner["kind"], "controller-manager")

    # --- ReplicaSet -----------------------------------------------------------------------------
    def _sync_replicaset(self, ns: str, name: str) -> None:
        rs = self.store.get(RS_KEY, ns, name)
        if rs is None:
            return
        spec = rs.get("spec") or {}
        pods = self._owned(POD_KEY, ns, rs["metadata"]["uid"])
        active = [p for p in pods if is_active(p)]
        want = spec.get("replicas", 1)
        if not rs["metadata"].get("deletionTimestamp"):
            if len(active) < want:
                for _ in range(min(want - len(active), MAX_BURST)):
                    if not self._create_pod(rs, spec.get("template") or {}, f"{name}-"):
                        break
            elif len(active) > want:
                # as the real controller ranks them: unscheduled, then not ready, then the newest first
                ranked = sorted(active, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
                ranked.sort(key=lambda p: (bool(p["spec"].get("nodeName")), pod_ready(p)))
                for pod in ranked[:len(active) - want]:
                    self._delete_pod(rs, pod)
            pods = self._owned(POD_KEY, ns, rs["metadata"]["uid"])
            active = [p for p in pods if is_active(p)]
        now = dt.datetime.now(dt.timezone.utc)
        min_ready = spec.get("minReadySeconds", 0) or 0
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        status = {"replicas": len(active),
                  "fullyLabeledReplicas": sum(1 for p in active if all(
                      (p["metadata"].get("labels") or {}).get(k) == v for k, v in template_labels.items())),
                  "readyReplicas": sum(1 for p in active if pod_ready(p)),
                  "availableReplicas": sum(1 for p in active if pod_available(p, min_ready, now)),
                  "observedGeneration": rs["metadata"].get("generation", 1)}
        if min_ready and status["readyReplicas"] > status["availableReplicas"]:
            self._later(min_ready, RS_KEY, ns, name)
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        self._write_status(RS_KEY, rs, status)

    # --- Deployment -----------------------------------------------------------------------------
    def _sync_deployment(self, ns: str, name: str) -> None:
        d = self.store.get(DEPLOY_KEY, ns, name)
        if d is None or d["metadata"].get("deletionTimestamp"):
            return
        spec = d["spec"]
        replicas = spec.get("replicas", 1)
        template = spec.get("template") or {}
        rss = sorted(self._owned(RS_KEY, ns, d["metadata"]["uid"]),
                     key=lambda r: (r["metadata"].get("creationTimestamp", ""), r["metadata"]["name"]))
        new_rs = next((r for r in rss if self._same_template(r, template)), None)
        old_rss = [r for r in rss if r is not new_rs]
        strategy = spec.get("strategy") or {}
        surge, unavailable = self._surge_unavailable(d)
        if not spec.get("paused"):
            if strategy.get("type") == "Recreate":
                new_rs = self._recreate(d, new_rs, old_rss, replicas)
            else:
                new_rs = self._rolling(d, new_rs, old_rss, replicas, surge, unavailable)
            self._cleanup_history(d, [r for r in rss if r is not new_rs])
        elif new_rs is not None and new_rs["spec"].get("replicas") != replicas and not old_rss:
            new_rs = self._scale(new_rs, replicas, d)
        self._deployment_status(d, new_rs, [r for r in self._owned(RS_KEY, ns, d["metadata"]["uid"])
                                            if new_rs is None or r["metadata"]["uid"] != new_rs["metadata"]["uid"]],
                                replicas, unavailable)

    @staticmethod
    def _same_template(rs: dict, template: dict) -> bool:
        """EqualIgnoreHash: the replica set's template is the deployment's, but for pod-template-hash."""
        rs_template = deep_copy((rs.get("spec") or {}).get("template") or {})
        ((rs_template.get("metadata") or {}).get("labels") or {}).pop(C.LABEL_POD_TEMPLATE_HASH, None)
        return _sorted(rs_template) == _sorted(template)

    @staticmethod
    def _surge_unavailable(d: dict) -> tuple[int, int]:
        replicas = d["spec"].get("replicas", 1)
        strategy = d["spec"].get("strategy") or {}
        if strategy.get("type") == "Recreate":
            return 0, replicas
        rolling = strategy.get("rollingUpdate") or {}
        surge = int_or_percent(rolling.get("maxSurge", "25%"), replicas, True)
        unavailable = int_or_percent(rolling.get("maxUnavailable", "25%"), replicas, False)
        if surge == 0 and unavailable == 0:
            unavailable = 1  # as the real controller: a rollout must be able to progress
        return surge, min(unavailable, replicas)

    def _revision(self, rs: dict) -> int:
        try:
            return int((rs["metadata"].get("annotations") or {}).get(C.ANNOTATION_DEPLOYMENT_REVISION, "0"))
        except ValueError:
            return 0

    def _new_replicaset(self, d: dict, replicas: int, revision: int) -> dict | None:
        template = deep_copy(d["spec"].get("template") or {})
        digest = template_hash(template)
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), C.LABEL_POD_TEMPLATE_HASH: digest}
        selector = deep_copy(d["spec"].get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), C.LABEL_POD_TEMPLATE_HASH: digest}
        surge, _ = self._surge_unavailable(d)
        rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
            "name": f"{d['metadata']['name']}-{digest}", "namespace": d["metadata"]["namespace"],
            "labels": dict(tmeta["labels"]),
            "annotations": {C.ANNOTATION_DEPLOYMENT_REVISION: str(revision),
                            C.ANNOTATION_DEPLOYMENT_DESIRED_REPLICAS: str(d["spec"].get("replicas", 1)),
                            C.ANNOTATION_DEPLOYMENT_MAX_REPLICAS: str(d["spec"].get("replicas", 1) + surge)},
            "ownerReferences": [owner_ref(d)]},
            "spec": {"replicas": replicas, "minReadySeconds": d["spec"].get("minReadySeconds", 0),
                     "selector": selector, "template": template}}
        try:
            created = self.objects.create(self.registry.by_key(RS_KEY), rs, d["metadata"]["namespace"])
        except errors.ApiError as exc:
            self.events.record(d, "Warning", "FailedCreate", f"Failed to create new replica set: {exc.message}",
                               "deployment-controller")
            return None
        self.events.record(d, "Normal", "ScalingReplicaSet",
                           f"Scaled up replica set {created['metadata']['name']} from 0 to {replicas}",
                           "deployment-controller")
        return created

    def _scale(self, rs: dict, replicas: int, d: dict) -> dict:
        old = rs["spec"].get("replicas", 1)
        if old == replicas:
            return rs
        new = deep_copy(rs)
        new["spec"]["replicas"] = replicas
        annotations = new["metadata"].setdefault("annotations", {})
        annotations[C.ANNOTATION_DEPLOYMENT_DESIRED_REPLICAS] = str(d["spec"].get("replicas", 1))
        updated = self.objects.update(self.registry.by_key(RS_KEY), new, rs["metadata"]["namespace"],
                                      rs["metadata"]["name"])
        verb = "up" if replicas > old else "down"
        self.events.record(d, "Normal", "ScalingReplicaSet",
                           f"Scaled {verb} replica set {rs['metadata']['name']} from {old} to {replicas}",
                           "deployment-controller")
        return updated

    def _ensure_revision(self, d: dict, new_rs: dict | None, old_rss: list[dict], replicas: int) -> dict | None:
        top = max([self._revision(r) for r in old_rss] + [0])
        if new_rs is None:
            return self._new_replicaset(d, replicas, top + 1)
        if self._revision(new_rs) <= top:  # a rollback to an old template: it becomes the newest revision
            new = deep_copy(new_rs)
            new["metadata"].setdefault("annotations", {})[C.ANNOTATION_DEPLOYMENT_REVISION] = str(top + 1)
            new_rs = self.objects.update(self.registry.by_key(RS_KEY), new, new_rs["metadata"]["namespace"],
                                         new_rs["metadata"]["name"])
        return new_rs

    def _recreate(self, d: dict, new_rs: dict | None, old_rss: list[dict], replicas: int) -> dict | None:
        for rs in old_rss:
            if rs["spec"].get("replicas", 1):
                self._scale(rs, 0, d)
        if any(is_active(p) or not is_terminal(p) for rs in old_rss
               for p in self._owned(POD_KEY, d["metadata"]["namespace"], rs["metadata"]["uid"])):
            return new_rs  # Recreate: no new pod while an old one still runs
        new_rs = self._ensure_revision(d, new_rs, old_rss, replicas)
        if new_rs is not None:
            new_rs = self._scale(new_rs, replicas, d)
        return new_rs

    def _rolling(self, d: dict, new_rs: dict | None, old_rss: list[dict], replicas: int, surge: int,
                 unavailable: int) -> dict | None:
        old_total = sum(r["spec"].get("replicas", 1) for r in old_rss)
        if new_rs is None:
            start = replicas if not old_total else max(0, min(replicas, replicas + surge - old_total))
            new_rs = self._ensure_revision(d, None, old_rss, start)
            if new_rs is None:
                return None
        else:
            new_rs = self._ensure_revision(d, new_rs, old_rss, replicas)
        # scale up the new replica set within maxSurge
        new_spec = new_rs["spec"].get("replicas", 1)
        if new_spec < replicas:
            room = replicas + surge - (old_total + new_spec)
            if room > 0:
                new_rs = self._scale(new_rs, min(replicas, new_spec + room), d)
        elif new_spec > replicas:
            new_rs = self._scale(new_rs, replicas, d)
        # scale down old replica sets while at least replicas - maxUnavailable pods stay available
        if old_total:
            min_available = replicas - unavailable
            new_spec = new_rs["spec"].get("replicas", 1)
            new_unavailable = new_spec - (new_rs.get("status") or {}).get("availableReplicas", 0)
            max_down = old_total + new_spec - min_available - new_unavailable
            if max_down > 0:
                for rs in old_rss:  # first the old pods that are not available anyway
                    spec_n = rs["spec"].get("replicas", 1)
                    unhealthy = spec_n - (rs.get("status") or {}).get("availableReplicas", 0)
                    cut = min(max_down, unhealthy, spec_n)
                    if cut > 0:
                        self._scale(rs, spec_n - cut, d)
                        max_down -= cut
                old_rss = [self.store.get(RS_KEY, r["metadata"]["namespace"], r["metadata"]["name"]) or r
                           for r in old_rss]
                available = sum((r.get("status") or {}).get("availableReplicas", 0) for r in old_rss + [new_rs])
                budget = min(max_down, available - min_available) if max_down > 0 else 0
                for rs in old_rss:  # oldest first
                    if budget <= 0:
                        break
                    spec_n = rs["spec"].get("replicas", 1)
                    cut = min(spec_n, budget)
                    if cut > 0:
                        self._scale(rs, spec_n - cut, d)
                        budget -= cut
        return new_rs

    def _cleanup_history(self, d: dict, old_rss: list[dict]) -> None:
        limit = d["spec"].get("revisionHistoryLimit", 10)
        idle = [r for r in old_rss if not r["spec"].get("replicas") and not (r.get("status") or {}).get("replicas")]
        idle.sort(key=self._revision)
        for rs in idle[:max(0, len(idle) - limit)]:
            try:
                self.objects.delete(self.registry.by_key(RS_KEY), rs["metadata"]["namespace"], rs["metadata"]["name"])
            except errors.ApiError:
                pass

    def _deployment_status(self, d: dict, new_rs: dict | None, old_rss: list[dict], replicas: int,
                           unavailable: int) -> None:
        d = self.store.get(DEPLOY_KEY, d["metadata"]["namespace"], d["metadata"]["name"]) or d
        all_rss = old_rss + ([new_rs] if new_rs is not None else [])
        st = [r.get("status") or {} for r in all_rss]
        status = dict(d.get("status") or {})
        status.update(observedGeneration=d["metadata"].get("generation", 1),
                      replicas=sum(s.get("replicas", 0) for s in st),
                      updatedReplicas=(new_rs.get("status") or {}).get("replicas", 0) if new_rs else 0,
                      readyReplicas=sum(s.get("readyReplicas", 0) for s in st),
                      availableReplicas=sum(s.get("availableReplicas", 0) for s in st))
        total_spec = sum(r["spec"].get("replicas", 1) for r in all_rss)
        status["unavailableReplicas"] = max(0, total_spec - status["availableReplicas"])
        for key in ("updatedReplicas", "readyReplicas", "availableReplicas", "unavailableReplicas"):
            if not status[key]:
                status.pop(key)
        conditions = deep_copy(status.get("conditions") or [])
        if status.get("availableReplicas", 0) >= replicas - unavailable:
            _set_condition(conditions, "Available", "True", "MinimumReplicasAvailable",
                           "Deployment has minimum availability.")
        else:
            _set_condition(conditions, "Available", "False", "MinimumReplicasUnavailable",
                           "Deployment does not have minimum availability.")
        if new_rs is not None:
            rs_name = new_rs["metadata"]["name"]
            complete = (status.get("updatedReplicas", 0) == replicas and status.get("availableReplicas", 0) == replicas
                        and status["replicas"] == replicas)
            if complete:
                _set_condition(conditions, "Progressing", "True", "NewReplicaSetAvailable",
                               f'ReplicaSet "{rs_name}" has successfully progressed.')
            else:
                _set_condition(conditions, "Progressing", "True", "ReplicaSetUpdated",
                               f'ReplicaSet "{rs_name}" is progressing.')
        conditions.sort(key=lambda c: c["type"] != "Available")
        status["conditions"] = conditions
        if new_rs is not None:
            revision = str(self._revision(new_rs))
            if (d["metadata"].get("annotations") or {}).get(C.ANNOTATION_DEPLOYMENT_REVISION) != revision:
                new = deep_copy(d)
                new["metadata"].setdefault("annotations", {})[C.ANNOTATION_DEPLOYMENT_REVISION] = revision
                new["status"] = status
                self.objects.update_status(DEPLOY_KEY, new)  # annotation set by the controller, no new generation
                return
        self._write_status(DEPLOY_KEY, d, status)

    # --- Job ------------------------------------------------------------------------------------
    def _release_job_pods(self, uid: str, ns: str) -> None:
        for pod in self._owned(POD_KEY, ns, uid):
            if C.FINALIZER_JOB_TRACKING in (pod["metadata"].get("finalizers") or []):
                self.objects.remove_finalizer(self.registry.by_key(POD_KEY), pod, C.FINALIZER_JOB_TRACKING)

    @staticmethod
    def _job_finished(job: dict) -> str | None:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond["type"] in ("Complete", "Failed") and cond.get("status") == "True":
                return cond["type"]
        return None

    @staticmethod
    def _failure_action(job: dict, pod: dict) -> tuple[str, str]:
        """podFailurePolicy: the first matching rule's action (FailJob, Ignore, Count, FailIndex)."""
        policy = job["spec"].get("podFailurePolicy") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for i, rule in enumerate(policy.get("rules") or []):
            codes = rule.get("onExitCodes")
            if codes:
                values = set(codes.get("values") or [])
                for cs in statuses:
                    if codes.get("containerName") and cs.get("name") != codes["containerName"]:
                        continue
                    term = (cs.get("state") or {}).get("terminated")
                    if not term or term.get("exitCode") == 0:
                        continue
                    hit = term.get("exitCode") in values
                    if hit if codes.get("operator") == "In" else not hit:
                        return rule["action"], (f"Container {cs['name']} for pod {pod['metadata']['namespace']}/"
                                                f"{pod['metadata']['name']} failed with exit code "
                                                f"{term.get('exitCode')} matching {rule['action']} rule at index {i}")
            for pattern in rule.get("onPodConditions") or []:
                cond = get_condition(pod, pattern.get("type", ""))
                if cond and cond.get("status") == pattern.get("status", "True"):
                    return rule["action"], (f"Pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has "
                                            f"condition {pattern['type']} matching {rule['action']} rule at index {i}")
        return "Count", ""

    def _finish_job(self, job: dict, status: dict, ctype: str, reason: str, message: str) -> None:
        conditions = status.setdefault("conditions", [])
        if ctype == "Complete":
            _set_condition(conditions, "SuccessCriteriaMet", "True", "CompletionsReached",
                           "Reached expected number of succeeded pods", update_time=False)
            status["completionTime"] = now_iso()
        else:
            _set_condition(conditions, "FailureTarget", "True", reason, message, update_time=False)
        _set_condition(conditions, ctype, "True", reason, message, update_time=False)
        for cond in conditions:
            cond.setdefault("lastProbeTime", cond["lastTransitionTime"])
            cond.pop("lastUpdateTime", None)
        self.events.record(job, "Normal" if ctype == "Complete" else "Warning",
                           "Completed" if ctype == "Complete" else reason,
                           "Job completed" if ctype == "Complete" else message, "job-controller")

    def _sync_job(self, ns: str, name: str) -> None:
        job = self.store.get(JOB_KEY, ns, name)
        if job is None:
            return
        uid = job["metadata"]["uid"]
        pods = self._owned(POD_KEY, ns, uid)
        spec = job["spec"]
        status = deep_copy(job.get("status") or {})
        finished = self._job_finished(job)
        fail: tuple[str, str] | None = None
        counted = []
        indexed = spec.get("completionMode") == "Indexed"
        done_indexes = _parse_indexes(status.get("completedIndexes", ""))
        for pod in pods:  # count each finished pod once, then release its tracking finalizer
            if C.FINALIZER_JOB_TRACKING not in (pod["metadata"].get("finalizers") or []):
                continue
            gone = pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName")
            if not is_terminal(pod) and not gone:
                continue
            counted.append(pod)
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                index = _pod_index(pod)
                if indexed and index is not None:
                    if index not in done_indexes:
                        done_indexes.add(index)
                        status["succeeded"] = status.get("succeeded", 0) + 1
                else:
                    status["succeeded"] = status.get("succeeded", 0) + 1
                continue
            action, message = self._failure_action(job, pod)
            if action == "Ignore":
                continue
            status["failed"] = status.get("failed", 0) + 1
            if action in ("FailJob", "FailIndex") and fail is None:
                fail = ("PodFailurePolicy", message)
        if indexed:
            status["completedIndexes"] = _format_indexes(done_indexes)
            if not status["completedIndexes"]:
                status.pop("completedIndexes")
        active = [p for p in pods if is_active(p)]
        now = dt.datetime.now(dt.timezone.utc)
        restarts = sum(cs.get("restartCount", 0) for p in active
                       for cs in (p.get("status") or {}).get("containerStatuses") or [])
        conditions = status.setdefault("conditions", [])
        suspended = bool(spec.get("suspend"))
        if finished is None:
            completions = spec.get("completions")
            started = parse_time(status.get("startTime"))
            deadline = spec.get("activeDeadlineSeconds")
            if fail is not None:
                self._finish_job(job, status, "Failed", *fail)
            elif status.get("failed", 0) + restarts > spec.get("backoffLimit", 6):
                self._finish_job(job, status, "Failed", "BackoffLimitExceeded",
                                 "Job has reached the specified backoff limit")
            elif deadline and started and not suspended and (now - started).total_seconds() >= deadline:
                self._finish_job(job, status, "Failed", "DeadlineExceeded",
                                 "Job was active longer than specified deadline")
            elif (completions is not None and status.get("succeeded", 0) >= completions) or \
                    (completions is None and status.get("succeeded", 0) > 0 and not active):
                self._finish_job(job, status, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
            finished = self._job_finished({"status": status})
            if finished is None and deadline and started and not suspended:
                self._later(deadline - (now - started).total_seconds(), JOB_KEY, ns, name)
        if finished is not None or suspended:
            for pod in active:
                self._delete_pod(job, pod)
            active = []
        elif not job["metadata"].get("deletionTimestamp"):
            active = self._job_pods_wanted(job, status, active, pods, done_indexes)
        if suspended and finished is None:
            if not any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
                _set_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended", update_time=False)
                self.events.record(job, "Normal", "Suspended", "Job suspended", "job-controller")
            status.pop("startTime", None)
        elif finished is None:
            if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
                _set_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed", update_time=False)
                self.events.record(job, "Normal", "Resumed", "Job resumed", "job-controller")
            status.setdefault("startTime", now_iso())
        for cond in conditions:
            cond.setdefault("lastProbeTime", cond["lastTransitionTime"])
            cond.pop("lastUpdateTime", None)
        if not conditions:
            status.pop("conditions")
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if pod_ready(p))
        status["terminating"] = sum(1 for p in pods if p["metadata"].get("deletionTimestamp") and not is_terminal(p))
        for key in ("active", "succeeded", "failed", "terminating"):
            if not status.get(key):
                status.pop(key, None)
        status.setdefault("ready", 0)
        self._write_status(JOB_KEY, job, status)  # counts first, then the finalizers: a pod is counted once
        for pod in counted:
            fresh = self.store.get(POD_KEY, ns, pod["metadata"]["name"])
            if fresh is not None and fresh["metadata"]["uid"] == pod["metadata"]["uid"]:
                self.objects.remove_finalizer(self.registry.by_key(POD_KEY), fresh, C.FINALIZER_JOB_TRACKING)

    def _job_pods_wanted(self, job: dict, status: dict, active: list[dict], pods: list[dict],
                         done_indexes: set[int]) -> list[dict]:
        spec = job["spec"]
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        if completions is None:
            want = 0 if status.get("succeeded") else parallelism
        else:
            want = max(0, min(parallelism, completions - status.get("succeeded", 0)))
        if spec.get("podReplacementPolicy") == "Failed":  # wait until terminating pods are gone
            want -= sum(1 for p in pods if p["metadata"].get("deletionTimestamp") and not is_terminal(p))
        if len(active) > want:
            for pod in sorted(active, key=lambda p: pod_ready(p))[:len(active) - want]:
                self._delete_pod(job, pod)
            return active[:want]
        name = job["metadata"]["name"]
        labels = {C.LABEL_JOB_NAME: name, C.LABEL_JOB_CONTROLLER_UID: job["metadata"]["uid"]}
        if spec.get("completionMode") == "Indexed":
            busy = {_pod_index(p) for p in active} | done_indexes
            free = [i for i in range(completions or 0) if i not in busy]
            for index in free[:max(0, want - len(active))]:
                self._create_pod(job, spec.get("template") or {}, f"{name}-{index}-",
                                 {**labels, C.LABEL_JOB_COMPLETION_INDEX: str(index)},
                                 {C.LABEL_JOB_COMPLETION_INDEX: str(index)},
                                 [C.FINALIZER_JOB_TRACKING], hostname=f"{name}-{index}",
                                 env={"JOB_COMPLETION_INDEX": str(index)})
        else:
            for _ in range(min(max(0, want - len(active)), MAX_BURST)):
                if not self._create_pod(job, spec.get("template") or {}, f"{name}-", labels, None,
                                        [C.FINALIZER_JOB_TRACKING]):
                    break
        return [p for p in self._owned(POD_KEY, job["metadata"]["namespace"], job["metadata"]["uid"]) if is_active(p)]

    # --- PodDisruptionBudget --------------------------------------------------------------------
    def _sync_pdb(self, ns: str, name: str) -> None:
        """The disruption controller's trySync: numbers from every pod the selector matches, the
        evictions the Eviction API announced in status.disruptedPods counted as gone until their pod is
        deleted (or DELETION_TIMEOUT passes); on a failed count, failSafe (no disruption allowed)."""
        pdb = self.store.get(PDB_KEY, ns, name)
        if pdb is None:
            return
        old = pdb.get("status") or {}
        conditions = deep_copy(old.get("conditions") or [])
        try:
            numbers = pdb_numbers(self.registry, self.store, pdb)
        except PdbCountError as exc:
            status = {**old, "disruptionsAllowed": 0}
            _set_pdb_condition(conditions, "False", "SyncFailed", str(exc), old.get("observedGeneration", 0))
            status["conditions"] = conditions
            if status != old:
                self.events.record(pdb, "Warning", "CalculateExpectedPodCountFailed",
                                   f"Failed to calculate the number of expected pods: {exc}", "controllermanager")
            self._write_status(PDB_KEY, pdb, status)
            return
        now = dt.datetime.now(dt.timezone.utc)
        disrupted, recheck = _disrupted_pods(numbers.pods, old.get("disruptedPods") or {}, now)
        healthy = sum(1 for p in numbers.pods if p["metadata"]["name"] not in disrupted and pod_ready(p))
        allowed = healthy - numbers.desired if numbers.expected > 0 and healthy > numbers.desired else 0
        generation = pdb["metadata"].get("generation", 1)
        status = {"currentHealthy": healthy, "desiredHealthy": numbers.desired, "disruptionsAllowed": allowed,
                  "expectedPods": numbers.expected, "observedGeneration": generation}
        if disrupted:
            status["disruptedPods"] = disrupted
        _set_pdb_condition(conditions, *_allowed_condition(allowed), generation)
        status["conditions"] = conditions
        self._write_status(PDB_KEY, pdb, status)
        if recheck is not None:
            self._later((recheck - now).total_seconds(), PDB_KEY, ns, name)


# --- PodDisruptionBudgets: the disruption controller's numbers and the Eviction API -------------
DELETION_TIMEOUT = dt.timedelta(minutes=2)  # disruption.DeletionTimeout: an announced eviction's pod
# that is still not being deleted by then counts again
MAX_DISRUPTED_PODS = 2000  # eviction.MaxDisruptedPodSize: announced evictions the controller has not seen


class PdbCountError(Exception):
    """getExpectedScale failed (a controller without a scale, or none found): the budget fails safe."""


@dataclass(frozen=True)
class PdbNumbers:
    pods: list[dict]
    expected: int
    desired: int


def _pdb_pods(store, pdb: dict) -> list[dict]:
    """getPodsForPdb: every pod the selector matches, terminating and terminal ones included (a nil
    selector selects nothing, an empty one everything)."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return []
    return [p for p in store.values(POD_KEY, pdb["metadata"]["namespace"])
            if label_selector_object_matches(selector, p["metadata"].get("labels"))]


def _controller_scale(registry, store, ns: str, ref: dict) -> tuple[str, int] | None:
    """The finders of the disruption controller: a ReplicaSet's Deployment, else the controller's own
    scale subresource; None when the controller object is gone."""
    group = ref.get("apiVersion", "").rpartition("/")[0]
    if ref.get("kind") == "ReplicaSet" and group in ("apps", "extensions"):
        rs = store.get(RS_KEY, ns, ref["name"])
        if rs is None or rs["metadata"]["uid"] != ref.get("uid"):
            return None
        owner = next((r for r in rs["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if owner is not None and owner.get("kind") == "Deployment":
            deploy = store.get(DEPLOY_KEY, ns, owner["name"])
            if deploy is not None and deploy["metadata"]["uid"] == owner.get("uid"):
                return deploy["metadata"]["uid"], (deploy.get("spec") or {}).get("replicas", 1)
        return rs["metadata"]["uid"], (rs.get("spec") or {}).get("replicas", 1)
    rt = registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
    if rt is None:
        raise PdbCountError(f'no matches for kind "{ref.get("kind")}" in version "{ref.get("apiVersion")}"')
    if "scale" not in rt.subresources:
        raise PdbCountError(f"{rt.plural}.{rt.group} does not implement the scale subresource"
                            if rt.group else f"{rt.plural} does not implement the scale subresource")
    owner_obj = store.get(rt.key, ns, ref["name"])
    if owner_obj is None or owner_obj["metadata"]["uid"] != ref.get("uid"):
        return None
    return owner_obj["metadata"]["uid"], (owner_obj.get("spec") or {}).get("replicas", 1)


def _expected_scale(registry, store, pods: list[dict]) -> int:
    """getExpectedScale: the sum of the scales of the pods' controllers; pods without a controller are
    not counted (the real controller only warns about them)."""
    scales: dict[str, int] = {}
    for pod in pods:
        ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if ref is None or ref.get("uid") in scales:
            continue
        found = _controller_scale(registry, store, pod["metadata"]["namespace"], ref)
        if found is None:
            raise PdbCountError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
        scales[found[0]] = found[1]
    return sum(scales.values())


def pdb_numbers(registry, store, pdb: dict) -> PdbNumbers:
    """getExpectedPodCount. An integer minAvailable counts the matching pods themselves, so a pod being
    evicted and its pending replacement are both expected until the first is gone; maxUnavailable and a
    percentage minAvailable scale from the controllers. Neither set (policy/v1 has no default): 0, 0."""
    spec = pdb.get("spec") or {}
    pods = _pdb_pods(store, pdb)
    if spec.get("maxUnavailable") is not None:
        expected = _expected_scale(registry, store, pods)
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    elif isinstance(spec.get("minAvailable"), int):
        expected, desired = len(pods), spec["minAvailable"]
    elif spec.get("minAvailable") is not None:
        expected = _expected_scale(registry, store, pods)
        desired = _scaled(spec["minAvailable"], expected)
    else:
        expected = desired = 0
    return PdbNumbers(pods, expected, desired)


def _scaled(value, total: int) -> int:
    try:
        return int_or_percent(value, total, True)
    except ValueError as exc:
        raise PdbCountError(str(exc)) from None


def _disrupted_pods(pods: list[dict], announced: dict, now: dt.datetime) -> tuple[dict, dt.datetime | None]:
    """buildDisruptedPodMap: announced evictions whose pod exists, is not yet being deleted and was
    announced less than DELETION_TIMEOUT ago; and when the earliest of them expires."""
    kept, recheck = {}, None
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp") or name not in announced:
            continue
        since = parse_time(announced[name])
        if since is None or since + DELETION_TIMEOUT < now:
            continue
        kept[name] = announced[name]
        recheck = min(recheck or since + DELETION_TIMEOUT, since + DELETION_TIMEOUT)
    return kept, recheck


def _allowed_condition(allowed: int) -> tuple[str, str, str]:
    return ("True", "SufficientPods", "") if allowed > 0 else ("False", "InsufficientPods", "")


def _set_pdb_condition(conditions: list, status: str, reason: str, message: str, generation: int) -> None:
    """apimeta.SetStatusCondition for DisruptionAllowed: the transition time moves only with status."""
    _set_condition(conditions, "DisruptionAllowed", status, reason, message, update_time=False)
    for cond in conditions:
        if cond["type"] == "DisruptionAllowed":
            cond["observedGeneration"] = generation


def _too_many_requests(message: str, retry_after: int = 0) -> errors.ApiError:
    details: dict = {"causes": [{"reason": "DisruptionBudget", "message": message}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return errors.ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           details)


def evict_pod(objects: ObjectAPI, pod: dict, grace: int | None, dry_run: bool) -> None:
    """The Eviction API (pkg/registry/core/pod/storage/eviction.go) on the budget's stored status, as the
    real one: pods that are Pending, terminal or already terminating are deleted without a budget; an
    unready pod goes if the budget is healthy (IfHealthyBudget) or always (AlwaysAllow); otherwise the
    budget must be observed at its generation and allow a disruption, which is taken (disruptionsAllowed
    decremented, the pod announced in disruptedPods) before the pod is deleted."""
    store, meta = objects.store, pod["metadata"]
    phase = (pod.get("status") or {}).get("phase")
    if phase not in ("Pending", "Succeeded", "Failed") and not meta.get("deletionTimestamp"):
        budgets = [b for b in store.values(PDB_KEY, meta["namespace"])
                   if (b.get("spec") or {}).get("selector")  # nil or empty: matches nothing here
                   and label_selector_object_matches(b["spec"]["selector"], meta.get("labels"))]
        if len(budgets) > 1:
            raise errors.ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                                                        "eviction subresource does not support.", {})
        if budgets:
            _take_disruption(objects, budgets[0], pod, dry_run)
    if not dry_run:
        objects.evict(meta["namespace"], meta["name"], grace)


def _take_disruption(objects: ObjectAPI, pdb: dict, pod: dict, dry_run: bool) -> None:
    status, name = pdb.get("status") or {}, pdb["metadata"]["name"]
    if not pod_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        desired = status.get("desiredHealthy", 0)
        if policy == "AlwaysAllow" or (status.get("currentHealthy", 0) >= desired and desired > 0):
            return
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise _too_many_requests(f"The disruption budget {name} is still being processed by the server.", 10)
    announced = status.get("disruptedPods") or {}
    if len(announced) > MAX_DISRUPTED_PODS:
        raise errors.forbidden("poddisruptionbudget", name, "DisruptedPods map too big - too many evictions "
                               "not confirmed by PDB controller", group="policy")
    allowed = status.get("disruptionsAllowed", 0)
    if allowed <= 0:
        raise _too_many_requests(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} "
                                 f"healthy pods and has {status.get('currentHealthy', 0)} currently")
    if dry_run:
        return
    new_status = {**status, "disruptionsAllowed": allowed - 1,
                  "disruptedPods": {**announced, pod["metadata"]["name"]: now_iso()}}
    conditions = deep_copy(status.get("conditions") or [])
    if allowed - 1 == 0:
        _set_pdb_condition(conditions, *_allowed_condition(0), status.get("observedGeneration", 0))
    new_status["conditions"] = conditions
    objects.update_status(PDB_KEY, {**pdb, "status": new_status, "metadata": dict(pdb["metadata"])})


# --- Indexed Jobs ------------------------------------------------------------------------------
def _pod_index(pod: dict) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(C.LABEL_JOB_COMPLETION_INDEX)
    return int(value) if value is not None and value.isdigit() else None


def _parse_indexes(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _format_indexes(indexes: set[int]) -> str:
    parts, run = [], []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)
