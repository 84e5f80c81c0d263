"""Every write the scheduler makes to the API, through the official client. `access.REQUIRED` lists
them (deploy/rbac.yaml grants exactly that). Bodies are plain dicts and answers are not decoded into
client models (`_preload_content=False`): faster, and immune to the client's V1Binding decode bug."""

from __future__ import annotations

import json
import logging
import os
import uuid
from datetime import datetime, timezone

from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.constants import PODGROUP_GROUP, PODGROUP_KIND, PODGROUP_PLURAL, PODGROUP_VERSION
from airflow_gpu.kube import preemptions

log = logging.getLogger(__name__)
MERGE = "application/merge-patch+json"
TIMEOUT = 15


def _now_rfc3339(micro: bool = False) -> str:
    dt = datetime.now(tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _release(resp) -> None:
    """Read an answer not otherwise read: only then does the client put its connection back in the
    pool. Unread, each write opened a new TCP connection (thousands at a fill's binding rate)."""
    resp.data  # noqa: B018


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


class Api:
    def __init__(self, api_client: client.ApiClient, component: str, identity: str):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.component = component
        self.identity = identity

    # --- pods -------------------------------------------------------------------------------
    def bind(self, pod_key: str, node: str, uid: str | None = None) -> str:
        """Bind a pod. Returns "bound", "already" (bound to that node before: a retry after a crash),
        or raises ApiException (e.g. 404: pod gone; 409 with another node)."""
        ns, name = _split(pod_key)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            _release(self.core.create_namespaced_pod_binding(name, ns, body, _preload_content=False,
                                                             _request_timeout=TIMEOUT))
            return "bound"
        except ApiException as exc:
            if exc.status == 409:
                resp = self.core.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=TIMEOUT)
                if (json.loads(resp.data).get("spec") or {}).get("nodeName") == node:
                    return "already"
            raise

    def mark_disruption(self, pod_key: str, message: str) -> None:
        """DisruptionTarget=True, reason PreemptionByScheduler, as kube-scheduler sets before it
        preempts: the pod (and the operator watching it) learns why it is being stopped."""
        ns, name = _split(pod_key)
        body = {
            "status": {
                "conditions": [
                    {
                        "type": C.CONDITION_DISRUPTION_TARGET,
                        "status": "True",
                        "reason": C.REASON_PREEMPTION_BY_SCHEDULER,
                        "message": message,
                        "lastTransitionTime": _now_rfc3339(),
                    }
                ]
            }
        }
        # strategic merge: conditions merge by type, other conditions are kept
        _release(self.core.patch_namespaced_pod_status(
            name, ns, body, _preload_content=False, _request_timeout=TIMEOUT,
            _content_type="application/strategic-merge-patch+json",
        ))

    def evict(self, pod_key: str, grace_seconds: int | None) -> str:
        """Eviction API with the victim's own grace period, so it gets SIGTERM and time to checkpoint.
        Returns "evicted", "gone" (already deleted) or "blocked" (a PodDisruptionBudget said 429)."""
        ns, name = _split(pod_key)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": int(grace_seconds)}
        try:
            _release(self.core.create_namespaced_pod_eviction(name, ns, body, _preload_content=False,
                                                              _request_timeout=TIMEOUT))
            return "evicted"
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 429:
                return "blocked"
            raise

    def patch_pod_annotations(self, pod_key: str, annotations: dict[str, str | None]) -> dict:
        ns, name = _split(pod_key)
        resp = self.core.patch_namespaced_pod(
            name, ns, {"metadata": {"annotations": annotations}}, _preload_content=False,
            _request_timeout=TIMEOUT, _content_type=MERGE,
        )
        return json.loads(resp.data)

    # --- podgroups --------------------------------------------------------------------------
    def patch_podgroup_annotations(self, pg_key: str, annotations: dict[str, str | None]) -> dict:
        ns, name = _split(pg_key)
        resp = self.custom.patch_namespaced_custom_object(
            PODGROUP_GROUP, PODGROUP_VERSION, ns, PODGROUP_PLURAL, name,
            {"metadata": {"annotations": annotations}}, _preload_content=False, _request_timeout=TIMEOUT,
            _content_type=MERGE,
        )
        return json.loads(resp.data)

    def patch_podgroup_status(self, pg_key: str, status: dict) -> dict:
        ns, name = _split(pg_key)
        resp = self.custom.patch_namespaced_custom_object_status(
            PODGROUP_GROUP, PODGROUP_VERSION, ns, PODGROUP_PLURAL, name, {"status": status},
            _preload_content=False, _request_timeout=TIMEOUT, _content_type=MERGE,
        )
        return json.loads(resp.data)

    # --- plan records (ConfigMaps in the scheduler's own namespace) ------------------------
    def write_plan(self, namespace: str, name: str, scheduler_name: str, record: str) -> dict:
        """Create or replace one plan record; returns the stored ConfigMap."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {C.LABEL_PLAN_OF: scheduler_name, C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}},
            "data": {C.PLAN_DATA_KEY: record},
        }
        try:
            resp = self.core.create_namespaced_config_map(namespace, body, _preload_content=False,
                                                          _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 409:
                raise
            resp = self.core.patch_namespaced_config_map(name, namespace, {"data": body["data"]},
                                                         _preload_content=False, _request_timeout=TIMEOUT,
                                                         _content_type=MERGE)
        return json.loads(resp.data)

    def write_queue_status(self, body: dict) -> None:
        """Create or replace the scheduler's published queue (kube.queue_status.manifest)."""
        meta = body["metadata"]
        try:
            _release(self.core.create_namespaced_config_map(meta["namespace"], body, _preload_content=False,
                                                            _request_timeout=TIMEOUT))
        except ApiException as exc:
            if exc.status != 409:
                raise
            _release(self.core.patch_namespaced_config_map(
                meta["name"], meta["namespace"], {"binaryData": body["binaryData"]}, _preload_content=False,
                _request_timeout=TIMEOUT, _content_type=MERGE))

    def delete_plan(self, namespace: str, name: str) -> dict | None:
        """Delete one plan record; returns its last state (None: it was gone already)."""
        try:
            resp = self.core.delete_namespaced_config_map(name, namespace, _preload_content=False,
                                                          _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = json.loads(resp.data)
        if data.get("kind") == "Status":  # older servers answer a Status
            return {"metadata": {"name": name, "namespace": namespace}}
        return data

    # --- the record of preempted pods (kube/preemptions.py) ------------------------------------
    def read_preemptions(self, namespace: str, scheduler_name: str) -> dict:
        """The record as stored (empty when there is none); a list by name: the scheduler's Role has
        no `get` on ConfigMaps."""
        resp = self.core.list_namespaced_config_map(
            namespace, field_selector=f"metadata.name={preemptions.record_name(scheduler_name)}",
            _preload_content=False, _request_timeout=TIMEOUT)
        items = json.loads(resp.data).get("items") or []
        return items[0] if items else {}

    def record_preemptions(self, namespace: str, scheduler_name: str, entries: list, expired: list[str]) -> None:
        """Add preempted pods to the record (and drop expired ones): a merge patch, or the record's
        creation when there is none yet."""
        name = preemptions.record_name(scheduler_name)
        patch = preemptions.record_patch(entries, expired)
        for _ in range(2):
            try:
                _release(self.core.patch_namespaced_config_map(name, namespace, patch, _preload_content=False,
                                                               _request_timeout=TIMEOUT, _content_type=MERGE))
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            try:
                _release(self.core.create_namespaced_config_map(
                    namespace, preemptions.record_manifest(namespace, scheduler_name, entries),
                    _preload_content=False, _request_timeout=TIMEOUT))
                return
            except ApiException as exc:
                if exc.status != 409:  # created meanwhile: patch it
                    raise

    # --- events -----------------------------------------------------------------------------
    def event(self, obj: dict, reason: str, message: str, type_: str = "Normal") -> None:
        """A core/v1 Event on a Pod or PodGroup, shown by `kubectl describe` and `kubectl get events`."""
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        is_pg = obj.get("kind") == PODGROUP_KIND or "minMember" in (obj.get("spec") or {})
        now = _now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "apiVersion": f"{PODGROUP_GROUP}/{PODGROUP_VERSION}" if is_pg else "v1",
                "kind": PODGROUP_KIND if is_pg else "Pod",
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": _now_rfc3339(micro=True),
            "action": "Scheduling",
            "count": 1,
        }
        try:
            _release(self.core.create_namespaced_event(ns, body, _preload_content=False, _request_timeout=TIMEOUT))
        except ApiException as exc:  # events are best effort, as in every Kubernetes component
            log.info("event %s on %s/%s not recorded: %s", reason, ns, meta.get("name"), exc.status)


def default_identity() -> str:
    return f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def grace_seconds_of(pod: dict) -> int | None:
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return int(value) if value is not None else None
