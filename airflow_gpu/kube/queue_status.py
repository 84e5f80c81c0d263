"""The scheduler's published queue as a Kubernetes object, both ways: the ConfigMap the scheduler
writes (`manifest`, gzip JSON in binaryData, bounded under the API's 1 MiB object limit by capping
lists and counting what was left out in `truncated`) and its reading back (`read`, `decode`) by the
UI plugin and `airflow-gpu queue`. And what a row says of a gang's pods (task instance, relaunch
counters, last checkpoint), read from their labels and annotations.

The document (version 1): generated_at, cycle, scheduler, profile, publish_interval, waiting
(core.visibility.WaitingEntry.as_dict + namespace and ti), incomplete, running, cluster
(core.visibility.cluster_picture), truncated {waiting, incomplete, running, nodes}.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.kube.wire import api_time

VERSION = 1
MAX_BYTES = 900 * 1024  # the API server refuses objects over 1 MiB (etcd's request limit); leave room for metadata
MAX_WAITING = 5000  # entries kept at most (the rest counted in `truncated`)
MAX_RUNNING = 5000
LISTS = (("waiting", MAX_WAITING), ("incomplete", MAX_WAITING), ("running", MAX_RUNNING))


class StatusUnreadable(ValueError):
    """The object is there but its content is not a queue this reader knows."""


def configmap_name(scheduler_name: str) -> str:
    return f"{C.QUEUE_CONFIGMAP_PREFIX}{scheduler_name}"


def encode(doc: dict, max_bytes: int = MAX_BYTES) -> bytes:
    """gzip JSON of `doc`; lists capped (and halved while the blob is too large) with the number of
    entries left out in doc["truncated"] (added to the counts `doc` brings: rows its maker did not
    build). The node list is cut last: the picture needs it whole."""
    doc = dict(doc)
    left_out = doc.get("truncated") or {}  # rows the document's maker left out already
    truncated = {name: 0 for name, _ in LISTS} | {"nodes": 0}
    for name, cap in LISTS:
        rows = doc.get(name) or []
        truncated[name] = left_out.get(name, 0) + max(0, len(rows) - cap)
        doc[name] = rows[:cap]
    while True:
        doc["truncated"] = truncated
        blob = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6, mtime=0)
        if len(blob) <= max_bytes:
            return blob
        name = max((n for n, _ in LISTS), key=lambda n: len(doc[n]))
        if not doc[name]:
            cluster = dict(doc.get("cluster") or {})
            nodes = cluster.get("nodes") or []
            if not nodes:
                raise ValueError(f"the published queue does not fit in {max_bytes} bytes even without its lists")
            keep = len(nodes) // 2
            truncated["nodes"] += len(nodes) - keep
            doc["cluster"] = {**cluster, "nodes": nodes[:keep]}
            continue
        keep = len(doc[name]) // 2
        truncated[name] += len(doc[name]) - keep
        doc[name] = doc[name][:keep]


def manifest(namespace: str, scheduler_name: str, blob: bytes) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(scheduler_name), "namespace": namespace,
                         "labels": {C.LABEL_QUEUE_OF: scheduler_name, C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}},
            "binaryData": {C.QUEUE_DATA_KEY: base64.b64encode(blob).decode()}}


def decode(configmap: Mapping) -> dict:
    """The document of a ConfigMap `manifest` made (a dict as the API returns it)."""
    data = (configmap.get("binaryData") or {}).get(C.QUEUE_DATA_KEY)
    if not data:
        raise StatusUnreadable(f"ConfigMap has no binaryData[{C.QUEUE_DATA_KEY!r}]")
    try:
        doc = json.loads(gzip.decompress(base64.b64decode(data)))
    except (ValueError, OSError, EOFError) as exc:
        raise StatusUnreadable(f"binaryData[{C.QUEUE_DATA_KEY!r}] is not gzip JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StatusUnreadable(f"queue document version {doc.get('version') if isinstance(doc, dict) else '?'!r}; "
                               f"this reader knows version {VERSION} (scheduler and plugin of different releases?)")
    return doc


def read(api_client, namespace: str, scheduler_name: str, timeout: float = 30) -> dict | None:
    """The published queue of `scheduler_name` in `namespace`; None when none is published (404)."""
    from kubernetes import client

    try:
        resp = client.CoreV1Api(api_client).read_namespaced_config_map(
            configmap_name(scheduler_name), namespace, _preload_content=False, _request_timeout=timeout)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return decode(json.loads(resp.data))


@dataclass(frozen=True)
class TaskInstance:
    """An operator's pod's task instance, from its labels."""

    dag_id: str
    task_id: str
    run_id: str
    try_number: str

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> TaskInstance | None:
        parts = tuple(labels.get(k) for k in (C.LABEL_DAG_ID, C.LABEL_TASK_ID, C.LABEL_RUN_ID, C.LABEL_TRY_NUMBER))
        return cls(*parts) if all(parts) else None

    def as_list(self) -> list[str]:
        return [self.dag_id, self.task_id, self.run_id, self.try_number]


def _meta(pod: Mapping, field: str) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get(field) or {}


def task_instance_of(pods: Iterable[Mapping]) -> list[str] | None:
    """[dag_id, task_id, run_id, try_number] of a gang's first pod; None for pods no operator made."""
    for pod in pods:
        ti = TaskInstance.of(_meta(pod, "labels"))
        return ti.as_list() if ti else None
    return None


def _count(annotations: Mapping[str, str], name: str) -> int:
    """A relaunch counter the operator writes on its pods; a value a user mangled counts as 0."""
    try:
        return max(0, int(annotations.get(name) or 0))
    except ValueError:
        return 0


def relaunches(pods: Iterable[Mapping]) -> tuple[int, int]:
    """(interruptions, preemptions) the operator counted on a gang's pods."""
    inter = pre = 0
    for pod in pods:
        ann = _meta(pod, "annotations")
        inter, pre = max(inter, _count(ann, C.ANNOTATION_INTERRUPTIONS)), max(pre, _count(ann, C.ANNOTATION_PREEMPTIONS))
    return inter, pre


def last_checkpoint_at(value: Any) -> float | None:
    """The gang's last checkpoint time (annotation ANNOTATION_LAST_CHECKPOINT_TIME the operator
    writes, RFC 3339; unreadable: none)."""
    return api_time(value)
