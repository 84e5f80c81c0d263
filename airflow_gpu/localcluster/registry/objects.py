"""Verbs on stored objects (create, update, patch, delete, bind, evict), independent of HTTP.

The HTTP layer and the in-process controllers (kubelet, scheduler, garbage collector) both come here,
so a pod deleted by a controller goes through the same graceful-deletion path as one deleted by kubectl.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid

from airflow_gpu import constants as C
from airflow_gpu.localcluster.admission import admission
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.registry import fieldmanager, workloadspec
from airflow_gpu.localcluster.registry.patch import apply_patch
from airflow_gpu.localcluster.podutil import is_terminal, now_iso, set_condition
from airflow_gpu.localcluster.registry.resources import CRD_KEY, Registry, ResourceType
from airflow_gpu.localcluster.registry.schema import decode_object
from airflow_gpu.localcluster.registry.store import Store, decode, encode

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as the real name generator
POD_KEY = "/pods"
NAMESPACE_KEY = "/namespaces"
SERVICE_KEY = "/services"


def deep_copy(obj: dict) -> dict:
    return decode(encode(obj))


def _version_of(rt: ResourceType, obj: dict) -> str:
    version = (obj.get("apiVersion") or "").rpartition("/")[2]
    return version if version in rt.versions else rt.versions[0]


def _unchanged(current: dict, new: dict) -> bool:
    """Equal but for resourceVersion and the times of managedFields entries (the API skips such writes)."""
    def comparable(obj: dict) -> dict:
        meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
        if meta.get("managedFields"):
            meta["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in meta["managedFields"]]
        return {**obj, "metadata": meta}
    return comparable(current) == comparable(new)


class ObjectAPI:
    def __init__(self, store: Store, registry: Registry):
        self.store, self.registry = store, registry
        self._service_ips = 0
        self.on_created: list = []  # (rt, obj) after a create is stored: what controllers do at once

    # --- create ---------------------------------------------------------------------------
    def create(self, rt: ResourceType, obj: dict, namespace: str | None = None, dry_run: bool = False,
               admit: bool = True, manager: str | None = None, managed_fields: list | None = None) -> dict:
        """manager: the request's fieldManager (an Update entry owns what it set); managed_fields:
        the entries of a server-side apply that creates the object."""
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(NAME_CHARS, k=5))
        obj["apiVersion"] = obj.get("apiVersion") or rt.api_version()
        obj["kind"] = rt.kind
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(key, None)
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        elif manager:
            fieldmanager.record_update(rt, _version_of(rt, obj), None, obj, manager)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta["generation"] = 1
        if rt.key == POD_KEY:
            obj["status"] = {}
        elif rt.crd and rt.has_status:
            obj.pop("status", None)
        admission.apply_defaults(rt, obj)
        admission.validate(rt, obj, creating=True)
        if admit:
            admission.admit_create(self.store, rt, obj)
        if rt.key == SERVICE_KEY:
            self._assign_cluster_ip(obj)
        if rt.key == CRD_KEY:
            self._crd_status(obj)
        if dry_run:
            return obj
        created = self.store.create(rt.key, obj, rt.plural, rt.group)
        for hook in self.on_created:
            hook(rt, created)
        return created

    def _assign_cluster_ip(self, svc: dict) -> None:
        spec = svc["spec"]
        if spec.get("clusterIP") in (None, ""):
            self._service_ips += 1
            n = self._service_ips
            spec["clusterIP"] = f"10.96.{n // 250}.{n % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]

    @staticmethod
    def _crd_status(crd: dict) -> None:
        names = crd.get("spec", {}).get("names", {})
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
                 "lastTransitionTime": now_iso()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now_iso()},
            ],
        }

    # --- update ---------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> dict:
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return obj

    def update(self, rt: ResourceType, obj: dict, namespace: str, name: str, subresource: str = "",
               dry_run: bool = False, manager: str | None = None) -> dict:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        current = self.get(rt, namespace, name)
        expect_rv = meta.get("resourceVersion") or None
        if expect_rv and expect_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, name, rt.group)
        new = dict(obj)
        new["apiVersion"], new["kind"] = current["apiVersion"], rt.kind
        if subresource == "status":
            new = {**current, "status": obj.get("status", current.get("status"))}
            new_meta = dict(current["metadata"])
        else:
            new_meta = dict(meta)
            for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
                if key in current["metadata"]:
                    new_meta[key] = current["metadata"][key]
                else:
                    new_meta.pop(key, None)
            new_meta["name"] = name
            if rt.namespaced:
                new_meta["namespace"] = namespace
            if "managedFields" not in new_meta and current["metadata"].get("managedFields"):
                new_meta["managedFields"] = current["metadata"]["managedFields"]  # unset keeps them, as the API
            if rt.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            if rt.kind == "Pod" and not rt.crd:
                admission.validate_pod_update(current, new)
            if not rt.crd and rt.kind in workloadspec.WORKLOAD_KINDS:
                new["metadata"] = new_meta
                workloadspec.apply_defaults(rt.kind, new)  # the real server defaults every decoded body
            if {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                    {k: v for k, v in current.items() if k not in ("metadata", "status")}:
                new_meta["generation"] = current["metadata"].get("generation", 1) + 1
        new_meta.pop("resourceVersion", None)
        new["metadata"] = new_meta
        if manager and subresource != "status":
            fieldmanager.record_update(rt, _version_of(rt, new), current, new, manager)
        admission.validate(rt, new, creating=False, old=current)
        if rt.key == CRD_KEY:
            self._crd_status(new)
        if _unchanged(current, new):
            return current  # a no-op write is not written: same resourceVersion, no watch event
        if dry_run:
            return {**new, "metadata": {**new_meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            return self.store.delete(rt.key, namespace if rt.namespaced else "", name, rt.plural, rt.group)
        return self.store.update(rt.key, new, rt.plural, rt.group, expect_rv=current["metadata"]["resourceVersion"])

    def patch(self, rt: ResourceType, namespace: str, name: str, body, content_type: str,
              subresource: str = "", dry_run: bool = False, manager: str | None = None,
              force: bool = False) -> tuple[dict, bool]:
        """-> (object, created). An apply patch (server-side apply) on a missing object creates it."""
        current = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if content_type.startswith("application/apply-patch"):
            return self._apply(rt, namespace, name, current, body, subresource, dry_run, manager, force)
        if current is None:
            raise errors.not_found(rt.plural, name, rt.group)
        patched = apply_patch(deep_copy(current), body, content_type, strategic_ok=not rt.crd)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch did not produce an object")
        patched.setdefault("metadata", {})
        # decode the result as the server decodes bodies: quantities normalised, unknown fields dropped
        version = (patched.get("apiVersion") or "").rpartition("/")[2] or rt.versions[0]
        patched, _ = decode_object(rt, version if version in rt.versions else rt.versions[0], patched, "Ignore")
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        patched["metadata"]["resourceVersion"] = wanted_rv or current["metadata"]["resourceVersion"]
        return self.update(rt, patched, namespace, name, subresource, dry_run, manager), False

    def _apply(self, rt: ResourceType, namespace: str, name: str, current: dict | None, body, subresource: str,
               dry_run: bool, manager: str | None, force: bool) -> tuple[dict, bool]:
        """Server-side apply (fieldmanager): managedFields, conflicts, removal of fields the manager dropped."""
        if subresource:
            raise errors.ApiError(415, "UnsupportedMediaType", f"server-side apply to the {subresource} subresource "
                                  "is not supported by the local cluster; apply the object, or PATCH with "
                                  "application/merge-patch+json")
        if not isinstance(body, dict):
            raise errors.bad_request("an apply patch must be an object")
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise errors.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        version = _version_of(rt, body)
        body, _ = decode_object(rt, version, body, "Ignore")
        body.setdefault("metadata", {})["name"] = name
        if current is None:
            obj = fieldmanager.apply(rt, version, None, body, manager, force)
            fields = obj["metadata"].pop("managedFields")
            return self.create(rt, obj, namespace, dry_run, managed_fields=fields), True
        merged = fieldmanager.apply(rt, version, current, body, manager, force)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(rt, merged, namespace, name, "", dry_run), False

    # --- delete ---------------------------------------------------------------------------
    def delete(self, rt: ResourceType, namespace: str, name: str, grace: int | None = None,
               propagation: str | None = None, preconditions: dict | None = None,
               dry_run: bool = False) -> tuple[dict, bool]:
        """-> (object, gone). gone=False: deletion pending (graceful pod, finalizers, foreground)."""
        ns = namespace if rt.namespaced else ""
        current = self.get(rt, namespace, name)
        meta = current["metadata"]
        for key in ("uid", "resourceVersion"):
            if preconditions and preconditions.get(key) and preconditions[key] != meta.get(key):
                raise errors.conflict(rt.plural, name, rt.group,
                                      f"Precondition failed: {key.capitalize()} in precondition: {preconditions[key]}, "
                                      f"{key.capitalize()} in object meta: {meta.get(key)}")
        if dry_run:
            return current, True
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and self._has_dependents(meta["uid"]) and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if rt.key == NAMESPACE_KEY and not meta.get("deletionTimestamp"):
            new = deep_copy(current)
            new["metadata"]["deletionTimestamp"] = now_iso()
            new["status"] = {"phase": "Terminating"}
            return self.store.update(rt.key, new, rt.plural), False
        if rt.key == POD_KEY:
            pending = self._graceful_pod(current, grace)
            if pending is not None:
                return pending, False
        if finalizers:
            if meta.get("deletionTimestamp") and finalizers == meta.get("finalizers"):
                return current, False
            new = deep_copy(current)
            new["metadata"].setdefault("deletionTimestamp", now_iso())
            new["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            new["metadata"]["finalizers"] = finalizers
            return self.store.update(rt.key, new, rt.plural, rt.group), False
        return self.store.delete(rt.key, ns, name, rt.plural, rt.group), True

    def _graceful_pod(self, pod: dict, grace: int | None) -> dict | None:
        """A running pod on a node is marked for deletion; its kubelet stops it and removes it."""
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace <= 0 or not spec.get("nodeName") or is_terminal(pod):
            return None
        if self.store.get("/nodes", "", spec["nodeName"]) is None:
            return None  # no kubelet will ever finish it
        old_grace = meta.get("deletionGracePeriodSeconds")
        if old_grace is not None and old_grace <= grace:
            return pod
        new = deep_copy(pod)
        deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace)
        new["metadata"]["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        return self.store.update(POD_KEY, new, "pods")

    def _dependents(self, uid: str) -> list[tuple[ResourceType, dict]]:
        out = []
        for rt in self.registry.all():
            for obj in self.store.values(rt.key):
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []):
                    out.append((rt, obj))
        return out

    def _has_dependents(self, uid: str) -> bool:
        return bool(self._dependents(uid))

    def _orphan_dependents(self, uid: str) -> None:
        for rt, obj in self._dependents(uid):
            new = deep_copy(obj)
            new["metadata"]["ownerReferences"] = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != uid]
            self.store.update(rt.key, new, rt.plural, rt.group)

    def remove_finalizer(self, rt: ResourceType, obj: dict, finalizer: str) -> None:
        new = deep_copy(obj)
        new["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        ns = obj["metadata"].get("namespace", "")
        if not new["metadata"]["finalizers"] and new["metadata"].get("deletionTimestamp"):
            self.store.delete(rt.key, ns, obj["metadata"]["name"], rt.plural, rt.group)
        else:
            self.store.update(rt.key, new, rt.plural, rt.group)

    # --- pod subresources -----------------------------------------------------------------
    def bind(self, namespace: str, name: str, node: str, expect_uid: str | None = None) -> dict:
        pod = self.store.get(POD_KEY, namespace, name)
        if pod is None:
            raise errors.not_found("pods", name)
        if expect_uid and pod["metadata"]["uid"] != expect_uid:
            raise errors.conflict("pods/binding", name, why="Precondition failed: UID mismatch")
        if pod["spec"].get("nodeName"):
            raise errors.conflict("pods/binding", name,
                                  why=f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict("pods/binding", name, why=f"pod {name} is being deleted, cannot be assigned to a host")
        new = deep_copy(pod)
        new["spec"]["nodeName"] = node
        set_condition(new.setdefault("status", {}), "PodScheduled", "True")
        return self.store.update(POD_KEY, new, "pods")

    def evict(self, namespace: str, name: str, grace: int | None = None) -> dict:
        pod = self.store.get(POD_KEY, namespace, name)
        if pod is None:
            raise errors.not_found("pods", name)
        if not is_terminal(pod) and not pod["metadata"].get("deletionTimestamp"):
            self.mark_disruption(pod, C.REASON_EVICTION_BY_EVICTION_API, "Eviction API: evicting")
        rt = self.registry.by_key(POD_KEY)
        obj, _ = self.delete(rt, namespace, name, grace=grace)
        return obj

    def mark_disruption(self, pod: dict, reason: str, message: str) -> dict:
        new = deep_copy(pod)
        if set_condition(new.setdefault("status", {}), C.CONDITION_DISRUPTION_TARGET, "True", reason, message):
            return self.store.update(POD_KEY, new, "pods")
        return pod

    def update_status(self, key: str, obj: dict) -> dict:
        """Controller write of an object it built from a fresh copy (no optimistic concurrency)."""
        rt = self.registry.by_key(key)
        return self.store.update(key, obj, rt.plural if rt else key)
